"""The quantized kernels' speed, type by type, against the float32 ones they replace.

    python bench/quant_matvec.py                    # every type; SmolLM2's files when present
    python bench/quant_matvec.py -t Q4_1,Q8_0 -r 5  # some types, more rounds

Tables (medians of -r rounds; variants interleaved within a round, wall-clock time):
- decode: the matvec (one activation row) on `simd` (one thread) and `pool` (two), in Gw/s
  (weights multiplied per second) and GB/s (the weight's own bytes read per second); F32 is
  today's float32 kernel on the same shape. "big" is one [8192, 4096] matrix (bigger than the
  caches); "smol" is SmolLM2-135M's seven matrices of a layer, 30 copies of each called in model
  order, so they stream from DRAM as a real decode step does; "1.7b" Qwen3-1.7B's, 4 copies.
  The `x` column says how the activations went in: f32, or int8 (qdot.py: the K-quants, where
  the machine has AVX2), or i16 (ldot.py: the legacy kinds, where float vectors are eight
  lanes); the backends' default where the machine has them. "panel": Q4_K repacked into panels
  of eight rows (kpanels.py, int8 activations), as the backends keep a linear weight.
- few rows: 2..16 activation rows (the server's batched decode step) on one thread, f32 and int8
  activations; Gw/s counts weights x rows, "reads" how many times faster than one matvec per
  row (in the same mode) that is.
- prefill: 512 activation rows on one thread, GFLOP/s against float32 sgemm on the same shape.
- panels (`--only panels`, not by default): the K-quants' two int8 kernels for several rows,
  qgemm's panels against qdot.k_few, by width, rows and remainder row: where the one overtakes
  the other on this machine (dispatch.GEMM_MIN, GEMM_MIN_COLS).
- files: each SmolLM2 GGUF's own tensors (read in place with gguf's GGUFReader) run as one
  decode step's linears in model order, q/k/v and gate/up fused (linear_many), on pool with two
  threads; the sum estimates the matvec part of a token. The rest of a token (norms, RoPE,
  attention, dispatch) cost about 0.9 ms on SmolLM2 (facts/quantized-matvec.md). Where the
  legacy kinds can take int16 activations (ldot.py), each file runs both ways ("legacy x").

Random weights: every byte random except finite float16 scales (tests/qblocks.py).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numba as nb
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from qblocks import random_blocks  # noqa: E402

from inferno.backends.numba import ldot, qkernels as Q  # noqa: E402
from inferno.backends.numba.codes import WeightKind  # noqa: E402
from inferno.backends.numba.ilanes import fast_int_dot  # noqa: E402
from inferno.backends.numba.kpanels import PanelTensor  # noqa: E402
from inferno.backends.numba.pool import PoolBackend  # noqa: E402
from inferno.formats.quant import QTYPES, QuantTensor  # noqa: E402
from inferno.backends.numba.simd import SimdBackend  # noqa: E402

SMOL_LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
QWEN_1_7B_LAYER = [(2048, 2048), (1024, 2048), (1024, 2048), (2048, 2048), (6144, 2048), (6144, 2048),
                   (2048, 6144)]
FILES = [Path.home() / ".cache/inferno/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf",
         Path.home() / ".cache/inferno/bench/SmolLM2-135M-Instruct.Q8_0.gguf",
         Path.home() / ".cache/inferno/bench/SmolLM2-135M-Instruct.Q4_K_M.gguf"]


def machine() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    except OSError:
        return "?"
    info = {k.strip(): v.strip() for k, v in (ln.split(":", 1) for ln in lines if ":" in ln)}
    simd = [f for f in ("avx512f", "avx512_vnni", "avx2", "f16c") if f in info.get("Flags", "").split()]
    return f"{info.get('Model name', '?')}, {info.get('CPU(s)', '?')} CPUs, {' '.join(simd)}"


CLOCK = {"wall": time.perf_counter, "cpu": time.thread_time}
clock = time.perf_counter


def rounds(fns: dict, reps: int, one_thread: bool = False) -> dict:
    """name -> median seconds of fn(), the functions interleaved round by round. One-thread
    tables use `clock` (--clock cpu: this thread's CPU time, which a busy machine's other
    processes do not inflate); the pool's are always wall-clock."""
    tick = clock if one_thread else time.perf_counter
    for fn in fns.values():
        fn()  # compile and warm
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = tick()
            fn()
            times[name].append(tick() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def weights(name: str, shapes, copies: int):
    """copies x shapes of random weights of type `name` (float32 arrays for F32); the K-quants
    take only the shapes whose rows are whole 256-weight blocks (SmolLM2: ffn_down's)."""
    block = QTYPES[name].block if name in QTYPES else 1
    out = []
    for c in range(copies):
        for i, (rows, cols) in enumerate(s for s in shapes if s[1] % block == 0):
            q = random_blocks("Q8_0" if name == "F32" else name, rows, cols, seed=c * 16 + i,
                              readonly=True)
            out.append(q.dequantize() if name == "F32" else q)
    return out


def x_types(name: str) -> tuple[str, ...]:
    """How a product of this type can take its activations here: always f32; int8 for the
    K-quants where the machine has AVX2 (qdot.py); int16 for the legacy kinds where float
    vectors are eight lanes (ldot.py). The backends take the second by default."""
    if name in WeightKind.__members__ and fast_int_dot():
        kind = int(WeightKind[name])
        if Q.int_dot(kind):
            return "f32", "int8"
        if ldot.legacy(kind) and ldot.eight_lane_floats():
            return "f32", "i16"
    return ("f32",)


def decode_table(types, reps):
    simd, pool = SimdBackend(), PoolBackend(threads=2)
    print("\ndecode (one activation row): Gw/s and GB/s of the weight's bytes")
    print(f"{'type':<6} {'x':<4} {'shape':<6} {'simd Gw/s':>10} {'GB/s':>6} {'pool-2 Gw/s':>12} {'GB/s':>6}")
    shape_sets = (("big", [(8192, 4096)], 1), ("smol", SMOL_LAYER, 30), ("1.7b", QWEN_1_7B_LAYER, 4))
    for shape_name, shapes, copies in shape_sets:
        for name in ["F32"] + types:
            ws = weights(name, shapes, copies)
            if not ws:
                continue
            xs = {cols: np.random.default_rng(1).standard_normal((1, cols), dtype=np.float32)
                  for _, cols in shapes}
            kept = {be.name: [be.weight(w) for w in ws] for be in (simd, pool)}
            panelled = {be.name: [be.linear_weight(w) for w in ws] for be in (simd, pool)}
            # Q4_K as the backends keep a linear weight by default: in panels (kpanels.py)
            extra = ("panel",) if any(isinstance(w, PanelTensor) for w in panelled["simd"]) else ()
            for x_type in x_types(name) + extra:
                prepared = panelled if x_type == "panel" else kept
                run = {be.name: (lambda be=be, ps=prepared: [be.linear(xs[w.shape[1]], w) for w in ps[be.name]])
                       for be in (simd, pool)}
                simd.int8_activations = pool.int8_activations = x_type != "f32"
                t = rounds({"simd": run["simd"]}, reps, one_thread=True) | rounds({"pool": run["pool"]}, reps)
                n = sum(w.shape[0] * w.shape[1] for w in ws)
                b = sum(w.nbytes for w in ws)
                print(f"{name:<6} {x_type:<4} {shape_name:<6} {n / t['simd'] / 1e9:>10.2f} "
                      f"{b / t['simd'] / 1e9:>6.1f} {n / t['pool'] / 1e9:>12.2f} {b / t['pool'] / 1e9:>6.1f}",
                      flush=True)
    simd.close()
    pool.close()


def few_table(types, reps):
    simd = SimdBackend()
    sizes = (2, 4, 8, 16)
    print("\nfew rows, one thread: Gw/s (weights x rows); reads = that over one matvec per row")
    print(f"{'type':<6} {'x':<4} " + " ".join(f"{'B=' + str(b):>8} {'reads':>6}" for b in sizes))
    for name in ["F32"] + types:
        ws = [simd.weight(w) for w in weights(name, SMOL_LAYER, 10)]
        for x_type in x_types(name):
            simd.int8_activations = x_type != "f32"
            fns = {}
            for B in (1,) + sizes:
                xs = {c: np.random.default_rng(B).standard_normal((B, c), dtype=np.float32) for c in (576, 1536)}
                fns[B] = lambda xs=xs: [simd.linear(xs[w.shape[1]], w) for w in ws]
            t = rounds(fns, reps, one_thread=True)
            n = sum(w.shape[0] * w.shape[1] for w in ws)
            cells = [f"{B * n / t[B] / 1e9:>8.1f} {t[1] * B / t[B]:>6.2f}" for B in sizes]
            print(f"{name:<6} {x_type:<4} " + " ".join(cells), flush=True)
    simd.close()


def prefill_table(types, reps, rows=512):
    simd = SimdBackend()
    print(f"\nprefill, {rows} activation rows, one thread: GFLOP/s (2 x rows x weights per s)")
    print(f"{'type':<6} {'4096x4096':>10} {'576x1536':>10}")
    for name in ["F32"] + types:
        cells = []
        for shape in ((4096, 4096), (576, 1536)):
            w = simd.weight(weights(name, [shape], 1)[0])
            x = np.random.default_rng(0).standard_normal((rows, shape[1]), dtype=np.float32)
            t = rounds({"q": lambda: simd.linear(x, w)}, reps, one_thread=True)["q"]
            cells.append(f"{2 * rows * shape[0] * shape[1] / t / 1e9:>10.1f}")
        print(f"{name:<6} " + " ".join(cells), flush=True)
    simd.close()


def panels_table(types, reps):
    """qgemm.k_gemm (the panels) against qdot.k_few on the same int8 rows, called directly, so
    dispatch.GEMM_MIN and GEMM_MIN_COLS can be read off this machine."""
    from inferno.backends.numba import qdot, qgemm
    simd = SimdBackend()  # first: the process set up as a model run has it (simd.py: BLAS, malloc)
    kinds = {"Q4_K": qdot.Q4_K_BYTES, "Q5_K": qdot.Q5_K_BYTES, "Q6_K": qdot.Q6_K_BYTES}
    print(f"\npanels (qgemm.k_gemm) against qdot.k_few, one thread, 1024 weight rows: GOP/s "
          f"(2 x rows x weights per s); remainder: the outliers' second int8 row (qgemm.WIDE: {qgemm.WIDE})")
    print(f"{'type':<6} {'cols':>5} {'remainder':<9} {'rows':>5} {'k_few':>7} {'panels':>7} {'ratio':>6}")
    for name in [t for t in types if t in kinds]:
        ub = kinds[name]

        @nb.njit(nogil=True)
        def few(w, xq, out):
            qdot.k_few(ub, w, xq[0], xq[1], xq[2], xq[3], xq[4], out, 0, w.shape[0])

        @nb.njit(nogil=True)
        def gemm(w, xq, out):
            qgemm.k_gemm(ub, w, xq[0], xq[1], xq[2], xq[3], xq[4], out, 0, w.shape[0])

        for cols in (768, 2048, 6144):
            w = random_blocks(name, 1024, cols, seed=0).data
            for two in (False, True):
                for B in (8, 12, 16, 17, 21, 32, 64, 512):  # from qgemm.GEMM_ROWS_MIN
                    x = np.random.default_rng(B).standard_normal((B, cols), dtype=np.float32)
                    xq, out = qdot.quantize(x, two), np.empty((B, 1024), np.float32)
                    t = rounds({"few": lambda: few(w, xq, out), "gemm": lambda: gemm(w, xq, out)},
                               reps, one_thread=True)
                    ops = 2 * B * 1024 * cols / 1e9
                    print(f"{name:<6} {cols:>5} {'yes' if two else 'no':<9} {B:>5} {ops / t['few']:>7.1f} "
                          f"{ops / t['gemm']:>7.1f} {t['few'] / t['gemm']:>6.2f}", flush=True)
    simd.close()


def file_tensors(path: Path) -> dict:
    """GGUF name -> QuantTensor (or float32 array) viewing the file in place."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    out = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))  # numpy order: [rows, cols]
        if t.tensor_type.name in QTYPES:
            out[t.name] = QuantTensor(t.tensor_type.name, shape, t.data)
        else:
            out[t.name] = np.asarray(t.data, dtype=np.float32).reshape(shape)
    return out


def decode_step(tensors: dict) -> list[tuple[str, list[str]]]:
    """One decode step's linears in model order: (input width, the GGUF names it multiplies)."""
    layers = sorted({int(n.split(".")[1]) for n in tensors if n.startswith("blk.")})
    steps = []
    for i in layers:
        p = f"blk.{i}."
        steps += [("hidden", [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"]),
                  ("hidden", [p + "attn_output.weight"]),
                  ("hidden", [p + "ffn_gate.weight", p + "ffn_up.weight"]),
                  ("inter", [p + "ffn_down.weight"])]
    return steps + [("hidden", ["output.weight" if "output.weight" in tensors else "token_embd.weight"])]


def files_table(reps):
    present = [p for p in FILES if p.exists()]
    if not present:
        return
    print("\nSmolLM2 files: one decode step's linears, q/k/v and gate/up fused, on pool (2 threads)"
          " and simd (1 thread); est. tok/s adds 0.9 ms for the rest of a token")
    print(f"{'file':<36} {'types':<26} {'legacy x':<8} {'MB/token':>8} {'pool ms':>8} {'simd ms':>8} {'est. tok/s':>10}")
    pool, simd = PoolBackend(threads=2), SimdBackend()
    for path, legacy_x in [(p, x) for p in present for x in (("f32", "i16") if ldot.eight_lane_floats() else ("f32",))]:
        pool.int16_legacy = simd.int16_legacy = legacy_x == "i16"
        tensors = file_tensors(path)
        steps = decode_step(tensors)
        x = {"hidden": np.random.default_rng(0).standard_normal((1, 576), dtype=np.float32),
             "inter": np.random.default_rng(1).standard_normal((1, 1536), dtype=np.float32)}
        fns = {}
        for be in (pool, simd):
            calls = [(x[width], [be.weight(tensors[n]) for n in names]) for width, names in steps]
            fns[be.name] = lambda be=be, calls=calls: [be.linear_many(xi, ws) for xi, ws in calls]
        total = sum(pool.weight_nbytes(tensors[n]) for _, names in steps for n in names)
        times = rounds({"pool": fns["pool"]}, reps) | rounds({"simd": fns["simd"]}, reps, one_thread=True)
        types = sorted({tensors[n].qtype.name for _, names in steps for n in names})
        print(f"{path.name:<36} {','.join(types):<26} {legacy_x:<8} {total / 1e6:>8.1f} {times['pool'] * 1e3:>8.2f} "
              f"{times['simd'] * 1e3:>8.2f} {1.0 / (times['pool'] + 0.9e-3):>10.0f}", flush=True)
    pool.close()
    simd.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-t", "--types", default=",".join(QTYPES), help="comma-separated types")
    parser.add_argument("-r", "--rounds", type=int, default=5, help="timed rounds per variant")
    parser.add_argument("--only", default="decode,few,prefill,files", help="which tables (and panels: k_gemm against k_few)")
    parser.add_argument("--clock", choices=CLOCK, default="wall",
                        help="one-thread timings: wall-clock, or this thread's CPU time (a shared machine)")
    args = parser.parse_args(argv)
    global clock
    clock = CLOCK[args.clock]
    types = [t for t in args.types.split(",") if t]
    unknown = [t for t in types if t not in QTYPES]
    if unknown:
        parser.error(f"unknown types {unknown}; known: {', '.join(QTYPES)}")
    print(f"machine: {machine()}; one-thread timings: {args.clock} clock")
    tables = args.only.split(",")
    if "decode" in tables:
        decode_table(types, args.rounds)
    if "few" in tables:
        few_table(types, args.rounds)
    if "prefill" in tables:
        prefill_table(types, args.rounds)
    if "files" in tables:
        files_table(args.rounds)
    if "panels" in tables:
        panels_table(types, args.rounds)


if __name__ == "__main__":
    main()
