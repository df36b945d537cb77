"""Decode matvecs of K-quant weights against int8 activations: integer dot products, as
llama.cpp computes them (ggml's ggml_vec_dot_q4_K_q8_K and _q6_K_q8_K).

Why: with float32 activations a weight costs a widening, a conversion and a float multiply-add
(one core here: Q4_K 14.8 Gw/s, Q6_K 9.9); as bytes, x86 multiplies 32 weights by 32
activations and adds them in pairs in one instruction (ilanes.py), and the same matrices ran at
34 and 26 Gw/s. The activation row is quantized once per call (`quantize_k`), as ggml's Q8_K:
per 256 values one float scale dx = max|x| / 127, and x ~ dx * qx with qx = round(x / dx) in
[-127, 127]; with it, the integer sums of qx over each run of 16 and of 32.

A super-block's dot product is then, for Q4_K (weight = d sc_g q - dmin m_g, q in 0..15):
  dx * (d * sum_g sc_g (q . qx)_g  -  dmin * sum_g m_g (sum of qx over g))
and for Q6_K (weight = d sc_s (q - 32), q in 0..63, a scale per 16):
  dx * d * (sum_s sc_s (q . qx)_s  -  32 sum_s sc_s (sum of qx over s)).
The dot products run in int32 lanes (their largest sums stay below 2^26), the offset terms in
float32 on exact integers, so a matvec equals the dequantised weights times the dequantised
activations up to float32 rounding: the error against float32 activations is the activations'
rounding alone, sum_i |w_i| dx / 2 at most, as in ggml (tests/test_quant.py checks both).

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
from inferno.backends.lanes import f16at, prefetch, vfma, vload, vmul, vsplat, vsum, vzero

jit = nb.njit(cache=True, nogil=True, fastmath=FAST)

QK = 256  # activations per scale, and weights per K-quant super-block
Q4_K_BYTES, Q6_K_BYTES = 144, 210


# -- the activation row --------------------------------------------------------------------------------
@jit
def empty():
    """The quantized activations of no row: what the drivers pass where none are needed."""
    return np.empty(0, np.int8), np.empty(0, np.float32), np.empty(0, np.float32)


@jit
def quantize_k(x, x8, dx, xs):
    """x [n] (n a multiple of 256) as int8 x8 [n] with a scale dx [n / 256] per 256 values, and
    xs [n / 8]: per 256 values, the 16 sums of x8 over each run of 16, then 16 lanes whose last
    8 are its sums over each run of 32 (first 8 zero), so that each weight kind's offsets take
    theirs in one vector load. (As float32: integers below 2^12, exact.)"""
    for u in range(x.shape[0] // QK):
        o = QK * u
        amax = np.float32(0.0)
        for i in range(16):
            amax = max(amax, vamax(vload(x, o + 16 * i)))
        dx[u] = amax / np.float32(127.0)
        inv = vsplat(np.float32(127.0) / amax if amax > 0 else np.float32(0.0))
        for i in range(16):
            q = vrint(vmul(vload(x, o + 16 * i), inv))
            vstore_i8(x8, o + 16 * i, q)
            xs[32 * u + i] = vsum(q)
        for g in range(8):
            xs[32 * u + 16 + g] = 0.0
            xs[32 * u + 24 + g] = xs[32 * u + 2 * g] + xs[32 * u + 2 * g + 1]


@jit
def quantize(x):
    """x [n] -> (x8, dx, xs) as quantize_k writes them."""
    n = x.shape[0]
    x8, dx, xs = np.empty(n, np.int8), np.empty(n // QK, np.float32), np.empty(n // 8, np.float32)
    quantize_k(x, x8, dx, xs)
    return x8, dx, xs


# -- Q4_K ----------------------------------------------------------------------------------------------
@jit
def q4k_quarter(qa, x8, xo, sc, j):
    """Weights 64j..64j + 64 of a Q4_K super-block (qa: their 32 bytes of nibbles, low ones
    weights 0-31, high ones 32-63) against x8[xo:], each run of 32 times its 6-bit scale
    (lanes 2j and 2j + 1 of sc): 8 int32 partial sums."""
    lo = maddwd(maddubs(bbits(qa, 0, 15), bload(x8, xo)), wsplat(sc, 2 * j))
    hi = maddwd(maddubs(bbits(qa, 4, 15), bload(x8, xo + 32)), wsplat(sc, 2 * j + 1))
    return iadd(lo, hi)


@jit
def q4k_unit(f, o, x8, dx, xs, u, acc, macc):
    """The Q4_K super-block at byte o against the activations' super-block u: the row's float
    accumulators (acc: scaled dot products; macc: the mins' terms) advanced."""
    sc = kscales(f, o + 4)  # [8 scales, 8 mins]
    macc = vfma(vmul(wfloat(sc), vsplat(-f16at(f, o + 2) * dx[u])), vload(xs, 32 * u + 16), macc)
    s = izero()
    for j in range(4):
        s = iadd(s, q4k_quarter(bload(f, o + 16 + 32 * j), x8, QK * u + 64 * j, sc, j))
    return ifma(acc, s, f16at(f, o) * dx[u]), macc


# -- Q6_K ----------------------------------------------------------------------------------------------
@jit
def q6k_half(f, o, x8, xo, sc, h):
    """Weights 128h..128h + 128 of the Q6_K super-block at byte o against x8[xo:]: run t of 32
    is the low (t < 2) or high nibbles of bytes 64h + 32 (t % 2) of the 128 bytes of nibbles,
    with bits 2t..2t + 1 of bytes 32h of the 64 bytes of high bits above them, in 0..63; each
    16 of them times its int8 scale (lanes 8h + 2t and 8h + 2t + 1 of sc)."""
    ql0, ql1, qh = bload(f, o + 64 * h), bload(f, o + 64 * h + 32), bload(f, o + 128 + 32 * h)
    s0 = maddwd(maddubs(bhigh(bbits(ql0, 0, 15), qh, 0), bload(x8, xo)), wpair(sc, 8 * h))
    s1 = maddwd(maddubs(bhigh(bbits(ql1, 0, 15), qh, 2), bload(x8, xo + 32)), wpair(sc, 8 * h + 2))
    s2 = maddwd(maddubs(bhigh(bbits(ql0, 4, 15), qh, 4), bload(x8, xo + 64)), wpair(sc, 8 * h + 4))
    s3 = maddwd(maddubs(bhigh(bbits(ql1, 4, 15), qh, 6), bload(x8, xo + 96)), wpair(sc, 8 * h + 6))
    return iadd(iadd(s0, s1), iadd(s2, s3))


@jit
def q6k_unit(f, o, x8, dx, xs, u, acc, macc):
    sc = wbytes(f, o + 192, True)  # 16 int8 scales
    d = f16at(f, o + 208) * dx[u]
    macc = vfma(vmul(wfloat(sc), vsplat(np.float32(-32.0) * d)), vload(xs, 32 * u), macc)
    s = iadd(q6k_half(f, o, x8, QK * u, sc, 0), q6k_half(f, o, x8, QK * u + 128, sc, 1))
    return ifma(acc, s, d), macc


# -- rows ----------------------------------------------------------------------------------------------
@jit
def k_rows(ub, w, x8, dx, xs, y, r0, r1):
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
                a, ma = q6k_unit(f, ra + ub * u, x8, dx, xs, u, a, ma)
                c, mc = q6k_unit(f, rc + ub * u, x8, dx, xs, u, c, mc)
            else:
                a, ma = q4k_unit(f, ra + ub * u, x8, dx, xs, u, a, ma)
                c, mc = q4k_unit(f, rc + ub * u, x8, dx, xs, u, c, mc)
        y[r] = fsum8(a) + vsum(ma)
        if r + 1 < r1:
            y[r + 1] = fsum8(c) + vsum(mc)
        r += 2
