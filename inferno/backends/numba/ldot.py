"""Matvecs of the legacy kinds (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4) against int16 activations, where a
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
0..31, m = -16 d; Q5_1: 0..31; MXFP4: its nibble through a table, -12..12, d = 2^(e - 128),
m = 0). The integer dot product is exact (|q qx| < 2^22, 32 of them), so
a row's result equals the dequantised weights times x' up to float32 rounding.

Decode and a few rows run here (l_rows), a prefill's rows through lgemm's GEMM, in one order of
arithmetic: per output, block by block, acc = fma(float(q . qx), d dx, acc) (and fma(m, xs, acc)
for Q4_1 and Q5_1). A row's result is then the same bit for bit however its tokens were
grouped into steps, on any number of threads (tests/test_invariance.py).

Q4_0, Q4_1 and MXFP4 on AVX-512 take `_l_dealt` (one row) and `_l_few_dealt`: the same integer
block sums, the weights widened in a 512-bit register without a shuffle (ilanes.DEALT), where
an expert's MXFP4 rows were bound by the widening, not by DRAM (bench/RESULTS.md, "The one-row
matvec"). Where the backends keep these kinds' weights in panels of sixteen rows (Q4_0X16,
Q4_1X16, MXFP4X16: lpanels.py), l_rows hands them to lpanels.m_rows, which gives the file's
rows' bits without reducing a block's lanes at all.

On AVX-512 machines with VNNI the decode here ran within noise of the float32 kernels (SmolLM2's
Q8_0, Q4_1, Q5_0 and Q4_K_M files, Gemma 3: 0.94-1.11x, bench/RESULTS.md), so the backends turn
it on there too, for the prefill's sake.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from numba import types
from numba.extending import overload, register_jitable

from inferno.backends.numba.codes import WeightKind
from inferno.backends.numba.dense import FAST
from inferno.backends.numba.ilanes import (
    e8m0vec8, f16vec8, fload8, fma8, fmul8, fsplat8, fstore8, fzero8, hdeal, hload, iadd, ifloat, isplat8, isums8,
    maddwd, target_features, vamax2, vrint, vstore_i16, wadd, wbits, wbytes, wfp4, wnib, wsub_const, zhload,
    zisums8, zwfp4_dealt, zwnib_dealt,
)
from inferno.backends.numba.lanes import e8m0at, f16at, prefetch, vload, vmul, vsplat, vsum
from inferno.backends.numba.lpanels import Q4_1X16, block_less, m_rows, panelled, plus

jit = nb.njit(cache=True, nogil=True, fastmath=FAST)
inline = nb.njit(cache=True, nogil=True, fastmath=FAST, inline="always")

LEGACY_KINDS = frozenset(WeightKind[k] for k in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4", "MXFP4X16", "Q4_0X16",
                                                 "Q4_1X16"))
Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4 = (int(WeightKind[k]) for k in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4"))
QMAX = np.float32(32767.0)


def eight_lane_floats() -> bool:
    """Whether the kernels compile for x86 with AVX2 and without AVX-512: where this module's
    integer matvec beats the float32 one (the module docstring)."""
    f = target_features()
    return "avx2" in f and "avx512f" not in f


@register_jitable
def legacy(kind):
    """Whether kind is one of this module's (plain Python where Python calls it, compiled into
    the jitted callers)."""
    return (kind >= Q8_0 and kind <= Q5_1) or kind == MXFP4 or panelled(kind)


# -- the activations ----------------------------------------------------------------------------------
@jit
def quantize_rows(x, x16, dx, xs, b0, b1):
    """Rows b0..b1 of x [B, n] rounded to int16 with a scale per block of 32: qx = round(x / dx),
    dx = max|x| / 32767 over the block, into x16 [B, n] and dx [B, n / 32]; xs [B, n / 32] the
    sums of x' = dx qx over each block (dx times a sum of integers: exact up to one rounding)."""
    n = x.shape[1]
    for b in range(b0, b1):
        for g in range(n // 32):
            o = b * n + 32 * g
            lo, hi = vload(x, o), vload(x, o + 16)
            amax = vamax2(lo, hi)
            d = amax / QMAX
            dx[b, g] = d
            inv = vsplat(QMAX / amax if amax > 0 else np.float32(0.0))
            ql, qh = vrint(vmul(lo, inv)), vrint(vmul(hi, inv))
            xs[b, g] = d * (vsum(ql) + vsum(qh))
            vstore_i16(x16, o, ql)
            vstore_i16(x16, o + 16, qh)


@jit
def quantized(x):
    """x's rows as `quantize_rows` writes them: (x16, dx, xs)."""
    B, n = x.shape
    x16 = np.empty((B, n), np.int16)
    dx = np.empty((B, n // 32), np.float32)
    xs = np.empty((B, n // 32), np.float32)
    quantize_rows(x, x16, dx, xs, np.int64(0), B)  # (qkernels.chunk_start: why)
    return x16, dx, xs


# -- the matvec ---------------------------------------------------------------------------------------
@jit
def block(kind, f, o):
    """The block at byte o: (lo, hi, d, m), its 32 weights d q + m with q as two runs of 16 int16
    in weight order."""
    if kind == MXFP4:  # e, then Q4_0's nibbles, each an index into lanes.MXFP4_VALUES
        return wfp4(f, o + 1, False), wfp4(f, o + 1, True), e8m0at(f, o), np.float32(0.0)
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
def offset(kind):
    """Whether the kind's blocks keep an offset m beside d q (Q4_1, Q5_1): Q4_0's and Q5_0's
    are taken into the integers (`signed_block`)."""
    return kind == Q4_1 or kind == Q5_1 or kind == Q4_1X16


@inline
def signed_block(kind, f, o):
    """The block at byte o as the products take it: (lo, hi, d, m), q as two runs of 16 int16,
    Q4_0's q - 8 and Q5_0's q - 16 (their offsets taken into the integers, exactly), m Q4_1's
    and Q5_1's offset (0 for the others)."""
    lo, hi, d, m = block(kind, f, o)
    if kind == Q4_0:
        return wsub_const(lo, 8), wsub_const(hi, 8), d, np.float32(0.0)
    if kind == Q5_0:
        return wsub_const(lo, 16), wsub_const(hi, 16), d, np.float32(0.0)
    return lo, hi, d, m


@inline
def dot(lo, hi, xl, xh):
    """q . qx for a block's weights lo, hi against activations xl, xh: int32 lanes of the
    products, summed in pairs (not yet across lanes)."""
    return iadd(maddwd(lo, xl), maddwd(hi, xh))


@inline
def block_sum(kind, f, o, xl, xh):
    """`dot` for the block at byte o."""
    lo, hi, _, _ = signed_block(kind, f, o)
    return dot(lo, hi, xl, xh)


@inline
def pass_rows(r, last, rb):
    """Byte offsets of the eight weight rows from r, rows past `last` repeating it."""
    return (r * rb, min(r + 1, last) * rb, min(r + 2, last) * rb, min(r + 3, last) * rb,
            min(r + 4, last) * rb, min(r + 5, last) * rb, min(r + 6, last) * rb, min(r + 7, last) * rb)


@inline
def scales(kind, f, o0, o1, o2, o3, o4, o5, o6, o7):
    """(d, m) of the eight blocks at bytes o0..o7, each an f32x8 (m zero but for Q4_1 and
    Q5_1, whose m is the half after d; MXFP4's d from its E8M0 byte)."""
    if kind == MXFP4:
        return e8m0vec8(f, o0, o1, o2, o3, o4, o5, o6, o7), fzero8()
    d = f16vec8(f, o0, o1, o2, o3, o4, o5, o6, o7)
    if offset(kind):
        return d, f16vec8(f, o0 + 2, o1 + 2, o2 + 2, o3 + 2, o4 + 2, o5 + 2, o6 + 2, o7 + 2)
    return d, fzero8()


@inline
def prefetch_block(f, ahead, b, bb):
    """The next pass's eight rows, a block's worth: 8 bb bytes from ahead + 8 b."""
    p = ahead + 8 * b
    while p < ahead + 8 * (b + bb):
        prefetch(f, p)
        p += 64


@jit
def l_rows(kind, w, x16, dx, xs, out, r0, r1):
    """out[a, r] = w[r] . x'[a] for rows r0..r1 of w, of a legacy kind (a literal: each compiles
    its own loops), and the activation rows a of x' that `quantized` wrote (one for decode, a
    few for a batched step).

    The order of arithmetic is lgemm's, so that a row's result is the same bit for bit
    whatever rows share its step (lgemm.l_gemm takes many): for each output, block by block,
    acc = fma(float(q . qx), d dx, acc), then for Q4_1 and Q5_1 acc = fma(m, xs, acc). Eight
    weight rows go at a time, their block sums transposed into the lanes of one vector
    (ilanes.isums8) and their scales loaded into another (ilanes.f16vec8), so the float work
    is one fma per block for eight rows, as in the GEMM's panels; with several activation rows
    each block is widened once for all of them. The next eight rows are prefetched as these
    are read, a block's worth each block (eight streams outrun the hardware's prefetchers: the
    lm_head ran at a third of the speed without). Rows past r1 in the last pass repeat its
    last row and are not stored."""
    rows_of(kind, w, x16, dx, xs, out, r0, r1)


@jit
def _l_one(kind, w, x16, dx, xs, out, r0, r1):
    """l_rows for one activation row, its accumulator in a register (its own function: sharing
    one with _l_few's loops cost decode a quarter of its speed)."""
    f = w.reshape(-1)
    rb = w.shape[1]
    blocks = x16.shape[1] // 32
    bb = rb // blocks
    last = r1 - 1
    lanes = np.empty(8, np.float32)
    r = r0
    while r < r1:
        o0, o1, o2, o3, o4, o5, o6, o7 = pass_rows(r, last, rb)
        ahead = (r + 8) * rb
        acc = fzero8()
        for g in range(blocks):
            b = bb * g
            prefetch_block(f, ahead, b, bb)
            xl, xh = hload(x16, 32 * g), hload(x16, 32 * g + 16)
            sums = isums8(block_sum(kind, f, o0 + b, xl, xh), block_sum(kind, f, o1 + b, xl, xh),
                          block_sum(kind, f, o2 + b, xl, xh), block_sum(kind, f, o3 + b, xl, xh),
                          block_sum(kind, f, o4 + b, xl, xh), block_sum(kind, f, o5 + b, xl, xh),
                          block_sum(kind, f, o6 + b, xl, xh), block_sum(kind, f, o7 + b, xl, xh))
            d, m = scales(kind, f, o0 + b, o1 + b, o2 + b, o3 + b, o4 + b, o5 + b, o6 + b, o7 + b)
            acc = fma8(ifloat(sums), fmul8(d, fsplat8(dx[0, g])), acc)
            if offset(kind):
                acc = fma8(m, fsplat8(xs[0, g]), acc)
        fstore8(lanes, 0, acc)
        for i in range(min(8, r1 - r)):
            out[0, r + i] = lanes[i]
        r += 8


# Where 512-bit int16 products exist (AVX-512 BW): the 4-bit kinds through `_l_dealt` and
# `_l_few_dealt`.
DEALT_ROWS = "avx512bw" in target_features()


@register_jitable
def dealt(kind):
    """Whether the kind's rows go through `_l_dealt` and `_l_few_dealt`: the 4-bit kinds whose
    nibbles fill whole bytes, on AVX-512."""
    return DEALT_ROWS and (kind == Q4_0 or kind == Q4_1 or kind == MXFP4)


def rows_of(kind, w, x16, dx, xs, out, r0, r1):
    """l_rows' loops for the kind and x16's rows: one row through `_l_one`, a few through
    `_l_few`, or `_l_dealt` and `_l_few_dealt` where dealt(kind) (jitted code only: the overload
    below)."""
    raise TypeError("rows_of runs in jitted code only")


@overload(rows_of, prefer_literal=True, jit_options=dict(fastmath=FAST))
def _rows_of(kind, w, x16, dx, xs, out, r0, r1):
    """Chosen while typing where the kind is a literal, so that only the loops taken compile."""
    if isinstance(kind, types.IntegerLiteral) and panelled(kind.literal_value):
        return lambda kind, w, x16, dx, xs, out, r0, r1: m_rows(kind, w, x16, dx, xs, out, r0, r1)
    if isinstance(kind, types.IntegerLiteral):
        one, few = (_l_dealt, _l_few_dealt) if dealt(kind.literal_value) else (_l_one, _l_few)

        def one_kind(kind, w, x16, dx, xs, out, r0, r1):
            if x16.shape[0] == 1:
                one(kind, w, x16, dx, xs, out, r0, r1)
            else:
                few(kind, w, x16, dx, xs, out, r0, r1)
        return one_kind

    def any_kind(kind, w, x16, dx, xs, out, r0, r1):
        if panelled(kind):
            m_rows(kind, w, x16, dx, xs, out, r0, r1)
        elif dealt(kind) and x16.shape[0] == 1:
            _l_dealt(kind, w, x16, dx, xs, out, r0, r1)
        elif dealt(kind):
            _l_few_dealt(kind, w, x16, dx, xs, out, r0, r1)
        elif x16.shape[0] == 1:
            _l_one(kind, w, x16, dx, xs, out, r0, r1)
        else:
            _l_few(kind, w, x16, dx, xs, out, r0, r1)
    return any_kind


@inline
def dealt_weights(kind, f, o):
    """The 4-bit block at byte o as 32 int16 lanes in ilanes.DEALT's order (q + lpanels.plus)."""
    if kind == MXFP4:
        return zwfp4_dealt(f, o + 1)
    return zwnib_dealt(f, o + 2 if kind == Q4_0 else o + 4)


@inline
def dealt_block(kind, f, o, x):
    """The 16 int32 lanes of q . qx for the 4-bit block at byte o, against 32 activations x in
    ilanes.DEALT's order."""
    return maddwd(dealt_weights(kind, f, o), x)


@jit
def deal(kind, x16):
    """x16's rows in ilanes.DEALT's order, and what each block's integer sum carries beyond
    q . qx (lpanels.block_less): (dealt rows, [rows, blocks]; not written for Q4_1, whose offset
    is 0 and whose kernels do not read it)."""
    B, n = x16.shape
    xd = np.empty((B, n), np.int16)
    less = np.empty((B, n // 32), np.int32)
    off = plus(kind)
    for a in range(B):
        for g in range(n // 32):
            hdeal(x16[a], 32 * g, xd[a], 32 * g)
            if off != 0:
                less[a, g] = block_less(x16, a, g, off)
    return xd, less


@jit
def _l_dealt(kind, w, x16, dx, xs, out, r0, r1):
    """_l_one for Q4_0, Q4_1 and MXFP4, its weights widened without a shuffle (ilanes.DEALT): the
    activations are dealt once into that order and each block's sum of them kept, so that a block's
    integer sum comes out as _l_one's, exactly, less lpanels.plus(kind) times that sum."""
    f = w.reshape(-1)
    rb = w.shape[1]
    blocks = x16.shape[1] // 32
    bb = rb // blocks
    last = r1 - 1
    xd, less = deal(kind, x16)
    xd = xd.reshape(-1)
    lanes = np.empty(8, np.float32)
    r = r0
    while r < r1:
        o0, o1, o2, o3, o4, o5, o6, o7 = pass_rows(r, last, rb)
        ahead = (r + 8) * rb
        acc = fzero8()
        for g in range(blocks):
            b = bb * g
            prefetch_block(f, ahead, b, bb)
            x = zhload(xd, 32 * g)
            sums = zisums8(dealt_block(kind, f, o0 + b, x), dealt_block(kind, f, o1 + b, x),
                           dealt_block(kind, f, o2 + b, x), dealt_block(kind, f, o3 + b, x),
                           dealt_block(kind, f, o4 + b, x), dealt_block(kind, f, o5 + b, x),
                           dealt_block(kind, f, o6 + b, x), dealt_block(kind, f, o7 + b, x))
            if plus(kind) != 0:
                sums = iadd(sums, isplat8(less[0, g]))
            d, m = scales(kind, f, o0 + b, o1 + b, o2 + b, o3 + b, o4 + b, o5 + b, o6 + b, o7 + b)
            acc = fma8(ifloat(sums), fmul8(d, fsplat8(dx[0, g])), acc)
            if offset(kind):
                acc = fma8(m, fsplat8(xs[0, g]), acc)
        fstore8(lanes, 0, acc)
        for i in range(min(8, r1 - r)):
            out[0, r + i] = lanes[i]
        r += 8


@jit
def _l_few_dealt(kind, w, x16, dx, xs, out, r0, r1):
    """_l_few for Q4_0, Q4_1 and MXFP4 as _l_dealt takes one row: each block of the eight weight
    rows widened once (one register each) for all the activation rows, dealt once a call."""
    f = w.reshape(-1)
    rb = w.shape[1]
    B, n = x16.shape
    blocks = n // 32
    bb = rb // blocks
    last = r1 - 1
    xd, less = deal(kind, x16)
    xd = xd.reshape(-1)
    lanes = np.empty(8 * B, np.float32)
    r = r0
    while r < r1:
        o0, o1, o2, o3, o4, o5, o6, o7 = pass_rows(r, last, rb)
        ahead = (r + 8) * rb
        for i in range(8 * B):
            lanes[i] = 0.0
        for g in range(blocks):
            b = bb * g
            prefetch_block(f, ahead, b, bb)
            w0, w1, w2, w3 = (dealt_weights(kind, f, o0 + b), dealt_weights(kind, f, o1 + b),
                              dealt_weights(kind, f, o2 + b), dealt_weights(kind, f, o3 + b))
            w4, w5, w6, w7 = (dealt_weights(kind, f, o4 + b), dealt_weights(kind, f, o5 + b),
                              dealt_weights(kind, f, o6 + b), dealt_weights(kind, f, o7 + b))
            d, m = scales(kind, f, o0 + b, o1 + b, o2 + b, o3 + b, o4 + b, o5 + b, o6 + b, o7 + b)
            for a in range(B):
                x = zhload(xd, a * n + 32 * g)
                sums = zisums8(maddwd(w0, x), maddwd(w1, x), maddwd(w2, x), maddwd(w3, x),
                               maddwd(w4, x), maddwd(w5, x), maddwd(w6, x), maddwd(w7, x))
                if plus(kind) != 0:
                    sums = iadd(sums, isplat8(less[a, g]))
                acc = fma8(ifloat(sums), fmul8(d, fsplat8(dx[a, g])), fload8(lanes, 8 * a))
                if offset(kind):
                    acc = fma8(m, fsplat8(xs[a, g]), acc)
                fstore8(lanes, 8 * a, acc)
        for a in range(B):
            for i in range(min(8, r1 - r)):
                out[a, r + i] = lanes[8 * a + i]
        r += 8


@jit
def _l_few(kind, w, x16, dx, xs, out, r0, r1):
    """l_rows for a few activation rows: each block of the eight weight rows widened once for
    all of them, their accumulators in memory between blocks."""
    f = w.reshape(-1)
    rb = w.shape[1]
    B, blocks = x16.shape[0], x16.shape[1] // 32
    bb = rb // blocks
    last = r1 - 1
    lanes = np.empty(8 * B, np.float32)
    r = r0
    while r < r1:
        o0, o1, o2, o3, o4, o5, o6, o7 = pass_rows(r, last, rb)
        ahead = (r + 8) * rb
        for i in range(8 * B):
            lanes[i] = 0.0
        for g in range(blocks):
            b = bb * g
            prefetch_block(f, ahead, b, bb)
            l0, h0, _, _ = signed_block(kind, f, o0 + b)
            l1, h1, _, _ = signed_block(kind, f, o1 + b)
            l2, h2, _, _ = signed_block(kind, f, o2 + b)
            l3, h3, _, _ = signed_block(kind, f, o3 + b)
            l4, h4, _, _ = signed_block(kind, f, o4 + b)
            l5, h5, _, _ = signed_block(kind, f, o5 + b)
            l6, h6, _, _ = signed_block(kind, f, o6 + b)
            l7, h7, _, _ = signed_block(kind, f, o7 + b)
            d, m = scales(kind, f, o0 + b, o1 + b, o2 + b, o3 + b, o4 + b, o5 + b, o6 + b, o7 + b)
            for a in range(B):
                xo = a * x16.shape[1] + 32 * g
                xl, xh = hload(x16, xo), hload(x16, xo + 16)
                sums = isums8(dot(l0, h0, xl, xh), dot(l1, h1, xl, xh), dot(l2, h2, xl, xh),
                              dot(l3, h3, xl, xh), dot(l4, h4, xl, xh), dot(l5, h5, xl, xh),
                              dot(l6, h6, xl, xh), dot(l7, h7, xl, xh))
                acc = fma8(ifloat(sums), fmul8(d, fsplat8(dx[a, g])), fload8(lanes, 8 * a))
                if offset(kind):
                    acc = fma8(m, fsplat8(xs[a, g]), acc)
                fstore8(lanes, 8 * a, acc)
        for a in range(B):
            for i in range(min(8, r1 - r)):
                out[a, r + i] = lanes[8 * a + i]
        r += 8
