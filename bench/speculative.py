"""Speculative decoding by prompt lookup against plain decoding, greedy, on grounded tasks and
free chat: decode tokens/s of each (medians of -r runs, alternating), their ratio, the drafted
and accepted tokens, and whether the text is the same (it must be).

    python bench/speculative.py                         # SmolLM2 on pool, drafts of up to 16
    python bench/speculative.py -m gemma3-270m -k 16 -r 5
    python bench/speculative.py --peer http://127.0.0.1:8392 --peer http://127.0.0.1:8393

`--peer URL` (repeatable): a llama-server on the same file, each started with the mode to
compare (plain; `--spec-type ngram-simple`, ...); its own decode rate (the response's
`timings.predicted_per_second`) on the same prompts, medians of -r requests.
"""

from __future__ import annotations

import argparse
import statistics

import inferno

PASSAGE = ("The Rhine is a river that begins in the Swiss Alps, flows through Germany and the Netherlands, "
           "and empties into the North Sea. It is about 1,230 kilometres long. Cities along the Rhine "
           "include Basel, Strasbourg, Cologne, Düsseldorf and Rotterdam. For centuries it has been one "
           "of the most important trade routes in Europe, carrying coal, grain and timber.")
CODE = ("def total_price(items, tax_rate):\n    subtotal = 0\n    for item in items:\n"
        "        subtotal += item.price * item.quantity\n    tax = subtotal * tax_rate\n"
        "    return subtotal + tax\n")
TASKS = {
    "quote": PASSAGE + "\n\nRepeat the text above word for word.",
    "summarise": PASSAGE + "\n\nSummarise the text above in two sentences.",
    "answer": PASSAGE + "\n\nWhich cities lie on the Rhine, and what did it carry? Answer from the text.",
    "edit code": CODE + "\nRename subtotal to net in this function and show the whole function.",
    "extract": PASSAGE + "\n\nGive the river's name, length and cities as a JSON object.",
    "free chat": "Write a short story about a fox who learns to swim.",
}


def peer_rate(url: str, prompt: str, max_tokens: int) -> float:
    import httpx
    r = httpx.post(f"{url}/v1/chat/completions", timeout=600, json={
        "messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": max_tokens})
    r.raise_for_status()
    return float(r.json()["timings"]["predicted_per_second"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", "-m", default=None)
    p.add_argument("--backend", "-b", default="pool")
    p.add_argument("--max-tokens", "-n", type=int, default=128)
    p.add_argument("--draft-max", "-k", type=int, default=16)
    p.add_argument("--repetitions", "-r", type=int, default=3)
    p.add_argument("--peer", action="append", default=[], metavar="URL")
    args = p.parse_args(argv)
    engine = inferno.load(args.model, backend=args.backend, progress=False)
    common = dict(max_tokens=args.max_tokens, temperature=0)
    head = f"| task | tokens | plain tok/s | ngram tok/s | ratio | accepted / drafted | same text |"
    head += "".join(f" peer {i + 1} tok/s |" for i in range(len(args.peer)))
    print(head)
    print("|" + "---|" * (7 + len(args.peer)))
    for name, prompt in TASKS.items():
        engine.generate(prompt, **common, speculative=args.draft_max)  # warm both paths
        plain, fast = [], []
        for _ in range(args.repetitions):
            a = engine.generate(prompt, **common)
            b = engine.generate(prompt, **common, speculative=args.draft_max)
            plain.append(a.decode_tokens_per_s)
            fast.append(b.decode_tokens_per_s)
        same = "yes" if a.text == b.text else "NO"
        mp, mf = statistics.median(plain), statistics.median(fast)
        row = (f"| {name} | {len(b.token_ids)} | {mp:.1f} | {mf:.1f} | {mf / mp:.2f}x | "
               f"{b.accepted_tokens} / {b.drafted_tokens} | {same} |")
        for url in args.peer:
            rates = [peer_rate(url, prompt, args.max_tokens) for _ in range(args.repetitions)]
            row += f" {statistics.median(rates):.1f} |"
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
