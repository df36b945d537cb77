"""Prefill's products of K-quant weights (Q4_K, Q5_K, Q6_K) with int8 activations: a GEMM on panels of
sixteen weight rows, interleaved by fours, as llama.cpp's repacked CPU kernels multiply them
(ggml-cpu's repack.cpp, block_q4_Kx8).

Why a panel: qdot.k_few multiplies one weight row's 32 bytes by one activation row's 32 in each
maddubs, so every 32 products pay for their own scale (a maddwd) and their own add. In a panel
the 64 bytes of one step hold four consecutive weights of each of sixteen rows (lane i of the
int32 view: row i's weights k..k + 3), and one activation's four values k..k + 3, broadcast to
all sixteen lanes, meet them in one vpdpbusd: sixteen rows' partial dot products at once, in
int32, with no widening between. A group of 32 weights (Q4_K, Q5_K; 16 for Q6_K), eight (four)
such steps, then takes its sixteen rows' scales in one int32 multiply, and a super-block its
rows' d in one float multiply-add. Eight activation rows meet a panel per pass where the machine
has AVX-512's 32 vector registers, four where it has AVX2's 16 (half as many with the remainder
rows, which need registers of their own), so one step is one 64-byte load, eight 4-byte
broadcasts (folded into the vpdpbusd as memory operands) and eight vpdpbusd. The vectors are 512 bits (ilanes' i8x64, i32x16): one zmm
instruction each where the machine has AVX-512 (VNNI for vpdpbusd), two ymm ones elsewhere
(the first and second eight rows, as two panels of eight side by side were before: the same
instructions).
Where the machine has no VNNI (`WIDE`), a step is vpmaddubsw + vpaddw into int16 sums, widened
and scaled by one vpmaddwd per run of steps that cannot overflow (`chunk`): the same integers,
so the same results.

The panels are packed as a call needs them, sixteen rows at a time, into scratch that stays in
L1/L2 while every activation row goes by, as a BLAS packs its panels: the weights stay mapped as
the file has them (nothing beside them for the process's life, no load-time work, decode's
kernels unchanged). Eight rows' run of 32 weights is eight loads (one a row), the nibbles split
in bytes, and an 8x8 transpose of 4-byte words in registers (24 shuffles) into one half of
eight steps; a short last panel goes the same way from a zero-padded copy of its rows, and only
the scales go one by one. Still, below some 16-32 activation rows qdot.k_few, which reads the
weights as they lie, is the quicker (dispatch.GEMM_MIN); at 512 the panels run at two to three
times its rate.

Panel layout, per super-block u of the sixteen rows:
  pq:  uint8 [64 steps][2 halves][8 rows][4]: row 8h + i's weights 4t..4t + 3 of the super-block
       (unsigned: Q4_K's 0..15, Q5_K's 0..31, Q6_K's 0..63) at bytes 64 (64 u + t) + 32 h + 4 i;
  psc: int32 [groups][16]: each group's integer scale per row (Q4_K's and Q5_K's 6-bit sc, Q6_K's int8);
  pd:  float32 [16]: each row's d;
  pm:  int16 [8 pairs][16][2]: what each group's (Q6_K: run's) sum of the int8 activations is
       multiplied by, two groups a lane: Q4_K's and Q5_K's mins, Q6_K's scales;
  po:  float32 [16]: each row's offset factor, Q4_K's and Q5_K's -dmin, Q6_K's -32 d (its
       weights are q - 32).
A row's result is then the sum over super-blocks of qdot.k_tail's four terms, from the same
integers as qdot's kernels sum (s and t here, m and n at the super-block's end, `offsets`), in
the same order with the same roundings: a row's logits are the same bits whether it came in a
prefill (here) or alone (qdot.k_rows).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from inferno.backends.numba.dense import FAST
from inferno.backends.numba.ilanes import (
    _vnni, bbits, bhigh, bload, bstore_columns, dpbusd, dpwssd, fast_int_dot, iadd, ifloat, imul,
    maddubs, maddwd, wadd, wdup, zbload, zbsplat4, zhload, zhsplat2, ziload, zizero, zmm_registers,
    zwzero,
)
from inferno.backends.numba.lanes import f16at, vfma_exact, vload, vmul, vsplat, vstore, vzero
from inferno.backends.numba.qdot import (
    FOUR, NO, Q5_K_BYTES, Q6_K_BYTES, QK, SUMS, TWO_ROWS, YES, q6k_weights, remainder_scale,
)

jit = nb.njit(cache=True, nogil=True, fastmath=FAST)
inline = nb.njit(cache=True, nogil=True, fastmath=FAST, inline="always")

P = 8  # weight rows per transposed block: one int32 lane of a 256-bit half each
ROWS = 2 * P  # weight rows per panel: one int32 lane of a 512-bit vector each
STEP_BYTES = 4 * ROWS  # one step: every row's four weights
STEPS = QK // 4  # dpbusd steps per super-block
RUNS = QK // 16  # runs of 16 activations per super-block
PAIRS = RUNS // 2  # int16 pairs of pm per super-block (Q4_K and Q5_K use the first four)
# Without VNNI, int16 sums (see `step`), fixed when the kernels compile, as ilanes' choice is.
WIDE = not (fast_int_dot() and _vnni())
# Activation rows per pass: a row's sums take three 512-bit vectors (five with its remainder
# row), so AVX-512's 32 zmm registers hold eight rows (four with remainder rows). Without
# AVX-512 each vector is two ymm halves and four rows (two) already spill a little, as the two
# panels of eight did before; eight measured slower there (bench/RESULTS.md, "Panels in zmm").
DEEP = zmm_registers()
EIGHT = 8
HIGH = EIGHT if DEEP else FOUR  # rows a pass
HIGH_TWO = FOUR if DEEP else TWO_ROWS  # rows a pass, with remainder rows
GEMM_ROWS_MIN = HIGH  # fewer activation rows than a pass are qdot.k_few's (dispatch.GEMM_MIN is more)
# A run of steps sums in int16 without VNNI (`step`), else in int32.
_sums_zero = zwzero if WIDE else zizero


@jit
def buffers(units):
    """Scratch for one panel of `units` super-blocks: (pq, psc, pd, pm, po)."""
    return (np.empty(units * STEPS * STEP_BYTES, np.uint8), np.empty(units * RUNS * ROWS, np.int32),
            np.empty(units * ROWS, np.float32), np.empty(units * PAIRS * ROWS * 2, np.int16),
            np.empty(units * ROWS, np.float32))


@inline
def pm_at(u, g, i):
    """Where group (run) g's factor of row i sits in pm, in super-block u."""
    return 2 * (ROWS * (PAIRS * u + g // 2) + i) + g % 2


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
def pack_q4k_scales(f, o, u, i, psc, pd, pm, po):
    """The scales of the Q4_K or Q5_K super-block at byte o as super-block u of panel row i."""
    pd[ROWS * u + i] = f16at(f, o)
    po[ROWS * u + i] = -f16at(f, o + 2)
    for g in range(8):
        sc, m = q4k_scale_min(f, o + 4, g)
        psc[(8 * u + g) * ROWS + i] = sc
        pm[pm_at(u, g, i)] = m


@jit
def pack_q6k_scales(f, o, u, i, psc, pd, pm, po):
    """The scales of the Q6_K super-block at byte o (128 bytes of low nibbles, 64 of high bits,
    16 int8 scales, f16 d) as super-block u of panel row i."""
    d = f16at(f, o + 208)
    pd[ROWS * u + i] = d
    po[ROWS * u + i] = np.float32(-32.0) * d
    for s in range(16):
        sc = np.int32(np.int8(f[o + 192 + s]))
        psc[(16 * u + s) * ROWS + i] = sc
        pm[pm_at(u, s, i)] = sc


@jit
def pack_q4k_weights(ub, f, o, rb, u, pq, half):
    """The weights of super-block u of eight whole rows (the first at byte o, rb bytes apart),
    Q4_K or Q5_K, into half `half` of the panel's steps: each run of 32 of them for the eight
    rows loaded as eight vectors and stored as its eight steps, transposed in registers."""
    qs = 48 if ub == Q5_K_BYTES else 16
    for j in range(4):
        a = o + qs + 32 * j
        q0, q1, q2, q3 = bload(f, a), bload(f, a + rb), bload(f, a + 2 * rb), bload(f, a + 3 * rb)
        q4, q5, q6, q7 = bload(f, a + 4 * rb), bload(f, a + 5 * rb), bload(f, a + 6 * rb), bload(f, a + 7 * rb)
        for nib in range(2):  # low nibbles: weights 64j..; high: 64j + 32..
            s = 4 * nib
            w0, w1, w2, w3 = bbits(q0, s, 15), bbits(q1, s, 15), bbits(q2, s, 15), bbits(q3, s, 15)
            w4, w5, w6, w7 = bbits(q4, s, 15), bbits(q5, s, 15), bbits(q6, s, 15), bbits(q7, s, 15)
            if ub == Q5_K_BYTES:
                g = 2 * j + nib  # the group's fifth bits: bit g of bytes 16..48
                w0, w1 = bhigh(w0, bload(f, o + 16), g, 1), bhigh(w1, bload(f, o + rb + 16), g, 1)
                w2, w3 = bhigh(w2, bload(f, o + 2 * rb + 16), g, 1), bhigh(w3, bload(f, o + 3 * rb + 16), g, 1)
                w4, w5 = bhigh(w4, bload(f, o + 4 * rb + 16), g, 1), bhigh(w5, bload(f, o + 5 * rb + 16), g, 1)
                w6, w7 = bhigh(w6, bload(f, o + 6 * rb + 16), g, 1), bhigh(w7, bload(f, o + 7 * rb + 16), g, 1)
            at = STEP_BYTES * (STEPS * u + 16 * j + 8 * nib) + 32 * half
            bstore_columns(pq, at, STEP_BYTES, w0, w1, w2, w3, w4, w5, w6, w7)


@jit
def pack_q6k_weights(f, o, rb, u, pq, half):
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
        at = STEP_BYTES * (STEPS * u + 32 * h) + 32 * half
        bstore_columns(pq, at, STEP_BYTES, a0, a1, a2, a3, a4, a5, a6, a7)
        bstore_columns(pq, at + 8 * STEP_BYTES, STEP_BYTES, b0, b1, b2, b3, b4, b5, b6, b7)
        bstore_columns(pq, at + 16 * STEP_BYTES, STEP_BYTES, c0, c1, c2, c3, c4, c5, c6, c7)
        bstore_columns(pq, at + 24 * STEP_BYTES, STEP_BYTES, d0, d1, d2, d3, d4, d5, d6, d7)


@jit
def pack_rows(ub, f, o, rb, pq, psc, pd, pm, po):
    """The sixteen rows of f at bytes o, o + rb, .. (Q4_K, Q5_K or Q6_K; ub its bytes) as one
    panel."""
    for u in range(rb // ub):
        for i in range(ROWS):
            if ub == Q6_K_BYTES:
                pack_q6k_scales(f, o + i * rb + ub * u, u, i, psc, pd, pm, po)
            else:
                pack_q4k_scales(f, o + i * rb + ub * u, u, i, psc, pd, pm, po)
        for half in range(2):
            if ub == Q6_K_BYTES:
                pack_q6k_weights(f, o + P * half * rb + ub * u, rb, u, pq, half)
            else:
                pack_q4k_weights(ub, f, o + P * half * rb + ub * u, rb, u, pq, half)


@jit
def pack(ub, w, p0, n, pq, psc, pd, pm, po, pad):
    """Rows p0..p0 + n (n <= 16) of w as one panel. A short one goes through `pad` (sixteen rows
    of scratch) with zero bytes past its rows: their weights, scales and d are all zero, so their
    lanes are computed and dropped."""
    f = w.reshape(-1)
    rb = w.shape[1]
    src, o = f, p0 * rb
    if n < ROWS:
        pad[:] = 0
        for i in range(n * rb):  # (a loop: a slice assignment's shape check compiles its message)
            pad[i] = f[p0 * rb + i]
        src, o = pad, np.int64(0)
    # One call, its source typed as w (a read-only pad where w is read-only): a call for each
    # would have compiled pack_rows and its unrolled loops twice.
    pack_rows(ub, src, o, rb, pq, psc, pd, pm, po)


# -- a panel against activation rows ------------------------------------------------------------------
# The state of one activation row against a panel (sixteen weight rows), in registers: a group's
# int32 sums (g: the row's, and the same of its remainder row), a super-block's scaled sums (s,
# alike) and the float results (f).
@inline
def step(q, x8, r8, st, k, two, g):
    """Step st of the panel against the four bytes at x8[k:] (and r8[k:]): vpdpbusd into int32
    sums; where the machine has no VNNI (`WIDE`) maddubs' pairs of products added in int16, with
    no vpmaddwd and no int32 add a step (ilanes.dpbusd's three instructions become two, and one
    multiply; `chunk` says for how many steps the int16 sums cannot overflow)."""
    w = zbload(q, STEP_BYTES * st)  # shared by every row (LLVM merges the loads)
    a, ra = g
    if WIDE:
        a = wadd(a, maddubs(w, zbsplat4(x8, k)))
        if two:
            ra = wadd(ra, maddubs(w, zbsplat4(r8, k)))
    else:
        a = dpbusd(a, w, zbsplat4(x8, k))
        if two:
            ra = dpbusd(ra, w, zbsplat4(r8, k))
    return a, ra


@inline
def chunk(ub):
    """Steps whose int16 sums stay below 2^15 with activations in -127..127: a maddubs lane holds
    two products of at most 127 q, so Q4_K (q <= 15) 8 steps (30,480), Q5_K (31) 4 (31,496), Q6_K
    (63) 2 (32,004)."""
    if ub == Q6_K_BYTES:
        return 2
    return 4 if ub == Q5_K_BYTES else 8


@inline
def scaled(g, sc, s):
    """s + a group's sums times its rows' scales (the remainder's are zeros without `two`: LLVM
    folds them away). Without VNNI the sums are int16 and the scales go in wdup'ed: one
    vpmaddwd adds each row's two pairs and applies its scale at once."""
    if WIDE:
        sc16 = wdup(sc)
        return iadd(s[0], maddwd(g[0], sc16)), iadd(s[1], maddwd(g[1], sc16))
    return iadd(s[0], imul(g[0], sc)), iadd(s[1], imul(g[1], sc))


@inline
def offsets(ub, pm, isum, b, u, two):
    """Activation row b's (m, n) against the panel's sixteen rows in super-block u (qdot.k_tail):
    its int8 sums per group (Q6_K: per run), two at a time, times the rows' mins (scales)."""
    at = b * isum.shape[1] + SUMS * u + (16 if ub == Q6_K_BYTES else 8)
    rest = isum.shape[1] // 2  # where the remainder row's sums start
    m, n = zizero(), zizero()
    for j in range(PAIRS if ub == Q6_K_BYTES else PAIRS // 2):
        factors = zhload(pm, 2 * ROWS * (PAIRS * u + j))
        m = dpwssd(m, factors, zhsplat2(isum, at + 2 * j))
        if two:
            n = dpwssd(n, factors, zhsplat2(isum, at + rest + 2 * j))
    return m, n


@inline
def unit_end(ub, f, s, pm, isum, b, u, d, o, dxs, drs, two):
    """f + a super-block's terms for activation row b (qdot.k_tail's order and roundings)."""
    m, n = offsets(ub, pm, isum, b, u, two)
    f = vfma_exact(ifloat(s[0]), vmul(d, vsplat(dxs)), f)
    if two:
        f = vfma_exact(ifloat(s[1]), vmul(d, vsplat(drs)), f)
    f = vfma_exact(ifloat(m), vmul(o, vsplat(dxs)), f)
    if two:
        f = vfma_exact(ifloat(n), vmul(o, vsplat(drs)), f)
    return f


# A block: up to four activation rows' state (rows of them live; LLVM drops the others), so that
# a pass of eight is two blocks.
@inline
def block_steps(q, x8, r8, st, k, cols, rows, two, G):
    """Step st of the panel against the block's rows' four bytes at k, k + cols, .."""
    a, b, c, d = G
    a = step(q, x8, r8, st, k, two, a)
    if rows >= 2:
        b = step(q, x8, r8, st, k + cols, two, b)
    if rows >= 3:
        c = step(q, x8, r8, st, k + 2 * cols, two, c)
        d = step(q, x8, r8, st, k + 3 * cols, two, d)
    return a, b, c, d


@inline
def block_scaled(G, sc, S, rows):
    """S + the block's group sums times their rows' scales."""
    a, b, c, d = S
    a = scaled(G[0], sc, a)
    if rows >= 2:
        b = scaled(G[1], sc, b)
    if rows >= 3:
        c, d = scaled(G[2], sc, c), scaled(G[3], sc, d)
    return a, b, c, d


@inline
def block_end(ub, F, S, pm, isum, d, o, dx, dr, b, u, rows, two):
    """F + the super-block's terms for the block's rows."""
    fa, fb, fc, fd = F
    fa = unit_end(ub, fa, S[0], pm, isum, b, u, d, o, dx[b, u], remainder_scale(dr, b, u, two), two)
    if rows >= 2:
        fb = unit_end(ub, fb, S[1], pm, isum, b + 1, u, d, o, dx[b + 1, u], remainder_scale(dr, b + 1, u, two), two)
    if rows >= 3:
        fc = unit_end(ub, fc, S[2], pm, isum, b + 2, u, d, o, dx[b + 2, u], remainder_scale(dr, b + 2, u, two), two)
        fd = unit_end(ub, fd, S[3], pm, isum, b + 3, u, d, o, dx[b + 3, u], remainder_scale(dr, b + 3, u, two), two)
    return fa, fb, fc, fd


@inline
def block_store(lanes, at, F):
    vstore(lanes, at, F[0])
    vstore(lanes, at + ROWS, F[1])
    vstore(lanes, at + 2 * ROWS, F[2])
    vstore(lanes, at + 3 * ROWS, F[3])


@jit
def panel(ub, rows, two, p, units, x8, r8, dx, dr, isum, out, b, p0, n):
    """out[b..b + rows, p0..p0 + n] = the rows of panel p (n <= 16) against activation rows
    b..b + rows (rows 2, 4 or 8 and two literals: `passes`): one block of them, or two."""
    q, sc_, d_, pm, o_ = p
    groups = 16 if ub == Q6_K_BYTES else 8
    steps = STEPS // groups
    cols = x8.shape[1]
    lo, hi = min(rows, 4), rows - 4  # the blocks' live rows
    z, iz, fz = (_sums_zero(), _sums_zero()), (zizero(), zizero()), vzero()
    F = H = (fz, fz, fz, fz)
    for u in range(units):
        S = T = (iz, iz, iz, iz)
        for g in range(groups):
            st0 = STEPS * u + steps * g
            k = b * cols + QK * u + 4 * steps * g
            o = (groups * u + g) * ROWS
            sc = ziload(sc_, o)
            c = chunk(ub) if WIDE else steps
            for t0 in range(0, steps, c):
                G = K = (z, z, z, z)
                for t in range(t0, t0 + c):
                    G = block_steps(q, x8, r8, st0 + t, k + 4 * t, cols, lo, two, G)
                    if hi > 0:
                        K = block_steps(q, x8, r8, st0 + t, k + 4 * cols + 4 * t, cols, hi, two, K)
                S = block_scaled(G, sc, S, lo)
                if hi > 0:
                    T = block_scaled(K, sc, T, hi)
        d, off = vload(d_, ROWS * u), vload(o_, ROWS * u)
        F = block_end(ub, F, S, pm, isum, d, off, dx, dr, b, u, lo, two)
        if hi > 0:
            H = block_end(ub, H, T, pm, isum, d, off, dx, dr, b + 4, u, hi, two)
    lanes = np.empty(8 * ROWS, np.float32)
    block_store(lanes, 0, F)
    block_store(lanes, 4 * ROWS, H)
    for a in range(rows):
        for i in range(n):
            out[b + a, p0 + i] = lanes[ROWS * a + i]


@jit
def passes(ub, p, units, x8, r8, dx, dr, isum, out, p0, n):
    """out[:, p0..p0 + n] = the packed panel p against every activation row (GEMM_ROWS_MIN or
    more), in passes of `HIGH` rows, of `HIGH_TWO` with remainder rows."""
    if x8.shape[0] < GEMM_ROWS_MIN:
        raise ValueError("qgemm's panels take GEMM_ROWS_MIN activation rows or more: fewer are qdot.k_few's")
    if dr.shape[0] > 0:
        _passes(ub, HIGH_TWO, HIGH_TWO, YES, p, units, x8, r8, dx, dr, isum, out, p0, n)
    else:
        _passes(ub, HIGH, FOUR, NO, p, units, x8, r8, dx, dr, isum, out, p0, n)


@jit
def _passes(ub, rows, low, two, p, units, x8, r8, dx, dr, isum, out, p0, n):
    """Passes of `rows` activation rows, then one ending at the last row, of `low` rows where
    the tail fits in that many, else of `rows` (rows, low and two literals). That pass takes
    some rows again: a row's sums do not depend on the rows beside it, so they are written
    again with the same bits. Passes of one and two rows for the tails had compiled six more
    specialisations of `panel`'s unrolled loops for the few rows a prefill's tail saves
    (bench/RESULTS.md, "Kernels compiled once")."""
    B = x8.shape[0]
    b = np.int64(0)  # (a literal 0 would have typed, and compiled, a pass for b = 0 as well)
    while b + rows <= B:
        panel(ub, rows, two, p, units, x8, r8, dx, dr, isum, out, b, p0, n)
        b += rows
    if b < B and B - b <= low:
        panel(ub, low, two, p, units, x8, r8, dx, dr, isum, out, B - low, p0, n)
    elif b < B:
        panel(ub, rows, two, p, units, x8, r8, dx, dr, isum, out, B - rows, p0, n)


@jit
def k_gemm(ub, w, x8, r8, dx, dr, isum, out, r0, r1):
    """out[b, r] = w[r] . x'[b] for rows r0..r1 of w (Q4_K, Q5_K or Q6_K; ub its bytes) and every
    activation row b that qdot.quantize wrote: sixteen weight rows at a time, packed once as a
    panel and then met by every activation row (`passes`), of which there are GEMM_ROWS_MIN or
    more. Same arguments as qdot.k_few."""
    units = w.shape[1] // ub
    p = buffers(units)
    pad = np.empty(ROWS * w.shape[1], np.uint8)
    for p0 in range(r0, r1, ROWS):
        n = min(ROWS, r1 - p0)
        pack(ub, w, p0, n, p[0], p[1], p[2], p[3], p[4], pad)
        passes(ub, p, units, x8, r8, dx, dr, isum, out, p0, n)
