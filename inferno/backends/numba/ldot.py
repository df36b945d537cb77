"""Matvecs of the legacy kinds (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) against int16 activations, where a
float32 vector is eight lanes wide (x86 without AVX-512), or where VNNI runs a prefill's products
of the same int16 rows (lgemm.py).

Why: the float32 kernels (qkernels.matvec_rows) widen every weight to a float and multiply it by
a float activation. Where float vectors are 256 bits that bounds a core to 8-13 G weights/s,
below what DRAM delivers, and models whose hidden size is not a multiple of 256 (SmolLM2's 576,
Gemma 3's 640: llama-quantize gives most of their matrices Q5_0 or Q8_0, and SmolLM2 ships as
Q4_1) decode well behind llama.cpp there. In int16, one vpmaddwd multiplies 16 weights by 16
activations and adds them in pairs; a block of 32 takes two, an add, one conversion and one
multiply-add by the block's scales.

Why int16 and not llama.cpp's int8: one int8 row moved the logits of SmolLM2 and Gemma 3 by
1.2e-1 and 6e-2 of their range (a remainder row brought that to 5e-4 and 2.5e-4, at the price
of most of the gain: bench/RESULTS.md, "Decode of the legacy kinds in integers"). x rounded to
int16 with a scale per block of 32, dx = max|x| / 32767, is within 1.5e-5 of the block's
largest value: as close as the two int8 rows, in one product.

A block, weight = d q + m, against x' = dx qx:
  d dx (q . qx)  +  m (the sum of x' over the block),
q as stored (Q8_0: signed bytes, m = 0; Q4_0: 0..15, m = -8 d; Q4_1: 0..15, m its own; Q5_0:
0..31, m = -16 d; Q5_1: 0..31). The integer dot product is exact (|q qx| < 2^22, 32 of them), so
a row's result equals the dequantised weights times x' up to float32 rounding.

Decode alone runs here. A few rows multiply the same x' (`rounded`, the same rounding) through
the float kernels; a prefill the same int16 rows through lgemm's GEMM where there is VNNI, else
x' through sgemm. A row's result then does not depend on how its tokens were grouped into steps
beyond float32 rounding.

On AVX-512 machines with VNNI the decode here ran within noise of the float32 kernels (SmolLM2's
Q8_0, Q4_1, Q5_0 and Q4_K_M files, Gemma 3: 0.94-1.11x, bench/RESULTS.md), so the backends turn
it on there too, for the prefill's sake.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from inferno.backends.numba.codes import WeightKind
from inferno.backends.numba.dense import FAST
from inferno.backends.numba.ilanes import (
    fsum8, fzero8, hload, iadd, ifma, maddwd, target_features, vamax2, vrint, vstore_i16, wadd,
    wbits, wbytes, wnib,
)
from inferno.backends.numba.lanes import f16at, prefetch, vload, vmul, vsplat, vstore, vsum

jit = nb.njit(cache=True, nogil=True, fastmath=FAST)

LEGACY_KINDS = frozenset(WeightKind[k] for k in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"))
Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 = (int(WeightKind[k]) for k in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"))
QMAX = np.float32(32767.0)


def eight_lane_floats() -> bool:
    """Whether the kernels compile for x86 with AVX2 and without AVX-512: where this module's
    integer matvec beats the float32 one (the module docstring)."""
    f = target_features()
    return "avx2" in f and "avx512f" not in f


@jit
def legacy(kind):
    """Whether kind is one of this module's."""
    return kind >= Q8_0 and kind <= Q5_1


# -- the activations ----------------------------------------------------------------------------------
@jit
def quantize_rows(x, x16, dx, xs, rounded, b0, b1):
    """Rows b0..b1 of x [B, n] rounded to int16 with a scale per block of 32: qx = round(x / dx),
    dx = max|x| / 32767 over the block, into x16 [B, n] and dx [B, n / 32], or, where `rounded`
    has rows, x' = dx qx into it as float32 instead. xs [B, n / 32]: with x16, the sums of x' over
    each block (dx times a sum of integers: exact up to one rounding)."""
    n = x.shape[1]
    out16 = rounded.shape[0] == 0
    for b in range(b0, b1):
        for g in range(n // 32):
            o = b * n + 32 * g
            lo, hi = vload(x, o), vload(x, o + 16)
            amax = vamax2(lo, hi)
            d = amax / QMAX
            dx[b, g] = d
            inv = vsplat(QMAX / amax if amax > 0 else np.float32(0.0))
            ql, qh = vrint(vmul(lo, inv)), vrint(vmul(hi, inv))
            if out16:
                xs[b, g] = d * (vsum(ql) + vsum(qh))
                vstore_i16(x16, o, ql)
                vstore_i16(x16, o + 16, qh)
            else:
                vstore(rounded, o, vmul(ql, vsplat(d)))
                vstore(rounded, o + 16, vmul(qh, vsplat(d)))


@jit
def quantized(x):
    """x's one row as `quantize_rows` writes it: (x16, dx, xs)."""
    B, n = x.shape
    x16 = np.empty((B, n), np.int16)
    dx = np.empty((B, n // 32), np.float32)
    xs = np.empty((B, n // 32), np.float32)
    quantize_rows(x, x16, dx, xs, np.empty((0, n), np.float32), 0, B)
    return x16, dx, xs


@jit
def rounded(x):
    """x' [B, n]: the float32 values x's rows take as int16 (`quantize_rows`), for the float
    kernels and sgemm."""
    B, n = x.shape
    out = np.empty_like(x)
    dx = np.empty((B, n // 32), np.float32)
    xs = np.empty((B, n // 32), np.float32)
    quantize_rows(x, np.empty((0, n), np.int16), dx, xs, out, 0, B)
    return out


# -- the matvec ---------------------------------------------------------------------------------------
@jit
def block(kind, f, o):
    """The block at byte o: (lo, hi, d, m), its 32 weights d q + m with q as two runs of 16 int16
    in weight order."""
    d = f16at(f, o)
    if kind == Q8_0:
        return wbytes(f, o + 2, True), wbytes(f, o + 18, True), d, np.float32(0.0)
    if kind == Q4_0:
        return wnib(f, o + 2, False), wnib(f, o + 2, True), d, np.float32(-8.0) * d
    if kind == Q4_1:
        return wnib(f, o + 4, False), wnib(f, o + 4, True), d, f16at(f, o + 2)
    if kind == Q5_0:  # the fifth bits: a uint32 at 2, bit i for weight i
        return (wadd(wnib(f, o + 6, False), wbits(f, o + 2, 16)),
                wadd(wnib(f, o + 6, True), wbits(f, o + 4, 16)), d, np.float32(-16.0) * d)
    return (wadd(wnib(f, o + 8, False), wbits(f, o + 4, 16)),  # Q5_1
            wadd(wnib(f, o + 8, True), wbits(f, o + 6, 16)), d, f16at(f, o + 2))


@jit
def l_rows(kind, w, x16, dx, xs, y, r0, r1):
    """y[r] = w[r] . x' for rows r0..r1 of w, of a legacy kind (a literal: each compiles its own
    loops), x' the one activation row `quantized` wrote. Two weight rows per pass share each
    load of the activations, and one prefetch per block walks the next pass's rows (as
    qkernels.matvec_rows)."""
    f = w.reshape(-1)
    rb = w.shape[1]
    blocks = x16.shape[1] // 32
    bb = rb // blocks
    r = r0
    while r < r1:
        ra, rc = r * rb, min(r + 1, r1 - 1) * rb  # an odd last row is paired with itself
        a, c = fzero8(), fzero8()
        ma, mc = np.float32(0.0), np.float32(0.0)
        for g in range(blocks):
            prefetch(f, rc + rb + 2 * bb * g)
            xl, xh, e, s = hload(x16, 32 * g), hload(x16, 32 * g + 16), dx[0, g], xs[0, g]
            la, ha, da, oa = block(kind, f, ra + bb * g)
            lc, hc, dc, oc = block(kind, f, rc + bb * g)
            a = ifma(a, iadd(maddwd(la, xl), maddwd(ha, xh)), da * e)
            c = ifma(c, iadd(maddwd(lc, xl), maddwd(hc, xh)), dc * e)
            ma += oa * s
            mc += oc * s
        y[r] = fsum8(a) + ma
        if r + 1 < r1:
            y[r + 1] = fsum8(c) + mc
        r += 2
