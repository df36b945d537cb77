"""Decode matvecs of K-quant weights against int8 activations: integer dot products, as
llama.cpp computes them (ggml's ggml_vec_dot_q4_K_q8_K and _q6_K_q8_K), with a second int8 row
for what the first leaves.

Why: with float32 activations a weight costs a widening, a conversion and a float multiply-add
(one core here: Q4_K 14.8 Gw/s, Q6_K 9.9); as bytes, x86 multiplies 32 weights by 32
activations and adds them in pairs in one instruction (ilanes.py), and the same matrices ran at
34 and 26 Gw/s with one int8 row. The activation row is quantized once per call (`quantize_k`),
per 256 values: x ~ dx * qx + dr * rx, qx = round(x / dx) with dx = max|x| / 127 (ggml's Q8_K),
and rx the same of the remainder x - dx * qx. ggml's single row moved whole-model logits by
4-5e-2 of their range against transformers, with 95-98% top-1 agreement (SmolLM2 Q4_K_M, Gemma
3 270M, decoded token by token); a scale per 32 instead would still have missed 1e-2 (2.6e-2,
simulated); the remainder row brings the activations' rounding to 1/254 of ggml's at the cost
of a second maddubs on the weight bytes already loaded.

A super-block's dot product is then, for Q4_K (weight = d sc_g q - dmin m_g, q in 0..15):
  d * sum_g sc_g (dx (q . qx)_g + dr (q . rx)_g)  -  dmin * sum_g m_g (sum of x' over g)
and for Q6_K (weight = d sc_s (q - 32), q in 0..63, a scale per 16):
  d * sum_s sc_s (dx (q . qx)_s + dr (q . rx)_s)  -  32 d sum_s sc_s (sum of x' over s),
x' = dx qx + dr rx, the dequantized activations. The dot products run in int32 lanes (their
largest sums stay below 2^26), so a matvec equals the dequantised weights times x' up to
float32 rounding: the error against float32 activations is the remainder's rounding alone,
sum_i |w_i| dr / 2 at most (tests/test_quant.py checks both).

Rows: two per pass, sharing each load of the activation bytes; 8 int32 lanes per super-block,
scaled into 8 float lanes per row once per super-block; prefetches walk the next pass's rows, a
cache line each, as qkernels.matvec_rows does.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from inferno.backends.ilanes import (
    bbits, bhigh, bload, fsum8, fzero8, iadd, ifma, izero, kscales, maddubs, maddwd, vamax,
    vrint, vstore_i8, wbytes, wfloat, wpair, wsplat,
)
from inferno.backends.kernels import FAST
from inferno.backends.lanes import f16at, prefetch, vfma, vload, vmul, vsplat, vstore, vsum, vzero

jit = nb.njit(cache=True, nogil=True, fastmath=FAST)
# For the per-block helpers: Numba compiles each jitted function on its own and leaves inlining to
# LLVM, which declined q6k_unit (its size): every super-block then paid a call that pushed ~40
# words of array arguments and returned its vectors through memory. Inlined in Numba's IR instead.
inline = nb.njit(cache=True, nogil=True, fastmath=FAST, inline="always")

QK = 256  # activations per scale, and weights per K-quant super-block
Q4_K_BYTES, Q6_K_BYTES = 144, 210


# -- the activation row --------------------------------------------------------------------------------
@jit
def empty():
    """The quantized activations of no row: what the drivers pass where none are needed."""
    return (np.empty(0, np.int8), np.empty(0, np.int8), np.empty(0, np.float32),
            np.empty(0, np.float32), np.empty(0, np.float32))


@jit
def quantize_k(x, x8, r8, dx, dr, xs, two):
    """x [n] (n a multiple of 256) as two int8 rows with a scale each per 256 values: x ~ dx * x8
    + dr * r8, x8 = round(x / dx) with dx = max|x| / 127 (ggml's Q8_K), and r8 the same of what
    that leaves, x - dx * x8 (at most dx / 2 a value). One int8 row alone moved whole-model logits
    by ~5e-2 of their range (module docstring); the residual row takes the error ~250x lower for
    a second integer dot product on weight bytes already in registers. xs [n / 8]: per 256
    values, the 16 float sums of the dequantized activations over each run of 16, then 16 lanes
    whose last 8 are its sums over each run of 32 (first 8 zero), so that each weight kind's
    offsets take theirs in one vector load. Without `two` only x8 is written (r8 and dr are
    empty), and xs sums dx * x8."""
    res = np.empty(QK, np.float32)
    for u in range(x.shape[0] // QK):
        o = QK * u
        amax = np.float32(0.0)
        for i in range(16):
            amax = max(amax, vamax(vload(x, o + 16 * i)))
        d = amax / np.float32(127.0)
        dx[u] = d
        inv = vsplat(np.float32(127.0) / amax if amax > 0 else np.float32(0.0))
        rmax = np.float32(0.0)
        for i in range(16):
            v = vload(x, o + 16 * i)
            q = vrint(vmul(v, inv))
            vstore_i8(x8, o + 16 * i, q)
            xs[32 * u + i] = d * vsum(q)  # sums of integers: exact
            if two:
                r = vfma(q, vsplat(-d), v)
                vstore(res, 16 * i, r)
                rmax = max(rmax, vamax(r))
        if two:
            e = rmax / np.float32(127.0)
            dr[u] = e
            rinv = vsplat(np.float32(127.0) / rmax if rmax > 0 else np.float32(0.0))
            for i in range(16):
                q = vrint(vmul(vload(res, 16 * i), rinv))
                vstore_i8(r8, o + 16 * i, q)
                xs[32 * u + i] += e * vsum(q)
        for g in range(8):
            xs[32 * u + 16 + g] = 0.0
            xs[32 * u + 24 + g] = xs[32 * u + 2 * g] + xs[32 * u + 2 * g + 1]


@jit
def quantize(x, two):
    """x [n] -> (x8, r8, dx, dr, xs) as quantize_k writes them (r8 and dr empty unless two)."""
    n = x.shape[0]
    m = n if two else 0
    x8, r8 = np.empty(n, np.int8), np.empty(m, np.int8)
    dx, dr = np.empty(n // QK, np.float32), np.empty(m // QK, np.float32)
    xs = np.empty(n // 8, np.float32)
    quantize_k(x, x8, r8, dx, dr, xs, two)
    return x8, r8, dx, dr, xs


# -- Q4_K ----------------------------------------------------------------------------------------------
@jit
def q4k_quarter(qa, x8, xo, sc, j):
    """Weights 64j..64j + 64 of a Q4_K super-block (qa: their 32 bytes of nibbles, low ones
    weights 0-31, high ones 32-63) against x8[xo:], each run of 32 times its 6-bit scale
    (lanes 2j and 2j + 1 of sc): 8 int32 partial sums."""
    lo = maddwd(maddubs(bbits(qa, 0, 15), bload(x8, xo)), wsplat(sc, 2 * j))
    hi = maddwd(maddubs(bbits(qa, 4, 15), bload(x8, xo + 32)), wsplat(sc, 2 * j + 1))
    return iadd(lo, hi)


@inline
def q4k_unit(f, o, x8, r8, dx, dr, xs, u, acc, macc):
    """The Q4_K super-block at byte o against the activations' super-block u: the row's float
    accumulators (acc: scaled dot products; macc: the mins' terms) advanced."""
    sc = kscales(f, o + 4)  # [8 scales, 8 mins]
    macc = vfma(vmul(wfloat(sc), vsplat(-f16at(f, o + 2))), vload(xs, 32 * u + 16), macc)
    s, t = izero(), izero()
    two = dr.shape[0] > 0
    for j in range(4):
        qa = bload(f, o + 16 + 32 * j)
        s = iadd(s, q4k_quarter(qa, x8, QK * u + 64 * j, sc, j))
        if two:
            t = iadd(t, q4k_quarter(qa, r8, QK * u + 64 * j, sc, j))
    d = f16at(f, o)
    acc = ifma(acc, s, d * dx[u])
    return (ifma(acc, t, d * dr[u]) if two else acc), macc


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
    return (bhigh(bbits(ql0, 0, 15), qh, 0), bhigh(bbits(ql1, 0, 15), qh, 2),
            bhigh(bbits(ql0, 4, 15), qh, 4), bhigh(bbits(ql1, 4, 15), qh, 6))


@inline
def q6k_unit(f, o, x8, r8, dx, dr, xs, u, acc, macc):
    sc = wbytes(f, o + 192, True)  # 16 int8 scales
    d = f16at(f, o + 208)
    macc = vfma(vmul(wfloat(sc), vsplat(np.float32(-32.0) * d)), vload(xs, 32 * u), macc)
    s, t = izero(), izero()
    two = dr.shape[0] > 0
    for h in range(2):
        w0, w1, w2, w3 = q6k_weights(f, o, h)
        s = iadd(s, q6k_half(w0, w1, w2, w3, x8, QK * u + 128 * h, sc, h))
        if two:
            t = iadd(t, q6k_half(w0, w1, w2, w3, r8, QK * u + 128 * h, sc, h))
    acc = ifma(acc, s, d * dx[u])
    return (ifma(acc, t, d * dr[u]) if two else acc), macc


# -- rows ----------------------------------------------------------------------------------------------
@jit
def k_rows(ub, w, x8, r8, dx, dr, xs, y, r0, r1):
    """y[r] = w[r] . x for rows r0..r1 of w, of Q4_K (ub = Q4_K_BYTES) or Q6_K (Q6_K_BYTES), x as
    quantize_k wrote it. ub a literal: each kind compiles its own loops."""
    f = w.reshape(-1)
    rb = w.shape[1]
    r = r0
    while r < r1:
        ra, rc = r * rb, min(r + 1, r1 - 1) * rb  # an odd last row is paired with itself
        a, c, ma, mc = fzero8(), fzero8(), vzero(), vzero()
        for u in range(rb // ub):
            p = rc + rb + 2 * ub * u  # the next pass's bytes, 2 ub a super-block
            for k in range((2 * ub + 63) // 64):
                prefetch(f, p + 64 * k)
            if ub == Q6_K_BYTES:
                a, ma = q6k_unit(f, ra + ub * u, x8, r8, dx, dr, xs, u, a, ma)
                c, mc = q6k_unit(f, rc + ub * u, x8, r8, dx, dr, xs, u, c, mc)
            else:
                a, ma = q4k_unit(f, ra + ub * u, x8, r8, dx, dr, xs, u, a, ma)
                c, mc = q4k_unit(f, rc + ub * u, x8, r8, dx, dr, xs, u, c, mc)
        y[r] = fsum8(a) + vsum(ma)
        if r + 1 < r1:
            y[r + 1] = fsum8(c) + vsum(mc)
        r += 2
