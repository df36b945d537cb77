"""A multi-turn agent loop through `inferno serve`, with and without speculative decoding (issue
45): end-to-end time of the loop, as the agent sees it over HTTP.

    python bench/agent_loop.py                      # SmolLM2 on pool, 6 turns, 3 rounds
    python bench/agent_loop.py -m gemma3-270m --text -r 5   # a base model: a transcript, /v1/completions

The agent resends its whole history every turn and asks for one line in a fixed tool-call
format (bench/speculative.py's "agent turns"), greedy, through the official `openai` client.
Each round runs the loop three times on one server, the modes alternating: no drafts, prompt
lookup (`speculative`, the server's per-request field), and suffix drafts (`spec_type:
"suffix"`, which also draft from the server's earlier replies). A round asks about its own
rivers, so a suffix run meets replies of earlier rounds' loops (as a server meets other
agents'), never its own answers. Printed: each mode's median seconds per loop, the ratio to no
drafts, the drafted and accepted tokens (the usage's completion_tokens_details), and whether
the texts are identical (they must be, greedy).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from serve_load import free_port, server  # noqa: E402

RIVERS = ["Danube", "Loire", "Elbe", "Po", "Tagus", "Vistula", "Rhone", "Oder", "Douro", "Ebro", "Seine",
          "Thames", "Shannon", "Dnieper", "Volga", "Don", "Neva", "Drava", "Sava", "Tisza", "Mures",
          "Prut", "Inn", "Main"]
SYSTEM = ("You are an agent with one tool, lookup(name, fields). Answer each request with exactly one "
          "line that calls it, and nothing else.")
MODES = {"plain": {}, "ngram": {"speculative": 16, "spec_type": "ngram"},
         "suffix": {"speculative": 16, "spec_type": "suffix"}}


def loop(client, rivers: list[str], max_tokens: int, extra: dict, text_only: bool = False):
    """(seconds, replies, drafted, accepted) of one loop. `text_only`: a base model without a
    chat template, its history a plain transcript through /v1/completions."""
    history = [{"role": "system", "content": SYSTEM}]
    texts, drafted, accepted = [], 0, 0
    t0 = time.perf_counter()
    for r in rivers:
        history.append({"role": "user", "content": f"Look up the river {r}. Reply with one line: lookup(name=\"{r}\", "
                                                   "fields=[\"length\", \"country\", \"towns\"]) and nothing else."})
        if text_only:
            transcript = "".join(f"{m['role'].title()}: {m['content']}\n" for m in history) + "Assistant:"
            reply = client.completions.create(model="bench", prompt=transcript, temperature=0, max_tokens=max_tokens,
                                              stop=["\nUser:"], extra_body=extra)
            text = reply.choices[0].text
        else:
            reply = client.chat.completions.create(model="bench", messages=history, temperature=0,
                                                   max_tokens=max_tokens, extra_body=extra)
            text = reply.choices[0].message.content
        details = reply.usage.completion_tokens_details
        if details is not None:
            accepted += details.accepted_prediction_tokens or 0
            drafted += (details.accepted_prediction_tokens or 0) + (details.rejected_prediction_tokens or 0)
        history.append({"role": "assistant", "content": text})
        texts.append(text)
    return time.perf_counter() - t0, texts, drafted, accepted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", "-m", default="smollm2-135m")
    ap.add_argument("--backend", "-b", default="pool")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--rounds", "-r", type=int, default=3)
    ap.add_argument("--max-tokens", "-n", type=int, default=64)
    ap.add_argument("--text", action="store_true",
                    help="a base model (no chat template): the history as a transcript through /v1/completions")
    args = ap.parse_args()
    import openai
    port = free_port()
    cmd = [sys.executable, "-m", "inferno", "serve", "-m", args.model, "-b", args.backend, "--port", str(port),
           "--parallel", "2", "--ctx-size", "4096", "--alias", "bench", "--log-level", "warning"]
    seconds = {m: [] for m in MODES}
    counts = {m: [0, 0] for m in MODES}
    same = True
    with server(cmd, port=port) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        loop(client, ["Amazon", "Nile"], args.max_tokens, MODES["suffix"], args.text)  # warm every path
        for r in range(args.rounds):
            rivers = [RIVERS[(r * args.turns + i) % len(RIVERS)] for i in range(args.turns)]
            reference = None
            for mode, extra in MODES.items():
                s, texts, drafted, accepted = loop(client, rivers, args.max_tokens, extra, args.text)
                seconds[mode].append(s)
                counts[mode][0] += drafted
                counts[mode][1] += accepted
                if reference is None:
                    reference = texts
                same = same and texts == reference
                print(f"round {r + 1} {mode:<7} {s:6.2f} s  ({accepted} of {drafted} drafted tokens accepted)", flush=True)
    plain = statistics.median(seconds["plain"])
    print(f"| mode | s per loop of {args.turns} turns (median of {args.rounds}) | speed-up | accepted / drafted |")
    print("| --- | ---: | ---: | --- |")
    for mode in MODES:
        med = statistics.median(seconds[mode])
        print(f"| {mode} | {med:.2f} | {plain / med:.2f}x | {counts[mode][1]} / {counts[mode][0]} |")
    print(f"same text in every mode: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
