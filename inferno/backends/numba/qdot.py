"""Matvecs and few-row products of K-quant weights (Q4_K, Q5_K, Q6_K) against int8 activations:
integer dot products, as llama.cpp computes them (ggml's ggml_vec_dot_q4_K_q8_K and _q6_K_q8_K),
with a second int8 row for what the first leaves where a weight's inputs carry outliers.

Why: with float32 activations a weight costs a widening, a conversion and a float multiply-add
per activation row; as bytes, x86 multiplies 32
weights by 32 activations and adds them in pairs in one instruction (ilanes.py), and the
K-quants' sub-block scales are integers, so a super-block's 256 products sum in int32 lanes
(maddwd by the scales) and become float once. Each activation row is quantized once per call
(`quantize_rows`), per unit of 256 values (a row's last unit may be shorter, a multiple of 32):
x ~ dx * qx + dr * rx, qx = round(x / dx) with dx = max|x| / 127 (ggml's Q8_K), and rx the same
of the remainder x - dx * qx. ggml's single row moved whole-model logits by 4-5e-2 of their
range against transformers, with 95-98% top-1 agreement (SmolLM2 Q4_K_M, Gemma 3 270M, decoded
token by token); a scale per 32 instead would still have missed 1e-2 (2.6e-2, simulated); the
remainder row, on the weights whose inputs are heavy-tailed (QuantTensor.outlier_inputs:
o_proj, down_proj), brings the activations' rounding to 1/254 of ggml's at the cost of a second
maddubs on the weight bytes already loaded.

A super-block's dot product is then, for Q4_K (weight = d sc_g q - dmin m_g, q in 0..15; Q5_K
the same with q in 0..31, its fifth bits in 32 bytes of their own):
  d * sum_g sc_g (dx (q . qx)_g + dr (q . rx)_g)  -  dmin * sum_g m_g (sum of x' over g)
and for Q6_K (weight = d sc_s (q - 32), q in 0..63, a scale per 16):
  d * sum_s sc_s (dx (q . qx)_s + dr (q . rx)_s)  -  32 d sum_s sc_s (sum of x' over s),
x' = dx qx + dr rx, the dequantized activations. The dot products run in int32 lanes (their
largest sums stay below 2^26), so a matvec equals the dequantised weights times x' up to
float32 rounding: the error against float32 activations is the remainder's rounding alone,
sum_i |w_i| dr / 2 at most (tests/ops/test_linear.py checks both).

Rows: for one activation row (`k_rows`), two weight rows per pass share each load of the
activation bytes, and prefetches walk the next pass's rows, a cache line each, as
qkernels.matvec_rows does; for a few (`k_few`, the server's batched decode step), each weight
row's super-blocks meet four activation rows per pass, unpacked once for all four.

Where this does not pay: the legacy kinds (Q4_0..Q8_0) have a float16 scale per 32 weights, so
each group's int32 lanes need a conversion and a float multiply-add of their own. Written that
way (dpbusd, cvt, fma per group and activation row) it ran no faster than their float32 kernels
on Zen 4, whose float vectors are 16 lanes; where they are 8 the integer matvec wins, and
ldot.py is it (in int16: one int8 row was too coarse for them). Transposing eight weight rows by quads into the int32 lanes, so that one conversion
serves eight rows' blocks, beat float32 from eight activation rows on but lost below (packing
the transposed blocks decides small batches), which would make a sequence's logits depend on
its batch (bench/RESULTS.md, "Figures behind the kernels' shape"). Their few and many rows
stay float32.

Every row is quantized on its own and multiplied the same way alone, in a batch or in a prefill
(qkernels.linear takes this path for any number of rows), so a row's result does not depend on
the rows beside it beyond float32 rounding.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from inferno.backends.numba.ilanes import (
    bbits, bhigh, bload, fsum8, fzero8, iadd, ifloat, ifma, izero, kscales, maddubs, maddwd, vamax,
    vrint, vstore_i8, wbytes, wpair, wsplat,
)
from inferno.backends.numba.dense import FAST
from inferno.backends.numba.lanes import (
    f16at, prefetch, vfma, vload, vmul, vpairs_hi, vsplat, vstore, vsum, vzero,
)

jit = nb.njit(cache=True, nogil=True, fastmath=FAST)
# For the per-block helpers: Numba compiles each jitted function on its own and leaves inlining to
# LLVM, which declined q6k_unit (its size): every super-block then paid a call that pushed ~40
# words of array arguments and returned its vectors through memory. Inlined in Numba's IR instead.
inline = nb.njit(cache=True, nogil=True, fastmath=FAST, inline="always")

QK = 256  # activations per scale, and weights per K-quant super-block
Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES = 144, 176, 210


# -- the activation rows -------------------------------------------------------------------------------
@jit
def empty():
    """The quantized activations of no rows: what the drivers pass where none are needed."""
    return (np.empty((0, 0), np.int8), np.empty((0, 0), np.int8), np.empty((0, 0), np.float32),
            np.empty((0, 0), np.float32), np.empty((0, 0), np.float32))


@jit
def quantize_rows(x, x8, r8, dx, dr, s16, b0, b1):
    """Rows b0..b1 of x [B, n] (n a multiple of 32) as int8 rows with a scale per unit of 256
    values (the last unit of a row may be shorter): x ~ dx * x8 + dr * r8, x8 = round(x / dx)
    with dx = max|x| / 127 over the unit (ggml's Q8_K), and r8 the same of what that leaves,
    x - dx * x8 (at most dx / 2 a value). Without a remainder (dr of no rows) only x8 is
    written. s16 [B, n / 16]: the sums of the dequantized activations over each run of 16 (sums
    of integers times the scales, so exact up to one rounding each)."""
    n = x.shape[1]
    two = dr.shape[0] > 0
    res = np.empty(QK, np.float32)
    for b in range(b0, b1):
        for u in range(dx.shape[1]):
            o = b * n + QK * u
            runs = min(QK, n - QK * u) // 16
            amax = np.float32(0.0)
            for i in range(runs):
                amax = max(amax, vamax(vload(x, o + 16 * i)))
            d = amax / np.float32(127.0)
            dx[b, u] = d
            inv = vsplat(np.float32(127.0) / amax if amax > 0 else np.float32(0.0))
            rmax = np.float32(0.0)
            for i in range(runs):
                v = vload(x, o + 16 * i)
                q = vrint(vmul(v, inv))
                vstore_i8(x8, o + 16 * i, q)
                s16[b, 16 * u + i] = d * vsum(q)  # sums of integers: exact
                if two:
                    r = vfma(q, vsplat(-d), v)
                    vstore(res, 16 * i, r)
                    rmax = max(rmax, vamax(r))
            if two:
                e = rmax / np.float32(127.0)
                dr[b, u] = e
                rinv = vsplat(np.float32(127.0) / rmax if rmax > 0 else np.float32(0.0))
                for i in range(runs):
                    q = vrint(vmul(vload(res, 16 * i), rinv))
                    vstore_i8(r8, o + 16 * i, q)
                    s16[b, 16 * u + i] += e * vsum(q)


@jit
def buffers(B, n, two):
    """Room for B rows of n activations quantized: (x8, r8, dx, dr, s16), quantize_rows' arrays
    (r8 and dr of no rows unless two)."""
    units = (n + QK - 1) // QK
    m = B if two else 0
    return (np.empty((B, n), np.int8), np.empty((m, n), np.int8), np.empty((B, units), np.float32),
            np.empty((m, units), np.float32), np.empty((B, n // 16), np.float32))


@jit
def quantize(x, two):
    """x [B, n] -> (x8, r8, dx, dr, s16) as quantize_rows writes them (r8 and dr of no rows
    unless two)."""
    x8, r8, dx, dr, s16 = buffers(x.shape[0], x.shape[1], two)
    quantize_rows(x, x8, r8, dx, dr, s16, 0, x.shape[0])
    return x8, r8, dx, dr, s16


# -- Q4_K and Q5_K -------------------------------------------------------------------------------------
@jit
def q4k_quarter(lo, hi, x8, xo, sc, j):
    """Weights 64j..64j + 64 of a Q4_K or Q5_K super-block (lo: weights 0-31 as bytes, hi:
    32-63) against x8[xo:], each run of 32 times its 6-bit scale (lanes 2j and 2j + 1 of sc):
    8 int32 partial sums."""
    lo = maddwd(maddubs(lo, bload(x8, xo)), wsplat(sc, 2 * j))
    hi = maddwd(maddubs(hi, bload(x8, xo + 32)), wsplat(sc, 2 * j + 1))
    return iadd(lo, hi)


@inline
def q4k_unit(ub, f, o, x8, r8, dx, dr, s16, b, u, two, acc, macc):
    """The Q4_K (ub = Q4_K_BYTES) or Q5_K super-block at byte o against super-block u of
    activation row b: the row's float accumulators (acc: scaled dot products; macc: the mins'
    terms) advanced."""
    n = x8.shape[1]
    sc = kscales(f, o + 4)  # [8 scales, 8 mins]
    sums = vpairs_hi(vload(s16, b * (n // 16) + 16 * u))  # per 32, in the mins' lanes
    macc = vfma(vmul(ifloat(sc), vsplat(-f16at(f, o + 2))), sums, macc)
    s, t = izero(), izero()
    xo = b * n + QK * u
    for j in range(4):
        if ub == Q5_K_BYTES:  # nibbles after 32 bytes of fifth bits: weight l of group g's is bit g of byte l
            qa, qh = bload(f, o + 48 + 32 * j), bload(f, o + 16)
            lo, hi = bhigh(bbits(qa, 0, 15), qh, 2 * j, 1), bhigh(bbits(qa, 4, 15), qh, 2 * j + 1, 1)
        else:
            qa = bload(f, o + 16 + 32 * j)
            lo, hi = bbits(qa, 0, 15), bbits(qa, 4, 15)
        s = iadd(s, q4k_quarter(lo, hi, x8, xo + 64 * j, sc, j))
        if two:
            t = iadd(t, q4k_quarter(lo, hi, r8, xo + 64 * j, sc, j))
    d = f16at(f, o)
    acc = ifma(acc, s, d * dx[b, u])
    return (ifma(acc, t, d * dr[b, u]) if two else acc), macc


# -- Q6_K ----------------------------------------------------------------------------------------------
@jit
def q6k_half(w0, w1, w2, w3, x8, xo, sc, h):
    """Weights 128h..128h + 128 of a Q6_K super-block (q6k_weights) against x8[xo:], each 16
    of them times its int8 scale (lanes 8h + 2t and 8h + 2t + 1 of sc)."""
    s0 = maddwd(maddubs(w0, bload(x8, xo)), wpair(sc, 8 * h))
    s1 = maddwd(maddubs(w1, bload(x8, xo + 32)), wpair(sc, 8 * h + 2))
    s2 = maddwd(maddubs(w2, bload(x8, xo + 64)), wpair(sc, 8 * h + 4))
    s3 = maddwd(maddubs(w3, bload(x8, xo + 96)), wpair(sc, 8 * h + 6))
    return iadd(iadd(s0, s1), iadd(s2, s3))


@jit
def q6k_weights(f, o, h):
    """The 128 weights 128h.. of the Q6_K super-block at byte o, in 0..63, as four runs of 32:
    run t is the low (t < 2) or high nibbles of bytes 64h + 32 (t % 2) of the 128 bytes of
    nibbles, with bits 2t..2t + 1 of bytes 32h of the 64 bytes of high bits above them."""
    ql0, ql1, qh = bload(f, o + 64 * h), bload(f, o + 64 * h + 32), bload(f, o + 128 + 32 * h)
    return (bhigh(bbits(ql0, 0, 15), qh, 0, 3), bhigh(bbits(ql1, 0, 15), qh, 2, 3),
            bhigh(bbits(ql0, 4, 15), qh, 4, 3), bhigh(bbits(ql1, 4, 15), qh, 6, 3))


@inline
def q6k_unit(f, o, x8, r8, dx, dr, s16, b, u, two, acc, macc):
    """As q4k_unit, for the Q6_K super-block at byte o."""
    n = x8.shape[1]
    sc = wbytes(f, o + 192, True)  # 16 int8 scales
    d = f16at(f, o + 208)
    macc = vfma(vmul(ifloat(sc), vsplat(np.float32(-32.0) * d)), vload(s16, b * (n // 16) + 16 * u), macc)
    s, t = izero(), izero()
    xo = b * n + QK * u
    for h in range(2):
        w0, w1, w2, w3 = q6k_weights(f, o, h)
        s = iadd(s, q6k_half(w0, w1, w2, w3, x8, xo + 128 * h, sc, h))
        if two:
            t = iadd(t, q6k_half(w0, w1, w2, w3, r8, xo + 128 * h, sc, h))
    acc = ifma(acc, s, d * dx[b, u])
    return (ifma(acc, t, d * dr[b, u]) if two else acc), macc


@inline
def k_unit(ub, f, o, x8, r8, dx, dr, s16, b, u, two, acc, macc):
    """The super-block at byte o of a Q4_K, Q5_K or Q6_K row (ub its bytes) against super-block
    u of activation row b."""
    if ub == Q6_K_BYTES:
        return q6k_unit(f, o, x8, r8, dx, dr, s16, b, u, two, acc, macc)
    return q4k_unit(ub, f, o, x8, r8, dx, dr, s16, b, u, two, acc, macc)


# -- rows ----------------------------------------------------------------------------------------------
@jit
def k_rows(ub, w, x8, r8, dx, dr, s16, y, r0, r1):
    """y[r] = w[r] . x' for rows r0..r1 of w, of Q4_K, Q5_K or Q6_K (ub: Q4_K_BYTES..), x' the
    one activation row quantize_rows wrote. ub a literal: each kind compiles its own loops."""
    f = w.reshape(-1)
    rb = w.shape[1]
    two = dr.shape[0] > 0
    r = r0
    while r < r1:
        ra, rc = r * rb, min(r + 1, r1 - 1) * rb  # an odd last row is paired with itself
        a, c, ma, mc = fzero8(), fzero8(), vzero(), vzero()
        for u in range(rb // ub):
            p = rc + rb + 2 * ub * u  # the next pass's bytes, 2 ub a super-block
            for k in range((2 * ub + 63) // 64):
                prefetch(f, p + 64 * k)
            a, ma = k_unit(ub, f, ra + ub * u, x8, r8, dx, dr, s16, 0, u, two, a, ma)
            c, mc = k_unit(ub, f, rc + ub * u, x8, r8, dx, dr, s16, 0, u, two, c, mc)
        y[r] = fsum8(a) + vsum(ma)
        if r + 1 < r1:
            y[r + 1] = fsum8(c) + vsum(mc)
        r += 2


# Literals for _k_block: activation rows per pass, and whether a remainder row comes too.
ONE, TWO_ROWS, FOUR = 1, 2, 4
YES, NO = True, False
ROWS_PER_BLOCK = 16  # weight rows the passes over activation rows share at a time (in L1)


@jit
def k_few(ub, w, x8, r8, dx, dr, s16, out, r0, r1):
    """out[b, r] = w[r] . x'[b] for rows r0..r1 of w and each of a few activation rows b: four
    per pass over each weight row (then two, then one), its super-blocks unpacked once for all
    of them. The weight rows go by in chunks that every pass reads while they sit in L1. Each
    pass compiles with its row count and remainder as literals, so no branch on them is left
    in the loop over super-blocks (a runtime count there ran at a third of the speed)."""
    B = x8.shape[0]
    two = dr.shape[0] > 0
    for c0 in range(r0, r1, ROWS_PER_BLOCK):
        c1 = min(c0 + ROWS_PER_BLOCK, r1)
        b = 0
        while b + 4 <= B:
            _k_pass(ub, FOUR, two, w, b, x8, r8, dx, dr, s16, out, c0, c1)
            b += 4
        if b + 2 <= B:
            _k_pass(ub, TWO_ROWS, two, w, b, x8, r8, dx, dr, s16, out, c0, c1)
            b += 2
        if b < B:
            _k_pass(ub, ONE, two, w, b, x8, r8, dx, dr, s16, out, c0, c1)


@jit
def _k_pass(ub, rows, two, w, b, x8, r8, dx, dr, s16, out, r0, r1):
    """_k_block with `two` made a literal too (rows already is one)."""
    if two:
        _k_block(ub, rows, YES, w, b, x8, r8, dx, dr, s16, out, r0, r1)
    else:
        _k_block(ub, rows, NO, w, b, x8, r8, dx, dr, s16, out, r0, r1)


@jit
def _k_block(ub, rows, two, w, b, x8, r8, dx, dr, s16, out, r0, r1):
    """Weight rows r0..r1 against activation rows b..b + rows (rows 1, 2 or 4)."""
    f = w.reshape(-1)
    rb = w.shape[1]
    for r in range(r0, r1):
        a0, a1, a2, a3 = fzero8(), fzero8(), fzero8(), fzero8()
        m0, m1, m2, m3 = vzero(), vzero(), vzero(), vzero()
        for u in range(rb // ub):
            o = r * rb + ub * u
            a0, m0 = k_unit(ub, f, o, x8, r8, dx, dr, s16, b, u, two, a0, m0)
            if rows >= 2:
                a1, m1 = k_unit(ub, f, o, x8, r8, dx, dr, s16, b + 1, u, two, a1, m1)
            if rows == 4:
                a2, m2 = k_unit(ub, f, o, x8, r8, dx, dr, s16, b + 2, u, two, a2, m2)
                a3, m3 = k_unit(ub, f, o, x8, r8, dx, dr, s16, b + 3, u, two, a3, m3)
        out[b, r] = fsum8(a0) + vsum(m0)
        if rows >= 2:
            out[b + 1, r] = fsum8(a1) + vsum(m1)
        if rows == 4:
            out[b + 2, r] = fsum8(a2) + vsum(m2)
            out[b + 3, r] = fsum8(a3) + vsum(m3)
