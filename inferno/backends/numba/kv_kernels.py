"""Numba kernels for KV caches of every cache type (cache_types.py): writes, reads, and batched
decode attention over the cache as stored (no float32 copy of it), for the simd and pool
backends.

A kernel takes a buffer as its bytes (uint8 [slots, capacity, row_bytes]) plus `kind`, the cache
type's code (codes.CacheKind, as an int). Writes and reads branch on it once per row; decode compiles one
copy of its loops per type (the kind passed on as a literal), since its branch would sit in the
innermost loop.

Numba has no float16 on the CPU (an array of it fails to compile: "NotImplementedError:
float16"). Converting the bits by hand (shifts, a multiply by 2^112, a select for inf/NaN) runs
at 0.39 ns per element in a dot product here, against 0.13 for float32; the intrinsics below
emit LLVM's own half <-> float conversion instead, which compiles to vcvtph2ps / vcvtps2ph
(F16C, AVX-512 here): 0.15 ns per element, and bit-exact with numpy's conversions both ways.

Decode accumulates in float32 and reads the cache where it lies: each cached K or V slice is
converted in registers (vcvtph2ps for f16) as the dot products take it, never copied out. The
kernel before this one converted tiles of whole rows into float32 scratch, which every query head
then read back from L2; with one FMA chain per key it waited on FMA latency as well: this way
is about 1.7x faster a step at long contexts (bench/RESULTS.md, "Figures behind the kernels' shape"). Software prefetch of the next tile, or of
the next job's first, measured no gain: not done.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from inferno.backends.numba import jitcache
from inferno.formats.cache_types import Q8_0_BYTES, QK8_0
from inferno.backends.numba.codes import CacheKind
from inferno.backends.numba.dense import FAST, exp_into, jit
from inferno.backends.numba.lanes import (
    f16at, f16bits, u32at, vadd, vbf16, vf16, vfma, vi8, vload, vmul, vsplat, vstore, vsum, vzero,
)
from inferno.backends.numba.quantizers import quantize_q8_0

# The cache kinds as the kernels branch on them: plain ints (codes.py says why).
F32, F16, BF16, Q8_0 = map(int, CacheKind)

# Writes round exactly as cache_types.py does: no fastmath (arcp would turn amax / 127 into a
# multiply by a rounded reciprocal and change Q8_0's scales).
exact = nb.njit(cache=True, nogil=True)
inline = nb.njit(cache=True, nogil=True, fastmath=FAST, inline="always")


@intrinsic
def f16_to_f32(typingctx, h):
    """IEEE half bits (uint16) -> float32, exactly."""
    def codegen(context, builder, sig, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.uint16), codegen


@intrinsic
def bits_to_f32(typingctx, u):
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.uint32), codegen


@intrinsic
def f32_to_bits(typingctx, x):
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen


# -- writes ---------------------------------------------------------------------------------------
@exact
def write_rows(rows, raw, kind, slot, start):
    """Rows of float32 [n, width] into positions start.. of one slot, converted to the cache type."""
    for i in range(rows.shape[0]):
        x, dst = rows[i], raw[slot, start + i]
        if kind == F32:
            y = dst.view(np.float32)
            for d in range(x.shape[0]):  # (a loop: a slice assignment's shape check compiles its message)
                y[d] = x[d]
        elif kind == F16:
            y = dst.view(np.uint16)
            for d in range(x.shape[0]):
                y[d] = f16bits(x[d])
        elif kind == BF16:
            y = dst.view(np.uint16)
            for d in range(x.shape[0]):
                u = f32_to_bits(x[d])
                rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
                y[d] = np.uint16(0x7FC0) if x[d] != x[d] else np.uint16(rounded)  # NaN stays quiet NaN
        else:
            # Q8_0 blocks exactly as the weights' quantizer (and cache_types) make them
            quantize_q8_0(x.reshape(1, -1), dst.reshape(1, -1), 0, 1)


@exact
def write_scattered(rows, raw, kind, slots, positions):
    """Row i of float32 rows [n, width] into position positions[i] of slot slots[i]; returns
    -1, or, writing nothing, the first i whose slot or position lies outside raw (checked here:
    a few compares, where numpy's reductions cost the caller microseconds a call)."""
    for i in range(rows.shape[0]):
        if not (0 <= slots[i] < raw.shape[0] and 0 <= positions[i] < raw.shape[1]):
            return i
    for i in range(rows.shape[0]):
        write_rows(rows[i:i + 1], raw, kind, slots[i], positions[i])
    return -1


# -- reads ----------------------------------------------------------------------------------------
@jit
def load_rows(raw, kind, slot, start, n, col, width, dst):
    """dst[:n, :width] = float32 of features col..col+width of positions start..start+n of one
    slot (q8_0: col and width are whole blocks). One branch on the type per call, so decode
    converts a tile of rows per call, not a row."""
    rows = raw[slot, start:start + n]  # [n, row_bytes] uint8
    # Each row is sliced before the loop over features: an index such as col + d, which LLVM
    # cannot prove non-negative, keeps Numba's negative-index check in the loop and stops it
    # vectorising (3-5x slower).
    if kind == F32:
        x = rows.view(np.float32)
        for j in range(n):
            src, out = x[j, col:col + width], dst[j]
            for d in range(width):
                out[d] = src[d]
    elif kind == F16:
        h = rows.view(np.uint16)
        for j in range(n):
            src, out = h[j, col:col + width], dst[j]
            for d in range(width):
                out[d] = f16_to_f32(src[d])
    elif kind == BF16:
        h = rows.view(np.uint16)
        for j in range(n):
            src, out = h[j, col:col + width], dst[j]
            for d in range(width):
                out[d] = bits_to_f32(np.uint32(src[d]) << np.uint32(16))
    else:
        blocks = width // QK8_0
        # 32, but not a constant to LLVM: with a constant trip count it unrolls the block's
        # loop fully and leaves it scalar (0.48 ns per element, against 0.07 vectorised).
        qk = width // blocks
        signed = rows.view(np.int8)
        c0 = col // QK8_0 * Q8_0_BYTES
        for j in range(n):
            src, qs, out = rows[j, c0:], signed[j, c0:], dst[j]
            for b in range(blocks):
                o = b * Q8_0_BYTES
                scale = f16_to_f32(np.uint16(src[o]) | np.uint16(src[o + 1]) << np.uint16(8))
                for i in range(qk):
                    out[b * qk + i] = scale * np.float32(qs[o + 2 + i])


@jit
def read_rows(raw, kind, slot, start, out):
    """out [n, width] = float32 of positions start..start+n of one slot."""
    load_rows(raw, kind, slot, start, out.shape[0], 0, out.shape[1], out)


class CacheOps(NamedTuple):
    write: object  # (rows, raw, slot, start): write_rows
    scatter: object  # (rows, raw, slots, positions) -> write_scattered's answer
    read: object  # (raw, slot, start, out): read_rows


@functools.cache
def cache_ops_for(kind: CacheKind) -> CacheOps:
    """write_rows, write_scattered and read_rows for one cache type alone, each compiling that
    type's branch only (the closures' literal; compiler.py prunes the others). (With the type an
    argument, every type's conversions compiled, Q8_0's quantizer among them: 1-1.5 s of a first
    run.)"""
    kind = int(CacheKind(kind))

    @exact
    def write_kind(rows, raw, slot, start):
        write_rows(rows, raw, kind, slot, start)

    @exact
    def scatter_kind(rows, raw, slots, positions):
        return write_scattered(rows, raw, kind, slots, positions)

    @jit
    def read_kind(raw, slot, start, out):
        read_rows(raw, kind, slot, start, out)
    return CacheOps(jitcache.lazy(write_kind), jitcache.lazy(scatter_kind), jitcache.lazy(read_kind))


# -- batched decode attention ---------------------------------------------------------------------
# Keys per tile in decode. A tile's rows come from DRAM once and stay in L1/L2 while every query
# head of the step reads its KV head's slice of them (GQA: group heads share a slice).
DECODE_TILE = 64
MAX_SPLITS = 16  # key ranges per row of a decode step, at most (row_splits)


@inline
def _row16(kind, f, o, c):
    """Elements 16c..16c + 16 of a cached head slice at byte o of f, as float32, converted in
    registers (vcvtph2ps for f16): the slice is never copied out as float32."""
    if kind == F32:
        return vload(f, o + 64 * c)  # bytes of a uint8 array: 16 float32 at byte o + 64c
    if kind == F16:
        return vf16(f, o + 32 * c)
    if kind == BF16:
        return vbf16(f, o + 32 * c)
    b = o + (c >> 1) * Q8_0_BYTES  # q8_0: a block of 32 is two chunks of 16, after its f16 scale
    return vmul(vi8(f, b + 2 + 16 * (c & 1)), vsplat(f16at(f, b)))


@inline
def _elem(kind, f, o, d):
    """Element d of a cached head slice at byte o (the head dims past the last 16; f32, f16 and
    bf16 only: q8_0 slices are whole blocks of 32)."""
    if kind == F32:
        return bits_to_f32(np.uint32(u32at(f, o + 4 * d)))
    if kind == F16:
        return f16at(f, o + 2 * d)
    h = np.uint32(f[o + 2 * d]) | (np.uint32(f[o + 2 * d + 1]) << np.uint32(8))
    return bits_to_f32(h << np.uint32(16))


@jit
def head_bytes(kind, hd):
    """Bytes of one KV head's slice of a cached row."""
    if kind == F32:
        return 4 * hd
    if kind == Q8_0:
        return hd // QK8_0 * Q8_0_BYTES
    return 2 * hd


@inline
def _scores(kind, qs, qo, f, o, rb, n, hd, sr):
    """sr[j] = qs[qo:qo + hd] . the head slice of cached row j (at byte o + j rb), j < n. Four
    keys per pass, each with two accumulators (even and odd chunks of 16): eight independent
    FMA chains, where one key at a time waited on the FMA latency of its single chain (4 cycles
    a chunk)."""
    chunks = hd // 16
    j = 0
    while j + 4 <= n:
        a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
        b0, b1, b2, b3 = vzero(), vzero(), vzero(), vzero()
        p = o + j * rb
        c = 0
        while c + 2 <= chunks:
            qa, qb = vload(qs, qo + 16 * c), vload(qs, qo + 16 * c + 16)
            a0 = vfma(qa, _row16(kind, f, p, c), a0)
            a1 = vfma(qa, _row16(kind, f, p + rb, c), a1)
            a2 = vfma(qa, _row16(kind, f, p + 2 * rb, c), a2)
            a3 = vfma(qa, _row16(kind, f, p + 3 * rb, c), a3)
            b0 = vfma(qb, _row16(kind, f, p, c + 1), b0)
            b1 = vfma(qb, _row16(kind, f, p + rb, c + 1), b1)
            b2 = vfma(qb, _row16(kind, f, p + 2 * rb, c + 1), b2)
            b3 = vfma(qb, _row16(kind, f, p + 3 * rb, c + 1), b3)
            c += 2
        if c < chunks:
            qa = vload(qs, qo + 16 * c)
            a0 = vfma(qa, _row16(kind, f, p, c), a0)
            a1 = vfma(qa, _row16(kind, f, p + rb, c), a1)
            a2 = vfma(qa, _row16(kind, f, p + 2 * rb, c), a2)
            a3 = vfma(qa, _row16(kind, f, p + 3 * rb, c), a3)
        sr[j], sr[j + 1] = vsum(vadd(a0, b0)), vsum(vadd(a1, b1))
        sr[j + 2], sr[j + 3] = vsum(vadd(a2, b2)), vsum(vadd(a3, b3))
        j += 4
    while j < n:
        a = vzero()
        for c in range(chunks):
            a = vfma(vload(qs, qo + 16 * c), _row16(kind, f, o + j * rb, c), a)
        sr[j] = vsum(a)
        j += 1
    for d in range(16 * chunks, hd):  # head dims past the last 16
        for j in range(n):
            sr[j] += qs[qo + d] * _elem(kind, f, o + j * rb, d)


@inline
def _accumulate(kind, p, corr, f, o, rb, n, hd, acc, ao):
    """acc[ao:ao + hd] = corr * acc[ao:ao + hd] + sum_j p[j] * (head slice of cached row j), j < n.
    Four chunks of 16 dims per pass, each with two accumulators (even and odd keys), held in
    registers over the tile: eight independent FMA chains."""
    chunks = hd // 16
    cv = vsplat(corr)
    c = 0
    while c < chunks:
        w = min(4, chunks - c)  # chunks this pass (the last pass may have fewer)
        a0, a1 = vmul(vload(acc, ao + 16 * c), cv), vzero()
        a2, a3 = (vmul(vload(acc, ao + 16 * c + 16), cv) if w > 1 else vzero()), vzero()
        a4, a5 = (vmul(vload(acc, ao + 16 * c + 32), cv) if w > 2 else vzero()), vzero()
        a6, a7 = (vmul(vload(acc, ao + 16 * c + 48), cv) if w > 3 else vzero()), vzero()
        j = 0
        while j + 2 <= n:
            pe, po = vsplat(p[j]), vsplat(p[j + 1])
            q0, q1 = o + j * rb, o + (j + 1) * rb
            a0 = vfma(pe, _row16(kind, f, q0, c), a0)
            a1 = vfma(po, _row16(kind, f, q1, c), a1)
            if w > 1:
                a2 = vfma(pe, _row16(kind, f, q0, c + 1), a2)
                a3 = vfma(po, _row16(kind, f, q1, c + 1), a3)
            if w > 2:
                a4 = vfma(pe, _row16(kind, f, q0, c + 2), a4)
                a5 = vfma(po, _row16(kind, f, q1, c + 2), a5)
            if w > 3:
                a6 = vfma(pe, _row16(kind, f, q0, c + 3), a6)
                a7 = vfma(po, _row16(kind, f, q1, c + 3), a7)
            j += 2
        if j < n:
            pe, q0 = vsplat(p[j]), o + j * rb
            a0 = vfma(pe, _row16(kind, f, q0, c), a0)
            if w > 1:
                a2 = vfma(pe, _row16(kind, f, q0, c + 1), a2)
            if w > 2:
                a4 = vfma(pe, _row16(kind, f, q0, c + 2), a4)
            if w > 3:
                a6 = vfma(pe, _row16(kind, f, q0, c + 3), a6)
        vstore(acc, ao + 16 * c, vadd(a0, a1))
        if w > 1:
            vstore(acc, ao + 16 * c + 16, vadd(a2, a3))
        if w > 2:
            vstore(acc, ao + 16 * c + 32, vadd(a4, a5))
        if w > 3:
            vstore(acc, ao + 16 * c + 48, vadd(a6, a7))
        c += w
    for d in range(16 * chunks, hd):  # head dims past the last 16
        t = acc[ao + d] * corr
        for j in range(n):
            t += p[j] * _elem(kind, f, o + j * rb, d)
        acc[ao + d] = t


@jit
def row_splits(keys, min_keys):
    """How many ranges a row's keys are cut into, one job each: a power of two, at most
    MAX_SPLITS, none shorter than min_keys. A function of the row's own keys, so its attention
    is the same sum whatever rows share its step, and a prefill's row the same as that row
    decoded (the model sends both here: Backend.batch_invariant); powers of two share out
    evenly over 2, 4 or 8 threads."""
    n = 1
    while n < MAX_SPLITS and 2 * n * min_keys <= keys:
        n *= 2
    return n


@jit
def most_splits(kv_lens, window, min_keys):
    """The most ranges any row of a step takes (row_splits): the jobs per row of the step."""
    n = 1
    for b in range(kv_lens.shape[0]):
        keys = min(kv_lens[b], window) if window > 0 else kv_lens[b]
        n = max(n, row_splits(keys, min_keys))
    return n


@jit
def decode_job(kind, q, k_raw, v_raw, slots, kv_lens, window, scale, sinks, n_kv_heads, head_dim, job,
               min_keys, part_acc, part_m, part_l):
    """One job of a decode step: row b, split `split` of the keys it attends
    (max(0, kv_len - window) .. kv_len - 1, cut into row_splits of them contiguous ranges of
    equal size, the last shorter; a split past them is empty), every head.
    Leaves each head's unnormalised accumulator, running max m and running sum l in part_acc
    [B, n_heads, n_splits, hd], part_m, part_l [B, n_heads, n_splits]; merge_parts combines the
    splits. An empty split leaves m = -inf, l = 0, acc = 0. `kind` is the cache type's code, a
    literal (decode_all_for, the pool's _decode_for): each type compiles its own loops.
    `sinks` (float32 [n_heads], -inf where a head has none; base.Backend.decode_attention): head
    h's sink joins split 0 alone, as the column its keys follow (m starts at the sink, l at 1),
    so the merge counts it once per row and head. Always an array (-inf: none), so one compiled
    kernel serves models with sinks and without.

    Tile by tile of keys, head by head: the head's scores over the tile (each key slice
    converted in registers and dotted with the query in 16-lane vectors), the online softmax,
    then the value rows into the head's accumulator, 16 dims at a time held in registers over
    the tile's keys (the module docstring says what this replaced)."""
    n_heads, n_splits = q.shape[1] // head_dim, part_acc.shape[2]
    b, split = job // n_splits, job % n_splits
    kv_len = kv_lens[b]
    first = max(0, kv_len - window) if window > 0 else 0
    n = row_splits(kv_len - first, min_keys)
    size = (kv_len - first + n - 1) // n
    lo = first + split * size
    hi = min(lo + size, kv_len)
    group, hd = n_heads // n_kv_heads, head_dim
    hb = head_bytes(kind, hd)
    kf, vf = k_raw.reshape(-1), v_raw.reshape(-1)
    rb = k_raw.shape[2]  # bytes per cached row
    row0 = (slots[b] * k_raw.shape[1]) * rb  # the slot's first row
    scale32 = np.float32(scale)
    qs = np.empty(n_heads * hd, np.float32)  # the queries, scaled
    for i in range(n_heads * hd):
        qs[i] = q[b, i] * scale32
    rows = max(1, min(DECODE_TILE, hi - lo))  # a short cache needs a short tile
    sr = np.empty(rows, np.float32)  # a head's scores over the tile, then its probabilities
    shifted = np.empty(rows, np.float32)
    bits = np.empty(rows, np.int32)
    acc = np.zeros(n_heads * hd, np.float32)
    m = np.full(n_heads, -np.inf, np.float32)
    l = np.zeros(n_heads, np.float32)
    if split == 0:  # the sinks, once per row: split 0 is never empty (it holds the oldest key)
        for h in range(n_heads):
            m[h] = sinks[h]  # -inf (no sink) keeps m = -inf, l = 0: the same bits as without
            l[h] = 0.0 if sinks[h] == -np.inf else 1.0
    for t0 in range(lo, hi, rows):
        n = min(rows, hi - t0)
        base = row0 + t0 * rb
        for h in range(n_heads):
            o, qo = base + (h // group) * hb, h * hd
            _scores(kind, qs, qo, kf, o, rb, n, hd, sr)
            mx = m[h]
            for j in range(n):
                mx = max(mx, sr[j])
            for j in range(n):
                shifted[j] = sr[j] - mx
            exp_into(shifted, sr, bits, n)  # sr now holds probabilities
            corr = np.float32(math.exp(m[h] - mx))  # 0 on the first tile without a sink (m = -inf)
            total = np.float32(0.0)
            for j in range(n):
                total += sr[j]
            l[h] = l[h] * corr + total
            m[h] = mx
            _accumulate(kind, sr, corr, vf, o, rb, n, hd, acc, qo)
    for h in range(n_heads):  # (loops: a slice assignment's shape check compiles its message)
        for d in range(hd):
            part_acc[b, h, split, d] = acc[h * hd + d]
        part_m[b, h, split] = m[h]
        part_l[b, h, split] = l[h]


@jit
def merge_parts(part_acc, part_m, part_l, out):
    """out[b, head h] = sum_s w_s acc_s / sum_s w_s l_s, w_s = exp(m_s - max_s m_s): the splits
    of each (sequence, head) combined. Split 0 holds the head's oldest visible key, so the max
    is finite; an empty split has m = -inf and weight 0. A head's sink is in split 0's m and l
    (decode_job): it joins here once, with that split's weight."""
    batch, n_heads, n_splits, hd = part_acc.shape
    w = np.empty(n_splits, np.float32)
    for b in range(batch):
        for h in range(n_heads):
            mx = part_m[b, h, 0]
            for sp in range(1, n_splits):
                mx = max(mx, part_m[b, h, sp])
            den = np.float32(0.0)
            for sp in range(n_splits):
                w[sp] = np.float32(math.exp(part_m[b, h, sp] - mx))
                den += w[sp] * part_l[b, h, sp]
            o = out[b, h * hd:(h + 1) * hd]
            o[:] = 0.0
            for sp in range(n_splits):
                a, ws = part_acc[b, h, sp], w[sp] / den
                for d in range(hd):
                    o[d] += a[d] * ws


@jit
def alloc_parts(q, kv_lens, window, min_keys, head_dim):
    """Scratch for a step's jobs: acc [B, n_heads, n_splits, head_dim], m and l [.., n_splits],
    n_splits = most_splits (the jobs per row)."""
    batch, n_heads, n_splits = q.shape[0], q.shape[1] // head_dim, most_splits(kv_lens, window, min_keys)
    return (np.empty((batch, n_heads, n_splits, head_dim), np.float32),
            np.empty((batch, n_heads, n_splits), np.float32),
            np.empty((batch, n_heads, n_splits), np.float32))


@jit
def merged(q, part_acc, part_m, part_l):
    """The step's output (q's shape), its rows' splits merged (merge_parts)."""
    out = np.empty_like(q)
    merge_parts(part_acc, part_m, part_l, out)
    return out


@functools.cache
def decode_all_for(kind: CacheKind):
    """Every job of a decode step one after another, then the merge (the simd backend), its
    loops compiled for one cache kind alone (the closure's literal, as qkernels.linear_for's):
    (q [B, n_heads * head_dim], k_raw, v_raw, slots, kv_lens, window, scale, sinks, n_kv_heads,
    head_dim, min_keys) -> [B, n_heads * head_dim]. The caller's jobs call decode_job directly:
    each layer of calls compiles the code below it again (Numba links its callees' code in)."""
    kind = int(CacheKind(kind))

    @jit
    def decode_all_kind(q, k_raw, v_raw, slots, kv_lens, window, scale, sinks, n_kv_heads, head_dim,
                        min_keys):
        part_acc, part_m, part_l = alloc_parts(q, kv_lens, window, min_keys, head_dim)
        for job in range(q.shape[0] * part_acc.shape[2]):
            decode_job(kind, q, k_raw, v_raw, slots, kv_lens, window, scale, sinks, n_kv_heads, head_dim,
                       job, min_keys, part_acc, part_m, part_l)
        return merged(q, part_acc, part_m, part_l)
    return jitcache.lazy(decode_all_kind)
