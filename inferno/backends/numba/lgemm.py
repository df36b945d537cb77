"""Prefill's products of the legacy kinds (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4) with int16 activations: a
GEMM on panels of sixteen weight rows interleaved by pairs, for more than a few activation rows
wherever the backends take these kinds as int16 (where the machine has VNNI, `FAST`, one
vpdpwssd a step; elsewhere vpmaddwd and an add).

Why: a prefill multiplied these kinds as sgemm on dequantised tiles, at the float32 FMA's rate:
eight products an instruction a 256-bit lane set. VNNI's vpdpwssd multiplies sixteen int16 pairs
and adds them into eight int32 lanes in one instruction, at the rate of an FMA, so the same
products take half the instructions (a zmm one, twice the products again). The activations are the int16 rows ldot.py's decode takes
(ldot.quantize_rows: a scale per block of 32, within 1.5e-5 of the block's largest value), so
a row's result does not depend on whether it came alone or among a few (ldot.l_rows) or in a
prefill (here).
llama.cpp's repacked Q8_0 GEMM rounds its activations to int8 instead; bench/RESULTS.md ("Q8_0
with int8 activations: built, measured, dropped") says what that costs the logits here.

Panel layout, per block g (32 weights) of sixteen rows, in bytes (uint8 scratch):
  pq: [16 steps][2 halves][8 rows][2 int16]: row 8h + i's weights 2t and 2t + 1 of the block
      at 64 (16 g + t) + 32 h + 4 i: Q8_0's q as stored, Q4_0's q - 8 and Q5_0's q - 16 (their
      offsets taken into the integers, exactly), Q4_1's and Q5_1's q as stored (0..15, 0..31),
      MXFP4's its table's values (-12..12: ldot.block);
  pd: float32 [blocks][16]: each row's d (MXFP4's 2^(e - 128));
  pm: float32 [blocks][16]: Q4_1's and Q5_1's offsets m (the others have none left).
Step t of a block loads the sixteen rows' pairs (one 64-byte load) and meets activation pair t,
broadcast to all sixteen lanes, in one vpdpwssd: sixteen rows' partial dot products in int32.
The vectors are 512 bits (ilanes' i16x32, i32x16): one zmm instruction where the machine has
AVX-512 VNNI, two ymm ones on AVX-VNNI. Two panels (32 weight rows) go side by side against
four activation rows: two loads and four broadcasts serve eight vpdpwssd, and the eight int32
and eight float32 accumulators leave AVX-512's 32 vector registers room. At the end of a block
each accumulator is converted and takes d dx (and, for Q4_1 and Q5_1, m times the sum of x'
over the block):
  y = sum_g d_g dx_g (q . qx)_g + m_g xs_g,
summed block by block with one rounding per fma, never reassociated (lanes.vfma_exact): the
order ldot.l_rows keeps for decode and a few rows, so a row's result is the same bit for bit
whatever rows share its step.

The panels are packed as a call needs them, 32 rows at a time, from the blocks where they lie
(the mapped file), into scratch that stays in L2 while every activation row goes by: nothing
is kept beside the weights, and decode's kernels read them as before. A block of eight rows is
eight `ldot.block` widenings and two 8x8 transposes of int32 words (ilanes.bstore_columns) into
one half of its steps; a short last panel goes through a zero-padded copy of its rows (zero
bytes: d, m and every product zero).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from inferno.backends.numba.dense import FAST as FASTMATH
from inferno.backends.numba.ilanes import (
    _vnni, bstore_columns, dpwssd, fast_int_dot, ifloat, zhload, zhsplat2, zizero,
)
from inferno.backends.numba.lanes import prefetch_l2, vfma_exact, vload, vmul, vsplat, vstore, vzero
from inferno.backends.numba.ldot import offset, signed_block
from inferno.backends.numba.lpanels import pack as unpack_panel
from inferno.backends.numba.lpanels import panelled

jit = nb.njit(cache=True, nogil=True, fastmath=FASTMATH)
inline = nb.njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")

# Whether vpdpwssd exists (AVX512-VNNI with VL, or AVX-VNNI): where the backends take the legacy
# kinds as int16 for its sake (simd.int16_legacy). Without it (x86 with AVX2 and no AVX-512) a
# step is vpmaddwd and an add, two instructions for the sixteen products an FMA pair gives
# sgemm; the GEMM runs there too, so that a prefill's rows sum as decode's do (ldot.l_rows), its
# speed there not yet measured against the sgemm on x' it replaced.
FAST = fast_int_dot() and _vnni()

P = 8  # weight rows per transposed block: one int32 lane of a 256-bit half each
ROWS = 2 * P  # weight rows per panel: one int32 lane of a 512-bit vector each
PANELS = 2  # panels per pass
STEP_BYTES = 4 * ROWS  # one step: sixteen rows' pairs of int16
BLOCK_BYTES = 16 * STEP_BYTES
ONE, TWO, FOUR = 1, 2, 4  # activation rows per pass (literals: each compiles its own loop)
# Activation rows whose int16 (and results) stay in L2 while every pass of panels meets them.
ROW_BLOCK = 128


@jit
def buffers(blocks):
    """Scratch for one panel of `blocks` blocks: (pq, pd, pm)."""
    return (np.empty(blocks * BLOCK_BYTES, np.uint8), np.empty(blocks * ROWS, np.float32),
            np.empty(blocks * ROWS, np.float32))


# -- packing -------------------------------------------------------------------------------------------
@jit
def pack_half(kind, f, o, rb, blocks, half, pq, pd, pm):
    """The eight rows of f at bytes o, o + rb, .. as half `half` of a panel."""
    bb = rb // blocks
    for g in range(blocks):
        a = o + bb * g
        l0, h0, d0, m0 = signed_block(kind, f, a)
        l1, h1, d1, m1 = signed_block(kind, f, a + rb)
        l2, h2, d2, m2 = signed_block(kind, f, a + 2 * rb)
        l3, h3, d3, m3 = signed_block(kind, f, a + 3 * rb)
        l4, h4, d4, m4 = signed_block(kind, f, a + 4 * rb)
        l5, h5, d5, m5 = signed_block(kind, f, a + 5 * rb)
        l6, h6, d6, m6 = signed_block(kind, f, a + 6 * rb)
        l7, h7, d7, m7 = signed_block(kind, f, a + 7 * rb)
        at = BLOCK_BYTES * g + 32 * half
        bstore_columns(pq, at, STEP_BYTES, l0, l1, l2, l3, l4, l5, l6, l7)
        bstore_columns(pq, at + 8 * STEP_BYTES, STEP_BYTES, h0, h1, h2, h3, h4, h5, h6, h7)
        s = ROWS * g + P * half
        pd[s], pd[s + 1], pd[s + 2], pd[s + 3] = d0, d1, d2, d3
        pd[s + 4], pd[s + 5], pd[s + 6], pd[s + 7] = d4, d5, d6, d7
        pm[s], pm[s + 1], pm[s + 2], pm[s + 3] = m0, m1, m2, m3
        pm[s + 4], pm[s + 5], pm[s + 6], pm[s + 7] = m4, m5, m6, m7


@jit
def pack(kind, w, p0, n, panel, pad):
    """Rows p0..p0 + n (n <= 16) of w as one panel; a short one through `pad` (sixteen rows of
    scratch), zero bytes past its rows."""
    f = w.reshape(-1)
    rb = w.shape[1]
    blocks = panel[1].shape[0] // ROWS
    o = p0 * rb
    if panelled(kind):  # stored as panels already (whole ones: p0 a multiple of 16)
        unpack_panel(kind, f, o, rb, n, panel[0], panel[1], panel[2])
        return
    if n < ROWS:
        pad[:] = 0
        if n > 0:
            for i in range(n * rb):  # (a loop: a slice assignment's shape check compiles its message)
                pad[i] = f[o + i]
        f, o = pad, 0
    for half in range(2):
        pack_half(kind, f, o + P * half * rb, rb, blocks, half, panel[0], panel[1], panel[2])


# -- two panels against activation rows ----------------------------------------------------------------
@inline
def step(qa, qb, x16, k, g):
    """One step of the two panels against the activation pair x16[k:k + 2]."""
    x = zhsplat2(x16, k)
    return dpwssd(g[0], qa, x), dpwssd(g[1], qb, x)


@inline
def block_end(kind, f, g, da, db, ma, mb, dx, xs):
    """f + a block's int32 sums times d dx (and the offsets times the sum of x' over the block),
    in ldot.l_rows' order and roundings (so a row's result does not depend on its company)."""
    e = vsplat(dx)
    fa = vfma_exact(ifloat(g[0]), vmul(da, e), f[0])
    fb = vfma_exact(ifloat(g[1]), vmul(db, e), f[1])
    if offset(kind):
        s = vsplat(xs)
        fa, fb = vfma_exact(ma, s, fa), vfma_exact(mb, s, fb)
    return fa, fb


@jit
def panels(kind, rows, pa, pb, x16, dx, xs, out, b, p0, n, lanes):
    """out[b..b + rows, p0..p0 + n] = the rows of panels pa and pb (n <= 32, in that order)
    against activation rows b..b + rows (rows 1, 2 or 4, a literal); `lanes` (scratch of
    4 PANELS ROWS float32) takes the accumulators on their way out."""
    cols = x16.shape[1]
    x = x16.reshape(-1)
    blocks = cols // 32
    z, fz = zizero(), vzero()
    f0 = f1 = f2 = f3 = (fz, fz)
    for g in range(blocks):
        g0 = g1 = g2 = g3 = (z, z)
        for t in range(16):
            o = BLOCK_BYTES * g + STEP_BYTES * t
            qa, qb = zhload(pa[0], o), zhload(pb[0], o)
            k = b * cols + 32 * g + 2 * t
            g0 = step(qa, qb, x, k, g0)
            if rows >= 2:
                g1 = step(qa, qb, x, k + cols, g1)
            if rows == 4:
                g2 = step(qa, qb, x, k + 2 * cols, g2)
                g3 = step(qa, qb, x, k + 3 * cols, g3)
        s = ROWS * g
        da, db, ma, mb = vload(pa[1], s), vload(pb[1], s), vload(pa[2], s), vload(pb[2], s)
        f0 = block_end(kind, f0, g0, da, db, ma, mb, dx[b, g], xs[b, g])
        if rows >= 2:
            f1 = block_end(kind, f1, g1, da, db, ma, mb, dx[b + 1, g], xs[b + 1, g])
        if rows == 4:
            f2 = block_end(kind, f2, g2, da, db, ma, mb, dx[b + 2, g], xs[b + 2, g])
            f3 = block_end(kind, f3, g3, da, db, ma, mb, dx[b + 3, g], xs[b + 3, g])
    for a, fa in enumerate((f0, f1, f2, f3)):
        if a < rows:
            vstore(lanes, PANELS * ROWS * a, fa[0])
            vstore(lanes, PANELS * ROWS * a + ROWS, fa[1])
    for a in range(rows):
        for i in range(n):
            out[b + a, p0 + i] = lanes[PANELS * ROWS * a + i]


@jit
def l_gemm(kind, w, x16, dx, xs, out, r0, r1):
    """out[b, r] = w[r] . x'[b] for rows r0..r1 of w (a legacy kind, a literal) and every activation
    row b that ldot.quantize_rows wrote into x16, dx and xs: 32 weight rows at a time, packed once
    as two panels and then met by the activation rows four at a time, then two, then one."""
    B, blocks = x16.shape[0], x16.shape[1] // 32
    f, rb = w.reshape(-1), w.shape[1]
    pa, pb = buffers(blocks), buffers(blocks)
    pad = np.empty(ROWS * w.shape[1], np.uint8)
    lanes = np.empty(4 * PANELS * ROWS, np.float32)
    for b0 in range(0, B, ROW_BLOCK):
        b1 = min(b0 + ROW_BLOCK, B)
        for p0 in range(r0, r1, PANELS * ROWS):
            n = min(PANELS * ROWS, r1 - p0)
            pack(kind, w, p0, min(ROWS, n), pa, pad)
            pack(kind, w, p0 + ROWS, max(n - ROWS, 0), pb, pad)
            # The next pass's rows into L2 while the activation rows meet these (a few rows
            # leave too little time for the hardware's prefetchers over 32 row streams).
            ahead = (p0 + PANELS * ROWS) * rb
            for line in range(0, min(PANELS * ROWS, max(r1 - p0 - PANELS * ROWS, 0)) * rb, 64):
                prefetch_l2(f, ahead + line)
            b = b0
            while b + 4 <= b1:
                panels(kind, FOUR, pa, pb, x16, dx, xs, out, b, p0, n, lanes)
                b += 4
            if b + 2 <= b1:
                panels(kind, TWO, pa, pb, x16, dx, xs, out, b, p0, n, lanes)
                b += 2
            if b < b1:
                panels(kind, ONE, pa, pb, x16, dx, xs, out, b, p0, n, lanes)
