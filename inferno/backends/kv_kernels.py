"""Numba kernels for KV caches of every cache type (cache_types.py): writes, reads, and batched
decode attention over the cache as stored (no float32 copy of it), for the simd and pool
backends.

A kernel takes a buffer as its bytes (uint8 [slots, capacity, row_bytes]) plus `kind`, the cache
type's index in CACHE_TYPES, so one compiled kernel serves all four types: the branch on kind
is taken once per tile of rows, and each branch's inner loop over the features vectorises.

Numba has no float16 on the CPU (an array of it fails to compile: "NotImplementedError:
float16"). Converting the bits by hand (shifts, a multiply by 2^112, a select for inf/NaN) runs
at 0.39 ns per element in a dot product here, against 0.13 for float32; the intrinsics below
emit LLVM's own half <-> float conversion instead, which compiles to vcvtph2ps / vcvtps2ph
(F16C, AVX-512 here): 0.15 ns per element, and bit-exact with numpy's conversions both ways.

Decode accumulates in float32: a tile of cached rows is converted once into float32 scratch and
read by every query head of each KV head's group (GQA), so a cache row is read and converted
once per step, not once per query head. Measured and not kept (SmolLM2's heads, 4000 cached
tokens, 30 layers, one thread's CPU time per step): converting inside the dot products instead
of into scratch (f16 19.7 against 19.5 ms, f32 28.9 against 24.3), and software prefetch of the
next tile on top of that (slower again).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from inferno.backends.base import CACHE_TYPES
from inferno.backends.cache_types import Q8_0_BYTES, QK8_0
from inferno.backends.kernels import exp_into, jit
from inferno.backends.lanes import f16bits
from inferno.backends.qkernels import quantize_q8_0

F32, F16, BF16, Q8_0 = (CACHE_TYPES.index(t) for t in ("f32", "f16", "bf16", "q8_0"))

# Writes round exactly as cache_types.py does: no fastmath (arcp would turn amax / 127 into a
# multiply by a rounded reciprocal and change Q8_0's scales).
exact = nb.njit(cache=True, nogil=True)


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
            dst.view(np.float32)[:] = x
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


# -- batched decode attention ---------------------------------------------------------------------
# Keys per tile in decode: whole cached rows, converted to float32 (at Qwen3-0.6B's width, 8 x 128,
# 512 KB: in L2). Measured here per layer at 4000 cached tokens, tiles of 32 / 64 / 128 / 256 keys:
# SmolLM2 (9:3 x 64) in L3, f32 0.85 / 0.64 / 0.47 / 0.48 ms; from DRAM (30 layers) within 10%
# of each other; Qwen3-0.6B (16:8 x 128) f16, 2.4 / 2.8 / 2.5 / 2.0 ms.
DECODE_TILE = 128


@jit
def tile_scores(qr, tile, col, n, out):
    """out[j] = qr . tile[j, col:col + len(qr)] for the n rows of a tile. Four keys per pass
    share each load of q (1.3-1.5x over one key per pass)."""
    hd = qr.shape[0]
    j = 0
    while j + 4 <= n:
        k0, k1 = tile[j, col:col + hd], tile[j + 1, col:col + hd]
        k2, k3 = tile[j + 2, col:col + hd], tile[j + 3, col:col + hd]
        a0 = a1 = a2 = a3 = np.float32(0.0)
        for d in range(hd):
            x = qr[d]
            a0 += x * k0[d]
            a1 += x * k1[d]
            a2 += x * k2[d]
            a3 += x * k3[d]
        out[j], out[j + 1], out[j + 2], out[j + 3] = a0, a1, a2, a3
        j += 4
    while j < n:
        kr = tile[j, col:col + hd]
        a0 = np.float32(0.0)
        for d in range(hd):
            a0 += qr[d] * kr[d]
        out[j] = a0
        j += 1


@jit
def tile_accumulate(p, tile, col, n, acc):
    """acc += sum_j p[j] * tile[j, col:col + len(acc)]: four rows per pass, so acc is loaded
    and stored once per four keys."""
    hd = acc.shape[0]
    j = 0
    while j + 4 <= n:
        p0, p1, p2, p3 = p[j], p[j + 1], p[j + 2], p[j + 3]
        v0, v1 = tile[j, col:col + hd], tile[j + 1, col:col + hd]
        v2, v3 = tile[j + 2, col:col + hd], tile[j + 3, col:col + hd]
        for d in range(hd):
            acc[d] += p0 * v0[d] + p1 * v1[d] + p2 * v2[d] + p3 * v3[d]
        j += 4
    while j < n:
        pj, vr = p[j], tile[j, col:col + hd]
        for d in range(hd):
            acc[d] += pj * vr[d]
        j += 1


@jit
def decode_job(q, k_raw, v_raw, kind, slots, kv_lens, window, scale, n_kv_heads, head_dim, job,
               part_acc, part_m, part_l):
    """One job of a decode step: sequence b, split `split` of the keys it attends
    (max(0, kv_len - window) .. kv_len - 1, cut into n_splits contiguous ranges), every head.
    Tiles of whole cached rows are converted once and read by every query head of each KV head
    (GQA); whole rows, because walking one KV head's slice at a time strides through memory
    (1.3-1.5x slower from DRAM). Leaves each head's unnormalised accumulator, running max m and
    running sum l in part_acc [B, n_heads, n_splits, hd], part_m, part_l [B, n_heads, n_splits];
    merge_parts combines the splits. An empty split leaves m = -inf, l = 0, acc = 0.
    """
    n_heads, n_splits = q.shape[1] // head_dim, part_acc.shape[2]
    b, split = job // n_splits, job % n_splits
    kv_len = kv_lens[b]
    first = max(0, kv_len - window) if window > 0 else 0
    size = (kv_len - first + n_splits - 1) // n_splits
    lo = first + split * size
    hi = min(lo + size, kv_len)
    group, hd = n_heads // n_kv_heads, head_dim
    scale32 = np.float32(scale)
    qs = np.empty((n_heads, hd), np.float32)  # the queries, scaled
    for h in range(n_heads):
        for d in range(hd):
            qs[h, d] = q[b, h * hd + d] * scale32
    rows = max(1, min(DECODE_TILE, hi - lo))  # a short cache needs a short tile
    s = np.empty((n_heads, rows), np.float32)  # a tile's scores, then probabilities
    shifted = np.empty(rows, np.float32)
    bits = np.empty(rows, np.int32)
    tile = np.empty((rows, n_kv_heads * hd), np.float32)  # cached K or V rows, converted
    acc = np.zeros((n_heads, hd), np.float32)
    m = np.full(n_heads, -np.inf, np.float32)
    l = np.zeros(n_heads, np.float32)
    corr = np.empty(n_heads, np.float32)
    slot = slots[b]
    for t0 in range(lo, hi, rows):
        n = min(rows, hi - t0)
        load_rows(k_raw, kind, slot, t0, n, 0, n_kv_heads * hd, tile)
        for h in range(n_heads):
            sr = s[h]
            tile_scores(qs[h], tile, h // group * hd, n, sr)
            mx = m[h]
            for j in range(n):
                mx = max(mx, sr[j])
            for j in range(n):
                shifted[j] = sr[j] - mx
            exp_into(shifted, sr, bits, n)  # s[h, :n] now holds probabilities
            corr[h] = np.float32(math.exp(m[h] - mx))  # 0 on the first tile (m = -inf)
            total = np.float32(0.0)
            for j in range(n):
                total += sr[j]
            l[h] = l[h] * corr[h] + total
            m[h] = mx
        load_rows(v_raw, kind, slot, t0, n, 0, n_kv_heads * hd, tile)
        for h in range(n_heads):
            a, c = acc[h], corr[h]
            for d in range(hd):
                a[d] *= c
            tile_accumulate(s[h], tile, h // group * hd, n, a)
    part_acc[b, :, split] = acc
    part_m[b, :, split] = m
    part_l[b, :, split] = l


@jit
def merge_parts(part_acc, part_m, part_l, out):
    """out[b, head h] = sum_s w_s acc_s / sum_s w_s l_s, w_s = exp(m_s - max_s m_s): the splits
    of each (sequence, head) combined. Split 0 holds the head's oldest visible key, so the max
    is finite; an empty split has m = -inf and weight 0."""
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
def alloc_parts(batch, n_heads, n_splits, head_dim):
    """Scratch for the jobs: acc [batch, n_heads, n_splits, head_dim], m and l [.., n_splits]."""
    return (np.empty((batch, n_heads, n_splits, head_dim), np.float32),
            np.empty((batch, n_heads, n_splits), np.float32),
            np.empty((batch, n_heads, n_splits), np.float32))


@jit
def decode_all(q, k_raw, v_raw, kind, slots, kv_lens, window, scale, n_kv_heads, head_dim,
               n_splits):
    """Every job of a decode step one after another, then the merge (the simd backend):
    q [B, n_heads * head_dim] -> [B, n_heads * head_dim]."""
    part_acc, part_m, part_l = alloc_parts(q.shape[0], q.shape[1] // head_dim, n_splits, head_dim)
    for job in range(q.shape[0] * n_splits):
        decode_job(q, k_raw, v_raw, kind, slots, kv_lens, window, scale, n_kv_heads, head_dim,
                   job, part_acc, part_m, part_l)
    out = np.empty_like(q)
    merge_parts(part_acc, part_m, part_l, out)
    return out
