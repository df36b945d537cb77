"""MXFP4 weights stored as panels of sixteen rows (a load-time repack of a mixture's experts), and
their products with int16 activations: decode and a few rows read the panels where they lie,
a prefill unpacks them into lgemm's panels.

Why: in the file's rows, a block's 32 weights sit in one row, so each block's products come out
spread over the lanes of a vector, and every block of every row pays to add its lanes into one
sum before its scale (ldot.l_rows: ilanes.zisums8, and eight scale bytes gathered a block). An
expert's one-row matvec spent about half its instructions there and ran at 37 GB/s from DRAM on
two cores where a Q8_0 matrix streams at 50-70 (bench/RESULTS.md, "MXFP4 experts in panels of
sixteen rows"). In a panel, one 64-byte load holds the same four weights of sixteen rows: each
16-bit word two pairs of nibbles, a row's pair k, k + 1 at word 2 i + e. One shift and a mask
give a pair of each of the sixteen rows in int16 lanes, a table lookup makes them MXFP4's values,
and one vpdpwssd against the activation pair broadcast to every lane adds them to the rows' own
int32 lanes: a block's sixteen sums come out in sixteen lanes, nothing to reduce, and its sixteen
scales are one 16-byte load. These are lgemm's steps (a panel of sixteen rows interleaved by
pairs), kept as nibbles: a decode step reads the same bytes as the file's rows.

Layout: the sixteen rows 16p..16p + 16 of an MXFP4 weight [rows, row_bytes] (row_bytes = 17
blocks) hold, in the same bytes and the same total size (16 row_bytes at byte 16 p row_bytes):
  blocks x 256 bytes of nibbles: block g's at 256 g, four runs t of 64 bytes, each 32
      little-endian 16-bit words: word 2 i + e of run t holds row i's weight 8 t + 2 s + e of the
      block in its bits 4 s .. 4 s + 3 (s = 0..3);
  blocks x 16 bytes of scales, at 256 blocks: block g's sixteen E8M0 bytes at 16 g, row i's at i.

A block's integer sums are those of ldot's kernels (the table gives each weight's value plus 12,
a non-negative byte, and the block's sum of activations times 12 is taken off: exact), so a row's
result, acc = fma(float(q . qx), d dx, acc) block by block, is the same bit for bit as ldot.l_rows
and lgemm.l_gemm give the file's rows, alone or among others (tests/test_invariance.py).
"""

from __future__ import annotations

import numba as nb
import numpy as np
from numba.extending import register_jitable

from inferno.backends.numba.codes import WeightKind
from inferno.backends.numba.dense import FAST
from inferno.backends.numba.ilanes import (
    dpwssd, e8m0vec16, iadd, ifloat, pext, target_features, u64at, zhsplat2, zhstore, zisplat, zizero,
    zwfp4_step, zwfp4_step_signed,
)
from inferno.backends.numba.lanes import prefetch, vfma_exact, vload, vmul, vsplat, vstore, vzero
from inferno.formats.quant import QuantTensor

jit = nb.njit(cache=True, nogil=True, fastmath=FAST)
inline = nb.njit(cache=True, nogil=True, fastmath=FAST, inline="always")

MXFP4, MXFP4X16 = int(WeightKind.MXFP4), int(WeightKind.MXFP4X16)
P = 16  # rows per panel
BLOCK = 17  # bytes of an MXFP4 block
NIB = 16 * P  # nibble bytes of a panel's block
PLUS = 12  # what the table adds to each value (ilanes.MXFP4_PLUS12)

# Where the panels are made (the backends' experts_weight): where the table lookup is one 512-bit
# pshufb (AVX-512 BW), as on the Zen 5 host they were measured on (bench/RESULTS.md). Elsewhere
# the kernels compile and give the same bits (tests), unmeasured against the file's rows.
PAYS = "avx512bw" in target_features()


# -- repacking -----------------------------------------------------------------------------------------
# pext masks: the low (high) nibbles of a u64's even (odd) bytes, four of them packed into one
# 16-bit word: weights 2 s + e of eight bytes' low nibbles at nibble s of word e.
EVEN_LOW, ODD_LOW = 0x000F000F000F000F, 0x0F000F000F000F00
EVEN_HIGH, ODD_HIGH = 0x00F000F000F000F0, 0xF000F000F000F000


@inline
def put16(g, at, word):
    g[at] = np.uint8(word & np.uint64(255))
    g[at + 1] = np.uint8(word >> np.uint64(8))


@jit
def repack_panel(f, o, rb, g, go):
    """The sixteen MXFP4 rows at bytes o, o + rb, .. of f as one panel at g[go:go + 16 rb]: each
    row's block read as two 8-byte words, its eight words of the panel one pext each."""
    blocks = rb // BLOCK
    sc = go + NIB * blocks
    for b in range(blocks):
        rec = go + NIB * b
        for i in range(P):
            src = o + i * rb + BLOCK * b
            g[sc + P * b + i] = f[src]
            lo, hi = u64at(f, src + 1), u64at(f, src + 9)  # weights 0-7 | 16-23, 8-15 | 24-31
            at = rec + 4 * i
            put16(g, at, pext(lo, EVEN_LOW))  # run 0: weights 0..7
            put16(g, at + 2, pext(lo, ODD_LOW))
            put16(g, at + 64, pext(hi, EVEN_LOW))  # run 1: weights 8..15
            put16(g, at + 66, pext(hi, ODD_LOW))
            put16(g, at + 128, pext(lo, EVEN_HIGH))  # run 2: weights 16..23
            put16(g, at + 130, pext(lo, ODD_HIGH))
            put16(g, at + 192, pext(hi, EVEN_HIGH))  # run 3: weights 24..31
            put16(g, at + 194, pext(hi, ODD_HIGH))


@jit
def repack_range(w, out, p0, p1):
    """Panels p0..p1 of MXFP4 rows w [rows, row_bytes] (rows a multiple of 16) into out, alike."""
    f, g, rb = w.reshape(-1), out.reshape(-1), w.shape[1]
    for p in range(p0, p1):
        repack_panel(f, P * p * rb, rb, g, P * p * rb)


@nb.njit(parallel=True, cache=True, fastmath=FAST)
def repack_rows(w, out, chunks):
    """repack_range over all of w's panels, cut into `chunks` for the threads."""
    panels = w.shape[0] // P
    for c in nb.prange(chunks):
        repack_range(w, out, panels * c // chunks, panels * (c + 1) // chunks)


@jit
def unpanel_rows(w, out, r0, r1):
    """Rows r0..r1 of a panelled weight w as the file's MXFP4 rows, into out [r1 - r0, row_bytes]."""
    f, rb = w.reshape(-1), w.shape[1]
    blocks = rb // BLOCK
    for r in range(r0, r1):
        go, i = (r // P) * P * rb, r % P
        for b in range(blocks):
            dst = BLOCK * b
            out[r - r0, dst] = f[go + NIB * blocks + P * b + i]
            for k in range(32):
                t, s, e = k // 8, (k % 8) // 2, k % 2
                at = go + NIB * b + 64 * t + 4 * i + 2 * e + s // 2
                q = (np.int64(f[at]) >> (4 * (s % 2))) & 15
                j = dst + 1 + k % 16
                if k < 16:
                    out[r - r0, j] = q
                else:
                    out[r - r0, j] = np.int64(out[r - r0, j]) | (q << 4)


# -- products ------------------------------------------------------------------------------------------
@jit
def offsets(x16):
    """What each block's integer sums carry beyond q . qx: PLUS times the block's sum of qx,
    negated ([rows, blocks] int32)."""
    B, n = x16.shape
    less = np.empty((B, n // 32), np.int32)
    for a in range(B):
        for g in range(n // 32):
            total = 0
            for i in range(32 * g, 32 * g + 32):
                total += np.int32(x16[a, i])
            less[a, g] = -PLUS * total
    return less


@inline
def run(f, o, x, k, a0, a1):
    """One 64-byte run of a panel's block (four steps, weights k..k + 8 of each row) against
    activations x[k:k + 8], into two accumulators (two chains of dependent vpdpwssd, not one)."""
    a0 = dpwssd(a0, zwfp4_step(f, o, 0), zhsplat2(x, k))
    a1 = dpwssd(a1, zwfp4_step(f, o, 1), zhsplat2(x, k + 2))
    a0 = dpwssd(a0, zwfp4_step(f, o, 2), zhsplat2(x, k + 4))
    a1 = dpwssd(a1, zwfp4_step(f, o, 3), zhsplat2(x, k + 6))
    return a0, a1


@inline
def prefetch_block(f, ahead, g):
    """The next panel, a block's share (272 bytes) each block."""
    for c in range(0, P * BLOCK, 64):
        prefetch(f, ahead + P * BLOCK * g + c)


@inline
def stored(out, a, lanes, lo, p, r0, r1):
    """out[a, rows of panel p within r0..r1] = lanes[lo:lo + 16]."""
    for i in range(max(r0 - P * p, 0), min(P, r1 - P * p)):
        out[a, P * p + i] = lanes[lo + i]


@jit
def _m_one(w, x16, dx, out, r0, r1):
    """m_rows for one activation row: the panel's sixteen sums and accumulator in registers."""
    f, rb = w.reshape(-1), w.shape[1]
    blocks = rb // BLOCK
    x = x16.reshape(-1)
    less = offsets(x16)
    lanes = np.empty(P, np.float32)
    for p in range(r0 // P, (r1 + P - 1) // P):
        base = P * p * rb
        ahead = base + P * rb
        acc = vzero()
        for g in range(blocks):
            prefetch_block(f, ahead, g)
            o, k = base + NIB * g, 32 * g
            a0, a1 = zizero(), zizero()
            a0, a1 = run(f, o, x, k, a0, a1)
            a0, a1 = run(f, o + 64, x, k + 8, a0, a1)
            a0, a1 = run(f, o + 128, x, k + 16, a0, a1)
            a0, a1 = run(f, o + 192, x, k + 24, a0, a1)
            s = iadd(iadd(a0, a1), zisplat(less[0, g]))
            acc = vfma_exact(ifloat(s), vmul(e8m0vec16(f, base + NIB * blocks + P * g), vsplat(dx[0, g])), acc)
        vstore(lanes, 0, acc)
        stored(out, 0, lanes, 0, p, r0, r1)


@inline
def run2(f, o, x, k, n, a0, a1, b0, b1):
    """`run` against two activation rows (x[k:], x[k + n:]): each step widened once for both."""
    v = zwfp4_step(f, o, 0)
    a0, b0 = dpwssd(a0, v, zhsplat2(x, k)), dpwssd(b0, v, zhsplat2(x, k + n))
    v = zwfp4_step(f, o, 1)
    a1, b1 = dpwssd(a1, v, zhsplat2(x, k + 2)), dpwssd(b1, v, zhsplat2(x, k + n + 2))
    v = zwfp4_step(f, o, 2)
    a0, b0 = dpwssd(a0, v, zhsplat2(x, k + 4)), dpwssd(b0, v, zhsplat2(x, k + n + 4))
    v = zwfp4_step(f, o, 3)
    a1, b1 = dpwssd(a1, v, zhsplat2(x, k + 6)), dpwssd(b1, v, zhsplat2(x, k + n + 6))
    return a0, a1, b0, b1


@inline
def block_end(lanes, at, s, less, d, dx):
    """lanes[at:at + 16] += float(s + less) d dx, as _m_one's accumulator takes a block."""
    s = iadd(s, zisplat(less))
    vstore(lanes, at, vfma_exact(ifloat(s), vmul(d, vsplat(dx)), vload(lanes, at)))


@jit
def _m_few(w, x16, dx, out, r0, r1):
    """m_rows for a few activation rows, two at a time: each step of a block widened once a pair
    (in registers: the unpacking is cheaper than a store and a load of each step a row), the
    accumulators in memory between blocks."""
    f, rb = w.reshape(-1), w.shape[1]
    B, n = x16.shape
    blocks = rb // BLOCK
    x = x16.reshape(-1)
    less = offsets(x16)
    lanes = np.empty(P * B, np.float32)
    for p in range(r0 // P, (r1 + P - 1) // P):
        base = P * p * rb
        ahead = base + P * rb
        lanes[:] = 0.0
        for g in range(blocks):
            prefetch_block(f, ahead, g)
            o = base + NIB * g
            d = e8m0vec16(f, base + NIB * blocks + P * g)
            for a in range(0, B - 1, 2):
                k = a * n + 32 * g
                a0, a1, b0, b1 = zizero(), zizero(), zizero(), zizero()
                a0, a1, b0, b1 = run2(f, o, x, k, n, a0, a1, b0, b1)
                a0, a1, b0, b1 = run2(f, o + 64, x, k + 8, n, a0, a1, b0, b1)
                a0, a1, b0, b1 = run2(f, o + 128, x, k + 16, n, a0, a1, b0, b1)
                a0, a1, b0, b1 = run2(f, o + 192, x, k + 24, n, a0, a1, b0, b1)
                block_end(lanes, P * a, iadd(a0, a1), less[a, g], d, dx[a, g])
                block_end(lanes, P * a + P, iadd(b0, b1), less[a + 1, g], d, dx[a + 1, g])
            if B % 2:
                a, k = B - 1, (B - 1) * n + 32 * g
                a0, a1 = zizero(), zizero()
                a0, a1 = run(f, o, x, k, a0, a1)
                a0, a1 = run(f, o + 64, x, k + 8, a0, a1)
                a0, a1 = run(f, o + 128, x, k + 16, a0, a1)
                a0, a1 = run(f, o + 192, x, k + 24, a0, a1)
                block_end(lanes, P * a, iadd(a0, a1), less[a, g], d, dx[a, g])
        for a in range(B):
            stored(out, a, lanes, P * a, p, r0, r1)


@register_jitable
def m_rows(w, x16, dx, out, r0, r1):
    """out[a, r] = w[r] . x'[a] for rows r0..r1 of a panelled MXFP4 weight and the activation rows
    that ldot.quantize_rows wrote (a few: ldot.l_rows' share of the table), as ldot.l_rows gives
    the file's rows, bit for bit. Panels cut by r0 or r1 are computed whole, their other rows not
    stored."""
    if x16.shape[0] == 1:
        _m_one(w, x16, dx, out, r0, r1)
    else:
        _m_few(w, x16, dx, out, r0, r1)


@jit
def pack(f, o, rb, n, pq, pd):
    """The panel at byte o of f (rb a row's bytes) as lgemm's panel (pq, pd: lgemm.pack's
    layout, each step a 64-byte run of sixteen rows' pairs), the values signed; n 0 (a pass's
    second panel past the weight's rows): only zero scales."""
    blocks = rb // BLOCK
    if n == 0:
        pd[:] = 0.0
        return
    for g in range(blocks):
        src, at = o + NIB * g, 16 * 64 * g
        for t in range(4):
            zhstore(pq, at + 256 * t, zwfp4_step_signed(f, src + 64 * t, 0))
            zhstore(pq, at + 256 * t + 64, zwfp4_step_signed(f, src + 64 * t, 1))
            zhstore(pq, at + 256 * t + 128, zwfp4_step_signed(f, src + 64 * t, 2))
            zhstore(pq, at + 256 * t + 192, zwfp4_step_signed(f, src + 64 * t, 3))
        vstore(pd, P * g, e8m0vec16(f, o + NIB * blocks + P * g))


# -- the weight -----------------------------------------------------------------------------------------
class Mxfp4Panels(QuantTensor):
    """An MXFP4 weight whose rows are stored as panels (the module docstring): the numba backends'
    form of a mixture's MXFP4 experts. `data` keeps the file's shape and size; rows are not
    contiguous in it, so row views are copies, unpacked to the file's layout."""

    __slots__ = ()
    kind_name = "MXFP4X16"

    def rows(self, r0: int, r1: int) -> QuantTensor:
        out = np.empty((r1 - r0, self.data.shape[1]), np.uint8)
        unpanel_rows(self.data, out, r0, r1)
        return QuantTensor(self.qtype, (r1 - r0, self.shape[1]), out, self.outlier_inputs)

    def take_rows(self, order: np.ndarray) -> QuantTensor:
        return QuantTensor.take_rows(self.rows(0, self.shape[0]), order)

    def dequantize(self, r0: int = 0, r1: int | None = None) -> np.ndarray:
        return self.rows(r0, self.shape[0] if r1 is None else r1).dequantize()

    def __repr__(self) -> str:
        return f"Mxfp4Panels({self.qtype.name}, {list(self.shape)})"


def can_repack(w, groups: int = 1) -> bool:
    """Whether w is an MXFP4 weight that panels can hold: each of its `groups` (an expert's rows
    of a stack) in whole panels."""
    return (type(w) is QuantTensor and w.qtype.name == "MXFP4" and w.shape[0] > 0
            and w.shape[0] % (groups * P) == 0)


def repack(w: QuantTensor, threads: int = 1, launch=None) -> Mxfp4Panels:
    """w (can_repack) as panels, in memory of its own, as kpanels.repack makes its panels: the
    pages of a memory-mapped original handed back once copied; on the pool's threads through
    `launch` where `threads` > 1."""
    from inferno.backends.numba.kpanels import release

    out = np.empty(w.data.shape, np.uint8)
    chunks = max(1, min(threads, w.shape[0] // P))
    if chunks == 1:
        repack_range(w.data, out, 0, w.shape[0] // P)
    else:
        (launch or (lambda kernel, *args: kernel(*args)))(repack_rows, w.data, out, chunks)
    release(w.data)
    out.flags.writeable = False
    return Mxfp4Panels(w.qtype, w.shape, out, w.outlier_inputs)

