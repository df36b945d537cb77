"""Matvecs of the legacy kinds (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) against int8 activations, where a
float32 vector is eight lanes wide (x86 without AVX-512).

Why: the float32 kernels (qkernels.matvec_rows) widen every weight byte to a float and multiply
it by a float activation: about three instructions per eight weights. On a CPU whose float
vectors are 256 bits that bounds one core to 8-12 Gw/s, below what DRAM delivers: on an
AVX2-only AMD host, models whose hidden size is not a multiple of 256 (SmolLM2's 576, Gemma 3's
640: llama-quantize gives most of their matrices Q5_0 or Q8_0) decoded at half llama.cpp's
speed. As bytes, one vpmaddubsw multiplies 32 weights by 32 activations; a block's products then
take a vpmaddwd, a conversion and a multiply-add by the block's scale (bench/RESULTS.md, "Decode
of the legacy kinds on an AVX2-only host"). With 512-bit float vectors the float32 kernels ran
as fast as such an integer path (measured on Zen 4, qdot's docstring), so there they stay.

The activation row is quantized as for the K-quants (qdot.quantize_rows: a scale per 256
values), always with the remainder row: x' = dx qx + dr rx. One row alone on the matrices the
K-quants take it for (q, k, v, gate, up) moved the logits of SmolLM2 and Gemma 3 by 6e-2 and
1.2e-1 of their range against float32 activations (in those files the legacy kinds are exactly
those matrices: their inputs are 576 and 640 wide, not whole super-blocks); with the remainder
row, 2.5e-4 and 5e-4 (bench/RESULTS.md).
A block of 32 weights, weight = d q + m, against it:
  d (dx (q . qx) + dr (q . rx))  +  m (the sum of x' over the block),
with q unsigned (Q4_0: 0..15 and m = -8 d; Q4_1: 0..15, m its own; Q5_0: 0..31, m = -16 d;
Q5_1: 0..31), or for Q8_0 signed (-127..127, m = 0), multiplied as |q| times x's bytes signed
by q. The integer dot products are exact, so a row's result equals the dequantised weights
times x' up to float32 rounding.

Decode alone runs here. A few rows or a prefill (qkernels' drivers) multiply the same x' in
float32, dequantised from the same int8 rows (`rounded_rows`) and fed to the float kernels or to
sgemm: a row's result then does not depend on how rows were grouped into steps beyond float32
rounding, as with the K-quants, and a prefill keeps sgemm's speed.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from inferno.backends.numba.codes import WeightKind
from inferno.backends.numba.dense import FAST
from inferno.backends.numba.ilanes import (
    bfrombits, bload, bnib, bor, bsign, dpbusd, fsum8, fzero8, ifma, izero, target_features,
)
from inferno.backends.numba.lanes import f16at, prefetch
from inferno.backends.numba.qdot import QK

jit = nb.njit(cache=True, nogil=True, fastmath=FAST)

Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 = (int(WeightKind[k]) for k in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"))


def eight_lane_floats() -> bool:
    """Whether the kernels compile for x86 with AVX2 and without AVX-512: where this module's
    integer matvec beats the float32 one (the module docstring)."""
    f = target_features()
    return "avx2" in f and "avx512f" not in f


@jit
def legacy(kind):
    """Whether kind is one of this module's."""
    return kind >= Q8_0 and kind <= Q5_1


@jit
def block(kind, f, o):
    """The block at byte o: (q, d, m), its 32 weights d q + m with q as bytes in weight order
    (signed for Q8_0, whose m is 0)."""
    d = f16at(f, o)
    if kind == Q8_0:
        return bload(f, o + 2), d, np.float32(0.0)
    if kind == Q4_0:
        return bnib(f, o + 2), d, np.float32(-8.0) * d
    if kind == Q4_1:
        return bnib(f, o + 4), d, f16at(f, o + 2)
    if kind == Q5_0:
        return bor(bnib(f, o + 6), bfrombits(f, o + 2, 16)), d, np.float32(-16.0) * d
    return bor(bnib(f, o + 8), bfrombits(f, o + 4, 16)), d, f16at(f, o + 2)  # Q5_1


@jit
def block_dot(kind, q, xb):
    """q . xb (a block's 32 activation bytes) as 8 int32 partial sums."""
    if kind == Q8_0:  # signed weights: |q| as the unsigned operand, x's bytes signed by q
        return dpbusd(izero(), bsign(q, q), bsign(xb, q))
    return dpbusd(izero(), q, xb)


@jit
def l_rows(kind, w, x8, r8, dx, dr, s16, y, r0, r1):
    """y[r] = w[r] . x' for rows r0..r1 of w, of a legacy kind (a literal: each compiles its own
    loops), x' the one activation row qdot.quantize_rows wrote, with its remainder row. Two
    weight rows per pass share each load of the activation bytes, and one prefetch per block
    walks the next pass's rows (as qkernels.matvec_rows). Every array is read here, in the
    loop's own body: passed to a helper, the arrays were reference-counted at every block
    (Numba's pruning of those calls missed them there), which ran at a seventh of the speed."""
    f = w.reshape(-1)
    rb = w.shape[1]
    blocks = x8.shape[1] // 32
    bb = rb // blocks
    r = r0
    while r < r1:
        ra, rc = r * rb, min(r + 1, r1 - 1) * rb  # an odd last row is paired with itself
        a, c = fzero8(), fzero8()
        ma, mc = np.float32(0.0), np.float32(0.0)
        for g in range(blocks):
            prefetch(f, rc + rb + 2 * bb * g)
            u = g >> 3  # the activations' unit of 256
            qa, da, oa = block(kind, f, ra + bb * g)
            qc, dc, oc = block(kind, f, rc + bb * g)
            xb, e = bload(x8, 32 * g), dx[0, u]
            a = ifma(a, block_dot(kind, qa, xb), da * e)
            c = ifma(c, block_dot(kind, qc, xb), dc * e)
            xb, e = bload(r8, 32 * g), dr[0, u]
            a = ifma(a, block_dot(kind, qa, xb), da * e)
            c = ifma(c, block_dot(kind, qc, xb), dc * e)
            xsum = s16[0, 2 * g] + s16[0, 2 * g + 1]
            ma += oa * xsum
            mc += oc * xsum
        y[r] = fsum8(a) + ma
        if r + 1 < r1:
            y[r + 1] = fsum8(c) + mc
        r += 2


@jit
def rounded_rows(x8, r8, dx, dr, out, b0, b1):
    """out[b] = x'[b] = dx qx + dr rx for rows b0..b1: the values the integer kernels multiply,
    for the float ones."""
    n = x8.shape[1]
    for b in range(b0, b1):
        for u in range(dx.shape[1]):
            d, e = dx[b, u], dr[b, u]
            for i in range(QK * u, min(QK * (u + 1), n)):
                out[b, i] = d * np.float32(x8[b, i]) + e * np.float32(r8[b, i])
