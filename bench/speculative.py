"""Speculative decoding by prompt lookup against plain decoding, greedy, on grounded tasks and
free chat: decode tokens/s of each (medians of -r runs, alternating), their ratio, the drafted
and accepted tokens, and whether the text is the same (it must be).

    python bench/speculative.py                         # SmolLM2 on pool, drafts of up to 16
    python bench/speculative.py -m gemma3-270m -k 16 -r 5
    python bench/speculative.py --peer http://127.0.0.1:8392 --peer http://127.0.0.1:8393
    python bench/speculative.py --series                # requests that repeat each other
    python bench/speculative.py --spec-type draft --model-draft smollm2-135m   # a draft model

`--series`: runs of requests that differ in their passage but not in their task (fields
extracted into the same JSON shape, an agent's turns that answer in one format with the
history resent), each run from an empty Replies: the run's decode tok/s with no drafts,
prompt lookup and suffix drafts (which also draft from the run's earlier replies).

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


FACTS = [("Danube", "Germany", 2850, "Vienna, Budapest and Belgrade"),
         ("Loire", "France", 1006, "Orleans, Tours and Nantes"),
         ("Elbe", "Czechia", 1094, "Dresden, Magdeburg and Hamburg"),
         ("Po", "Italy", 652, "Turin, Piacenza and Cremona"),
         ("Tagus", "Spain", 1007, "Toledo, Aranjuez and Lisbon"),
         ("Vistula", "Poland", 1047, "Krakow, Warsaw and Gdansk")]
SERIES = {
    "extract x6": [f"The {r} is a river that rises in {c}. It is {n} kilometres long and passes {t}.\n\n"
                   "Give the river's name, country, length in kilometres and towns as a JSON object with "
                   "the keys name, country, length_km and towns." for r, c, n, t in FACTS],
    "agent turns x6": [f"Look up the river {r}. Reply with one line: lookup(name=\"{r}\", fields=[\"length\", "
                       "\"country\", \"towns\"]) and nothing else." for r, *_ in FACTS],
}


def run_series(engine, prompts: list[str], multi_turn: bool, **options):
    """One run of a series from an empty Replies: (decode tok/s over the run, accepted,
    drafted, the texts). An agent's turns resend the history: each prompt follows the run's
    earlier turns and replies."""
    from inferno.draft import Replies
    engine.replies = Replies()
    history, texts, tokens, seconds, accepted, drafted = [], [], 0, 0.0, 0, 0
    for prompt in prompts:
        history.append({"role": "user", "content": prompt})
        r = engine.generate(history if multi_turn else prompt, **options)
        history.append({"role": "assistant", "content": r.text})
        texts.append(r.text)
        tokens += len(r.token_ids) - 1  # decode rate: the first token is the prompt's
        seconds += (len(r.token_ids) - 1) / r.decode_tokens_per_s if r.decode_tokens_per_s else 0.0
        accepted, drafted = accepted + r.accepted_tokens, drafted + r.drafted_tokens
    return tokens / seconds, accepted, drafted, texts


def series(engine, args) -> None:
    common = dict(max_tokens=args.max_tokens, temperature=0)
    modes = {"plain": {}, "ngram": dict(speculative=args.draft_max),
             "suffix": dict(speculative=args.draft_max, spec_type="suffix")}
    print("| series | plain tok/s | ngram tok/s | suffix tok/s | suffix / plain | suffix / ngram | "
          "accepted / drafted (suffix) | same text |")
    print("|" + "---|" * 8)
    for name, prompts in SERIES.items():
        multi = name.startswith("agent")
        run_series(engine, prompts[:2], multi, **common, **modes["suffix"])  # warm every path
        rates, same = {m: [] for m in modes}, "yes"
        for _ in range(args.repetitions):
            for m, opts in modes.items():
                rate, acc, dr, texts = run_series(engine, prompts, multi, **common, **opts)
                rates[m].append(rate)
                if m == "plain":
                    reference = texts
                elif texts != reference:
                    same = "NO"
        med = {m: statistics.median(v) for m, v in rates.items()}
        print(f"| {name} | {med['plain']:.1f} | {med['ngram']:.1f} | {med['suffix']:.1f} | "
              f"{med['suffix'] / med['plain']:.2f}x | {med['suffix'] / med['ngram']:.2f}x | {acc} / {dr} | {same} |",
              flush=True)


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
    p.add_argument("--series", action="store_true", help="requests that repeat each other (see above)")
    p.add_argument("--spec-type", default="ngram", choices=("ngram", "suffix", "draft"),
                   help="the drafts the table compares with plain decoding")
    p.add_argument("--model-draft", default=None, help="the draft model (--spec-type draft)")
    args = p.parse_args(argv)
    engine = inferno.load(args.model, backend=args.backend, progress=False, draft=args.model_draft)
    if args.series:
        series(engine, args)
        return 0
    common = dict(max_tokens=args.max_tokens, temperature=0)
    spec = dict(speculative=args.draft_max, spec_type=args.spec_type)
    head = f"| task | tokens | plain tok/s | {args.spec_type} tok/s | ratio | accepted / drafted | same text |"
    head += "".join(f" peer {i + 1} tok/s |" for i in range(len(args.peer)))
    print(head)
    print("|" + "---|" * (7 + len(args.peer)))
    for name, prompt in TASKS.items():
        engine.generate(prompt, **common, **spec)  # warm both paths
        plain, fast = [], []
        for _ in range(args.repetitions):
            a = engine.generate(prompt, **common)
            b = engine.generate(prompt, **common, **spec)
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
