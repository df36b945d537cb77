"""The 4-bit legacy kinds (Q4_0, Q4_1, MXFP4) stored as panels of sixteen rows (a load-time
repack of linear weights and of a mixture's experts), and their products with int16
activations: decode and a few rows read the panels where they lie, a prefill unpacks them into
lgemm's panels.

Why: in the file's rows, a block's 32 weights sit in one row, so each block's products come out
spread over the lanes of a vector, and every block of every row pays to add its lanes into one
sum before its scale (ldot.l_rows: ilanes.zisums8, and eight scales gathered a block). An
expert's one-row MXFP4 matvec spent about half its instructions there and ran at 37 GB/s from
DRAM on two cores where a Q8_0 matrix streams at 50-70; a few rows paid it once a row
(bench/RESULTS.md, "MXFP4 experts in panels of sixteen rows"). In a panel, one 64-byte load
holds the same eight weights of sixteen rows: each 16-bit word two pairs of nibbles, a row's
pair k, k + 1 in word 2 i + e. One shift and a mask give one pair of each of the sixteen rows in
int16 lanes (MXFP4: and a table lookup), and one vpdpwssd against the activation pair
broadcast to every lane adds them to each row's own int32 lane: a block's sixteen sums come out
in sixteen lanes with nothing to reduce, and its sixteen scales are one load. These are lgemm's
steps (a panel of sixteen rows interleaved by pairs), kept as nibbles: a decode step reads the
same bytes as the file's rows.

Layout: the sixteen rows 16p..16p + 16 of a weight [rows, row_bytes] (row_bytes = blocks x
BYTES[kind]) hold, in the same bytes and the same total size (16 row_bytes at byte 16 p
row_bytes):
  blocks x 256 bytes of nibbles: block g's at 256 g, four runs t of 64 bytes, each 32
      little-endian 16-bit words: word 2 i + e of run t holds row i's weight 8 t + 2 s + e of the
      block in its bits 4 s .. 4 s + 3 (s = 0..3);
  blocks x 16 x HEAD[kind] bytes of each row's scales, from 256 blocks: block g's at
      16 HEAD g, a field at a time (MXFP4 its E8M0 byte; Q4_0 d; Q4_1 d, then m: IEEE halves),
      row i's at i in its field.

A block's integer sums are those of ldot's kernels (the nibble, or MXFP4's value plus 12, a
non-negative byte; Q4_0's 8 and MXFP4's 12 times the block's sum of activations taken off:
exact), so a row's result, acc = fma(float(q . qx), d dx, acc) block by block (then fma(m, xs,
acc) for Q4_1), is the same bit for bit as ldot.l_rows and lgemm.l_gemm give the file's rows,
alone or among others (tests/test_invariance.py).
"""

from __future__ import annotations

import numba as nb
import numpy as np
from numba.extending import register_jitable

from inferno.backends.numba.codes import WeightKind
from inferno.backends.numba.dense import FAST
from inferno.backends.numba.ilanes import (
    dpwssd, e8m0vec16, fhalf16, iadd, ifloat, pext, target_features, u64at, wsub_const, zhsplat2, zhstore, zisplat,
    zizero, zwfp4_step, zwfp4_step_signed, zwnib_step,
)
from inferno.backends.numba.lanes import prefetch, vfma_exact, vload, vmul, vsplat, vstore, vzero
from inferno.backends.numba.kpanels import Panelled, call_here, release
from inferno.formats.quant import QuantTensor

jit = nb.njit(cache=True, nogil=True, fastmath=FAST)
inline = nb.njit(cache=True, nogil=True, fastmath=FAST, inline="always")

Q4_0X16, Q4_1X16, MXFP4X16 = (int(WeightKind[k]) for k in ("Q4_0X16", "Q4_1X16", "MXFP4X16"))
Q4_0, MXFP4 = int(WeightKind.Q4_0), int(WeightKind.MXFP4)
# The file's kind of each panelled one, and back.
STORED = {"Q4_0": "Q4_0X16", "Q4_1": "Q4_1X16", "MXFP4": "MXFP4X16"}
P = 16  # rows per panel
NIB = 16 * P  # nibble bytes of a panel's block


@register_jitable
def panelled(kind):
    """Whether kind is one of this module's (plain Python where Python calls it)."""
    return kind == Q4_0X16 or kind == Q4_1X16 or kind == MXFP4X16


@register_jitable
def head(kind):
    """Bytes of a block before its nibbles: MXFP4's E8M0 byte; Q4_0's d; Q4_1's d and m."""
    return 1 if kind == MXFP4X16 else (2 if kind == Q4_0X16 else 4)


@register_jitable
def plus(kind):
    """What a 4-bit block's integer lanes carry beyond q, in panels and in the file's rows (ldot's
    dealt kernels) alike: Q4_0's stored nibble is q + 8, MXFP4's table gives q + 12
    (ilanes.MXFP4_PLUS12); Q4_1's q is the nibble."""
    if kind == MXFP4X16 or kind == MXFP4:
        return 12
    return 8 if kind == Q4_0X16 or kind == Q4_0 else 0


@inline
def block_less(x16, a, g, off):
    """What block g's integer sums against row a of x16 carry beyond q . qx, negated: `off`
    (plus) times the block's sum of qx."""
    total = 0
    for i in range(32 * g, 32 * g + 32):
        total += np.int32(x16[a, i])
    return -off * total


# Where the panels are made (the backends' linear_weight and experts_weight): AVX-512 BW, as on
# the Zen 5 host they were measured on (bench/RESULTS.md). Elsewhere the kernels compile and give
# the same bits (tests), unmeasured against the file's rows.
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
def repack_panel(kind, f, o, rb, g, go):
    """The sixteen rows at bytes o, o + rb, .. of f (the file's blocks of the kind a panelled
    `kind` holds) as one panel at g[go:go + 16 rb]: each row's block read as two 8-byte words,
    its eight words of the panel one pext each."""
    h = head(kind)
    bb = h + 16
    blocks = rb // bb
    fw = 1 if h == 1 else 2  # bytes of a scale field
    sc = go + NIB * blocks
    for b in range(blocks):
        rec = go + NIB * b
        for i in range(P):
            src = o + i * rb + bb * b
            for j in range(h):
                g[sc + P * h * b + P * fw * (j // fw) + fw * i + j % fw] = f[src + j]
            lo, hi = u64at(f, src + h), u64at(f, src + h + 8)  # weights 0-7 | 16-23, 8-15 | 24-31
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
def repack_range(kind, w, out, p0, p1):
    """Panels p0..p1 of rows w [rows, row_bytes] (rows a multiple of 16) into out, alike."""
    f, g, rb = w.reshape(-1), out.reshape(-1), w.shape[1]
    for p in range(p0, p1):
        repack_panel(kind, f, P * p * rb, rb, g, P * p * rb)


@nb.njit(parallel=True, cache=True, fastmath=FAST)
def repack_rows(kind, w, out, chunks):
    """repack_range over all of w's panels, cut into `chunks` for the threads."""
    panels = w.shape[0] // P
    for c in nb.prange(chunks):
        repack_range(kind, w, out, panels * c // chunks, panels * (c + 1) // chunks)


@jit
def unpanel_rows(kind, w, out, r0, r1):
    """Rows r0..r1 of a panelled weight w as the file's rows, into out [r1 - r0, row_bytes]."""
    f, rb = w.reshape(-1), w.shape[1]
    h = head(kind)
    fw = 1 if h == 1 else 2
    blocks = rb // (h + 16)
    for r in range(r0, r1):
        go, i = (r // P) * P * rb, r % P
        for b in range(blocks):
            dst = (h + 16) * b
            for j in range(h):
                out[r - r0, dst + j] = f[go + NIB * blocks + P * h * b + P * fw * (j // fw) + fw * i + j % fw]
            for k in range(32):
                t, s, e = k // 8, (k % 8) // 2, k % 2
                at = go + NIB * b + 64 * t + 4 * i + 2 * e + s // 2
                q = (np.int64(f[at]) >> (4 * (s % 2))) & 15
                j = dst + h + k % 16
                if k < 16:
                    out[r - r0, j] = q
                else:
                    out[r - r0, j] = np.int64(out[r - r0, j]) | (q << 4)


# -- products ------------------------------------------------------------------------------------------
@jit
def offsets(kind, x16):
    """Each block's block_less for every row of x16 ([rows, blocks] int32; zeros for Q4_1)."""
    B, n = x16.shape
    less = np.zeros((B, n // 32), np.int32)
    off = plus(kind)
    if off != 0:
        for a in range(B):
            for g in range(n // 32):
                less[a, g] = block_less(x16, a, g, off)
    return less


@inline
def step(kind, f, o, s):
    """Step s of the run at byte o: sixteen rows' pairs as int16 lanes, plus(kind) added."""
    if kind == MXFP4X16:
        return zwfp4_step(f, o, s)
    return zwnib_step(f, o, s)


@inline
def run(kind, f, o, x, k, a0, a1):
    """One 64-byte run of a panel's block (four steps, weights k..k + 8 of each row) against
    activations x[k:k + 8], into two accumulators (two chains of dependent vpdpwssd, not one)."""
    a0 = dpwssd(a0, step(kind, f, o, 0), zhsplat2(x, k))
    a1 = dpwssd(a1, step(kind, f, o, 1), zhsplat2(x, k + 2))
    a0 = dpwssd(a0, step(kind, f, o, 2), zhsplat2(x, k + 4))
    a1 = dpwssd(a1, step(kind, f, o, 3), zhsplat2(x, k + 6))
    return a0, a1


@inline
def run2(kind, f, o, x, k, n, a0, a1, b0, b1):
    """`run` against two activation rows (x[k:], x[k + n:]): each step widened once for both."""
    v = step(kind, f, o, 0)
    a0, b0 = dpwssd(a0, v, zhsplat2(x, k)), dpwssd(b0, v, zhsplat2(x, k + n))
    v = step(kind, f, o, 1)
    a1, b1 = dpwssd(a1, v, zhsplat2(x, k + 2)), dpwssd(b1, v, zhsplat2(x, k + n + 2))
    v = step(kind, f, o, 2)
    a0, b0 = dpwssd(a0, v, zhsplat2(x, k + 4)), dpwssd(b0, v, zhsplat2(x, k + n + 4))
    v = step(kind, f, o, 3)
    a1, b1 = dpwssd(a1, v, zhsplat2(x, k + 6)), dpwssd(b1, v, zhsplat2(x, k + n + 6))
    return a0, a1, b0, b1


@inline
def block_sum(kind, f, o, x, k):
    """The sixteen rows' integer sums of the block whose nibbles are at byte o, against x[k:k + 32]."""
    a0, a1 = zizero(), zizero()
    a0, a1 = run(kind, f, o, x, k, a0, a1)
    a0, a1 = run(kind, f, o + 64, x, k + 8, a0, a1)
    a0, a1 = run(kind, f, o + 128, x, k + 16, a0, a1)
    a0, a1 = run(kind, f, o + 192, x, k + 24, a0, a1)
    return iadd(a0, a1)


@inline
def scales(kind, f, o):
    """(d, m) of the panel's block whose scales are at byte o, sixteen rows each (m: Q4_1's;
    d again for the others, unread)."""
    if kind == MXFP4X16:
        d = e8m0vec16(f, o)
        return d, d
    d = fhalf16(f, o)
    if kind == Q4_1X16:
        return d, fhalf16(f, o + 2 * P)
    return d, d


@inline
def block_end(kind, acc, s, less, d, m, dx, xs):
    """acc after a block: fma(float(s + less), d dx, acc), then fma(m, xs, acc) for Q4_1: ldot's
    order and roundings."""
    if plus(kind) != 0:
        s = iadd(s, zisplat(less))
    acc = vfma_exact(ifloat(s), vmul(d, vsplat(dx)), acc)
    if kind == Q4_1X16:
        acc = vfma_exact(m, vsplat(xs), acc)
    return acc


@inline
def prefetch_block(f, ahead, g, bb):
    """The next panel, a block's share (16 bb bytes) each block."""
    for c in range(0, P * bb, 64):
        prefetch(f, ahead + P * bb * g + c)


@inline
def stored(out, a, lanes, lo, p, r0, r1):
    """out[a, rows of panel p within r0..r1] = lanes[lo:lo + 16]."""
    for i in range(max(r0 - P * p, 0), min(P, r1 - P * p)):
        out[a, P * p + i] = lanes[lo + i]


@jit
def _m_one(kind, w, x16, dx, xs, out, r0, r1):
    """m_rows for one activation row: the panel's sixteen sums and accumulator in registers."""
    f, rb = w.reshape(-1), w.shape[1]
    bb = head(kind) + 16
    blocks = rb // bb
    x = x16.reshape(-1)
    less = offsets(kind, x16)
    lanes = np.empty(P, np.float32)
    for p in range(r0 // P, (r1 + P - 1) // P):
        base = P * p * rb
        ahead, sc = base + P * rb, base + NIB * blocks
        acc = vzero()
        for g in range(blocks):
            prefetch_block(f, ahead, g, bb)
            d, m = scales(kind, f, sc + P * head(kind) * g)
            acc = block_end(kind, acc, block_sum(kind, f, base + NIB * g, x, 32 * g), less[0, g], d, m,
                            dx[0, g], xs[0, g])
        vstore(lanes, 0, acc)
        stored(out, 0, lanes, 0, p, r0, r1)


@jit
def _m_few(kind, w, x16, dx, xs, out, r0, r1):
    """m_rows for a few activation rows, two at a time: each step of a block widened once a pair
    (in registers: cheaper than a store and a load of each step a row), the accumulators in
    memory between blocks."""
    f, rb = w.reshape(-1), w.shape[1]
    B, n = x16.shape
    bb = head(kind) + 16
    blocks = rb // bb
    x = x16.reshape(-1)
    less = offsets(kind, x16)
    lanes = np.empty(P * B, np.float32)
    for p in range(r0 // P, (r1 + P - 1) // P):
        base = P * p * rb
        ahead, sc = base + P * rb, base + NIB * blocks
        lanes[:] = 0.0
        for g in range(blocks):
            prefetch_block(f, ahead, g, bb)
            o = base + NIB * g
            d, m = scales(kind, f, sc + P * head(kind) * g)
            for a in range(0, B - 1, 2):
                k = a * n + 32 * g
                a0, a1, b0, b1 = zizero(), zizero(), zizero(), zizero()
                a0, a1, b0, b1 = run2(kind, f, o, x, k, n, a0, a1, b0, b1)
                a0, a1, b0, b1 = run2(kind, f, o + 64, x, k + 8, n, a0, a1, b0, b1)
                a0, a1, b0, b1 = run2(kind, f, o + 128, x, k + 16, n, a0, a1, b0, b1)
                a0, a1, b0, b1 = run2(kind, f, o + 192, x, k + 24, n, a0, a1, b0, b1)
                vstore(lanes, P * a, block_end(kind, vload(lanes, P * a), iadd(a0, a1), less[a, g], d, m,
                                               dx[a, g], xs[a, g]))
                vstore(lanes, P * a + P, block_end(kind, vload(lanes, P * a + P), iadd(b0, b1), less[a + 1, g],
                                                   d, m, dx[a + 1, g], xs[a + 1, g]))
            if B % 2:
                a = B - 1
                s = block_sum(kind, f, o, x, a * n + 32 * g)
                vstore(lanes, P * a, block_end(kind, vload(lanes, P * a), s, less[a, g], d, m, dx[a, g], xs[a, g]))
        for a in range(B):
            stored(out, a, lanes, P * a, p, r0, r1)


@register_jitable
def m_rows(kind, w, x16, dx, xs, out, r0, r1):
    """out[a, r] = w[r] . x'[a] for rows r0..r1 of a panelled weight (kind a literal) and the
    activation rows that ldot.quantize_rows wrote (a few: ldot.l_rows' share of the table), as
    ldot.l_rows gives the file's rows, bit for bit. Panels cut by r0 or r1 are computed whole,
    their other rows not stored."""
    if x16.shape[0] == 1:
        _m_one(kind, w, x16, dx, xs, out, r0, r1)
    else:
        _m_few(kind, w, x16, dx, xs, out, r0, r1)


@inline
def signed_step(kind, f, o, s):
    """Step s of the run at byte o as lgemm's panels take it: MXFP4's values, Q4_0's q - 8 (its
    offset taken into the integers), Q4_1's nibble."""
    if kind == MXFP4X16:
        return zwfp4_step_signed(f, o, s)
    if kind == Q4_0X16:
        return wsub_const(zwnib_step(f, o, s), 8)
    return zwnib_step(f, o, s)


@jit
def pack(kind, f, o, rb, n, pq, pd, pm):
    """The panel at byte o of f (rb a row's bytes) as lgemm's panel (pq, pd, pm: lgemm.pack's
    layout, each step a 64-byte run of sixteen rows' pairs); n 0 (a pass's second panel past the
    weight's rows): only zero scales."""
    if n == 0:
        pd[:] = 0.0
        pm[:] = 0.0
        return
    blocks = rb // (head(kind) + 16)
    for g in range(blocks):
        src, at = o + NIB * g, 16 * 64 * g
        for t in range(4):
            zhstore(pq, at + 256 * t, signed_step(kind, f, src + 64 * t, 0))
            zhstore(pq, at + 256 * t + 64, signed_step(kind, f, src + 64 * t, 1))
            zhstore(pq, at + 256 * t + 128, signed_step(kind, f, src + 64 * t, 2))
            zhstore(pq, at + 256 * t + 192, signed_step(kind, f, src + 64 * t, 3))
        d, m = scales(kind, f, o + NIB * blocks + P * head(kind) * g)
        vstore(pd, P * g, d)
        if kind == Q4_1X16:
            vstore(pm, P * g, m)


# -- the weight -----------------------------------------------------------------------------------------
class LegacyPanels(Panelled):
    """A Q4_0, Q4_1 or MXFP4 weight whose rows are stored as panels (the module docstring): the
    numba backends' form of these linears and experts."""

    __slots__ = ()

    @property
    def kind_name(self) -> str:
        return STORED[self.qtype.name]

    def _unpanel(self, out: np.ndarray, r0: int, r1: int) -> None:
        unpanel_rows(int(WeightKind[self.kind_name]), self.data, out, r0, r1)


def can_repack(w, groups: int = 1) -> bool:
    """Whether w is a Q4_0, Q4_1 or MXFP4 weight that panels can hold: each of its `groups` (an
    expert's rows of a stack) in whole panels."""
    return (type(w) is QuantTensor and w.qtype.name in STORED and w.shape[0] > 0
            and w.shape[0] % (groups * P) == 0)


def repack(w: QuantTensor, threads: int = 1, launch=None) -> LegacyPanels:
    """w (can_repack) as panels, in memory of its own, as kpanels.repack makes its panels: the
    pages of a memory-mapped original handed back once copied; on the pool's threads through
    `launch` where `threads` > 1."""
    kind = int(WeightKind[STORED[w.qtype.name]])
    out = np.empty(w.data.shape, np.uint8)
    chunks = max(1, min(threads, w.shape[0] // P))
    if chunks == 1:
        repack_range(kind, w.data, out, 0, w.shape[0] // P)
    else:
        (launch or call_here)(repack_rows, kind, w.data, out, chunks)
    release(w.data)
    out.flags.writeable = False
    return LegacyPanels(w.qtype, w.shape, out, w.outlier_inputs)
