"""Prefill and decode tokens/s of one GGUF on pool with the legacy kinds' activations (Q8_0, Q4_0,
Q4_1, Q5_0, Q5_1) as float32 and as int16 (ldot.py's decode, lgemm.py's prefill panels),
interleaved in one process (so a noisy host moves both alike):

    python bench/legacy_modes.py ~/.cache/inferno/bench/SmolLM2-135M-Instruct.Q8_0.gguf -r 8

Each round prefills a -p-token prompt into an empty cache and decodes -n tokens after a one-token
prompt, once per mode, the order of the modes alternating between rounds; the table holds
medians over rounds. float32 is what the backends chose for these kinds on AVX-512 machines
before lgemm.py (the float kernels and sgemm).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import inferno


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("-r", "--rounds", type=int, default=4)
    p.add_argument("-n", "--tokens", type=int, default=48)
    p.add_argument("-p", "--prompt", type=int, default=512)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    options = {} if args.threads is None else {"threads": args.threads}
    engine = inferno.load(args.model, backend="pool", progress=False, **options)
    model, ops = engine.model, engine.ops
    ids = [int(i) for i in np.random.default_rng(0).integers(100, 1000, args.prompt)]

    def prefill() -> float:
        cache = model.new_cache(args.prompt)
        t0 = time.perf_counter()
        model.forward(ids, cache, last_only=True)
        return args.prompt / (time.perf_counter() - t0)

    def decode() -> float:
        cache = model.new_cache(args.tokens + 1)
        model.forward([1], cache, last_only=True)
        t0 = time.perf_counter()
        for i in range(args.tokens):
            model.forward([100 + i], cache, last_only=True)
        return args.tokens / (time.perf_counter() - t0)

    modes = {"float32": False, "int16": True}
    rates = {m: ([], []) for m in modes}
    for r in range(args.rounds + 1):  # round 0 warms (and loads) each mode's kernels, untimed
        for m in (list(modes) if r % 2 else list(modes)[::-1]):
            ops.int16_legacy = modes[m]
            pp, tg = prefill(), decode()
            if r:
                rates[m][0].append(pp)
                rates[m][1].append(tg)
    print(f"{args.model}: pool, {getattr(ops, 'threads', '?')} threads, medians of {args.rounds} rounds")
    print(f"| mode | pp{args.prompt} tok/s | tg{args.tokens} tok/s |")
    print("| --- | ---: | ---: |")
    for m, (pp, tg) in rates.items():
        print(f"| {m} | {statistics.median(pp):.1f} | {statistics.median(tg):.1f} |")
    (fp, ft), (ip, it) = (map(statistics.median, rates[m]) for m in modes)
    print(f"| int16 / float32 | {ip / fp:.2f}x | {it / ft:.2f}x |")


if __name__ == "__main__":
    main()
