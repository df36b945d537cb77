"""Prefill's products of K-quant weights (Q4_K, Q5_K, Q6_K) with int8 activations: a GEMM on panels of
eight weight rows, interleaved by fours, as llama.cpp's repacked CPU kernels multiply them
(ggml-cpu's repack.cpp, block_q4_Kx8).

Why a panel: qdot.k_few multiplies one weight row's 32 bytes by one activation row's 32 in each
maddubs, so every 32 products pay for their own scale (a maddwd) and their own add. In a panel
the 32 bytes of one load hold four consecutive weights of each of eight rows (lane i of the
int32 view: row i's weights k..k + 3), and one activation's four values k..k + 3, broadcast to
all eight lanes, meet them in one vpdpbusd: eight rows' partial dot products at once, in int32,
with no widening between. A group of 32 weights (Q4_K, Q5_K; 16 for Q6_K), eight (four) such steps,
then takes its eight rows' scales in one int32 multiply, and a super-block its eight rows' d in
one float multiply-add. Two panels (sixteen rows) go side by side and four activation rows meet
them (two with the remainder rows, which need registers of their own), so one step is two
32-byte loads, four 4-byte broadcasts and eight dpbusd: the loads stay below what the cores can
issue, which one panel at a time (five loads to four dpbusd) was not. Where the machine has no
VNNI (`WIDE`), a step is vpmaddubsw + vpaddw into int16 sums, widened and scaled by one vpmaddwd
per run of steps that cannot overflow (`chunk`): the same integers, so the same results.

The panels are packed as a call needs them, sixteen rows at a time, into scratch that stays in
L1/L2 while every activation row goes by, as a BLAS packs its panels: the weights stay mapped as
the file has them (nothing beside them for the process's life, no load-time work, decode's
kernels unchanged). A whole panel's run of 32 weights is eight loads (one a row), the nibbles
split in bytes, and an 8x8 transpose of 4-byte words in registers (24 shuffles) into eight
steps; a short last panel goes the same way from a zero-padded copy of its rows, and only the
scales go one by one. Still, below some 16-32 activation rows qdot.k_few, which reads the
weights as they lie, is the quicker (qkernels.GEMM_MIN); at 512 the panels run at about twice its rate.

Panel layout, per super-block u of the eight rows:
  pq:  uint8 [64 steps][8 rows][4]: row i's weights 4t..4t + 3 of the super-block (unsigned:
       Q4_K's 0..15, Q5_K's 0..31, Q6_K's 0..63) at bytes 32 (64 u + t) + 4 i;
  psc: int32 [groups][8]: each group's integer scale per row (Q4_K's and Q5_K's 6-bit sc, Q6_K's int8);
  pd:  float32 [8]: each row's d;
  pm:  float32 [groups][8]: what the sum of a group's dequantized activations is multiplied by
       and added: Q4_K's and Q5_K's -dmin m, Q6_K's -32 d sc (its weights are q - 32).
A row's result is then, with x' = dx qx + dr rx and S_g the sum of x' over group g (from
qdot.quantize_rows' sums of 16):
  sum_u d_u (dx_u sum_g sc_g (q . qx)_g + dr_u sum_g sc_g (q . rx)_g) + sum_u sum_g pm_g S_g,
the same integers as qdot's kernels sum, so the two agree up to float32 rounding: a row's
logits do not depend on whether it came in a prefill (here) or alone (qdot.k_rows).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from inferno.backends.numba.dense import FAST
from inferno.backends.numba.ilanes import (
    _vnni, bbits, bhigh, bload, bsplat4, bstore_columns, dpbusd, fast_int_dot, ffma8, fload8, fmul8,
    fsplat8, fstore8, fzero8, iadd, ifloat, iload, imul, izero, maddubs, maddwd, wadd, wdup, wzero,
)
from inferno.backends.numba.lanes import f16at
from inferno.backends.numba.qdot import (
    FOUR, NO, ONE, Q5_K_BYTES, Q6_K_BYTES, QK, TWO_ROWS, YES, q6k_weights,
)

jit = nb.njit(cache=True, nogil=True, fastmath=FAST)
inline = nb.njit(cache=True, nogil=True, fastmath=FAST, inline="always")

P = 8  # weight rows per panel: one int32 lane each
STEPS = QK // 4  # dpbusd steps per super-block
RUNS = QK // 16  # runs of 16 activations per super-block (qdot's sums)
# Without VNNI, int16 sums (see `wide_step`), fixed when the kernels compile, as ilanes' choice is.
WIDE = not (fast_int_dot() and _vnni())


@jit
def buffers(units):
    """Scratch for one panel of `units` super-blocks: (pq, psc, pd, pm)."""
    return (np.empty(units * STEPS * 32, np.uint8), np.empty(units * RUNS * P, np.int32),
            np.empty(units * P, np.float32), np.empty(units * RUNS * P, np.float32))


# -- packing -------------------------------------------------------------------------------------------
@jit
def q4k_scale_min(f, o, g):
    """Scale and min of group g (0..7) from the 12 packed bytes at f[o:] (ggml's
    get_scale_min_k4)."""
    if g < 4:
        return f[o + g] & 63, f[o + g + 4] & 63
    sc = (f[o + g + 4] & 0xF) | ((f[o + g - 4] >> 6) << 4)
    m = (f[o + g + 4] >> 4) | ((f[o + g] >> 6) << 4)
    return sc, m


@jit
def pack_q4k_scales(f, o, u, i, psc, pd, pm):
    """The scales of the Q4_K or Q5_K super-block at byte o as super-block u of panel row i."""
    pd[P * u + i] = f16at(f, o)
    dmin = f16at(f, o + 2)
    for g in range(8):
        sc, m = q4k_scale_min(f, o + 4, g)
        psc[(8 * u + g) * P + i] = sc
        pm[(8 * u + g) * P + i] = -dmin * np.float32(m)


@jit
def pack_q6k_scales(f, o, u, i, psc, pd, pm):
    """The scales of the Q6_K super-block at byte o (128 bytes of low nibbles, 64 of high bits,
    16 int8 scales, f16 d) as super-block u of panel row i."""
    d = f16at(f, o + 208)
    pd[P * u + i] = d
    for s in range(16):
        sc = np.int32(np.int8(f[o + 192 + s]))
        psc[(16 * u + s) * P + i] = sc
        pm[(16 * u + s) * P + i] = np.float32(-32.0) * d * np.float32(sc)


@jit
def pack_q4k_weights(ub, f, o, rb, u, pq):
    """The weights of super-block u of eight whole rows (the first at byte o, rb bytes apart),
    Q4_K or Q5_K, into the panel: each run of 32 of them for the eight rows loaded as eight
    vectors and stored as its eight steps, transposed in registers."""
    qs = 48 if ub == Q5_K_BYTES else 16
    for j in range(4):
        a = o + qs + 32 * j
        q0, q1, q2, q3 = bload(f, a), bload(f, a + rb), bload(f, a + 2 * rb), bload(f, a + 3 * rb)
        q4, q5, q6, q7 = bload(f, a + 4 * rb), bload(f, a + 5 * rb), bload(f, a + 6 * rb), bload(f, a + 7 * rb)
        for half in range(2):  # low nibbles: weights 64j..; high: 64j + 32..
            s = 4 * half
            w0, w1, w2, w3 = bbits(q0, s, 15), bbits(q1, s, 15), bbits(q2, s, 15), bbits(q3, s, 15)
            w4, w5, w6, w7 = bbits(q4, s, 15), bbits(q5, s, 15), bbits(q6, s, 15), bbits(q7, s, 15)
            if ub == Q5_K_BYTES:
                g = 2 * j + half  # the group's fifth bits: bit g of bytes 16..48
                w0, w1 = bhigh(w0, bload(f, o + 16), g, 1), bhigh(w1, bload(f, o + rb + 16), g, 1)
                w2, w3 = bhigh(w2, bload(f, o + 2 * rb + 16), g, 1), bhigh(w3, bload(f, o + 3 * rb + 16), g, 1)
                w4, w5 = bhigh(w4, bload(f, o + 4 * rb + 16), g, 1), bhigh(w5, bload(f, o + 5 * rb + 16), g, 1)
                w6, w7 = bhigh(w6, bload(f, o + 6 * rb + 16), g, 1), bhigh(w7, bload(f, o + 7 * rb + 16), g, 1)
            bstore_columns(pq, 32 * (STEPS * u + 16 * j + 8 * half), w0, w1, w2, w3, w4, w5, w6, w7)


@jit
def pack_q6k_weights(f, o, rb, u, pq):
    """As pack_q4k_weights, for Q6_K: each row's runs of 32 as qdot.q6k_weights unpacks them."""
    for h in range(2):
        a0, b0, c0, d0 = q6k_weights(f, o, h)
        a1, b1, c1, d1 = q6k_weights(f, o + rb, h)
        a2, b2, c2, d2 = q6k_weights(f, o + 2 * rb, h)
        a3, b3, c3, d3 = q6k_weights(f, o + 3 * rb, h)
        a4, b4, c4, d4 = q6k_weights(f, o + 4 * rb, h)
        a5, b5, c5, d5 = q6k_weights(f, o + 5 * rb, h)
        a6, b6, c6, d6 = q6k_weights(f, o + 6 * rb, h)
        a7, b7, c7, d7 = q6k_weights(f, o + 7 * rb, h)
        st = STEPS * u + 32 * h
        bstore_columns(pq, 32 * st, a0, a1, a2, a3, a4, a5, a6, a7)
        bstore_columns(pq, 32 * (st + 8), b0, b1, b2, b3, b4, b5, b6, b7)
        bstore_columns(pq, 32 * (st + 16), c0, c1, c2, c3, c4, c5, c6, c7)
        bstore_columns(pq, 32 * (st + 24), d0, d1, d2, d3, d4, d5, d6, d7)


@jit
def pack_rows(ub, f, o, rb, pq, psc, pd, pm):
    """The eight rows of f at bytes o, o + rb, .. (Q4_K, Q5_K or Q6_K; ub its bytes) as one
    panel."""
    for u in range(rb // ub):
        for i in range(P):
            if ub == Q6_K_BYTES:
                pack_q6k_scales(f, o + i * rb + ub * u, u, i, psc, pd, pm)
            else:
                pack_q4k_scales(f, o + i * rb + ub * u, u, i, psc, pd, pm)
        if ub == Q6_K_BYTES:
            pack_q6k_weights(f, o + ub * u, rb, u, pq)
        else:
            pack_q4k_weights(ub, f, o + ub * u, rb, u, pq)


@jit
def pack(ub, w, p0, n, pq, psc, pd, pm, pad):
    """Rows p0..p0 + n (n <= 8) of w as one panel. A short one goes through `pad` (eight rows of
    scratch) with zero bytes past its rows: their weights, scales and d are all zero, so their
    lanes are computed and dropped."""
    f = w.reshape(-1)
    rb = w.shape[1]
    if n == P:
        pack_rows(ub, f, p0 * rb, rb, pq, psc, pd, pm)
    else:
        pad[:] = 0
        pad[:n * rb] = f[p0 * rb:(p0 + n) * rb]
        pack_rows(ub, pad, 0, rb, pq, psc, pd, pm)


# -- two panels against activation rows ---------------------------------------------------------------
# The state of one activation row against a pair of panels (sixteen weight rows), in registers:
# a group's int32 sums (g: panel a, panel b, and the same of the remainder row), a super-block's
# scaled sums (s, alike) and the float results (f: panel a, panel b).
@inline
def step(qa, qb, x8, r8, st, k, two, g):
    """Step st of both panels against the four bytes at x8[k:] (and r8[k:])."""
    wa, wb = bload(qa, 32 * st), bload(qb, 32 * st)  # shared by every row (LLVM merges the loads)
    x = bsplat4(x8, k)
    a, b, ra, rb = g
    a, b = dpbusd(a, wa, x), dpbusd(b, wb, x)
    if two:
        y = bsplat4(r8, k)
        ra, rb = dpbusd(ra, wa, y), dpbusd(rb, wb, y)
    return a, b, ra, rb


@inline
def wide_step(qa, qb, x8, r8, st, k, two, h):
    """As `step`, where the machine has no VNNI: maddubs' pairs of products added in int16, with
    no vpmaddwd and no int32 add a step (ilanes.dpbusd's three instructions become two, and one
    multiply); `chunk` says for how many steps the int16 sums cannot overflow."""
    wa, wb = bload(qa, 32 * st), bload(qb, 32 * st)
    x = bsplat4(x8, k)
    a, b, ra, rb = h
    a, b = wadd(a, maddubs(wa, x)), wadd(b, maddubs(wb, x))
    if two:
        y = bsplat4(r8, k)
        ra, rb = wadd(ra, maddubs(wa, y)), wadd(rb, maddubs(wb, y))
    return a, b, ra, rb


@inline
def chunk(ub):
    """Steps whose int16 sums stay below 2^15 with activations in -127..127: a maddubs lane holds
    two products of at most 127 q, so Q4_K (q <= 15) 8 steps (30,480), Q5_K (31) 4 (31,496), Q6_K
    (63) 2 (32,004)."""
    if ub == Q6_K_BYTES:
        return 2
    return 4 if ub == Q5_K_BYTES else 8


@inline
def wide_scaled(h, sca, scb, s):
    """s + int16 sums times their rows' scales (wdup'ed): one vpmaddwd adds each row's two
    pairs and applies its scale at once."""
    return (iadd(s[0], maddwd(h[0], sca)), iadd(s[1], maddwd(h[1], scb)),
            iadd(s[2], maddwd(h[2], sca)), iadd(s[3], maddwd(h[3], scb)))


@inline
def scaled(g, sca, scb, s):
    """s + a group's sums times its rows' scales (the remainder's are zeros without `two`: LLVM
    folds them away)."""
    return (iadd(s[0], imul(g[0], sca)), iadd(s[1], imul(g[1], scb)),
            iadd(s[2], imul(g[2], sca)), iadd(s[3], imul(g[3], scb)))


@inline
def offset(f, ma, mb, xsum):
    """f + the group's mins (Q6_K: its -32 offset) times the sum of its dequantized activations."""
    v = fsplat8(xsum)
    return ffma8(ma, v, f[0]), ffma8(mb, v, f[1])


@inline
def unit_end(f, s, da, db, dxs, drs, two):
    """f + a super-block's scaled sums times d and the activations' scales."""
    fa = ffma8(ifloat(s[0]), fmul8(da, fsplat8(dxs)), f[0])
    fb = ffma8(ifloat(s[1]), fmul8(db, fsplat8(dxs)), f[1])
    if two:
        fa = ffma8(ifloat(s[2]), fmul8(da, fsplat8(drs)), fa)
        fb = ffma8(ifloat(s[3]), fmul8(db, fsplat8(drs)), fb)
    return fa, fb


@inline
def group_sum(ub, s16, b, u, g):
    """The sum of the dequantized activations of row b over group g of super-block u."""
    if ub == Q6_K_BYTES:
        return s16[b, RUNS * u + g]
    return s16[b, RUNS * u + 2 * g] + s16[b, RUNS * u + 2 * g + 1]


@jit
def panels(ub, rows, two, pa, pb, units, x8, r8, dx, dr, s16, out, b, p0, n):
    """out[b..b + rows, p0..p0 + n] = the rows of panels pa and pb (n <= 16: pa's eight, then
    pb's) against activation rows b..b + rows (rows 1, 2 or 4 and two literals)."""
    qa, sca_, da_, ma_ = pa
    qb, scb_, db_, mb_ = pb
    groups = 16 if ub == Q6_K_BYTES else 8
    steps = STEPS // groups
    cols = x8.shape[1]
    z, wz, fz = izero(), wzero(), fzero8()
    f0 = f1 = f2 = f3 = (fz, fz)
    for u in range(units):
        s0 = s1 = s2 = s3 = (z, z, z, z)
        for g in range(groups):
            st0 = STEPS * u + steps * g
            k = b * cols + QK * u + 4 * steps * g
            o = (groups * u + g) * P
            sca, scb, ma, mb = iload(sca_, o), iload(scb_, o), fload8(ma_, o), fload8(mb_, o)
            if WIDE:
                sca16, scb16 = wdup(sca), wdup(scb)
                c = chunk(ub)
                for t0 in range(0, steps, c):
                    h0 = h1 = h2 = h3 = (wz, wz, wz, wz)
                    for t in range(t0, t0 + c):
                        h0 = wide_step(qa, qb, x8, r8, st0 + t, k + 4 * t, two, h0)
                        if rows >= 2:
                            h1 = wide_step(qa, qb, x8, r8, st0 + t, k + cols + 4 * t, two, h1)
                        if rows == 4:
                            h2 = wide_step(qa, qb, x8, r8, st0 + t, k + 2 * cols + 4 * t, two, h2)
                            h3 = wide_step(qa, qb, x8, r8, st0 + t, k + 3 * cols + 4 * t, two, h3)
                    s0 = wide_scaled(h0, sca16, scb16, s0)
                    if rows >= 2:
                        s1 = wide_scaled(h1, sca16, scb16, s1)
                    if rows == 4:
                        s2 = wide_scaled(h2, sca16, scb16, s2)
                        s3 = wide_scaled(h3, sca16, scb16, s3)
            else:
                g0 = g1 = g2 = g3 = (z, z, z, z)
                for t in range(steps):
                    g0 = step(qa, qb, x8, r8, st0 + t, k + 4 * t, two, g0)
                    if rows >= 2:
                        g1 = step(qa, qb, x8, r8, st0 + t, k + cols + 4 * t, two, g1)
                    if rows == 4:
                        g2 = step(qa, qb, x8, r8, st0 + t, k + 2 * cols + 4 * t, two, g2)
                        g3 = step(qa, qb, x8, r8, st0 + t, k + 3 * cols + 4 * t, two, g3)
                s0 = scaled(g0, sca, scb, s0)
                if rows >= 2:
                    s1 = scaled(g1, sca, scb, s1)
                if rows == 4:
                    s2 = scaled(g2, sca, scb, s2)
                    s3 = scaled(g3, sca, scb, s3)
            f0 = offset(f0, ma, mb, group_sum(ub, s16, b, u, g))
            if rows >= 2:
                f1 = offset(f1, ma, mb, group_sum(ub, s16, b + 1, u, g))
            if rows == 4:
                f2 = offset(f2, ma, mb, group_sum(ub, s16, b + 2, u, g))
                f3 = offset(f3, ma, mb, group_sum(ub, s16, b + 3, u, g))
        da, db = fload8(da_, P * u), fload8(db_, P * u)
        f0 = unit_end(f0, s0, da, db, dx[b, u], dr[b, u] if two else 0.0, two)
        if rows >= 2:
            f1 = unit_end(f1, s1, da, db, dx[b + 1, u], dr[b + 1, u] if two else 0.0, two)
        if rows == 4:
            f2 = unit_end(f2, s2, da, db, dx[b + 2, u], dr[b + 2, u] if two else 0.0, two)
            f3 = unit_end(f3, s3, da, db, dx[b + 3, u], dr[b + 3, u] if two else 0.0, two)
    lanes = np.empty(4 * 2 * P, np.float32)
    fstore8(lanes, 0, f0[0])
    fstore8(lanes, P, f0[1])
    fstore8(lanes, 2 * P, f1[0])
    fstore8(lanes, 3 * P, f1[1])
    fstore8(lanes, 4 * P, f2[0])
    fstore8(lanes, 5 * P, f2[1])
    fstore8(lanes, 6 * P, f3[0])
    fstore8(lanes, 7 * P, f3[1])
    for a in range(rows):
        for i in range(n):
            out[b + a, p0 + i] = lanes[2 * P * a + i]


@jit
def _pass(ub, rows, two, pa, pb, units, x8, r8, dx, dr, s16, out, b, p0, n):
    """panels with `two` made a literal (rows already is one)."""
    if two:
        panels(ub, rows, YES, pa, pb, units, x8, r8, dx, dr, s16, out, b, p0, n)
    else:
        panels(ub, rows, NO, pa, pb, units, x8, r8, dx, dr, s16, out, b, p0, n)


@jit
def k_gemm(ub, w, x8, r8, dx, dr, s16, out, r0, r1):
    """out[b, r] = w[r] . x'[b] for rows r0..r1 of w (Q4_K, Q5_K or Q6_K; ub its bytes) and every
    activation row b that qdot.quantize wrote: sixteen weight rows at a time, packed once as two
    panels and then met by the activation rows four at a time (two with the remainder rows,
    whose sums need registers of their own), then two, then one. Same arguments as qdot.k_few."""
    B = x8.shape[0]
    two = dr.shape[0] > 0
    units = w.shape[1] // ub
    pa, pb = buffers(units), buffers(units)
    pad = np.empty(P * w.shape[1], np.uint8)
    for p0 in range(r0, r1, 2 * P):
        n = min(2 * P, r1 - p0)
        pack(ub, w, p0, min(P, n), pa[0], pa[1], pa[2], pa[3], pad)
        pack(ub, w, p0 + P, max(n - P, 0), pb[0], pb[1], pb[2], pb[3], pad)
        b = 0
        while b + 4 <= B and not two:
            _pass(ub, FOUR, two, pa, pb, units, x8, r8, dx, dr, s16, out, b, p0, n)
            b += 4
        while b + 2 <= B:
            _pass(ub, TWO_ROWS, two, pa, pb, units, x8, r8, dx, dr, s16, out, b, p0, n)
            b += 2
        if b < B:
            _pass(ub, ONE, two, pa, pb, units, x8, r8, dx, dr, s16, out, b, p0, n)
