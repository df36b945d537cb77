"""Float weights (F32, F16, BF16) times float32 activation rows, in one order of arithmetic.

A weight row and an activation row meet the same way whatever else is computed beside them:
- their columns in blocks of sixteen, the products of even blocks summed in one vector of
  sixteen lanes and those of odd blocks in another, each product added with one rounding
  (llvm.fma, which fast-math cannot reassociate);
- the two vectors added lane by lane, the lanes in one fixed tree (lanes.vsum_exact's, which
  vsums_exact runs for several rows at once), adds whose flags allow no regrouping;
- the columns past the last whole sixteen one by one (sfma).
So one row alone (decode), a few (a verify step, a batch) and a prefill give a row the same
bits, and so do one thread and two: the float kinds' part of batch invariance (ldot.py and
qdot.k_tail are the quantized kinds'). Two sums a row, not one, so that decode keeps eight
chains of fmas in flight over four weight rows.

Blocking changes which sums run side by side, never a sum's order:
- activation rows four at a time (two without AVX-512's registers) against two weight rows, on
  tiles of weight rows that stay in L2 while every block of activation rows (in L1) passes them;
- the rows left over (all of them in decode) one at a time against four weight rows a pass,
  prefetching the next pass's rows as these are read, as the quantized matvecs do.

A weight is its bytes (uint8 [rows, row_bytes]): a F16/BF16 QuantTensor's data as stored, a
float32 matrix viewed as bytes; `kind` (a WeightKind code, a literal to the drivers) says how
sixteen of them become float32.
"""

from __future__ import annotations

import numba as nb

from inferno.backends.numba import jitcache  # noqa: F401  first: where the kernels below are cached
from inferno.backends.numba.codes import WeightKind
from inferno.backends.numba.dense import FAST
from inferno.backends.numba.lanes import (
    _mask_registers, bf16at, f16at, f32at, prefetch, sfma, stack_f32, vadd_exact, vbf16, vf16,
    vfma_exact, vload, vstore, vsums_exact, vzero,
)

jit = nb.njit(cache=True, nogil=True, fastmath=FAST)

F16, BF16, F32 = int(WeightKind.F16), int(WeightKind.BF16), int(WeightKind.F32)

# Weight bytes per tile of rows: a tile stays in L2 while every block of activation rows passes
# it, each block in L1.
TILE_BYTES = 1 << 18
# Activation rows a pass: four where the vector registers hold the sixteen accumulators and
# their operands (AVX-512's 32), else two.
BLOCK = 4 if _mask_registers() else 2


@jit
def esize(kind):
    """Bytes per weight."""
    return 4 if kind == F32 else 2


@jit
def w16(kind, f, o):
    """Sixteen weights at byte o, as float32."""
    if kind == F32:
        return vload(f, o)
    if kind == F16:
        return vf16(f, o)
    return vbf16(f, o)


@jit
def w1(kind, f, o):
    """The weight at byte o, as float32."""
    if kind == F32:
        return f32at(f, o)
    if kind == F16:
        return f16at(f, o)
    return bf16at(f, o)


@jit
def tail(kind, f, o, x, b, n16, s):
    """s, then the products of the weight row at byte o and x[b] from column n16 on, added one
    by one."""
    e = esize(kind)
    for j in range(n16, x.shape[1]):
        s = sfma(w1(kind, f, o + j * e), x[b, j], s)
    return s


@jit
def f_rows(kind, w, x, out, r0, r1):
    """out[b, r] = w[r] . x[b] for rows r0..r1 of w [rows, row_bytes] (bytes of `kind`) and
    every row b of x [B, cols] (rows contiguous), in the order the module docstring gives."""
    f = w.reshape(-1)
    B, n = x.shape
    rb = w.shape[1]
    n16 = n - n % 16
    blocks = B - B % BLOCK
    tile = max(2, TILE_BYTES // rb // 2 * 2)
    for t0 in range(r0, r1, tile):
        t1 = min(t0 + tile, r1)
        for b in range(0, blocks, BLOCK):
            if BLOCK == 4:
                _two_by_four(kind, f, t0, t1, rb, x, n16, out, b)
            else:
                _two_by_two(kind, f, t0, t1, rb, x, n16, out, b)
    for b in range(blocks, B):
        _four_by_one(kind, f, r0, r1, rb, x, n16, out, b)


@jit
def _four_by_one(kind, f, r0, r1, rb, x, n16, out, b):
    """Weight rows r0..r1 four a pass (the last repeated past r1) against activation row b,
    into out[b, r0:r1]: eight chains of fmas. The next pass's four rows (contiguous) stream in
    by a prefetch per line as these are read (bench/RESULTS.md, "Float weights in one order":
    two rows a pass, or no prefetch, ran at half the rate)."""
    e = esize(kind)
    xo = b * x.shape[1]
    n32 = n16 - n16 % 32
    last = r1 - 1
    sums = nb.carray(stack_f32(16), 16)
    for r in range(r0, r1, 4):
        o0, o1, o2, o3 = r * rb, min(r + 1, last) * rb, min(r + 2, last) * rb, min(r + 3, last) * rb
        nxt = (r + 4) * rb
        a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()  # even blocks
        c0, c1, c2, c3 = vzero(), vzero(), vzero(), vzero()  # odd blocks
        for j in range(0, n32, 32):
            p = nxt + 4 * j * e
            for line in range(0, 4 * 32 * e, 64):  # four rows of 32 weights
                prefetch(f, p + line)
            v = vload(x, xo + j)
            a0, a1, a2, a3 = _one(kind, f, o0 + j * e, o1 + j * e, o2 + j * e, o3 + j * e, v, a0, a1, a2, a3)
            k = j + 16
            v = vload(x, xo + k)
            c0, c1, c2, c3 = _one(kind, f, o0 + k * e, o1 + k * e, o2 + k * e, o3 + k * e, v, c0, c1, c2, c3)
        if n32 < n16:  # a last even block
            v = vload(x, xo + n32)
            k = n32 * e
            a0, a1, a2, a3 = _one(kind, f, o0 + k, o1 + k, o2 + k, o3 + k, v, a0, a1, a2, a3)
        vstore(sums, 0, vsums_exact((vadd_exact(a0, c0), vadd_exact(a1, c1), vadd_exact(a2, c2), vadd_exact(a3, c3))))
        out[b, r] = tail(kind, f, o0, x, b, n16, sums[0])
        if r + 1 < r1:
            out[b, r + 1] = tail(kind, f, o1, x, b, n16, sums[1])
        if r + 2 < r1:
            out[b, r + 2] = tail(kind, f, o2, x, b, n16, sums[2])
        if r + 3 < r1:
            out[b, r + 3] = tail(kind, f, o3, x, b, n16, sums[3])


@jit
def _one(kind, f, o0, o1, o2, o3, v, a0, a1, a2, a3):
    """One block of sixteen columns of four weight rows (at bytes o0..o3) against v."""
    return (vfma_exact(w16(kind, f, o0), v, a0), vfma_exact(w16(kind, f, o1), v, a1),
            vfma_exact(w16(kind, f, o2), v, a2), vfma_exact(w16(kind, f, o3), v, a3))


@jit
def _two_by_four(kind, f, r0, r1, rb, x, n16, out, b):
    """Weight rows r0..r1 two at a time (an odd last one paired with itself) against
    activation rows b..b + 3, into out[b..b + 3, r0:r1]: sixteen accumulators (two sums of
    each of eight products)."""
    for r in range(r0, r1, 2):
        _two_by_four_at(kind, f, r, r1, rb, x, n16, out, b)


@jit
def _two_by_four_at(kind, f, r, r1, rb, x, n16, out, b):
    """_two_by_four for rows b..b + 3."""
    e, n = esize(kind), x.shape[1]
    o0, o1 = r * rb, min(r + 1, r1 - 1) * rb
    xo = b * n
    a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()  # row r, even blocks
    c0, c1, c2, c3 = vzero(), vzero(), vzero(), vzero()  # row r + 1, even blocks
    d0, d1, d2, d3 = vzero(), vzero(), vzero(), vzero()  # row r, odd blocks
    g0, g1, g2, g3 = vzero(), vzero(), vzero(), vzero()  # row r + 1, odd blocks
    n32 = n16 - n16 % 32
    for j in range(0, n32, 32):
        a0, a1, a2, a3, c0, c1, c2, c3 = _four(kind, f, o0 + j * e, o1 + j * e, x, xo + j, n,
                                               a0, a1, a2, a3, c0, c1, c2, c3)
        d0, d1, d2, d3, g0, g1, g2, g3 = _four(kind, f, o0 + (j + 16) * e, o1 + (j + 16) * e, x, xo + j + 16, n,
                                               d0, d1, d2, d3, g0, g1, g2, g3)
    if n32 < n16:  # a last even block
        a0, a1, a2, a3, c0, c1, c2, c3 = _four(kind, f, o0 + n32 * e, o1 + n32 * e, x, xo + n32, n,
                                               a0, a1, a2, a3, c0, c1, c2, c3)
    sums = nb.carray(stack_f32(16), 16)
    vstore(sums, 0, vsums_exact((vadd_exact(a0, d0), vadd_exact(a1, d1), vadd_exact(a2, d2), vadd_exact(a3, d3),
                                 vadd_exact(c0, g0), vadd_exact(c1, g1), vadd_exact(c2, g2), vadd_exact(c3, g3))))
    for i in range(4):
        out[b + i, r] = tail(kind, f, o0, x, b + i, n16, sums[i])
    if r + 1 < r1:
        for i in range(4):
            out[b + i, r + 1] = tail(kind, f, o1, x, b + i, n16, sums[4 + i])


@jit
def _four(kind, f, oa, oc, x, xo, n, a0, a1, a2, a3, c0, c1, c2, c3):
    """One block of sixteen columns: the weights at bytes oa and oc against four activation
    rows n apart from x's element xo, added into a* and c*."""
    wa, wc = w16(kind, f, oa), w16(kind, f, oc)
    v = vload(x, xo)
    a0, c0 = vfma_exact(wa, v, a0), vfma_exact(wc, v, c0)
    v = vload(x, xo + n)
    a1, c1 = vfma_exact(wa, v, a1), vfma_exact(wc, v, c1)
    v = vload(x, xo + 2 * n)
    a2, c2 = vfma_exact(wa, v, a2), vfma_exact(wc, v, c2)
    v = vload(x, xo + 3 * n)
    a3, c3 = vfma_exact(wa, v, a3), vfma_exact(wc, v, c3)
    return a0, a1, a2, a3, c0, c1, c2, c3


@jit
def _two_by_two(kind, f, r0, r1, rb, x, n16, out, b):
    """_two_by_four for activation rows b and b + 1 (eight accumulators: AVX2's sixteen
    registers hold them as two halves each)."""
    for r in range(r0, r1, 2):
        _two_by_two_at(kind, f, r, r1, rb, x, n16, out, b)


@jit
def _two_by_two_at(kind, f, r, r1, rb, x, n16, out, b):
    """_two_by_two for rows b and b + 1."""
    e, n = esize(kind), x.shape[1]
    o0, o1 = r * rb, min(r + 1, r1 - 1) * rb
    xo = b * n
    a0, a1, c0, c1 = vzero(), vzero(), vzero(), vzero()  # even blocks: rows r, r + 1
    d0, d1, g0, g1 = vzero(), vzero(), vzero(), vzero()  # odd blocks
    n32 = n16 - n16 % 32
    for j in range(0, n32, 32):
        a0, a1, c0, c1 = _two(kind, f, o0 + j * e, o1 + j * e, x, xo + j, n, a0, a1, c0, c1)
        d0, d1, g0, g1 = _two(kind, f, o0 + (j + 16) * e, o1 + (j + 16) * e, x, xo + j + 16, n, d0, d1, g0, g1)
    if n32 < n16:  # a last even block
        a0, a1, c0, c1 = _two(kind, f, o0 + n32 * e, o1 + n32 * e, x, xo + n32, n, a0, a1, c0, c1)
    sums = nb.carray(stack_f32(16), 16)
    vstore(sums, 0, vsums_exact((vadd_exact(a0, d0), vadd_exact(a1, d1), vadd_exact(c0, g0), vadd_exact(c1, g1))))
    for i in range(2):
        out[b + i, r] = tail(kind, f, o0, x, b + i, n16, sums[i])
    if r + 1 < r1:
        for i in range(2):
            out[b + i, r + 1] = tail(kind, f, o1, x, b + i, n16, sums[2 + i])


@jit
def _two(kind, f, oa, oc, x, xo, n, a0, a1, c0, c1):
    """_four for two activation rows."""
    wa, wc = w16(kind, f, oa), w16(kind, f, oc)
    v = vload(x, xo)
    a0, c0 = vfma_exact(wa, v, a0), vfma_exact(wc, v, c0)
    v = vload(x, xo + n)
    a1, c1 = vfma_exact(wa, v, a1), vfma_exact(wc, v, c1)
    return a0, a1, c0, c1
