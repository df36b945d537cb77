"""Q4_K weights stored as panels of eight rows (a load-time repack), and their products with int8
activations: decode and a few rows read the panels where they lie; prefill unpacks them into
qgemm's panels.

Why: qdot.k_rows multiplies one weight row by the activation row 32 bytes at a time, and each
run of 32 pays for its own 6-bit scale (a broadcast and a vpmaddwd), and each super-block for
unpacking its scales one row at a time: about 75 instructions for 256 weights, so that Q4_K
decode is bound by the cores' arithmetic wherever the memory is faster than about 25 GB/s on
two cores (bench/RESULTS.md, "Q4_K in panels of eight rows"). In a panel, one 32-byte load holds four consecutive weights of each of eight rows in its int32 lanes
(as each half of a qgemm panel's 64-byte step, and llama.cpp's repacked block_q4_Kx8), so one vpdpbusd against four
activation bytes broadcast to every lane adds eight rows' products, a group's scales are one
int32 multiply for the eight rows, and a super-block's d and mins one float multiply-add each.
The nibbles stay nibbles: a decode step reads the same bytes as the file's rows.

Layout: the eight rows 8p..8p + 8 of a [rows, row_bytes] Q4_K weight hold, in the same bytes and
the same total size, one 1152-byte record per super-block u (at byte 1152 u of the panel's
8 * row_bytes), for rows i = 0..7, groups g = 0..7 (32 weights each), entries e = 8 g + i:
  0:    d of each row (8 halves);
  16:   dmin of each row (8 halves);
  32:   64 bytes: the low four bits of entry e's scale, and its min's above them;
  96:   32 bytes: byte e % 32 holds the high two bits of entry e's scale (bits 0-1, 4-5 for
        e >= 32) and of its min (bits 2-3, 6-7);
  128:  1024 bytes of nibbles: for j = 0..3 and t = 0..7, 32 bytes at 128 + 256 j + 32 t whose
        byte 4 i + k holds row i's weight 64 j + 4 t + k (group 2 j) in its low nibble and
        64 j + 32 + 4 t + k (group 2 j + 1) in its high one.
The nibbles are the file's own bytes, 4-byte words transposed across the eight rows; nothing is
rounded, so the panels multiply the same integers as qdot's and qgemm's kernels.

A row's result is the sum over super-blocks of qdot.k_tail's four terms, from the same integers
in the same order with the same roundings as qdot's and qgemm's kernels: the same bits as theirs.
"""

from __future__ import annotations

import ctypes
import mmap

import numba as nb
import numpy as np

from inferno.backends.numba import qgemm
from inferno.backends.numba.dense import FAST
from inferno.backends.numba.ilanes import (
    bbits, bhigh, bload, bsplat4, bstore, bstore_columns, dpbusd, fhalf8, fma8, fmul8, fsplat8,
    fstore8, fzero8, iadd, ifloat, iload_u8, imul, isplat8, izero,
)
from inferno.backends.numba.lanes import f16at, prefetch_l2, target_cpu
from inferno.backends.numba.qdot import NO, Q4_K_BYTES, QK, SUMS, YES
from inferno.formats.quant import QuantTensor

jit = nb.njit(cache=True, nogil=True, fastmath=FAST)
inline = nb.njit(cache=True, nogil=True, fastmath=FAST, inline="always")

P = 8  # rows per panel
REC = P * Q4_K_BYTES  # bytes of a panel's super-block: 1152
SCL, SCH, QS = 32, 96, 128  # where a record's scales' low bits, high bits and nibbles start


# -- repacking -----------------------------------------------------------------------------------------
@jit
def repack_panel(f, o, rb, g, go):
    """The eight Q4_K rows at bytes o, o + rb, .. of f as one panel at g[go:go + 8 rb]."""
    for u in range(rb // Q4_K_BYTES):
        so, rec = o + Q4_K_BYTES * u, go + REC * u
        for i in range(P):
            ro = so + i * rb
            g[rec + 2 * i], g[rec + 2 * i + 1] = f[ro], f[ro + 1]  # d
            g[rec + 16 + 2 * i], g[rec + 17 + 2 * i] = f[ro + 2], f[ro + 3]  # dmin
        for e in range(32):
            g[rec + SCH + e] = 0
        for i in range(P):
            for gr in range(8):
                sc, m = qgemm.q4k_scale_min(f, so + i * rb + 4, gr)
                sc, m, e = np.int64(sc), np.int64(m), 8 * gr + i
                g[rec + SCL + e] = (sc & 15) | ((m & 15) << 4)
                g[rec + SCH + e % 32] |= ((sc >> 4) | ((m >> 4) << 2)) << (4 * (e // 32))
        for j in range(4):
            a = so + 16 + 32 * j
            bstore_columns(g, rec + QS + 256 * j, 32, bload(f, a), bload(f, a + rb), bload(f, a + 2 * rb),
                           bload(f, a + 3 * rb), bload(f, a + 4 * rb), bload(f, a + 5 * rb),
                           bload(f, a + 6 * rb), bload(f, a + 7 * rb))


@jit
def repack_range(w, out, p0, p1):
    """Panels p0..p1 of Q4_K rows w [rows, row_bytes] (rows a multiple of 8) into out, alike."""
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
def unpanel_row(f, rb, r, out, oo):
    """Row r of a panelled weight (f its bytes, rb a row's) as the file's Q4_K row, into
    out[oo:oo + rb]."""
    i = r % P
    for u in range(rb // Q4_K_BYTES):
        rec, so = (r // P) * P * rb + REC * u, oo + Q4_K_BYTES * u
        out[so], out[so + 1] = f[rec + 2 * i], f[rec + 2 * i + 1]
        out[so + 2], out[so + 3] = f[rec + 16 + 2 * i], f[rec + 17 + 2 * i]
        sc = np.empty(8, np.int64)
        m = np.empty(8, np.int64)
        for gr in range(8):
            e = 8 * gr + i
            lo, hi = f[rec + SCL + e], f[rec + SCH + e % 32] >> (4 * (e // 32))
            sc[gr] = (lo & 15) | ((hi & 3) << 4)
            m[gr] = (lo >> 4) | (((hi >> 2) & 3) << 4)
        for gr in range(4):  # ggml's 12 bytes (get_scale_min_k4 read backwards)
            out[so + 4 + gr] = (sc[gr] & 63) | ((sc[gr + 4] >> 4) << 6)
            out[so + 8 + gr] = (m[gr] & 63) | ((m[gr + 4] >> 4) << 6)
            out[so + 12 + gr] = (sc[gr + 4] & 15) | ((m[gr + 4] & 15) << 4)
        for j in range(4):
            for t in range(8):
                for k in range(4):
                    out[so + 16 + 32 * j + 4 * t + k] = f[rec + QS + 256 * j + 32 * t + 4 * i + k]


@jit
def unpanel_rows(w, out, r0, r1):
    """Rows r0..r1 of a panelled weight w as the file's Q4_K rows, into out [r1 - r0, row_bytes]."""
    f, o = w.reshape(-1), out.reshape(-1)
    for r in range(r0, r1):
        unpanel_row(f, w.shape[1], r, o, (r - r0) * w.shape[1])


# -- decode and a few rows -----------------------------------------------------------------------------
@inline
def record_scales(f, rec, sm):
    """A record's 64 scales into sm[0:64] and its 64 mins into sm[64:128], entry 8 g + i."""
    lo0, lo1, hi = bload(f, rec + SCL), bload(f, rec + SCL + 32), bload(f, rec + SCH)
    bstore(sm, 0, bhigh(bbits(lo0, 0, 15), hi, 0, 3))
    bstore(sm, 32, bhigh(bbits(lo1, 0, 15), hi, 4, 3))
    bstore(sm, 64, bhigh(bbits(lo0, 4, 15), hi, 2, 3))
    bstore(sm, 96, bhigh(bbits(lo1, 4, 15), hi, 6, 3))


@inline
def _scaled(f, q, qb, x8, xo, sm, smb, j, s, sb):
    """s (sb) + groups 2j and 2j + 1 of one panel's (another's) super-block, their nibbles at
    byte q (qb), their scales in sm (smb), times the activations at xo: each activation quad is
    broadcast once for both panels."""
    a_lo, a_hi, b_lo, b_hi = izero(), izero(), izero(), izero()
    for t in range(8):
        xa, xb = bsplat4(x8, xo + 4 * t), bsplat4(x8, xo + 32 + 4 * t)
        v, w = bload(f, q + 32 * t), bload(f, qb + 32 * t)
        a_lo, a_hi = dpbusd(a_lo, bbits(v, 0, 15), xa), dpbusd(a_hi, bbits(v, 4, 15), xb)
        b_lo, b_hi = dpbusd(b_lo, bbits(w, 0, 15), xa), dpbusd(b_hi, bbits(w, 4, 15), xb)
    s = iadd(s, iadd(imul(a_lo, iload_u8(sm, 16 * j)), imul(a_hi, iload_u8(sm, 16 * j + 8))))
    sb = iadd(sb, iadd(imul(b_lo, iload_u8(smb, 16 * j)), imul(b_hi, iload_u8(smb, 16 * j + 8))))
    return s, sb


@inline
def _unit_end(f, rec, sm, s, t, isum, dx, dr, b, u, two, acc):
    """acc + one panel's super-block for activation row b: its integer sums (s; t of the
    remainder row), and the mins against the groups' int8 sums (m, n), as qdot.k_tail adds them."""
    at = SUMS * u + 8
    rest = isum.shape[1] // 2
    m, n = izero(), izero()
    for g in range(8):
        mins = iload_u8(sm, 64 + 8 * g)
        m = iadd(m, imul(mins, isplat8(isum[b, at + g])))
        if two:
            n = iadd(n, imul(mins, isplat8(isum[b, rest + at + g])))
    d, o = fhalf8(f, rec), fmul8(fhalf8(f, rec + 16), fsplat8(np.float32(-1.0)))
    acc = fma8(ifloat(s), fmul8(d, fsplat8(dx[b, u])), acc)
    if two:
        acc = fma8(ifloat(t), fmul8(d, fsplat8(dr[b, u])), acc)
    acc = fma8(ifloat(m), fmul8(o, fsplat8(dx[b, u])), acc)
    if two:
        acc = fma8(ifloat(n), fmul8(o, fsplat8(dr[b, u])), acc)
    return acc


@jit
def _panel_pair(two, f, ra, rb_, units, sm, smb, x8, r8, dx, dr, isum, b):
    """Two panels (their first records at bytes ra and rb_) against activation row b: sixteen
    rows' results, two streams of weights read side by side."""
    n = x8.shape[1]
    acc, accb = fzero8(), fzero8()
    for u in range(units):
        rec, recb = ra + REC * u, rb_ + REC * u
        # The next pair of panels, at twice this pair's pace, into L2: prefetches into L1 (what
        # qdot's slower loops take on AMD) held the miss buffers and cut the rate from DRAM.
        nxt = ra + 2 * REC * (units + u)
        for k in range(2 * REC // 64):
            prefetch_l2(f, nxt + 64 * k)
        record_scales(f, rec, sm)
        record_scales(f, recb, smb)
        xo = b * n + QK * u
        s, sb, t, tb = izero(), izero(), izero(), izero()
        for j in range(4):
            q, qb = rec + QS + 256 * j, recb + QS + 256 * j
            s, sb = _scaled(f, q, qb, x8, xo + 64 * j, sm, smb, j, s, sb)
            if two:
                t, tb = _scaled(f, q, qb, r8, xo + 64 * j, sm, smb, j, t, tb)
        acc = _unit_end(f, rec, sm, s, t, isum, dx, dr, b, u, two, acc)
        accb = _unit_end(f, recb, smb, sb, tb, isum, dx, dr, b, u, two, accb)
    return acc, accb


@jit
def _p_rows(two, w, x8, r8, dx, dr, isum, out, r0, r1):
    """p_rows with `two` a literal."""
    f = w.reshape(-1)
    rb = w.shape[1]
    units = rb // Q4_K_BYTES
    sm, smb = np.empty(128, np.uint8), np.empty(128, np.uint8)
    lanes = np.empty(2 * P, np.float32)
    p, p1 = r0 // P, (r1 + P - 1) // P
    while p < p1:
        pb = min(p + 1, p1 - 1)  # an odd last panel is paired with itself
        for b in range(x8.shape[0]):
            acc, accb = _panel_pair(two, f, P * p * rb, P * pb * rb, units, sm, smb, x8, r8, dx, dr, isum, b)
            fstore8(lanes, 0, acc)
            fstore8(lanes, P, accb)
            for i in range(max(r0 - P * p, 0), min(r1 - P * p, P * (pb - p + 1))):
                out[b, P * p + i] = lanes[i]
        p += 2


@jit
def p_rows(w, x8, r8, dx, dr, isum, out, r0, r1):
    """out[b, r] = w[r] . x'[b] for rows r0..r1 of a panelled weight w and every activation row
    b that qdot.quantize wrote (decode, or the few of a server's step): each row's product is
    computed alike however many come with it. Whole panels are read; only rows r0..r1 are
    written."""
    if dr.shape[0] > 0:
        _p_rows(YES, w, x8, r8, dx, dr, isum, out, r0, r1)
    else:
        _p_rows(NO, w, x8, r8, dx, dr, isum, out, r0, r1)


# -- prefill: qgemm's panels, unpacked from the stored ones ----------------------------------------------
@jit
def unpack_panel(f, rec0, units, pq, psc, pd, pm, po, sm, half):
    """The stored panel at byte rec0 as half `half` (rows 8 half..) of qgemm's (pq, psc, pd, pm):
    its nibbles split into bytes, in qgemm's step order (step 64 u + 8 g + t holds the quads of
    weights 4t.. of group g)."""
    step, rows = qgemm.STEP_BYTES, qgemm.ROWS
    for u in range(units):
        rec = rec0 + REC * u
        for j in range(4):
            for t in range(8):
                v = bload(f, rec + QS + 256 * j + 32 * t)
                at = step * (qgemm.STEPS * u + 16 * j + t) + 32 * half
                bstore(pq, at, bbits(v, 0, 15))
                bstore(pq, at + 8 * step, bbits(v, 4, 15))
        record_scales(f, rec, sm)
        for i in range(P):
            r = P * half + i
            pd[rows * u + r] = f16at(f, rec + 2 * i)
            po[rows * u + r] = -f16at(f, rec + 16 + 2 * i)
            for g in range(8):
                psc[(8 * u + g) * rows + r] = sm[8 * g + i]
                pm[qgemm.pm_at(u, g, r)] = sm[64 + 8 * g + i]


@jit
def p_gemm(w, x8, r8, dx, dr, isum, out, r0, r1):
    """As qgemm.k_gemm, for a panelled weight: sixteen rows at a time unpacked into one of
    qgemm's panels (no transpose: the stored panels already are interleaved), then the same
    passes. Rows r0..r1 that do not start or end on a panel go through p_rows."""
    f = w.reshape(-1)
    rb = w.shape[1]
    units = rb // Q4_K_BYTES
    a0, a1 = min(-(-r0 // P) * P, r1), max(r1 // P * P, r0)
    if a0 >= a1:
        p_rows(w, x8, r8, dx, dr, isum, out, r0, r1)
        return
    if r0 < a0:
        p_rows(w, x8, r8, dx, dr, isum, out, r0, a0)
    if a1 < r1:
        p_rows(w, x8, r8, dx, dr, isum, out, a1, r1)
    p = qgemm.buffers(units)
    sm = np.empty(128, np.uint8)
    for p0 in range(a0, a1, qgemm.ROWS):
        n = min(qgemm.ROWS, a1 - p0)
        unpack_panel(f, p0 * rb, units, p[0], p[1], p[2], p[3], p[4], sm, 0)
        if n > P:  # else the second half's lanes hold the last panel's rows, computed and dropped
            unpack_panel(f, (p0 + P) * rb, units, p[0], p[1], p[2], p[3], p[4], sm, 1)
        qgemm.passes(Q4_K_BYTES, p, units, x8, r8, dx, dr, isum, out, p0, n)


# -- the weight -----------------------------------------------------------------------------------------
class Panelled(QuantTensor):
    """A weight whose rows a backend stores as panels (PanelTensor here, lpanels.LegacyPanels):
    `data` keeps the file's shape and size; rows are not contiguous in it, so row views are
    copies, unpacked to the file's layout (`_unpanel`)."""

    __slots__ = ()

    def _unpanel(self, out: np.ndarray, r0: int, r1: int) -> None:
        raise NotImplementedError

    def rows(self, r0: int, r1: int) -> QuantTensor:
        out = np.empty((r1 - r0, self.data.shape[1]), np.uint8)
        self._unpanel(out, r0, r1)
        return QuantTensor(self.qtype, (r1 - r0, self.shape[1]), out, self.outlier_inputs)

    def take_rows(self, order: np.ndarray) -> QuantTensor:
        return QuantTensor.take_rows(self.rows(0, self.shape[0]), order)

    def dequantize(self, r0: int = 0, r1: int | None = None) -> np.ndarray:
        return self.rows(r0, self.shape[0] if r1 is None else r1).dequantize()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.qtype.name}, {list(self.shape)})"


class PanelTensor(Panelled):
    """A Q4_K weight whose rows are stored as panels (see the module docstring): the numba
    backends' form of a Q4_K linear weight."""

    __slots__ = ()
    kind_name = "Q4_KX8"

    def _unpanel(self, out: np.ndarray, r0: int, r1: int) -> None:
        unpanel_rows(self.data, out, r0, r1)



def pays_on(cpu: str) -> bool:
    """Whether the backends repack Q4_K linear weights into panels by default on this CPU (LLVM's
    name for it): where a model's decode, its weights streaming from DRAM, measured at least as
    fast on panels as on the file's rows. Zen 4: yes (the 8B shape's decode 1.29x, the smaller
    files 1.00-1.01x). Zen 5: no (from DRAM 0.65-0.89x of qdot.k_rows, whatever the prefetch;
    the 8B shape's decode 0.85x), as the panels' gain is in the arithmetic and a Zen 5 core
    keeps up with its memory on the file's rows. Elsewhere unmeasured on the hardware itself,
    so the file's rows stay (bench/RESULTS.md, "A Zen 5 host")."""
    return cpu == "znver4"


PAYS = pays_on(target_cpu())


def can_repack(w) -> bool:
    """Whether w is a Q4_K weight that panels can hold: rows in whole panels."""
    return type(w) is QuantTensor and w.qtype.name == "Q4_K" and w.shape[0] % P == 0 and w.shape[0] > 0


def repack(w: QuantTensor, threads: int = 1, launch=None) -> PanelTensor:
    """w (can_repack) as panels, in memory of its own; the pages of a memory-mapped original
    are handed back to the kernel once copied (`release`), so the panels replace them in the
    process's memory rather than sit beside them. On this thread unless `threads` > 1, then
    through `launch(kernel, *args)` (pool's, which holds its lock around Numba's thread team):
    a one-core backend starts no threads at load."""
    out = np.empty(w.data.shape, np.uint8)
    chunks = max(1, min(threads, w.shape[0] // P))
    if chunks == 1:
        repack_range(w.data, out, 0, w.shape[0] // P)
    else:
        (launch or call_here)(repack_rows, w.data, out, chunks)
    release(w.data)
    out.flags.writeable = False
    return PanelTensor(w.qtype, w.shape, out, w.outlier_inputs)


def call_here(kernel, *args):
    """kernel(*args) on this thread: the repacks' launch where no pool lends its threads."""
    return kernel(*args)


_MADV_DONTNEED = 4


def release(data: np.ndarray) -> None:
    """Drop this process's pages of `data` if it views a read-only memory-mapped file (the
    file's pages stay in the page cache; a later read maps them again): whole pages only, so a
    neighbouring tensor's bytes are never touched. Anything else is left to the garbage
    collector."""
    base = data
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):  # np.frombuffer's
        base = base.obj
    if not isinstance(base, mmap.mmap) or not data.flags.c_contiguous:
        return
    page = mmap.PAGESIZE
    start = data.ctypes.data
    lo, hi = -(-start // page) * page, (start + data.nbytes) // page * page
    if hi <= lo:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED)
    except (OSError, AttributeError):
        pass
