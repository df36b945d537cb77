"""The server's batched decode step in process: one `model.step` over B sequences, each one
token after its own cached context, as the scheduler runs it (no HTTP, no sampling).

    python bench/batch_step.py                          # SmolLM2 on pool, B = 1, 2, 4, 8, 16
    python bench/batch_step.py -m gemma3-270m -B 1,8 --trace
    python bench/batch_step.py --check -B 1,4,8,16      # one sequence, B rows: a draft's check

`--check`: one sequence's step over B new rows with every row's logits, as speculative decoding
checks a draft of B - 1 tokens (rows against B = 1: what a drafted token costs).

Per B: the median step time over -r steps, tokens/s (B / step) and that rate against B = 1 in
the same run: what continuous batching can buy before the server adds its own costs.
`--trace` prints the op histogram of the last B's steps.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import inferno
from inferno.model.decoder import Segment


def step_ms(engine, B: int, *, check: bool, context: int, steps: int, rng, before=None) -> float:
    """The median of `steps` timed steps (after two untimed), ms: B sequences one token each
    after `context` cached tokens of their own, or (`check`) one sequence's B rows with every
    row's logits, each time at the same place (its rows overwrite the last check's). `before`
    is called between the prefill and the steps."""
    model, ops = engine.model, engine.ops
    vocab = engine.config.vocab_size
    slots = 1 if check else B
    cache = model.new_cache(context + (B if check else steps + 2), slots=slots)
    for s in range(slots):  # each slot's context, one prefill each
        model.step([Segment(rng.integers(0, vocab, context), s, 0, logits=False)], cache)
    if before is not None:
        before()
    times = []
    for k in range(steps + 2):
        if check:
            segs = [Segment(rng.integers(0, vocab, B), 0, context, every_row=True)]
        else:
            segs = [Segment(rng.integers(0, vocab, 1), s, context + k) for s in range(B)]
        t0 = time.perf_counter()
        ops.to_numpy(model.step(segs, cache))
        times.append(time.perf_counter() - t0)
    return float(np.median(times[2:])) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", default=None)
    p.add_argument("-b", "--backend", default="pool")
    p.add_argument("-B", "--batches", default="1,2,4,8,16")
    p.add_argument("-c", "--context", type=int, default=100, help="cached tokens per sequence")
    p.add_argument("-r", "--steps", type=int, default=20)
    p.add_argument("--trace", action="store_true")
    p.add_argument("--check", action="store_true", help="one sequence, B rows, every row's logits")
    p.add_argument("--int8", choices=("default", "on", "off"), default="default")
    args = p.parse_args()
    opts = {} if args.int8 == "default" else {"int8_activations": args.int8 == "on"}
    engine = inferno.load(args.model, backend=args.backend, progress=False, trace=args.trace, **opts)
    ops = engine.ops
    sizes = [int(b) for b in args.batches.split(",")]
    rng = np.random.default_rng(0)
    base = None
    print(f"{engine.source}, {args.backend}, {args.context} cached tokens per sequence")
    if args.check:
        print("|  rows | step ms | cost vs 1 row |\n| ---: | ---: | ---: |")
    else:
        print("|  B | step ms | tokens/s | vs B=1 |\n| ---: | ---: | ---: | ---: |")
    for B in sizes:
        ms = step_ms(engine, B, check=args.check, context=args.context, steps=args.steps, rng=rng,
                     before=ops.reset if args.trace else None)
        if args.check:
            base = base or ms
            print(f"| {B:2d} | {ms:7.2f} | {ms / base:5.2f}x |")
            continue
        rate = B / ms * 1e3
        base = base or rate
        print(f"| {B:2d} | {ms:7.2f} | {rate:8.1f} | {rate / base:5.2f}x |")
    if args.trace:
        print(ops.format_histogram())
    engine.close()


if __name__ == "__main__":
    main()
