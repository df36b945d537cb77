"""This CPU's int8 dot-product peak on one core, as the integer kernels can reach it.

    python bench/int8_peak.py            # a table; --json for one JSON object

The ceiling a quantized GEMM is measured against (issue 20 asks for each kernel's fraction of
it). One Numba loop keeps 8 accumulators of eight int32 lanes busy with ilanes.dpbusd: 32 byte
products summed into int32 per instruction (VNNI's vpdpbusd where the CPU has AVX512-VNNI with
VL or AVX-VNNI; else AVX2's vpmaddubsw + vpmaddwd + vpaddd, what llama.cpp's AVX2 kernels run).
Without VNNI a second loop sums the same products as qgemm's kernels do there: vpmaddubsw's int16
pairs added in int16, widened by one vpmaddwd every eight (the ceiling of those kernels).
The weight bytes stream from a 4 KiB buffer (L1), four loads a pass serving eight products, as
a register-blocked tile does; the activation bytes sit in registers. A multiply-add counts two
operations, so the figures read as llama.cpp's "GFLOP/s" of a GEMM. Beside it: the float32 FMA
peak of lanes.vfma (16 lanes), the ceiling of the sgemm and float32 paths, and the int16 peak
(ilanes.dpwssd: 16 int16 products an instruction), the ceiling of lgemm's legacy-kind GEMM.

Each integer loop runs twice: in 256-bit vectors (ilanes' ymm types: decode's kernels) and in
512-bit ones (its zmm twins: qgemm's and lgemm's panels), one zmm register each with AVX-512,
two ymm halves elsewhere. A CPU with a full 512-bit datapath (Zen 5) does twice the products in
zmm; one that splits zmm instructions in two (Zen 4) about the same. The float32 loop uses
lanes' 16-lane vectors (one zmm register with AVX-512, two ymm with AVX2).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numba as nb  # noqa: E402
import numpy as np  # noqa: E402

from inferno.backends.numba import ilanes  # noqa: E402
from inferno.backends.numba.ilanes import (  # noqa: E402
    bload, dpbusd, dpwssd, fsum8, fzero8, hload, iadd, ifloat, ifma, izero, maddubs, maddwd, wadd, wzero,
    zbload, zhload, zizero, zwzero,
)
from inferno.backends.numba.lanes import vfma, vload, vsum, vzero  # noqa: E402

RING = 4096  # bytes of weights cycled through (in L1; more than 8 passes of 512-bit loads, so no pass repeats within a widening)
F32_MACS = 6 * 16  # 6 FMAs of 16 lanes


@nb.njit(inline="always")
def _total8(s):
    return fsum8(ifma(fzero8(), s, 1.0))


@nb.njit(inline="always")
def _total16(s):
    return vsum(ifloat(s))


def loops(bits: int) -> dict:
    """The integer loops in `bits`-bit vectors (256: ilanes' ymm types; 512: its zmm twins, one
    zmm register each with AVX-512, two ymm halves elsewhere), and the multiply-adds a pass of
    each (int8: 8 instructions of 32 or 64 byte products; int16: 16 or 32 pairs)."""
    wide = bits == 512
    vb = 64 if wide else 32  # bytes a vector
    bvec, hvec = (zbload, zhload) if wide else (bload, hload)
    zero, hzero = (zizero, zwzero) if wide else (izero, wzero)
    total = _total16 if wide else _total8

    def dot_loop(vec, dot):
        """8 `dot`s a pass: 4 weight vectors (loaded with `vec`) x 2 activation vectors (in
        registers); 8 accumulators, so that AVX2's 16 registers hold them with the operands.
        dpbusd: int8 products; dpwssd: int16 pairs (vpdpwssd with VNNI, else vpmaddwd + vpaddd),
        the ceiling of lgemm's panels, which multiply the legacy kinds with int16 activations."""
        @nb.njit(cache=False, nogil=True)
        def loop(w, x, passes, out):
            x0, x1 = vec(x, 0), vec(x, vb)
            a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = zero()
            o = 0
            for _ in range(passes):
                w0, w1, w2, w3 = vec(w, o), vec(w, o + vb), vec(w, o + 2 * vb), vec(w, o + 3 * vb)
                a0, a1 = dot(a0, w0, x0), dot(a1, w0, x1)
                a2, a3 = dot(a2, w1, x0), dot(a3, w1, x1)
                a4, a5 = dot(a4, w2, x0), dot(a5, w2, x1)
                a6, a7 = dot(a6, w3, x0), dot(a7, w3, x1)
                o = (o + 4 * vb) & (RING - 1)
            s = iadd(iadd(iadd(a0, a1), iadd(a2, a3)), iadd(iadd(a4, a5), iadd(a6, a7)))
            out[0] = total(s)
        return loop

    @nb.njit(cache=False, nogil=True)
    def wide_loop(w, x, passes, out):
        """The same products as int8_loop, summed as qgemm's kernels do without VNNI: maddubs'
        int16 pairs added in int16 (vpmaddubsw + vpaddw), widened by one vpmaddwd every 8 passes."""
        x0, x1 = bvec(x, 0), bvec(x, vb)
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = zero()
        o = 0
        for _ in range(passes // 8):
            h0 = h1 = h2 = h3 = h4 = h5 = h6 = h7 = hzero()
            for _ in range(8):
                w0, w1, w2, w3 = bvec(w, o), bvec(w, o + vb), bvec(w, o + 2 * vb), bvec(w, o + 3 * vb)
                h0, h1 = wadd(h0, maddubs(w0, x0)), wadd(h1, maddubs(w0, x1))
                h2, h3 = wadd(h2, maddubs(w1, x0)), wadd(h3, maddubs(w1, x1))
                h4, h5 = wadd(h4, maddubs(w2, x0)), wadd(h5, maddubs(w2, x1))
                h6, h7 = wadd(h6, maddubs(w3, x0)), wadd(h7, maddubs(w3, x1))
                o = (o + 4 * vb) & (RING - 1)
            a0, a1, a2, a3 = iadd(a0, maddwd(h0, h0)), iadd(a1, maddwd(h1, h1)), iadd(a2, maddwd(h2, h2)), iadd(a3, maddwd(h3, h3))
            a4, a5, a6, a7 = iadd(a4, maddwd(h4, h4)), iadd(a5, maddwd(h5, h5)), iadd(a6, maddwd(h6, h6)), iadd(a7, maddwd(h7, h7))
        s = iadd(iadd(iadd(a0, a1), iadd(a2, a3)), iadd(iadd(a4, a5), iadd(a6, a7)))
        out[0] = total(s)

    int8_loop, int16_loop = dot_loop(bvec, dpbusd), dot_loop(hvec, dpwssd)
    return {"int8": (int8_loop, 8 * vb), "int8_int16_sums": (wide_loop, 8 * vb), "int16": (int16_loop, 8 * vb // 2)}


@nb.njit(cache=False, nogil=True, fastmath={"contract"})
def f32_loop(w, x, passes, out):
    """6 FMAs of 16 lanes a pass: 2 loaded vectors x 3 in registers."""
    x0, x1, x2 = vload(x, 0), vload(x, 16), vload(x, 32)
    a0 = a1 = a2 = a3 = a4 = a5 = vzero()
    o = 0
    for _ in range(passes):
        w0, w1 = vload(w, o), vload(w, o + 16)
        a0, a1, a2 = vfma(w0, x0, a0), vfma(w0, x1, a1), vfma(w0, x2, a2)
        a3, a4, a5 = vfma(w1, x0, a3), vfma(w1, x1, a4), vfma(w1, x2, a5)
        o = (o + 32) & (RING // 4 - 1)
    out[0] = vsum(a0) + vsum(a1) + vsum(a2) + vsum(a3) + vsum(a4) + vsum(a5)


def timed(fn, w, x, passes: int, repeats: int) -> float:
    """Median seconds of fn over `passes` passes (one untimed call compiles and warms)."""
    out = np.zeros(1, np.float32)
    fn(w, x, 10, out)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(w, x, passes, out)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--passes", type=int, default=20_000_000)
    p.add_argument("--repeats", "-r", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    w8, x8 = rng.integers(0, 16, RING, dtype=np.uint8), rng.integers(-128, 128, 128).astype(np.int8).view(np.uint8)
    wf, xf = rng.standard_normal(RING // 4, dtype=np.float32), rng.standard_normal(48, dtype=np.float32)
    tf = timed(f32_loop, wf, xf, args.passes, args.repeats)
    gops = {}
    for bits in (256, 512):
        for name, (fn, macs) in loops(bits).items():
            passes = args.passes // 8 * 8
            gops[f"{name}_{bits}"] = macs * 2 * passes / timed(fn, w8, x8, passes, args.repeats) / 1e9
    feats = ilanes.target_features()
    result = {
        "cpu": next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
        if os.path.exists("/proc/cpuinfo") else "?",
        "int8_instruction": "vpdpbusd" if ilanes.fast_int_dot() and ilanes._vnni() else
        ("vpmaddubsw+vpmaddwd" if ilanes.fast_int_dot() else "generic LLVM vectors"),
        "avx512": "avx512f" in feats,
        "zmm_int_dot": ilanes.zmm_int_dot(),
        "int8_gops": gops["int8_256"],
        "int8_int16_sums_gops": gops["int8_int16_sums_256"],
        "int16_gops": gops["int16_256"],
        "int8_512_gops": gops["int8_512"],
        "int8_int16_sums_512_gops": gops["int8_int16_sums_512"],
        "int16_512_gops": gops["int16_512"],
        "f32_gflops": F32_MACS * 2 * args.passes / tf / 1e9,
    }
    result["int8_over_f32"] = max(gops["int8_256"], gops["int8_512"]) / result["f32_gflops"]
    if args.json:
        print(json.dumps(result))
        return
    zmm = "one zmm register" if result["avx512"] else "two ymm halves"
    print(f"{result['cpu']}, one core ({result['int8_instruction']}); GOP/s, a multiply-add is 2")
    print(f"  {'':20} {'256-bit':>9} {'512-bit':>9}  (512-bit vectors: {zmm})")
    print(f"  {'int8 dot products':20} {result['int8_gops']:9.1f} {result['int8_512_gops']:9.1f}")
    print(f"  {'int8, int16 sums':20} {result['int8_int16_sums_gops']:9.1f} {result['int8_int16_sums_512_gops']:9.1f}"
          "  (vpmaddubsw+vpaddw: qgemm without VNNI)")
    print(f"  {'int16 dot products':20} {result['int16_gops']:9.1f} {result['int16_512_gops']:9.1f}"
          f"  ({'vpdpwssd' if ilanes.fast_int_dot() and ilanes._vnni() else 'vpmaddwd+vpaddd'}: lgemm's ceiling)")
    print(f"  float32 FMA          {result['f32_gflops']:9.1f} GFLOP/s (16 lanes)")
    print(f"  int8 over float32    {result['int8_over_f32']:9.2f}x (the wider int8)")


if __name__ == "__main__":
    main()
