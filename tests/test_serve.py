"""`inferno serve` over HTTP, driven by the official `openai` client, on a tiny random model: a
server on a free port in this process (its engine within reach of the tests), plus a real
`inferno serve` subprocess for SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from unittest.mock import ANY

import httpx
import numpy as np
import openai
import pytest
import uvicorn

import inferno
from inferno.serve.app import ServerConfig, build_app

MODEL = "tiny"
GREEDY = dict(temperature=0, max_tokens=12)


@contextmanager
def running(app):
    """`app` on uvicorn in a thread, on a port the OS picked; yields the base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        while not server.started:
            time.sleep(0.01)
        yield url
    finally:
        server.should_exit = True
        thread.join(10)


def wait_healthy(url, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not become healthy")


@pytest.fixture(scope="module")
def server(qwen3_dir):
    app = build_app(ServerConfig(model=str(qwen3_dir), model_id=MODEL, parallel=4, ctx_size=256, queue_limit=4))
    with running(app) as url:
        wait_healthy(url)
        yield url, app.state.inferno


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def engine(server):
    return server[1].batch.engine


@pytest.fixture
def slow_steps(engine, monkeypatch):
    """Each model step waits a few ms: streams last long enough to be caught mid-way."""
    delay_steps(engine, monkeypatch, 0.005)


@pytest.fixture
def slower_steps(engine, monkeypatch):
    """Each model step waits 50 ms: a 200-token stream lasts 10 s, long after a client thread
    that the batch and server threads keep from the GIL (and the pool's workers from the two
    cores: 4 s were seen) has read its first chunks."""
    delay_steps(engine, monkeypatch, 0.05)


def delay_steps(engine, monkeypatch, seconds: float) -> None:
    step = engine.model.run
    monkeypatch.setattr(engine.model, "run", lambda *a, **k: (time.sleep(seconds), step(*a, **k))[1])


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a city."}]


def test_chat_matches_the_engine_and_counts_usage(client, engine):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, **GREEDY)
    want = engine.generate(MESSAGES, max_tokens=12, temperature=0, top_k=0, top_p=1, min_p=0)
    (choice,) = r.choices
    assert choice.message.role == "assistant" and choice.message.content == want.text
    assert choice.finish_reason == want.finish_reason
    assert r.usage.prompt_tokens == len(engine.encode_prompt(MESSAGES)) == want.prompt_tokens
    assert r.usage.completion_tokens == want.generated_tokens
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.object == "chat.completion" and r.model == MODEL and r.id.startswith("chatcmpl-")


def test_streamed_chat_adds_up_to_the_whole(client):
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, seed=3, max_tokens=16)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, seed=3, max_tokens=16,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_take_the_raw_prompt_with_bos(client, engine):
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0)
    want = engine.generate("Once upon a time", raw=True, max_tokens=10, temperature=0, top_k=0, top_p=1, min_p=0)
    assert r.choices[0].text == want.text
    assert r.usage.prompt_tokens == len(engine.tokenizer.encode("Once upon a time", add_special_tokens=True))
    streamed = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == want.text


def test_n_choices_and_seeds_that_reproduce(client):
    ask = dict(model=MODEL, messages=MESSAGES, max_tokens=10, temperature=1.0, n=2)
    a = client.chat.completions.create(seed=42, **ask)
    b = client.chat.completions.create(seed=42, **ask)
    c = client.chat.completions.create(seed=43, **ask)
    texts = lambda r: [ch.message.content for ch in sorted(r.choices, key=lambda ch: ch.index)]  # noqa: E731
    assert [ch.index for ch in a.choices] == [0, 1]
    assert texts(a) == texts(b) != texts(c) and texts(a)[0] != texts(a)[1]
    assert a.usage.completion_tokens == 20 or any(ch.finish_reason == "stop" for ch in a.choices)
    streamed = client.chat.completions.create(seed=42, stream=True, **ask)
    got = ["", ""]
    for chunk in streamed:
        for ch in chunk.choices:
            got[ch.index] += ch.delta.content or ""
    assert got == texts(a)


def test_stop_strings(client):
    free = client.completions.create(model=MODEL, prompt="Hello", max_tokens=24, temperature=0).choices[0]
    stop = free.text[5:8]
    assert len(stop) == 3
    want = free.text[:free.text.index(stop)]
    for stream in (False, True):
        r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=24, temperature=0,
                                      stop=[stop, "never seen"], stream=stream)
        chunks = list(r) if stream else [r]
        assert "".join(c.choices[0].text for c in chunks) == want
        assert chunks[-1].choices[0].finish_reason == "stop"


def test_logprobs(client, engine):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, logprobs=True, top_logprobs=3, **GREEDY)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens  # no EOS: the reply ran to max_tokens
    # cached: keys read back from a cache of the server's type (f16 on pool), as generation does
    logits = engine.logits(engine.encode_prompt(MESSAGES), cached=True)[-1].astype(np.float64)
    lse = logits.max() + np.log(np.exp(logits - logits.max()).sum())
    first = content[0]
    assert first.logprob == pytest.approx(logits.max() - lse, abs=1e-5)
    assert [t.logprob for t in first.top_logprobs] == sorted((t.logprob for t in first.top_logprobs), reverse=True)
    assert first.top_logprobs[0].token == first.token and len(first.top_logprobs) == 3
    assert "".join(bytes(t.bytes).decode("utf-8", "replace") for t in content) .startswith(content[0].token)
    text = client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, temperature=0, logprobs=2)
    lp = text.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert lp.text_offset[0] == 0 and all(len(alts) <= 2 for alts in lp.top_logprobs)


# A reply that opens the tiny model's think block (its template has Qwen3's), held to a grammar.
THINKING = 'root ::= "<think>\\n" ("yes" | "no") " and so\\n</think>\\n\\n" ("Paris" | "Rome") "."'


def test_a_think_block_is_the_reasoning_content(server, client, qwen3_dir):
    """The think block a reply opens with goes out as reasoning_content, its tags and blank
    lines left out, streamed or not; the answer is the content, and the tokens up to it are
    usage's reasoning_tokens. With --reasoning-format none the reply is the content, tags and all."""
    ask = dict(model=MODEL, messages=MESSAGES, max_tokens=40, temperature=0, extra_body={"grammar": THINKING})
    whole = client.chat.completions.create(**ask)
    message = whole.choices[0].message
    reasoning = (message.model_extra or {}).get("reasoning_content")
    assert reasoning in ("yes and so", "no and so") and message.content in ("Paris.", "Rome.")
    assert whole.usage.completion_tokens_details.reasoning_tokens > 0
    assert whole.usage.completion_tokens_details.reasoning_tokens < whole.usage.completion_tokens
    chunks = list(client.chat.completions.create(stream=True, **ask))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == reasoning
    assert "".join(d.content or "" for d in deltas) == message.content
    written = f"<think>\n{reasoning}\n</think>\n\n{message.content}"
    app = build_app(ServerConfig(model=str(qwen3_dir), model_id=MODEL, ctx_size=256, reasoning_format="none"))
    with running(app) as url:
        wait_healthy(url)
        plain = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        kept = plain.chat.completions.create(**ask).choices[0].message
        assert kept.content == written and not (kept.model_extra or {}).get("reasoning_content")


@pytest.mark.parametrize("body,status,param", [
    (b"{not json", 400, None),
    (b'["a list"]', 400, None),
    ({"model": MODEL}, 400, "messages"),
    ({"model": MODEL, "messages": []}, 400, "messages"),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
    ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages.0.content.0.type"),
    ({"model": MODEL, "messages": MESSAGES, "temperature": 3}, 400, "temperature"),
    ({"model": MODEL, "messages": MESSAGES, "top_p": 0}, 400, "top_p"),
    ({"model": MODEL, "messages": MESSAGES, "presence_penalty": -2.5}, 400, "presence_penalty"),
    ({"model": MODEL, "messages": MESSAGES, "top_logprobs": 30, "logprobs": True}, 400, "top_logprobs"),
    ({"model": MODEL, "messages": MESSAGES, "n": 5}, 400, "n"),
    ({"model": MODEL, "messages": MESSAGES, "tools": [{"type": "function"}]}, 400, "tools.0.function"),
    ({"model": MODEL, "messages": MESSAGES, "tools": [{"type": "function", "function": {"name": ""}}]}, 400,
     "tools.0.function.name"),
    ({"model": MODEL, "messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, 400, "tool_choice"),
    ({"model": MODEL, "messages": MESSAGES, "tool_choice": "required"}, 400, "tool_choice"),
    ({"model": MODEL, "messages": MESSAGES, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "nonsense"}}}}, 400, "response_format"),
    ({"model": MODEL, "messages": MESSAGES, "response_format": {"type": "xml"}}, 400, "response_format.type"),
    ({"model": MODEL, "messages": MESSAGES, "grammar": "root ::= (("}, 400, "grammar"),
    ({"model": MODEL, "messages": MESSAGES, "json_schema": {"type": 5}}, 400, "json_schema"),
    ({"model": MODEL, "messages": MESSAGES, "functions": [{"name": "f"}]}, 400, "functions"),
    ({"model": MODEL, "messages": MESSAGES, "max_tokens": 250}, 400, "max_completion_tokens"),
    ({"model": "gpt-4o", "messages": MESSAGES}, 404, "model"),
])
def test_bad_requests_get_openai_errors(server, body, status, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server[0] + "/v1/chat/completions", content=content)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]
    if param == "max_completion_tokens":  # the numbers, and the fix
        assert "+ max_tokens (250)" in error["message"] and "256" in error["message"]


def test_other_http_errors(server):
    url = server[0]
    huge = b'{"model": "tiny", "prompt": "' + b"a" * (1 << 20) + b'"}'
    assert httpx.post(url + "/v1/completions", content=huge).status_code == 413
    chunked = httpx.post(url + "/v1/completions", content=iter([huge[:1000], huge[1000:]]))
    assert chunked.status_code == 413 and chunked.json()["error"]["message"]
    r = httpx.post(url + "/v1/completions", content=b'{"model": "tiny", "prompt": "hi", "echo": true}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"
    r = httpx.post(url + "/v1/assistants", json={"model": MODEL})
    assert r.status_code == 404 and "Invalid URL (POST /v1/assistants)" in r.json()["error"]["message"]
    assert "POST /v1/chat/completions" in r.json()["error"]["message"]
    r = httpx.get(url + "/v1/chat/completions")
    assert r.status_code == 405 and "Invalid URL (GET /v1/chat/completions)" in r.json()["error"]["message"]
    models = httpx.get(url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert httpx.get(url + f"/v1/models/{MODEL}").json() == {**models["data"][0], "created": ANY}
    r = httpx.get(url + "/v1/models/gpt-4o")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_client_disconnect_frees_the_slot(server, client, engine, slower_steps):
    url, state = server
    batch = state.batch
    # EOS banned: a random model that sampled it early would end the stream before the check
    no_eos = {str(t): -100 for t in engine.eos}
    with httpx.stream("POST", url + "/v1/chat/completions",
                      json={"model": MODEL, "messages": MESSAGES, "max_tokens": 200, "stream": True,
                            "logit_bias": no_eos}) as r:
        chunks = (line for line in r.iter_lines() if line.startswith("data: "))
        next(chunks)  # the role chunk, which may come before the scheduler admits the request
        line = next(chunks)  # a token's: admitted and decoding
        deadline = time.monotonic() + 5
        while batch.stats()["slots_used"] != 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert batch.stats()["slots_used"] == 1, (line, batch.stats(), batch.steps)
    tokens = batch.metrics.generated_tokens
    with pytest.raises(httpx.ReadTimeout):  # a non-streamed request whose client gives up
        httpx.post(url + "/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 200,
                                                        "logit_bias": no_eos}, timeout=0.3)
    deadline = time.monotonic() + 5
    while batch.stats()["slots_used"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert batch.stats() == dict(running=0, waiting=0, slots_used=0, slots=4)
    assert batch.metrics.generated_tokens - tokens < 150  # it stopped, far short of 200


def test_past_the_queue_limit_is_429_with_retry_after(server, engine, monkeypatch):
    url, state = server
    gate = threading.Event()
    step = engine.model.run
    monkeypatch.setattr(engine.model, "run", lambda *a, **k: (gate.wait(10), step(*a, **k))[1])
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4}
    results = []
    threads = [threading.Thread(target=lambda: results.append(httpx.post(url + "/v1/chat/completions", json=body,
                                                                         timeout=30).status_code))
               for _ in range(8)]  # 4 slots + a queue of 4
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while state.batch.stats()["slots_used"] + state.batch.stats()["waiting"] < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    refused = httpx.post(url + "/v1/chat/completions", json=body)
    gate.set()
    for t in threads:
        t.join(30)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert results == [200] * 8


def test_an_exception_fails_that_request_only(server, client, engine, monkeypatch):
    step = engine.model.run
    poison = 7

    def faulty(segments, cache, **kw):
        if any(poison in s.ids for s in segments):
            raise RuntimeError("injected fault")
        return step(segments, cache, **kw)
    monkeypatch.setattr(engine.model, "run", faulty)
    good = [int(t) for t in engine.tokenizer.encode("Hello there") if t != poison]
    want = client.completions.create(model=MODEL, prompt=good, max_tokens=8, temperature=0,
                                     logit_bias={str(poison): -100}).choices[0].text
    out = {}

    def call(name, prompt):
        out[name] = httpx.post(server[0] + "/v1/completions", timeout=30, json={
            "model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0, "logit_bias": {str(poison): -100}})
    threads = [threading.Thread(target=call, args=(name, p)) for name, p in
               [("a", good), ("bad", good + [poison]), ("b", good)]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert out["bad"].status_code == 500 and "injected fault" in out["bad"].json()["error"]["message"]
    assert out["bad"].json()["error"]["type"] == "server_error"
    for name in "ab":
        assert out[name].status_code == 200 and out[name].json()["choices"][0]["text"] == want


def test_metrics(server, client):
    client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
    text = httpx.get(server[0] + "/metrics").text
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if not line.startswith("#")}
    assert values['inferno_requests_total{status="200"}'] >= 1
    assert values["inferno_prompt_tokens_total"] > 0 and values["inferno_generation_tokens_total"] >= 3
    assert values["inferno_time_to_first_token_seconds_count"] >= 1
    assert values['inferno_inter_token_latency_seconds_bucket{le="+Inf"}'] >= 2
    assert values["inferno_kv_slots"] == 4 and values["inferno_kv_slots_used"] == 0
    assert "inferno_sequences_running" in values and "inferno_sequences_waiting" in values
    # The same request again: its prompt's rows come from the slot that held them.
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
    assert r.usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens - 1
    again = {line.split()[0]: float(line.split()[1]) for line in httpx.get(server[0] + "/metrics").text.splitlines()
             if not line.startswith("#")}
    assert again["inferno_prompt_tokens_cached_total"] - values["inferno_prompt_tokens_cached_total"] == r.usage.prompt_tokens - 1
    assert again["inferno_prompt_tokens_total"] - values["inferno_prompt_tokens_total"] == 1


def test_api_key_and_health_before_load(qwen3_dir):
    loaded = threading.Event()
    config = ServerConfig(model=str(qwen3_dir), model_id=MODEL, api_key="sesame")

    def load(metrics):
        loaded.wait(10)
        return config.load(metrics)
    with running(build_app(config, load)) as url:
        assert httpx.get(url + "/health").status_code == 503
        loaded.set()
        wait_healthy(url)
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sesame"}):
            r = httpx.post(url + "/v1/chat/completions", json=body, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(url + "/metrics").status_code == 401
        c = openai.OpenAI(base_url=url + "/v1", api_key="sesame", max_retries=0)
        assert c.chat.completions.create(**body).choices[0].finish_reason in ("stop", "length")


SLOW_SERVE = """
import sys, time
from inferno.model.decoder import DecoderModel
step = DecoderModel.run
DecoderModel.run = lambda *a, **k: (time.sleep(0.01), step(*a, **k))[1]  # streams that last
from inferno.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_drains_and_exits_0(qwen3_dir):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SERVE, "serve", "-m", str(qwen3_dir), "--port", str(port),
                             "--alias", MODEL], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url)
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 60, "stream": True,
                "logit_bias": {str(t): -100 for t in inferno.load(qwen3_dir, progress=False).tokenizer.eos_ids}}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            while "content" not in next(lines):
                pass
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)
            with pytest.raises(httpx.ConnectError):  # no longer accepting
                httpx.get(url + "/health")
            rest = [ln for ln in lines if ln.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "length"  # it ran to its end
        assert proc.wait(30) == 0, proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


def test_a_bad_model_is_one_line_before_any_port_is_bound(tmp_path):
    p = subprocess.run([sys.executable, "-m", "inferno", "serve", "-m", str(tmp_path / "missing.gguf")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stderr.startswith("inferno: error: ") and p.stderr.count("\n") == 1
    assert "Uvicorn" not in p.stderr


def test_a_log_line_per_request(client, caplog):
    import logging
    with caplog.at_level(logging.INFO, logger="inferno.serve"):
        r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, stream=True).close()
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="nope", messages=MESSAGES)
    lines = [rec.getMessage() for rec in caplog.records if rec.getMessage().startswith("POST /v1/")]
    assert any(ln.startswith("POST /v1/chat/completions 200 prompt ") and f"generated {r.usage.completion_tokens}" in ln
               and "cached" in ln and "TTFT" in ln and ln.endswith(" ms") for ln in lines), lines
    assert any(ln.startswith("POST /v1/chat/completions 404,") for ln in lines), lines
