"""`inferno serve` under load, beside llama-cpp-python's server on the same GGUF.

    python bench/serve_load.py                        # every scenario: SmolLM2 on pool
    python bench/serve_load.py --scenario load --clients 8 --max-tokens 128
    python bench/serve_load.py --scenario itl         # the wait-policy x threads table only

Each server runs in its own process, started here and stopped with SIGTERM; the clients are the
`openai` package's AsyncOpenAI, streaming, all in this process (on a small machine they share the
cores with the server: say so beside the numbers). EOS is banned with logit_bias so every stream
generates exactly --max-tokens tokens. Scenarios:
  load   --clients streams at once with prompts of mixed lengths, against inferno and against
         llama-cpp-python's server (`python -m llama_cpp.server`, its `server` extra: it runs one
         request at a time; --interrupt_requests False so a new request queues instead of
         cutting the running one short); one stream alone on inferno, and the ratio.
  join   a request joining 7 running streams: its TTFT, against its TTFT on an idle server.
  burst  100 clients at once against --parallel 8: each completes or gets 429; nothing hangs;
         the server's RSS before, after one burst and after a second.
  itl    the load scenario on pool with OMP_WAIT_POLICY passive / active and --threads 1 / 2:
         inter-token latency with the event loop busy streaming to the clients.
  turns  an agent-like workload: 4 clients x 5 turns over a shared ~1,300-token system prompt,
         the whole history resent every turn, against llama.cpp's own llama-server (built by
         ../shared/bin/llama-server.sh) with the same --parallel; and a newcomer whose system
         prompt a busy slot holds. Prefix reuse is what it measures.
  ray    the turns workload on two Ray Serve replicas, Ray's default router against --router
         prefix, beside one replica (not in the default set: it starts Ray; --rounds).
Per run: aggregate generated tok/s (all tokens / wall time, prefill included), aggregate decode
tok/s (tokens after each stream's first / the time some stream was between its first token and
its last: the other prompts' prefill steps fall inside it), "all decoding" tok/s (tokens in the
window where every stream was decoding and no prompt was left to prefill, over that window:
the batched decode step as the clients see it), TTFT p50/p99, inter-token latency
p50/p99 (gaps between a stream's chunks), errors.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

DEFAULT_GGUF = Path("~/.cache/inferno/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf").expanduser()
TEXT = ("The history of bread begins in the Neolithic, when people first ground grain between stones "
        "and baked the paste on hot rocks. Over the centuries bakers learned to leaven dough with wild "
        "yeasts, to build ovens of clay and brick, and to mill flour ever finer. ")


@dataclass
class Stream:
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    first: float = 0.0  # perf_counter at the first token, and at the last
    last: float = 0.0
    error: str | None = None
    status: int = 200


@dataclass
class Run:
    label: str
    streams: list[Stream]
    wall: float

    def line(self) -> str:
        ok = [s for s in self.streams if s.error is None]
        tokens = sum(s.tokens for s in ok)
        ttft = [s.ttft for s in ok if s.ttft is not None]
        gaps = [g for s in ok for g in s.gaps]
        pct = lambda xs, q: np.percentile(xs, q) * 1e3 if xs else float("nan")  # noqa: E731
        return (f"{self.label:<34} {tokens / self.wall:8.1f} tok/s  decode {self.decode_tok_s:7.1f} tok/s  "
                f"all decoding {self.steady_tok_s:7.1f} tok/s  TTFT p50 {pct(ttft, 50):7.0f} ms "
                f"p99 {pct(ttft, 99):7.0f} ms  ITL p50 {pct(gaps, 50):6.1f} ms p99 {pct(gaps, 99):7.1f} ms  "
                f"errors {len(self.streams) - len(ok)}")

    @property
    def decode_tok_s(self) -> float:
        """Tokens after each stream's first, over the time some stream was decoding: the union
        of the spans from a stream's first token to its last (a server that runs the streams
        one after another gets their sum, not the overlap)."""
        spans = sorted((s.first, s.last) for s in self.streams if s.error is None and s.gaps)
        busy, end = 0.0, float("-inf")
        for a, b in spans:
            busy += max(0.0, b - max(a, end))
            end = max(end, b)
        return sum(len(s.gaps) for s in self.streams if s.error is None) / busy if busy else float("nan")

    @property
    def steady_tok_s(self) -> float:
        """Tokens per second while every stream was decoding: from the last stream's first token
        to the first stream's last, no prompt being prefilled in between (all of them are in),
        so this is the batched decode step's rate as the clients see it."""
        ok = [s for s in self.streams if s.error is None and s.gaps]
        if len(ok) < 2:
            return float("nan")
        start, end = max(s.first for s in ok), min(s.last for s in ok)
        if end <= start:
            return float("nan")
        times = np.concatenate([s.first + np.cumsum([0.0] + s.gaps) for s in ok])
        return float(((times > start) & (times <= end)).sum() / (end - start))

    @property
    def tok_s(self) -> float:
        return sum(s.tokens for s in self.streams if s.error is None) / self.wall


def prompts(n: int) -> list[str]:
    """Mixed lengths, about 40 to 400 tokens, cycling. Each starts with a number of its own, so
    that no two share more than the chat template's header: these scenarios measure batching,
    not prefix reuse (the turns scenario does)."""
    words = (TEXT * 12).split()
    tag = random.randrange(10**6)
    return [f"{tag + i}. " + " ".join(words[:[30, 90, 180, 300][i % 4]]) + "\nSummarise this." for i in range(n)]


def stop_ids(gguf: Path) -> list[int]:
    from gguf import GGUFReader
    fields = GGUFReader(gguf).fields
    keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")
    return sorted({int(fields[k].contents()) for k in keys if k in fields})


async def one(client, model: str, prompt: str, max_tokens: int, bias: dict, timeout: float,
              s: Stream | None = None) -> Stream:
    """One streamed chat request, its timings written into `s` as they come."""
    import openai
    s = s or Stream()
    t0 = last = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            stream = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
                temperature=0, logit_bias=bias, stream=True)
            async for chunk in stream:
                if not chunk.choices or not chunk.choices[0].delta.content:
                    continue
                now = time.perf_counter()
                if s.ttft is None:
                    s.ttft, s.first = now - t0, now
                else:
                    s.gaps.append(now - last)
                last = s.last = now
                s.tokens += 1
    except openai.APIStatusError as e:
        s.error, s.status = f"HTTP {e.status_code}", e.status_code
    except TimeoutError:
        s.error, s.status = "timeout (hung)", 0
    except Exception as e:  # noqa: BLE001  counted, not raised: the run goes on
        s.error, s.status = f"{type(e).__name__}: {e}", -1
    return s


def client(url: str, timeout: float = 600):
    import openai
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="bench", max_retries=0, timeout=timeout)


async def load(url: str, model: str, texts: list[str], max_tokens: int, bias: dict, label: str,
               timeout: float = 600) -> Run:
    """All `texts` at once, each a stream of `max_tokens`."""
    c = client(url, timeout)
    t0 = time.perf_counter()
    streams = await asyncio.gather(*(one(c, model, t, max_tokens, bias, timeout) for t in texts))
    run = Run(label, list(streams), time.perf_counter() - t0)
    await c.close()
    return run


async def join(url: str, text: str, others: list[str], max_tokens: int, bias: dict) -> float:
    """The TTFT of `text` sent once every one of `others` is streaming."""
    c = client(url)
    running = [Stream() for _ in others]
    tasks = [asyncio.create_task(one(c, "bench", t, max_tokens, bias, 600, s)) for t, s in zip(others, running)]
    while any(s.ttft is None and s.error is None for s in running):
        await asyncio.sleep(0.01)
    newcomer = await one(c, "bench", text, 8, bias, 600)
    if any(not t.done() for t in tasks):
        ttft = newcomer.ttft
    else:
        ttft = float("nan")  # the others ended first: not a join; --max-tokens is too small
    await asyncio.gather(*tasks)
    await c.close()
    return ttft


@contextmanager
def server(cmd: list[str], env: dict | None = None, port: int = 0):
    """A server process; yields (url, pid) once /v1/models answers 200 (llama-cpp-python's
    server has no /health); SIGTERM at the end. Its log goes to a file: a pipe nobody reads
    fills up and blocks a chatty server (llama.cpp logs the whole model at load)."""
    import httpx
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=log, stderr=log, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"{' '.join(cmd[1:4])} exited: {log.read()[-2000:]}")
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{cmd} did not start")
            time.sleep(0.5)
        yield url, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def inferno_cmd(args, port: int, threads: int | None = None, **extra) -> list[str]:
    cmd = [sys.executable, "-m", "inferno", "serve", "-m", str(args.model), "-b", args.backend,
           "--port", str(port), "--parallel", str(args.parallel), "--ctx-size", str(args.ctx_size),
           "--alias", "bench"]
    if threads or args.threads:
        cmd += ["--threads", str(threads or args.threads)]
    for k, v in extra.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    return cmd


def llama_cmd(args, port: int) -> list[str]:
    threads = str(args.threads or os.cpu_count())
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(args.model), "--port", str(port),
            "--host", "127.0.0.1", "--n_ctx", str(args.ctx_size), "--n_threads", threads,
            "--n_threads_batch", threads, "--interrupt_requests", "False", "--model_alias", "bench"]


def rss(pid: int) -> float:
    import psutil
    return psutil.Process(pid).memory_info().rss / 2**20


def scenario_load(args, bias):
    texts = prompts(args.clients)
    port = free_port()
    with server(inferno_cmd(args, port), port=port) as (url, _):
        asyncio.run(load(url, "bench", texts[:2], 8, bias, "warm-up"))
        solo = asyncio.run(load(url, "bench", texts[:1], args.max_tokens, bias, "inferno, 1 stream alone"))
        many = asyncio.run(load(url, "bench", texts, args.max_tokens, bias, f"inferno, {args.clients} streams"))
    print(solo.line())
    print(many.line())
    print(f"{'':<34} {many.tok_s / solo.tok_s:8.2f}x one stream alone, "
          f"decode {many.decode_tok_s / solo.decode_tok_s:.2f}x, "
          f"all decoding {many.steady_tok_s / solo.decode_tok_s:.2f}x its decode rate")
    if args.peer:
        port = free_port()
        with server(llama_cmd(args, port), port=port) as (url, _):
            asyncio.run(load(url, "bench", texts[:2], 8, bias, "warm-up"))
            peer = asyncio.run(load(url, "bench", texts, args.max_tokens, bias,
                                    f"llama-cpp-python, {args.clients} streams"))
        print(peer.line())
        print(f"{'':<34} {many.tok_s / peer.tok_s:8.2f}x llama-cpp-python's server, "
              f"decode {many.decode_tok_s / peer.decode_tok_s:.2f}x")


def scenario_join(args, bias):
    text = prompts(3)[2]  # ~180 words
    port = free_port()
    with server(inferno_cmd(args, port), port=port) as (url, _):
        asyncio.run(load(url, "bench", [text], 8, bias, "warm-up"))
        idle = [asyncio.run(load(url, "bench", [text], 8, bias, "idle")).streams[0].ttft for _ in range(3)]
        joined = [asyncio.run(join(url, text, prompts(7), args.max_tokens, bias)) for _ in range(3)]
    print(f"TTFT of a ~{len(text.split())}-word prompt: idle {np.median(idle) * 1e3:.0f} ms, joining 7 running "
          f"streams {np.median(joined) * 1e3:.0f} ms ({np.median(joined) / np.median(idle):.2f}x; medians of 3)")


def scenario_burst(args, bias):
    port = free_port()
    with server(inferno_cmd(args, port), port=port) as (url, pid):
        asyncio.run(load(url, "bench", prompts(2), 8, bias, "warm-up"))
        before = rss(pid)
        after = []
        for i in range(2):
            run = asyncio.run(load(url, "bench", prompts(100), 32, bias, f"burst {i + 1}", timeout=600))
            statuses = [s.status if s.error else 200 for s in run.streams]
            done, refused = statuses.count(200), statuses.count(429)
            after.append(rss(pid))
            print(f"burst {i + 1}: 100 clients, --parallel {args.parallel}: {done} completed, {refused} got 429, "
                  f"{100 - done - refused} other ({sorted({s.error for s in run.streams if s.error and s.status != 429})}); "
                  f"{run.wall:.1f} s")
    print(f"server RSS: {before:.0f} MiB before, {after[0]:.0f} after one burst, {after[1]:.0f} after two")


def scenario_itl(args, bias):
    texts = prompts(args.clients)
    rows = []
    for policy in ("passive", "active"):
        for threads in (1, 2):
            port = free_port()
            with server(inferno_cmd(args, port, threads=threads), env={"OMP_WAIT_POLICY": policy}, port=port) as (url, _):
                asyncio.run(load(url, "bench", texts[:2], 8, bias, "warm-up"))
                rows.append(asyncio.run(load(url, "bench", texts, args.max_tokens, bias,
                                             f"OMP_WAIT_POLICY={policy} --threads {threads}")))
            print(rows[-1].line())


def system_prompt(words: int = 1000) -> str:
    """An agent's long system prompt (about 1,300 SmolLM2 tokens at the default): instructions
    and a tool list, the same for every client."""
    tools = [f"- tool_{i}(query: string, limit: integer): looks up {w} records in the archive and "
             f"returns the matching rows as JSON, newest first." for i, w in
             enumerate("orders invoices shipments customers products suppliers refunds returns".split())]
    body = " ".join((TEXT * 20).split()[:words - 40 * len(tools) // 2])
    return "You are a careful assistant for a bakery's back office.\n" + "\n".join(tools) + "\n" + body


QUESTIONS = ["What does tool_0 return?", "Which tool finds refunds?", "Summarise the history in one line.",
             "Name two tools.", "What did people first do with grain?", "Which tool looks up suppliers?"]


async def conversation(c, model: str, system: str, client_no: int, turns: int, max_tokens: int,
                       bias: dict) -> list[dict]:
    """One client's chat: the whole history resent every turn. Per turn: TTFT, cached tokens."""
    messages = [{"role": "system", "content": system}]
    out = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"(client {client_no}) {QUESTIONS[(client_no + turn) % len(QUESTIONS)]}"})
        t0 = time.perf_counter()
        ttft, parts, usage = None, [], None
        stream = await c.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                                 temperature=0, logit_bias=bias, stream=True,
                                                 stream_options={"include_usage": True})
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if chunk.choices and chunk.choices[0].delta.content:
                ttft = ttft if ttft is not None else time.perf_counter() - t0
                parts.append(chunk.choices[0].delta.content)
        details = getattr(usage, "prompt_tokens_details", None) if usage else None
        out.append(dict(turn=turn, ttft=ttft, prompt=usage.prompt_tokens if usage else None,
                        cached=getattr(details, "cached_tokens", None) if details else None))
        messages.append({"role": "assistant", "content": "".join(parts)})
    return out


def own_prompt(client_no: int) -> str:
    """A system prompt as long as system_prompt's that shares nothing with another client's:
    each conversation's own document."""
    words = system_prompt().split(" ")
    random.Random(client_no).shuffle(words)
    return f"Document {client_no}: " + " ".join(words)


async def turns_run(url: str, clients: int, turns: int, max_tokens: int, bias: dict, shared: bool = True):
    c = client(url)
    t0 = time.perf_counter()
    results = await asyncio.gather(*(conversation(c, "bench", system_prompt() if shared else own_prompt(i), i,
                                                  turns, max_tokens, bias) for i in range(clients)))
    wall = time.perf_counter() - t0
    await c.close()
    return wall, [r for conv in results for r in conv]


async def newcomer(url: str, max_tokens: int, bias: dict) -> tuple[float, float]:
    """TTFT of a new client while another streams with the system prompt in its busy slot: with
    the same system prompt, and (cold) with one that shares nothing."""
    c = client(url)
    system = system_prompt()

    async def ask(sys_text, q, n):
        t0 = time.perf_counter()
        stream = await c.chat.completions.create(model="bench", max_tokens=n, temperature=0, logit_bias=bias,
                                                 stream=True, messages=[{"role": "system", "content": sys_text},
                                                                        {"role": "user", "content": q}])
        ttft = None
        async for chunk in stream:
            if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                ttft = time.perf_counter() - t0
        return ttft

    out = []
    words = system.split(" ")
    random.Random(0).shuffle(words)
    unrelated = "Note: " + " ".join(words)  # as long, and sharing no prefix
    for other in (system, unrelated):
        busy = asyncio.create_task(ask(system, "Describe every tool at length.", 400))
        await asyncio.sleep(3.0)  # its prompt is in and it is decoding
        out.append(await ask(other, "Which tool finds refunds?", 8))
        busy.cancel()
        await asyncio.sleep(0.5)
    await c.close()
    return out[0], out[1]


def llama_server_cmd(args, port: int, parallel: int, per_slot: int) -> list[str]:
    import shlex
    binary = subprocess.run(["bash", str(Path(__file__).parents[2] / "shared/bin/llama-server.sh")],
                            capture_output=True, text=True, check=True).stdout.strip()
    threads = str(args.threads or os.cpu_count())
    return shlex.split(f"{binary} -m {args.model} --port {port} --host 127.0.0.1 -t {threads} -tb {threads} "
                       f"--parallel {parallel} -c {parallel * per_slot} --alias bench --no-webui")


def turns_report(label: str, wall: float, rows: list[dict]) -> None:
    first = [r["ttft"] for r in rows if r["turn"] == 0]
    later = [r["ttft"] for r in rows if r["turn"] > 0]
    cached = sum(r["cached"] or 0 for r in rows)
    prompt = sum(r["prompt"] or 0 for r in rows)
    by_turn = " ".join(f"{np.median([r['ttft'] for r in rows if r['turn'] == t]) * 1e3:.0f}"
                       for t in sorted({r["turn"] for r in rows}))
    print(f"{label:<28} total {wall:6.1f} s  TTFT turn 1 median {np.median(first) * 1e3:6.0f} ms, "
          f"turns 2+ median {np.median(later) * 1e3:6.0f} ms ({np.median(later) / np.median(first):.2f}x turn 1); "
          f"by turn {by_turn} ms; cached {cached} of {prompt} prompt tokens")


def scenario_turns(args, bias):
    """4 clients x 5 turns, a shared ~1,300-token system prompt, the whole history resent every
    turn, against llama.cpp's own llama-server with the same --parallel (cache_prompt on, its
    default); then a newcomer sharing the system prompt held in a busy slot, against one that
    shares nothing."""
    clients, turns, n, per_slot = 4, 5, 48, 2048

    def measure(label, cmd, port):
        with server(cmd, port=port) as (url, _):
            asyncio.run(load(url, "bench", ["Hi"], 4, bias, "warm-up"))
            wall, rows = asyncio.run(turns_run(url, clients, turns, n, bias))
            turns_report(label, wall, rows)
            shared, cold = asyncio.run(newcomer(url, n, bias))
        print(f"{'':<28} newcomer beside a busy slot: shared system prompt {shared * 1e3:.0f} ms, "
              f"cold {cold * 1e3:.0f} ms ({shared / cold:.2f}x)")
        return wall, np.median([r["ttft"] for r in rows if r["turn"]])

    port = free_port()
    cmd = inferno_cmd(args, port)
    cmd[cmd.index("--parallel") + 1], cmd[cmd.index("--ctx-size") + 1] = str(clients), str(per_slot)
    ours = measure("inferno", cmd, port)
    if args.peer:
        port = free_port()
        peer = measure("llama-server", llama_server_cmd(args, port, clients, per_slot), port)
        print(f"{'':<28} inferno / llama-server: total {ours[0] / peer[0]:.2f}x, "
              f"TTFT turns 2+ {ours[1] / peer[1]:.2f}x")


def scenario_ray(args, bias):
    """The turns workload (4 clients x 5 turns, the history resent) on two Ray Serve replicas
    (one CPU each), Ray's default router against --router prefix, beside one replica (`inferno
    serve`, both cores) and one replica on one core (`--threads 1`: a Ray replica's share, so
    that the split of the cores and the routing show apart); each client's system prompt its own
    (`--shared-system`: one for all, which every replica's slots then hold). Rounds alternate
    the four servers."""
    clients, turns, n, per_slot = 4, 5, 48, 2048
    results: dict[str, list] = {}
    print(f"system prompts: {'one shared by every client' if args.shared_system else 'one per client, sharing nothing'}")
    for _ in range(args.rounds):
        for label, extra in (("one replica", []), ("one replica, one core", ["--threads", "1"]),
                             ("2 replicas, default router", ["--ray", "--replicas", "2"]),
                             ("2 replicas, prefix router", ["--ray", "--replicas", "2", "--router", "prefix"])):
            port = free_port()
            cmd = inferno_cmd(args, port) + extra
            cmd[cmd.index("--parallel") + 1], cmd[cmd.index("--ctx-size") + 1] = str(clients), str(per_slot)
            with server(cmd, port=port) as (url, _):
                asyncio.run(load(url, "bench", ["Hi"], 4, bias, "warm-up"))
                wall, rows = asyncio.run(turns_run(url, clients, turns, n, bias, shared=args.shared_system))
                turns_report(label, wall, rows)
            results.setdefault(label, []).append((wall, np.median([r["ttft"] for r in rows if r["turn"]])))
    one = np.median([t for _, t in results["one replica"]])
    for label, runs in results.items():
        print(f"{label:<28} median of {len(runs)}: total {np.median([w for w, _ in runs]):.1f} s, TTFT turns 2+ "
              f"{np.median([t for _, t in runs]) * 1e3:.0f} ms ({np.median([t for _, t in runs]) / one:.2f}x one replica's)")


SCENARIOS = {"load": scenario_load, "join": scenario_join, "burst": scenario_burst, "itl": scenario_itl,
             "turns": scenario_turns, "ray": scenario_ray}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", "-m", type=Path, default=DEFAULT_GGUF, help="a .gguf (the peer needs one)")
    p.add_argument("--backend", "-b", default="pool")
    p.add_argument("--threads", type=int, default=None, help="server threads (default: inferno's own)")
    p.add_argument("--parallel", type=int, default=8)
    p.add_argument("--ctx-size", type=int, default=1024)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--scenario", action="append", choices=list(SCENARIOS), help="default: all")
    p.add_argument("--no-peer", dest="peer", action="store_false", help="skip llama-cpp-python's server")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the ray scenario")
    p.add_argument("--shared-system", action="store_true", help="ray scenario: one system prompt for every client")
    args = p.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # each line as it is measured, into a file too
    import platform
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores; {args.model.name}, "
          f"{args.backend}, --parallel {args.parallel}, {args.clients} clients x {args.max_tokens} tokens")
    bias = {str(t): -100 for t in stop_ids(args.model)}
    for name in args.scenario or [s for s in SCENARIOS if s != "ray"]:
        SCENARIOS[name](args, bias)
    return 0


if __name__ == "__main__":
    sys.exit(main())
