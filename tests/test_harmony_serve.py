"""OpenAI's harmony format (gpt-oss's chat, inferno/harmony.py) wired into the engine, the server
and the CLI, on a tiny random gpt-oss whose tokenizer has harmony's tags as special tokens and a
chat template that writes them: the prompt is harmony.render's (reasoning effort, tools), the
reply ends at <|return|> or <|call|>, and it comes back as reasoning_content, content and
tool_calls, whole and streamed alike, never with a tag in it.

Random weights write no harmony, so a reply is either scripted (each sampled token the next of a
recorded reply's, `scripted`) or grammar-enforced (tool_choice required: a call whose arguments
match its schema)."""

from __future__ import annotations

import io
import json

import httpx
import jsonschema
import openai
import pytest
import test_gpt_oss
import tiny
from test_serve import running, wait_healthy

import inferno
from inferno import cli
from inferno import harmony as H
from inferno.chat import run_chat
from inferno.errors import InfernoError
from inferno.sequence import Sampler
from inferno.serve.app import ServerConfig, build_app

MODEL = "tiny-gpt-oss"
# gpt-oss's template writes harmony; this one only has to say so (engine.speaks_harmony)
TEMPLATE = ("{%- for m in messages %}<|start|>{{ m.role }}<|channel|>final<|message|>{{ m.content }}<|end|>"
            "{%- endfor %}{%- if add_generation_prompt %}<|start|>assistant{%- endif %}")
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"]}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                        "b": {"type": "integer", "minimum": 0, "maximum": 9}},
       "required": ["a", "b"]}
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
TOOLS = [{"type": "function", "function": {"name": n, "description": f"The {n} tool.", "parameters": s}}
         for n, s in SCHEMAS.items()]
USER = [{"role": "user", "content": "Hello!"}]

# Recorded replies (the text after the prompt's <|start|>assistant; the stop token is the EOS
# `scripted` ends them with). Multi-byte characters split across byte-level tokens on the way.
REASONING = "The user greets me; answer warmly, in French 🙂."
ANSWER = "Bonjour, café 東京 🙂!"
FINAL = (f"<|channel|>analysis<|message|>{REASONING}<|end|>"
         f"<|start|>assistant<|channel|>final<|message|>{ANSWER}")
CALL = ("<|channel|>analysis<|message|>Need the weather: naïve guess is rain.<|end|>"
        '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
        '{"city":"Oslo","days":3}')


@pytest.fixture(scope="module")
def gptoss_dir(tmp_path_factory):
    """test_gpt_oss's tiny gpt-oss, its tokenizer with harmony's tags added (ids past the trained
    vocabulary, inside the model's) and a harmony template. Its config's eos is <|im_end|>
    only: the engine adds <|return|> and <|call|> itself."""
    folder = tiny.make_model(tmp_path_factory.mktemp("gptoss-harmony"), **test_gpt_oss.GPT_OSS)
    tiny.make_tokenizer(folder, specials=H.TAGS, chat_template=TEMPLATE)
    return folder


@pytest.fixture(scope="module")
def server(gptoss_dir):
    app = build_app(ServerConfig(model=str(gptoss_dir), model_id=MODEL, parallel=2, ctx_size=1024))
    with running(app) as url:
        wait_healthy(url)
        yield url, app.state.inferno.batch.engine


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def engine(gptoss_dir):
    """An engine of its own (the server's runs on the batch's thread)."""
    e = inferno.load(str(gptoss_dir), progress=False)
    yield e
    e.close()


def token(e, tag: str) -> int:
    return e.tokenizer.hf.token_to_id(tag)


def scripted(monkeypatch, e, text: str, end: str = H.RETURN) -> None:
    """Every sequence sampled from now on writes `text` (its tokens one a step), then `end`."""
    ids = e.tokenizer.encode(text, add_special_tokens=False) + [token(e, end)]

    def choose(self, logits, mask, history):
        script = self.__dict__.setdefault("script", iter(ids))
        return next(script, ids[-1]), None
    monkeypatch.setattr(Sampler, "choose", choose)


def prompts_of(monkeypatch, e) -> list[str]:
    """The prompt text of each chat the engine encodes from now on."""
    seen, encode = [], e.encode_prompt

    def spy(*args, **kwargs):
        ids = encode(*args, **kwargs)
        seen.append(e.tokenizer.decode(ids, skip_special_tokens=False))
        return ids
    monkeypatch.setattr(e, "encode_prompt", spy)
    return seen


# -- the engine -------------------------------------------------------------------------------------
def test_tools_dispatches_harmony_to_harmony_py():
    from inferno import tools as T
    assert T.detect_format(TEMPLATE) == "harmony" and T.detect_format(tiny.CHAT_TEMPLATE) == "generic"
    assert isinstance(T.stream_parser("harmony"), H.StreamParser) and T.call_guard("harmony") is None
    assert isinstance(T.call_guard("hermes"), T.CallGuard) and T.call_guard(None) is None
    assert T.tool_choice_grammar("harmony", TOOLS, "required") == H.tool_choice_grammar(TOOLS, "required")
    reasoning, content, calls = T.parse_reply("harmony", CALL)
    assert (reasoning, content, [(c.name, c.arguments) for c in calls]) == (
        "Need the weather: naïve guess is rain.", "", [("get_weather", '{"city":"Oslo","days":3}')])
    assert T.parse("harmony", FINAL) == (ANSWER, [])


def test_the_engine_speaks_harmony(engine):
    assert engine.speaks_harmony and engine.tool_format == "harmony" and engine.reply_format == "harmony"
    assert {token(engine, H.RETURN), token(engine, H.CALL)} <= engine.eos  # beside the config's own
    assert token(engine, "<|im_end|>") in engine.eos
    messages = [{"role": "system", "content": "Be brief."}, *USER]
    ids = engine.encode_prompt(messages, tools=TOOLS, reasoning_effort="high")
    want = H.render(messages, TOOLS, reasoning_effort="high")
    assert ids == engine.tokenizer.encode(want, add_special_tokens=False)  # no BOS: the tags are tokens
    text = engine.tokenizer.decode(ids, skip_special_tokens=False)
    assert text == want and "Reasoning: high" in text and "type get_weather = (_: {" in text
    assert "# Instructions\n\nBe brief." in text and text.endswith("<|start|>assistant")
    assert ids[0] == token(engine, H.START)
    for effort, line in (("low", "Reasoning: low"), (None, "Reasoning: medium")):
        assert line in engine.tokenizer.decode(engine.encode_prompt(USER, reasoning_effort=effort),
                                               skip_special_tokens=False)
    with pytest.raises(InfernoError, match="reasoning_effort") as e:
        engine.encode_prompt(USER, reasoning_effort="extreme")
    assert e.value.params == ("reasoning_effort",)


def test_a_model_without_harmony_refuses_a_reasoning_effort(qwen3_dir):
    e = inferno.load(str(qwen3_dir), progress=False, warm_up=False)
    try:
        assert not e.speaks_harmony and e.reply_format is None and e.tool_format == "generic"
        with pytest.raises(InfernoError, match="reasoning effort") as err:
            e.encode_prompt(USER, reasoning_effort="high")
        assert err.value.params == ("reasoning_effort",)
        with pytest.raises(InfernoError, match="raw"):
            e.encode_prompt("Hi", raw=True, reasoning_effort="high")
    finally:
        e.close()


def test_a_stream_keeps_the_tags_and_ends_at_return(engine, monkeypatch):
    scripted(monkeypatch, engine, FINAL + "<|return|>never this")
    stream = engine.stream(USER, max_tokens=200, temperature=0)
    pieces = list(stream)
    assert stream.harmony and "".join(pieces) == stream.result.text == FINAL  # <|return|> ended it
    assert stream.result.finish_reason == "stop" and stream.result.cut_by is None
    assert all("\ufffd" not in p for p in pieces)  # no character cut in half
    reply = H.parse(stream.result.text)
    assert (reply.reasoning, reply.content, reply.calls) == (REASONING, ANSWER, [])
    raw = engine.stream("Hello", raw=True, max_tokens=200, temperature=0)  # no chat: no tags kept
    assert not raw.harmony and "".join(raw) == f"analysis{REASONING}assistantfinal{ANSWER}"


# -- the server -------------------------------------------------------------------------------------
def extra(obj, key):
    return (obj.model_extra or {}).get(key)


def sse_text(url: str, body: dict) -> tuple[list[dict], str]:
    """A streamed chat completion's chunks, and its raw text."""
    with httpx.stream("POST", url + "/v1/chat/completions", json={"model": MODEL, "stream": True, **body},
                      timeout=120) as r:
        assert r.status_code == 200, r.read()
        raw = "".join(r.iter_text())
    chunks = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
    return chunks, raw


def folded(chunks: list[dict]) -> dict:
    """A choice's streamed deltas, folded: reasoning, content, calls, finish."""
    out = {"reasoning": "", "content": "", "calls": [], "finish": None}
    for chunk in chunks:
        for choice in chunk["choices"]:
            d = choice["delta"]
            out["reasoning"] += d.get("reasoning_content") or ""
            out["content"] += d.get("content") or ""
            for call in d.get("tool_calls") or ():
                if call.get("id"):
                    out["calls"].append([call["id"], call["function"]["name"], ""])
                out["calls"][call["index"]][2] += call["function"]["arguments"]
            out["finish"] = choice["finish_reason"] or out["finish"]
    return out


def test_a_recorded_reply_is_reasoning_and_content_whole_and_streamed(server, client, monkeypatch):
    url, e = server
    scripted(monkeypatch, e, FINAL)
    whole = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=300)
    message = whole.choices[0].message
    assert (extra(message, "reasoning_content"), message.content) == (REASONING, ANSWER)
    assert whole.choices[0].finish_reason == "stop" and not message.tool_calls
    chunks, raw = sse_text(url, {"messages": USER, "max_tokens": 300})
    got = folded(chunks)
    assert (got["reasoning"], got["content"], got["calls"], got["finish"]) == (REASONING, ANSWER, [], "stop")
    assert "<|" not in raw and "<|" not in whole.model_dump_json()  # no tag reaches the client
    # the reasoning streams as it is written: in more than one delta, before the answer's first
    kinds = [k for c in chunks for ch in c["choices"] for k, v in ch["delta"].items()
             if k in ("reasoning_content", "content") and v]
    assert kinds.count("reasoning_content") > 1 and kinds.index("content") > kinds.index("reasoning_content")


def test_usage_counts_the_tokens_before_the_answer_as_reasoning(server, client, monkeypatch):
    """usage.completion_tokens_details.reasoning_tokens: the reply's tokens up to its answer (the
    analysis channel and the headers around it), whole, streamed and through the Responses API
    (output_tokens_details); a reply with no reasoning has none."""
    url, e = server
    thinking = len(e.tokenizer.encode(FINAL[:FINAL.index(ANSWER)], add_special_tokens=False))
    scripted(monkeypatch, e, FINAL)
    whole = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=300)
    assert whole.usage.completion_tokens_details.reasoning_tokens == thinking
    assert whole.usage.completion_tokens > thinking
    chunks, _ = sse_text(url, {"messages": USER, "max_tokens": 300, "stream_options": {"include_usage": True}})
    assert chunks[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] == thinking
    r = httpx.post(url + "/v1/responses", json={"model": MODEL, "input": "Hello!", "max_output_tokens": 300}, timeout=120)
    assert r.json()["usage"]["output_tokens_details"]["reasoning_tokens"] == thinking
    scripted(monkeypatch, e, f"<|channel|>final<|message|>{ANSWER}")
    plain = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=300)
    assert plain.choices[0].message.content == ANSWER and plain.usage.completion_tokens_details is None


def test_a_recorded_call_is_a_tool_call_whole_and_streamed(server, client, monkeypatch):
    """tool_choice auto: the grammar takes the recorded call (each scripted token goes through
    the matcher), and <|call|>, an end token, ends the reply."""
    url, e = server
    scripted(monkeypatch, e, CALL, end=H.CALL)
    whole = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS, max_tokens=300)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert extra(choice.message, "reasoning_content") == "Need the weather: naïve guess is rain."
    [call] = choice.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", '{"city":"Oslo","days":3}')
    chunks, raw = sse_text(url, {"messages": USER, "tools": TOOLS, "max_tokens": 300})
    got = folded(chunks)
    assert [c[1:] for c in got["calls"]] == [["get_weather", '{"city":"Oslo","days":3}']]
    assert got["finish"] == "tool_calls" and got["content"] == "" and "<|" not in raw


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_tool_choice_is_grammar_enforced(server, client, choice):
    """The random model writes a call, valid for its schema: the grammar allows nothing else.
    (<|channel|> pushed down: it would open an analysis message, which a random model never
    ends; the grammar still writes it where a call's header needs it.)"""
    url, e = server
    opts = dict(messages=USER, tools=TOOLS, tool_choice=choice, max_tokens=300, temperature=0,
                logit_bias={str(token(e, H.CHANNEL)): -100})
    whole = client.chat.completions.create(model=MODEL, **opts)
    assert whole.choices[0].finish_reason == "tool_calls"
    [call] = whole.choices[0].message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert isinstance(choice, str) or call.function.name == "add"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    chunks, raw = sse_text(url, opts)
    got = folded(chunks)
    assert [c[1:] for c in got["calls"]] == [[call.function.name, call.function.arguments]]  # greedy: the same
    assert got["finish"] == "tool_calls" and "<|" not in raw


def test_a_response_format_holds_the_answer_not_the_reasoning(server, client, monkeypatch):
    """response_format on gpt-oss: the grammar opens a channel before the JSON (the model's
    reasoning may come first), and the content is the final message's JSON, valid for the
    schema. (The first token of "final" pushed up: the random model would otherwise open an
    analysis message it never ends.)"""
    url, e = server
    final = e.tokenizer.encode("final", add_special_tokens=False)[0]
    rf = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER}}
    whole = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=300, temperature=0,
                                           response_format=rf, logit_bias={str(final): 100})
    choice = whole.choices[0]
    assert choice.finish_reason == "stop" and "<|" not in choice.message.content
    jsonschema.validate(json.loads(choice.message.content), WEATHER)
    # a recorded reply that reasons, then answers in JSON: the grammar takes it whole
    answer = '{"city":"Rome","days":2}'
    scripted(monkeypatch, e, f"<|channel|>analysis<|message|>{REASONING}<|end|>"
                             f"<|start|>assistant<|channel|>final<|message|>{answer}")
    whole = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=300, response_format=rf)
    message = whole.choices[0].message
    assert (extra(message, "reasoning_content"), message.content) == (REASONING, answer)
    r = httpx.post(url + "/v1/chat/completions", json={"model": MODEL, "messages": USER, "response_format": {
        "type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object", "properties": {
            "a": {"type": "string", "format": "zork"}}}}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text


def test_reasoning_effort_reaches_the_prompt(server, client, monkeypatch):
    url, e = server
    scripted(monkeypatch, e, FINAL)
    prompts = prompts_of(monkeypatch, e)
    for effort in ("low", "high"):
        client.chat.completions.create(model=MODEL, messages=USER, max_tokens=300, reasoning_effort=effort)
    client.chat.completions.create(model=MODEL, messages=USER, max_tokens=300)
    assert [p.split("Reasoning: ")[1].split("\n")[0] for p in prompts] == ["low", "high", "medium"]


def test_a_bad_reasoning_effort_is_a_400_naming_it(server):
    url, _ = server
    for value in ("extreme", 3, "HIGH"):
        r = httpx.post(url + "/v1/chat/completions", json={"model": MODEL, "messages": USER, "reasoning_effort": value})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "reasoning_effort" and "reasoning_effort" in r.json()["error"]["message"]


def test_history_keeps_reasoning_during_a_turn_of_calls(server, client, monkeypatch):
    """An assistant turn's reasoning_content, sent back with its tool_calls, is in the next prompt
    while the turn goes on (harmony's rule), and dropped once it was answered."""
    url, e = server
    scripted(monkeypatch, e, FINAL)
    prompts = prompts_of(monkeypatch, e)
    turn = [*USER, {"role": "assistant", "content": None, "reasoning_content": "Check the weather first.",
                    "tool_calls": [{"id": "c1", "type": "function",
                                    "function": {"name": "get_weather", "arguments": '{"city":"Rome","days":1}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    client.chat.completions.create(model=MODEL, messages=turn, tools=TOOLS, tool_choice="none", max_tokens=300)
    answered = [*turn, {"role": "assistant", "content": "It is sunny.", "reasoning_content": "Say it."},
                {"role": "user", "content": "Thanks"}]
    client.chat.completions.create(model=MODEL, messages=answered, tools=TOOLS, tool_choice="none", max_tokens=300)
    assert "<|channel|>analysis<|message|>Check the weather first.<|end|>" in prompts[0]
    assert "functions.get_weather to=assistant<|channel|>commentary<|message|>sunny" in prompts[0]
    assert "Check the weather first." not in prompts[1] and "Say it." not in prompts[1]


def test_responses_api_gives_the_reasoning_an_item_of_its_own(server, monkeypatch):
    """The answer is the message's output_text; the reasoning a reasoning item before it (its
    reasoning_text content), whole and streamed as response.reasoning_text deltas, never output
    text; sent back in `input`, it joins the assistant turn after it."""
    url, e = server
    scripted(monkeypatch, e, FINAL)
    prompts = prompts_of(monkeypatch, e)
    body = {"model": MODEL, "input": "Hello!", "max_output_tokens": 300, "reasoning": {"effort": "high"}}
    r = httpx.post(url + "/v1/responses", json=body, timeout=120)
    assert r.status_code == 200, r.text
    thought, item = r.json()["output"]
    assert thought["type"] == "reasoning" and thought["content"] == [{"type": "reasoning_text", "text": REASONING}]
    assert item["type"] == "message" and item["content"][0]["text"] == ANSWER
    assert "<|" not in r.text and "Reasoning: high" in prompts[-1]
    parsed = openai.OpenAI(base_url=url + "/v1", api_key="unused").responses.create(**{
        k: v for k, v in body.items() if k != "model"}, model=MODEL)
    assert parsed.output[0].type == "reasoning" and parsed.output[0].content[0].text == REASONING
    assert parsed.output_text == ANSWER
    with httpx.stream("POST", url + "/v1/responses", json={**body, "stream": True}, timeout=120) as s:
        raw = "".join(s.iter_text())
    events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
    assert "".join(ev["delta"] for ev in events if ev["type"] == "response.output_text.delta") == ANSWER
    assert "".join(ev["delta"] for ev in events if ev["type"] == "response.reasoning_text.delta") == REASONING
    done = [ev["item"] for ev in events if ev["type"] == "response.output_item.done"]
    assert [i["type"] for i in done] == ["reasoning", "message"] and "<|" not in raw
    assert events[-1]["response"]["output"] == done
    # the stored conversation keeps it for the next turn, where an answered turn's is dropped
    stored = r.json()["id"]
    r = httpx.post(url + "/v1/responses", json={**body, "input": "More?", "previous_response_id": stored}, timeout=120)
    assert r.status_code == 200 and f"<|channel|>final<|message|>{ANSWER}<|end|>" in prompts[-1]
    r = httpx.post(url + "/v1/responses", json={**body, "reasoning": {"effort": "max"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning.effort"
    # a client that keeps its own context sends the reasoning item back before its call
    turn = [{"type": "message", "role": "user", "content": "Weather in Rome?"},
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "Check the weather first."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Rome","days":1}'},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]
    r = httpx.post(url + "/v1/responses", json={**body, "input": turn, "tools": [
        {"type": "function", **t["function"]} for t in TOOLS]}, timeout=120)
    assert r.status_code == 200, r.text
    assert "<|channel|>analysis<|message|>Check the weather first.<|end|>" in prompts[-1]

# -- the CLI ----------------------------------------------------------------------------------------
class TTY(io.StringIO):
    def isatty(self):
        return True


def chat(engine, stdout, turns="Hello!\n", **options) -> str:
    err = io.StringIO()
    assert run_chat(engine, stdin=io.StringIO(turns), stdout=stdout, stderr=err, max_tokens=300, **options) == 0
    return stdout.getvalue()


def test_chat_shows_the_reasoning_dimmed_then_the_answer(engine, monkeypatch):
    scripted(monkeypatch, engine, FINAL)
    assert chat(engine, io.StringIO()) == f"{REASONING}\n\n{ANSWER}\n"  # a pipe: plain
    assert chat(engine, TTY()) == f"\033[2m{REASONING}\033[0m\n\n{ANSWER}\n"  # a terminal: dimmed
    assert chat(engine, TTY(), hide_reasoning=True) == f"{ANSWER}\n"


def test_chat_history_keeps_the_answer_and_the_effort(engine, monkeypatch):
    scripted(monkeypatch, engine, FINAL)
    prompts = prompts_of(monkeypatch, engine)
    out = chat(engine, io.StringIO(), turns="Hello!\nAgain?\n", reasoning_effort="low")
    assert out == f"{REASONING}\n\n{ANSWER}\n" * 2
    assert all("Reasoning: low" in p for p in prompts) and len(prompts) == 2
    assert f"<|start|>assistant<|channel|>final<|message|>{ANSWER}<|end|><|start|>user<|message|>Again?" in prompts[1]
    assert REASONING not in prompts[1]  # answered: dropped


def test_chat_stops_the_dim_when_a_reply_is_cut_in_its_reasoning(engine, monkeypatch):
    scripted(monkeypatch, engine, FINAL)
    out, err = TTY(), io.StringIO()
    cut = len(engine.tokenizer.encode("<|channel|>analysis<|message|>The user greets", add_special_tokens=False))
    run_chat(engine, stdin=io.StringIO("Hi\n"), stdout=out, stderr=err, max_tokens=cut)
    assert out.getvalue() == "\033[2mThe user greets\033[0m\n" and "[max tokens" in err.getvalue()


def test_cli_flags():
    parser = cli.build_parser()
    args = parser.parse_args(["chat", "--reasoning-effort", "high", "--hide-reasoning"])
    assert (args.reasoning_effort, args.hide_reasoning) == ("high", True)
    args = parser.parse_args(["generate", "-p", "x"])
    assert (args.reasoning_effort, args.hide_reasoning) == (None, False)
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "-p", "x", "--reasoning-effort", "extreme"])


def test_generate_prints_the_answer_and_the_reasoning_on_stderr(gptoss_dir, monkeypatch, capsys):
    # (the engine cli.main loads is its own: Sampler's patch scripts it all the same)
    ids = tiny_ids(gptoss_dir)
    monkeypatch.setattr(Sampler, "choose", lambda self, *a: (next(self.__dict__.setdefault("script", iter(ids))), None))
    argv = ["generate", "-m", str(gptoss_dir), "-p", "Hello!", "-n", 300, "--reasoning-effort", "high"]
    assert cli.main(list(map(str, argv))) == 0
    out, err = capsys.readouterr()
    assert out == ANSWER + "\n" and f"{REASONING}\n" in err
    assert cli.main(list(map(str, argv + ["--hide-reasoning"]))) == 0
    out, err = capsys.readouterr()
    assert out == ANSWER + "\n" and REASONING not in err
    assert cli.main(list(map(str, argv + ["--json"]))) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["text"], got["reasoning"], got["finish_reason"]) == (ANSWER, REASONING, "stop")
    assert cli.main(["generate", "-m", str(gptoss_dir), "-p", "Hi", "--raw", "--reasoning-effort", "low"]) == 1
    assert "--reasoning-effort needs the chat template" in capsys.readouterr().err


def tiny_ids(folder) -> list[int]:
    from inferno.tokenizers.tokenizer import Tokenizer
    tok = Tokenizer.from_folder(folder)
    return tok.encode(FINAL, add_special_tokens=False) + [tok.hf.token_to_id(H.RETURN)] * 400
