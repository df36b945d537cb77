"""Flash attention against materialized scores on the same backend, at the article's prompts;
and, op by op on random tensors, sliding-window against full causal prefill, and decode
attention by KV cache type.

    python bench/make_qwen3_shape.py            # once: the Qwen3-0.6B-shaped model
    python bench/attention.py                   # pool and simd, prompts of 511 and 2044 tokens
    python bench/attention.py --mode window     # pool, 4096 tokens, W=512 vs full causal
    python bench/attention.py --mode decode     # pool, SmolLM2's shape at 4000 cached tokens

For each backend, flash on and off, and each prompt size: one warm-up prefill, then -r timed
prefills of a synthetic prompt into an empty cache, traced. The attention op's time is its line
in the trace histogram (flash_attention_prefill, or materialized_attention: per head q k^T,
scale, mask, softmax, @ v, all on the backend's own ops, so on pool its matmuls are BLAS split
across the threads and its mask and softmax are parallel too). The whole prefill is timed beside
it. Each backend x flash setting runs in its own spawned process.

`--mode window` times flash_attention_prefill alone (Gemma 3 270M's heads, 4 over 1 at head
dim 256, and Qwen3-0.6B's, 16 over 8 at 128) with a sliding window against full causal
attention on the same tensors; `--mode decode` times one decode step's decode_attention over
all layers (SmolLM2's 9 heads over 3, head dim 64, 30 layers: a cache bigger than the caches)
in each cache type (`--shape qwen3-1.7b` or gemma3-270m for theirs). Both alternate the variants round by round and report medians.
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
from inferno.backends import create_backend

# (name, n_heads, n_kv_heads, head_dim) for the op-level modes
WINDOW_SHAPES = [("gemma3-270m", 4, 1, 256), ("qwen3-0.6b", 16, 8, 128)]
# (name, n_heads, n_kv_heads, head_dim, layers) for --mode decode
DECODE_SHAPES = {"smollm2-135m": (9, 3, 64, 30), "qwen3-1.7b": (16, 8, 128, 28),
                 "gemma3-270m": (4, 1, 256, 18)}


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


def interleaved(variants: dict, rounds: int) -> dict:
    """Each variant once per round, in turn (after one warm-up call each): a machine whose speed
    drifts slows them all alike. Milliseconds per call, every round."""
    for fn in variants.values():
        fn()
    ms = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            fn()
            ms[name].append((time.perf_counter() - t0) * 1e3)
    return ms


def window_table(backends: list[str], tokens: int, window: int, rounds: int, threads) -> str:
    lines = [f"flash_attention_prefill, {tokens} tokens, causal: sliding window W={window} against "
             f"full attention (medians of {rounds} interleaved rounds)", "",
             "| backend | shape | heads | full ms | window ms | speed-up |",
             "| --- | --- | --- | ---: | ---: | ---: |"]
    rng = np.random.default_rng(0)
    for name in backends:
        ops = create_backend(name, **({"threads": threads} if name == "pool" and threads else {}))
        for shape, nh, nkv, hd in WINDOW_SHAPES:
            q = rng.standard_normal((tokens, nh * hd), dtype=np.float32)
            k, v = (rng.standard_normal((tokens, nkv * hd), dtype=np.float32) for _ in range(2))
            ms = interleaved({w: (lambda w=w: ops.flash_attention_prefill(q, k, v, nh, nkv, hd, True, w))
                              for w in (0, window)}, rounds)
            full, win = statistics.median(ms[0]), statistics.median(ms[window])
            lines.append(f"| {name} | {shape} | {nh}:{nkv}x{hd} | {full:.1f} | {win:.1f} | {full / win:.2f}x |")
        ops.close()
    return "\n".join(lines)


def decode_table(backends: list[str], kv_len: int, cache_types: list[str], rounds: int, threads,
                 shape: str = "smollm2-135m") -> str:
    nh, nkv, hd, layers = DECODE_SHAPES[shape]
    lines = [f"decode_attention, one step over {layers} layers, {shape} heads {nh}:{nkv}x{hd}, "
             f"{kv_len} cached tokens (medians of {rounds} interleaved rounds)", "",
             "| backend | cache | cache MB read | ms per step | GB/s | vs f32 |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, nh * hd), dtype=np.float32)
    for name in backends:
        ops = create_backend(name, **({"threads": threads} if name == "pool" and threads else {}))
        caches = {}
        for ct in cache_types:
            bufs = [[ops.kv_buffer(1, kv_len, nkv * hd, ct) for _ in range(layers)] for _ in "kv"]
            for buf in bufs[0] + bufs[1]:
                ops.write_kv(buf, 0, 0, rng.standard_normal((kv_len, nkv * hd), dtype=np.float32))
            caches[ct] = bufs

        def step(ct):
            ks, vs = caches[ct]
            for i in range(layers):
                ops.decode_attention(q, ks[i], vs[i], [0], [kv_len], nh, nkv, hd)

        ms = interleaved({ct: (lambda ct=ct: step(ct)) for ct in cache_types}, rounds)
        base = statistics.median(ms[cache_types[0]])
        for ct in cache_types:
            t = statistics.median(ms[ct])
            mb = sum(b.nbytes for b in caches[ct][0] + caches[ct][1]) / 1e6
            lines.append(f"| {name} | {ct} | {mb:.1f} | {t:.2f} | {mb / t:.1f} | {base / t:.2f}x |")
        ops.close()
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", "-m", default=str(DEFAULT_QWEN3_SHAPE),
                   help="model (make it with bench/make_qwen3_shape.py)")
    p.add_argument("--backend", "-b", help="comma list (default: pool,simd; pool for the op modes)")
    p.add_argument("--prompt-tokens", "-p", help="prompt sizes, comma list (default: 511,2044; "
                                                 "4096 for --mode window)")
    p.add_argument("--repetitions", "-r", type=int, default=3)
    p.add_argument("--threads", "-t", type=int, default=None, help="pool threads (default: the cores)")
    p.add_argument("--mode", choices=("prefill", "window", "decode"), default="prefill",
                   help="prefill: the model, flash vs materialized; window: the op, sliding window "
                        "vs full causal; decode: the op, by KV cache type")
    p.add_argument("--window", "-w", type=int, default=512, help="--mode window: the window")
    p.add_argument("--kv", type=int, default=4000, help="--mode decode: cached tokens")
    p.add_argument("--cache-types", default="f32,f16,bf16,q8_0", help="--mode decode: comma list")
    p.add_argument("--shape", choices=sorted(DECODE_SHAPES), default="smollm2-135m",
                   help="--mode decode: whose heads and layers")
    p.add_argument("--rounds", type=int, default=7, help="--mode window/decode: interleaved rounds")
    args = p.parse_args(argv)
    backends = bench.parse_names([args.backend or ("pool,simd" if args.mode == "prefill" else "pool")])
    sizes = bench.parse_sizes(args.prompt_tokens or ("4096" if args.mode == "window" else "511,2044"), "-p")
    if args.mode == "window":
        print(window_table(backends, sizes[0], args.window, args.rounds, args.threads))
        return 0
    if args.mode == "decode":
        print(decode_table(backends, args.kv, bench.parse_names([args.cache_types]), args.rounds,
                           args.threads, args.shape))
        return 0
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
