"""Flash attention against materialized scores on the same backend, at the article's prompts.

    python bench/make_qwen3_shape.py            # once: the Qwen3-0.6B-shaped model
    python bench/attention.py                   # pool and simd, prompts of 511 and 2044 tokens

For each backend, flash on and off, and each prompt size: one warm-up prefill, then -r timed
prefills of a synthetic prompt into an empty cache, traced. The attention op's time is its line
in the trace histogram (flash_attention_prefill, or materialized_attention: per head q k^T,
scale, mask, softmax, @ v, all on the backend's own ops, so on pool its matmuls are BLAS split
across the threads and its mask and softmax are parallel too). The whole prefill is timed beside
it. Each backend x flash setting runs in its own spawned process.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from make_qwen3_shape import DEFAULT_OUT as DEFAULT_QWEN3_SHAPE

from inferno import bench


def measure(model: str, backend: str, flash: bool, sizes: list[int], reps: int, threads) -> list[dict]:
    """In a fresh process: attention op ms and prefill ms for each prompt size."""
    from inferno.engine import load
    options = {"threads": threads} if backend == "pool" and threads else {}
    engine = load(model, backend=backend, flash=flash, trace=True, progress=False, **options)
    op = "flash_attention_prefill" if flash else "materialized_attention"
    ops, model_ = engine.ops, engine.model
    results = []
    for n in sizes:
        ids = bench.synthetic_prompt(engine.config.vocab_size, n)
        attention_ms, prefill_ms = [], []
        for rep in range(reps + 1):  # the first is the warm-up
            cache = model_.new_cache(n)
            ops.reset()
            t0 = time.perf_counter()
            np.argmax(ops.to_numpy(model_.forward(ids, cache, last_only=True))[0])
            elapsed = time.perf_counter() - t0
            calls = ops.calls[op]
            assert calls == engine.config.num_hidden_layers, f"{calls} calls to {op}, expected one per layer"
            if rep:
                attention_ms.append(ops.seconds[op] * 1e3)
                prefill_ms.append(elapsed * 1e3)
        print(f"attention: {backend} flash={'on' if flash else 'off'} {n} tokens: attention "
              f"{statistics.median(attention_ms):.0f} ms of {statistics.median(prefill_ms):.0f} ms",
              file=sys.stderr, flush=True)
        results.append(dict(backend=backend, threads=getattr(ops, "threads", None), flash=flash,
                            tokens=n, attention_ms=attention_ms, prefill_ms=prefill_ms))
    engine.close()
    return results


def _pm(xs) -> str:
    return f"{statistics.fmean(xs):.0f} ± {statistics.stdev(xs) if len(xs) > 1 else 0:.0f}"


def _median(rows, backend, flash, n, key):
    found = [r for r in rows if r["backend"] == backend and r["flash"] == flash and r["tokens"] == n]
    return statistics.median(found[0][key]) if found else None


def report(rows: list[dict], backends: list[str], sizes: list[int]) -> str:
    lines = ["| backend | threads | prompt | attention | attention op ms | prefill ms | attention share |",
             "| --- | ---: | ---: | --- | ---: | ---: | ---: |"]
    for r in rows:
        share = statistics.median(r["attention_ms"]) / statistics.median(r["prefill_ms"])
        lines.append(f"| {r['backend']} | {r['threads'] or '-'} | {r['tokens']} | "
                     f"{'flash' if r['flash'] else 'materialized'} | {_pm(r['attention_ms'])} | "
                     f"{_pm(r['prefill_ms'])} | {share:.0%} |")
    lines += ["", "| backend | prompt | attention op: flash vs materialized | whole prefill: flash vs materialized |",
              "| --- | ---: | ---: | ---: |"]
    for b in backends:
        for n in sizes:
            cells = []
            for key in ("attention_ms", "prefill_ms"):
                on, off = _median(rows, b, True, n, key), _median(rows, b, False, n, key)
                cells.append("n/a" if not (on and off) else f"{(on - off) / off:+.0%} ({off:.0f} -> {on:.0f} ms)")
            lines.append(f"| {b} | {n} | {cells[0]} | {cells[1]} |")
    if "pool" in backends and "simd" in backends:
        lines += ["", "| prompt | pool prefill speed-up over simd (flash on, medians) |", "| ---: | ---: |"]
        for n in sizes:
            pool, simd = _median(rows, "pool", True, n, "prefill_ms"), _median(rows, "simd", True, n, "prefill_ms")
            lines.append(f"| {n} | {simd / pool:.2f}x ({simd:.0f} -> {pool:.0f} ms) |" if pool and simd else f"| {n} | n/a |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", "-m", default=str(DEFAULT_QWEN3_SHAPE),
                   help="model (make it with bench/make_qwen3_shape.py)")
    p.add_argument("--backend", "-b", default="pool,simd", help="comma list")
    p.add_argument("--prompt-tokens", "-p", default="511,2044", help="prompt sizes, comma list")
    p.add_argument("--repetitions", "-r", type=int, default=3)
    p.add_argument("--threads", "-t", type=int, default=None, help="pool threads (default: the cores)")
    args = p.parse_args(argv)
    backends = bench.parse_names([args.backend])
    sizes = bench.parse_sizes(args.prompt_tokens, "-p")
    rows = []
    context = multiprocessing.get_context("spawn")
    for backend in backends:
        for flash in (True, False):
            with ProcessPoolExecutor(max_workers=1, mp_context=context) as ex:
                rows += ex.submit(measure, args.model, backend, flash, sizes, args.repetitions,
                                  args.threads).result()
    print(report(rows, backends, sizes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
