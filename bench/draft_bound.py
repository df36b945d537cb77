"""What prompt lookup can buy on bench/speculative.py's tasks, and how close a drafter comes:
each task's greedy reply is recorded once (plain decoding; a check of a draft gives the same
tokens, so the reply fixes which drafted tokens any drafter would have had accepted), a check's
cost by its rows is measured on this machine (bench/batch_step.py --check's step, against one
row), and the drafters are replayed over the replies, step by step as the scheduler runs them:

    python bench/draft_bound.py                 # SmolLM2 on pool, drafts of up to 16
    python bench/draft_bound.py -m gemma3-270m

Columns, each a modelled decode-rate ratio against plain decoding (the tokens over the checks'
summed cost, a one-row step costing 1; drafting itself and sampling cost nothing here):
`drafter`, inferno's NgramDrafter; `cut` and `cut, n = 1`, a drafter that proposes the lookup's
continuation cut to exactly the tokens the model will accept (it knows the reply), matching
2-3 tokens as NgramDrafter does and also single tokens: no lookup drafter gets more than these
from the same matches. Then the lookups' hit rates by the context they share with the
sequence's end, what draft.EARNED reads.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import inferno
from inferno import draft

sys.path.insert(0, str(Path(__file__).parent))
from batch_step import step_ms  # noqa: E402
from speculative import TASKS  # noqa: E402


def check_costs(engine, rows: list[int], steps: int = 40, context: int = 100) -> dict[int, float]:
    """A check of r rows (one sequence, every row's logits) against one row's step, medians."""
    rng = np.random.default_rng(0)
    ms = {r: step_ms(engine, r, check=True, context=context, steps=steps, rng=rng) for r in rows}
    return {r: t / ms[rows[0]] for r, t in ms.items()}


class Cut:
    """The lookup's continuation (NGRAM_MIN = n_min) cut to what the model will accept."""

    def __init__(self, most: int, reply_of, n_min: int):
        self.most, self.reply_of, self.n_min = most, reply_of, n_min

    def propose(self, tokens: list[int], room: int) -> list[int]:
        full = self.reply_of(tokens)
        guess = draft.ngram_draft(tokens, min(self.most, room), n_min=self.n_min)
        n = 0
        while n < len(guess) and len(tokens) + n < len(full) and guess[n] == full[len(tokens) + n]:
            n += 1
        return guess[:n]

    def learn(self, drafted: int, accepted: int) -> None:
        pass


def replay(drafter, prompt: list[int], reply: list[int], cost, max_tokens: int) -> tuple[float, int, int]:
    """(modelled ratio to plain decoding, accepted, drafted) of a drafter over one reply. The
    first token is the prefill's; each step checks a draft and takes the accepted tokens and
    the model's own next one, until the reply (its end token included) is taken."""
    t, spent, accepted, drafted = 1, 0.0, 0, 0
    while t < len(reply):
        room = max_tokens - t - 1
        guess = drafter.propose(prompt + reply[:t], room) if room >= 1 else []
        n = 0
        while n < len(guess) and t + n < len(reply) and guess[n] == reply[t + n]:
            n += 1
        drafter.learn(len(guess), n)
        spent += cost(1 + len(guess))
        accepted, drafted = accepted + n, drafted + len(guess)
        t += n + 1
    return (len(reply) - 1) / spent, accepted, drafted


def hit_rates(replies: dict[str, tuple[list[int], list[int]]]) -> list[tuple[str, int, list[float]]]:
    """Over every decode position of every reply: the lookup's place and shared context
    (draft.ngram_place), and how many of its tokens the reply goes on with; by shared context,
    the share of lookups whose first 1, 2, 4, 8 tokens hold."""
    buckets = {"2": [], "3-8": [], "9+": []}
    for prompt, reply in replies.values():
        full = prompt + reply
        for t in range(1, len(reply)):
            tokens = full[:len(prompt) + t]
            start, shared = draft.ngram_place(tokens)
            if not start:
                continue
            n = 0
            while n < 8 and len(tokens) + n < len(full) and start + n < len(tokens) \
                    and tokens[start + n] == full[len(tokens) + n]:
                n += 1
            buckets["2" if shared == 2 else "3-8" if shared <= 8 else "9+"].append(n)
    return [(k, len(v), [sum(n >= j for n in v) / len(v) for j in (1, 2, 4, 8)]) for k, v in buckets.items() if v]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", default=None)
    p.add_argument("-b", "--backend", default="pool")
    p.add_argument("-n", "--max-tokens", type=int, default=128)
    p.add_argument("-k", "--draft-max", type=int, default=16)
    args = p.parse_args()
    engine = inferno.load(args.model, backend=args.backend, progress=False)
    rows = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 17]
    rel = check_costs(engine, rows)
    print(f"{engine.source}, {args.backend}: a check of r rows against one row's step")
    print("| rows | " + " | ".join(str(r) for r in rows) + " |\n|" + "---|" * (len(rows) + 1))
    print("| cost | " + " | ".join(f"{rel[r]:.2f}" for r in rows) + " |\n")

    def cost(r: int) -> float:
        return float(np.interp(r, rows, [rel[x] for x in rows]))

    replies = {}
    for name, prompt in TASKS.items():
        r = engine.generate(prompt, max_tokens=args.max_tokens, temperature=0)
        replies[name] = (engine.encode_prompt(prompt), list(r.token_ids))

    def reply_of(tokens):
        return next(p + r for p, r in replies.values() if tokens[:len(p)] == p)

    print("| task | tokens | drafter | accepted / drafted | cut | cut, n = 1 |\n|---|---|---|---|---|---|")
    for name, (prompt, reply) in replies.items():
        ours, acc, dr = replay(draft.NgramDrafter(args.draft_max), prompt, reply, cost, args.max_tokens)
        cut = replay(Cut(args.draft_max, reply_of, draft.NGRAM_MIN), prompt, reply, cost, args.max_tokens)[0]
        one = replay(Cut(args.draft_max, reply_of, 1), prompt, reply, cost, args.max_tokens)[0]
        print(f"| {name} | {len(reply)} | {ours:.2f}x | {acc} / {dr} | {cut:.2f}x | {one:.2f}x |")
    print("\n| shared context | lookups | first holds | 2 hold | 4 hold | 8 hold |\n|---|---|---|---|---|---|")
    for k, n, shares in hit_rates(replies):
        print(f"| {k} | {n} | " + " | ".join(f"{s:.2f}" for s in shares) + " |")
    engine.close()


if __name__ == "__main__":
    main()
