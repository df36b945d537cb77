"""Decode attention as a Triton kernel: GQA-packed tiles, split KV, and the S/P ping-pong.

Decode reads the whole KV cache to produce one row per query head, so it is bound by memory
bandwidth: the figure of merit is bytes of K and V read per second against the card's copy
bandwidth. Three things get the bytes moving:

1. GQA packing. The query heads that share a KV head (16 of them at GQA 16:1) sit together in
   one tile of `BLOCK_H` rows (x the new tokens, padded up to 16, the smallest tile a tensor-core
   dot takes), so each K/V block is read once per KV head, not once per query head, and QK^T is a
   [BLOCK_H, head_dim] x [head_dim, BLOCK_N] matmul instead of a matvec.
2. Split KV (flash-decoding). One KV head of one sequence is too little work to fill a GPU, so
   the sequence is cut into `num_splits` contiguous ranges, one program each; every program
   leaves an unnormalised partial output with its running max m and sum l, and a second, small
   kernel merges them: o = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s, M = max_s m_s.
3. The S/P ping-pong (`variant="pingpong"`, not the default: see below), from FlashAttention-4's decode path
   (Colfax, "S/P ping-pong for FlashAttention-4 decode"). In the `serial` loop, block i runs
   QK^T, then softmax, then PV, and QK^T of block i+1 waits for all of it, although it depends on
   nothing but K(i+1). With one (padded) query tile there is no second tile to fill that gap, so
   the softmax latency is exposed on every block. The ping-pong keeps two score tiles, S(i) and
   S(i+1), alternating like FA4's two TMEM slots: QK^T for block i+1 is issued before the
   softmax of block i, and the loads go K0, K1, V0, K2, V1, ..., K one block ahead of V.

What it measured (bench/RESULTS.md, an H200, torch 2.11, Triton 3.6, graph-timed): the
ping-pong ran at 0.97-1.03x the serial loop on every shape of the sweep, so `serial`, with fewer
registers (104 against 123 at head dim 128), is the default and the ping-pong is kept, tested, for
comparison. Why: source order is only a request, and Triton and ptxas schedule the instructions.
16-row tiles lower to synchronous `mma.sync`, and 64-row tiles to `wgmma` whose
`wgmma.wait_group` still waits for 0 pending groups, so the next block's QK^T never overlaps the
softmax. FlashAttention-4's gain (up to 16%) comes from Blackwell's tensor memory and an MMA warp
of its own, a schedule Triton on Hopper does not express; a warp-specialised version (Gluon's
warp_specialize) is worth writing only if it beats torch's SDPA.

The entry points take torch tensors in the layout the engine's KV cache keeps:
`[slots, capacity, n_kv_heads * head_dim]` per layer (or one slot, `[capacity, width]`). Each
sequence of a batch reads its own slot and its own length, and with a sliding window only its
last `window` keys: the programs' key ranges start at the window, and the splits are sized for
the longest window's worth of keys, not the longest cache. K and V may be stored narrower than
the queries (an f16 cache under float32 activations): they are widened as they are loaded.
`decode_attention` takes the slots and lengths from the host (and checks them);
`decode_attention_device` takes them as device tensors it never reads, for a step captured in
a CUDA graph: the grid is then sized for the cache's capacity and each sequence uses the splits
its own length needs. CUDA tensors run compiled; CPU tensors run under Triton's interpreter,
which must be switched on (TRITON_INTERPRET=1) before this module is imported, because
`@triton.jit` reads it when the kernels are defined.
"""

from __future__ import annotations

import functools
import math
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"  # how the kernels below were built
VARIANTS = ("serial", "pingpong")
LOG2E = 1.4426950408889634  # scores are kept in log2 units so the softmax uses exp2
_LOG2E = tl.constexpr(LOG2E)  # the same, for the kernels (a global they read must be constexpr)
MIN_BLOCKS_PER_SPLIT = 4  # a split shorter than this spends its time in prologue and merge
PROGRAMS_PER_SM = 2  # the default grid: about this many split programs per multiprocessor
MERGE_SPLITS = 32  # splits the merge kernel holds at once
MAX_ROWS = 128  # query rows (heads per KV head x new tokens) in one tile


# -- the KV loop's pieces --------------------------------------------------------------------
@triton.jit
def _load_kt(k_base, start, hi, stride_kt, offs_n, d, d_ok):
    """K rows start..start+BLOCK_N of one KV head, transposed: [BLOCK_D, BLOCK_N]."""
    n = start + offs_n
    return tl.load(k_base + n[None, :] * stride_kt + d[:, None],
                   mask=(n[None, :] < hi) & d_ok[:, None], other=0.0)


@triton.jit
def _load_v(v_base, start, hi, stride_vt, offs_n, d, d_ok):
    """V rows start..start+BLOCK_N of one KV head: [BLOCK_N, BLOCK_D]."""
    n = start + offs_n
    return tl.load(v_base + n[:, None] * stride_vt + d[None, :],
                   mask=(n[:, None] < hi) & d_ok[None, :], other=0.0)


@triton.jit
def _scores(q, kt, start, hi, key_lo, key_end, qk_scale, offs_n, DOT_PRECISION: tl.constexpr):
    """S = q K^T for one block, in log2 units, -inf where a key is past the split's end, in the
    row's causal future or older than its window: [BLOCK_H, BLOCK_N]."""
    n = start + offs_n
    s = tl.dot(q, kt.to(q.dtype), input_precision=DOT_PRECISION) * qk_scale
    visible = (n[None, :] < hi) & (n[None, :] < key_end[:, None]) & (n[None, :] >= key_lo[:, None])
    return tl.where(visible, s, float("-inf"))


@triton.jit
def _softmax_pv(s, v, m, l, acc, DOT_PRECISION: tl.constexpr):
    """One online-softmax step: raise the running max, rescale l and acc by 2^(m_old - m_new),
    add this block's probabilities and P V."""
    m_new = tl.maximum(m, tl.max(s, 1))
    # A row that has seen no key yet (every score -inf, a causal row in a late split) keeps
    # m = -inf; subtracting 0 instead makes its p and alpha 0 rather than NaN.
    m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_sub)  # 1 where the max held, < 1 where this block raised it
    p = tl.exp2(s - m_sub[:, None])  # [BLOCK_H, BLOCK_N]
    l = l * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l, acc


@triton.jit
def _split_range(kv_len, window, num_splits, min_blocks, N_NEW: tl.constexpr, BLOCK_N: tl.constexpr):
    """How one sequence's keys are cut: its first visible key (the window's start, or 0), the
    keys each of its splits takes (whole blocks), and how many splits it uses. Computed in the
    kernel from the sequence's own length, so the grid is fixed (`num_splits` programs per KV
    head, sized for the longest sequence the call may see) and a short sequence uses only its
    first splits: the others find an empty range and are skipped by the merge."""
    first = tl.where(window > 0, tl.maximum(kv_len - N_NEW + 1 - window, 0), 0)
    n_blocks = tl.cdiv(kv_len - first, BLOCK_N)
    count = tl.minimum(num_splits, tl.maximum(n_blocks // min_blocks, 1))
    per = tl.cdiv(n_blocks, count)  # blocks a split
    return first, per * BLOCK_N, tl.cdiv(n_blocks, per)  # none of the count empty


# -- kernel 1: one split of one sequence's keys for one KV head -----------------------------
# The lengths, window and split counts change from call to call; specialising on them (Triton's
# default for integers: == 1, divisible by 16) would recompile as the cache grows.
@triton.jit(do_not_specialize=["window", "num_splits", "min_blocks"])
def _decode_split_kernel(
    Q, K, V, Slots, KvLens, PartO, PartM, PartL,
    window, n_kv, n_heads, num_splits, min_blocks, qk_scale,
    stride_qb, stride_qt, stride_kb, stride_kt, stride_vb, stride_vt,
    GROUP: tl.constexpr, N_NEW: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PINGPONG: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    pid = tl.program_id(0)  # batch * n_kv + KV head
    split = tl.program_id(1)
    b = (pid // n_kv).to(tl.int64)
    kvh = pid % n_kv
    kv_len = tl.load(KvLens + b)  # this sequence's length, from device memory
    slot = tl.load(Slots + b).to(tl.int64)  # and its cache slot

    # Tile row r holds new token t = r // GROUP, query head kvh * GROUP + r % GROUP.
    r = tl.arange(0, BLOCK_H)
    t = r // GROUP
    head = kvh * GROUP + r % GROUP
    row_ok = r < N_NEW * GROUP
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q = tl.load(Q + b * stride_qb + t[:, None] * stride_qt + head[:, None] * HEAD_DIM + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_H, BLOCK_D]
    if UPCAST:  # K/V stored in another dtype than q: everything in float32
        q = q.to(tl.float32)
    # Causal, bottom-right aligned: new token t sits at position kv_len - N_NEW + t and sees
    # keys key_lo .. key_end - 1, the last `window` of them when there is a window.
    key_end = kv_len - N_NEW + 1 + t  # [BLOCK_H], exclusive
    key_lo = tl.where(window > 0, tl.maximum(key_end - window, 0), 0)  # [BLOCK_H]
    first, split_size, count = _split_range(kv_len, window, num_splits, min_blocks, N_NEW, BLOCK_N)

    lo = first + split * split_size
    # A split past this sequence's count starts at or past kv_len: hi = lo, nothing is loaded
    # and nothing stored.
    hi = tl.maximum(tl.minimum(lo + split_size, kv_len), lo)
    k_base = K + slot * stride_kb + kvh * HEAD_DIM
    v_base = V + slot * stride_vb + kvh * HEAD_DIM
    offs_n = tl.arange(0, BLOCK_N)

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    if PINGPONG:
        # Prologue: K0, then S(0) = QK^T(0) into the first slot.
        kt = _load_kt(k_base, lo, hi, stride_kt, offs_n, d, d_ok)
        s_cur = _scores(q, kt, lo, hi, key_lo, key_end, qk_scale, offs_n, DOT_PRECISION)
        # Every block that has a successor: QK^T(i+1) goes out before softmax(i).
        for start in range(lo, hi - BLOCK_N, BLOCK_N):
            kt = _load_kt(k_base, start + BLOCK_N, hi, stride_kt, offs_n, d, d_ok)  # K(i+1)
            s_next = _scores(q, kt, start + BLOCK_N, hi, key_lo, key_end, qk_scale, offs_n,
                             DOT_PRECISION)  # the other slot: independent of softmax(S(i))
            v = _load_v(v_base, start, hi, stride_vt, offs_n, d, d_ok).to(q.dtype)  # V(i)
            m, l, acc = _softmax_pv(s_cur, v, m, l, acc, DOT_PRECISION)  # softmax(i), PV(i)
            s_cur = s_next  # the slots swap roles
        # Epilogue: the last block's softmax and PV; V trails K by one block to the end.
        last = tl.maximum(lo + (tl.cdiv(hi - lo, BLOCK_N) - 1) * BLOCK_N, lo)
        v = _load_v(v_base, last, hi, stride_vt, offs_n, d, d_ok).to(q.dtype)
        m, l, acc = _softmax_pv(s_cur, v, m, l, acc, DOT_PRECISION)
    else:
        # Serial: QK^T(i), softmax(i), PV(i), and only then block i+1. Loads go K0, V0, K1, ...
        for start in range(lo, hi, BLOCK_N):
            kt = _load_kt(k_base, start, hi, stride_kt, offs_n, d, d_ok)
            s = _scores(q, kt, start, hi, key_lo, key_end, qk_scale, offs_n, DOT_PRECISION)
            v = _load_v(v_base, start, hi, stride_vt, offs_n, d, d_ok).to(q.dtype)
            m, l, acc = _softmax_pv(s, v, m, l, acc, DOT_PRECISION)

    # Partials are [batch, N_NEW, n_heads, num_splits] (m, l) and [..., HEAD_DIM] (acc).
    part = ((b * N_NEW + t) * n_heads + head) * num_splits + split  # [BLOCK_H]
    keep = r < tl.where(split < count, N_NEW * GROUP, 0)  # row_ok, for the splits in use
    tl.store(PartM + part, m, mask=keep)
    tl.store(PartL + part, l, mask=keep)
    tl.store(PartO + part[:, None] * HEAD_DIM + d[None, :], acc, mask=keep[:, None] & d_ok[None, :])


# -- kernel 2: merge the splits of one (sequence, new token, query head) row -----------------
# has_sinks (0 or 1) is not specialised either: with and without sinks are one compiled kernel.
@triton.jit(do_not_specialize=["window", "num_splits", "min_blocks", "has_sinks"])
def _decode_merge_kernel(
    PartO, PartM, PartL, Out, KvLens, Sinks, window, n_heads, num_splits, min_blocks, has_sinks,
    stride_ob, stride_ot,
    N_NEW: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # (b * N_NEW + t) * n_heads + head
    head = row % n_heads
    t = (row // n_heads) % N_NEW
    b = row // (n_heads * N_NEW)
    _, _, count = _split_range(tl.load(KvLens + b), window, num_splits, min_blocks, N_NEW, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    # The splits BLOCK_S at a time, with the running max, sum and output of an online softmax:
    # o = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s. (Loading all splits at once held
    # [splits, head_dim] floats in a few registers per thread: 256 splits spilled.)
    # The head's attention sink (gpt-oss) is one more column of the row's softmax, with value
    # 0: it starts the running max at the sink (log2 units) and the sum at 1, so it joins once
    # per row, however many splits the keys took. Without sinks (has_sinks 0, nothing loaded)
    # m starts at -inf and l at 0, as before there were sinks; a sink of -inf does the same.
    m_run = tl.load(Sinks + head, mask=has_sinks != 0, other=float("-inf")).to(tl.float32) * _LOG2E
    l_run = tl.where(m_run == float("-inf"), 0.0, 1.0)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for s0 in range(0, count, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        s_ok = s < count
        m = tl.load(PartM + row * num_splits + s, mask=s_ok, other=float("-inf"))  # [BLOCK_S]
        l = tl.load(PartL + row * num_splits + s, mask=s_ok, other=0.0)
        part = tl.load(PartO + (row * num_splits + s)[:, None] * HEAD_DIM + d[None, :],
                       mask=s_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_S, BLOCK_D]
        # A split a row cannot see (before its window) has m = -inf and weight 0; every row
        # sees its own key, so the final max is finite, but a first chunk may have none.
        m_new = tl.maximum(m_run, tl.max(m, 0))
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_run - m_sub)
        w = tl.exp2(m - m_sub)  # [BLOCK_S]
        l_run = l_run * alpha + tl.sum(w * l, 0)
        acc = acc * alpha + tl.sum(w[:, None] * part, 0)
        m_run = m_new
    tl.store(Out + b * stride_ob + t * stride_ot + head * HEAD_DIM + d,
             (acc / l_run).to(Out.dtype.element_ty), mask=d_ok)


# -- the Python side ---------------------------------------------------------------------------
class Plan(NamedTuple):
    num_splits: int  # programs per KV head: the longest sequence's splits, none of them empty
    split_size: int  # keys per split of the longest sequence, a multiple of block_n
    min_blocks: int  # no sequence cuts its keys into splits of fewer blocks (the kernel's rule)


def default_block_n(head_dim: int) -> int:
    """Keys per block: 64 at head dim 128 (a 16 KB bf16 K tile), 128 at smaller head dims."""
    return 128 if head_dim <= 64 else 64


def plan_splits(kv_len: int, batch: int, n_kv_heads: int, block_n: int,
                num_splits: int | None = None, device: torch.device | str = "cpu") -> Plan:
    """How the longest sequence's keys are cut: `kv_len` is the most keys one sequence of the
    batch attends (its window, when that is shorter than its cache; in a captured step, the
    cache's capacity). Every sequence then cuts its own keys by the same rule in the kernel
    (_split_range): up to num_splits splits of whole blocks, none shorter than min_blocks.
    By default: about PROGRAMS_PER_SM programs per streaming multiprocessor over all
    (sequence, KV head) pairs, and no split shorter than MIN_BLOCKS_PER_SPLIT blocks. A given
    `num_splits` is taken as is, down to one split per block."""
    n_blocks = triton.cdiv(kv_len, block_n)
    min_blocks = 1
    if num_splits is None:
        num_splits = triton.cdiv(PROGRAMS_PER_SM * _sm_count(torch.device(device)), batch * n_kv_heads)
        min_blocks = MIN_BLOCKS_PER_SPLIT
    if num_splits < 1:
        raise ValueError(f"num_splits must be at least 1, got {num_splits}")
    count = min(num_splits, max(1, n_blocks // min_blocks))
    count = triton.cdiv(n_blocks, triton.cdiv(n_blocks, count))  # none empty
    return Plan(count, triton.cdiv(n_blocks, count) * block_n, min_blocks)


def alloc_partials(batch: int, n_new: int, n_heads: int, num_splits: int, head_dim: int,
                   device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float32 scratch for the split kernel: acc [batch, n_new, n_heads, splits, head_dim], and
    m, l [batch, n_new, n_heads, splits]. Uninitialised: each call writes what it reads."""
    shape = (batch, n_new, n_heads, num_splits)
    return (torch.empty(shape + (head_dim,), dtype=torch.float32, device=device),
            torch.empty(shape, dtype=torch.float32, device=device),
            torch.empty(shape, dtype=torch.float32, device=device))


def decode_attention(q, k_cache, v_cache, kv_len, n_heads: int, n_kv_heads: int,
                     head_dim: int, variant: str = "serial", num_splits: int | None = None,
                     block_n: int | None = None, *, slots=None, window: int = 0,
                     scale: float | None = None, block_h: int | None = None, out=None,
                     partials=None, num_warps: int = 4, num_stages: int = 2, meta=None,
                     sinks=None):
    """softmax(scale * q K^T) V for the newest tokens of each sequence of a batch.

    q [n_new, n_heads * head_dim], or [batch, n_new, n_heads * head_dim]: the new tokens of each
    sequence, at cache positions kv_len - n_new .. kv_len - 1, causal among themselves
    (bottom-right). `kv_len` is one length for every sequence or one per sequence. k_cache,
    v_cache [slots, capacity, n_kv_heads * head_dim] (or one slot, [capacity, width]): sequence
    b reads slot slots[b] (None: slot b), its first kv_len[b] rows, in place; rows may be
    strided, features must be contiguous. With a `window` a token at position p sees only keys
    p - window < j <= p. `scale` defaults to 1 / sqrt(head_dim). Query head h reads KV head
    h // (n_heads // n_kv). Returns a tensor shaped like q (or writes `out`). `partials` (from
    alloc_partials, sized by plan_splits) lets a caller reuse or inspect the scratch. float32
    inputs use IEEE float32 dots (no TF32), 16-bit inputs tensor-core dots with float32
    accumulation; a cache in another dtype than q is widened to float32 as it is loaded.
    `meta` (slot_meta's) saves the per-call copy of slots and lengths to the device.
    `sinks` (gpt-oss's attention sinks: a float tensor [n_heads] on q's device, or None) adds
    head h's sink as one more column of each of its rows' softmax, value 0, unscaled; -inf is
    no sink. The merge kernel starts each row from it, so it counts once whatever the splits.
    """
    out, handles = _launch(q, k_cache, v_cache, kv_len, n_heads, n_kv_heads, head_dim, variant,
                           num_splits, block_n, block_h, out, partials, num_warps, num_stages,
                           slots, window, scale, meta, sinks)
    return out


def decode_attention_device(q, k_cache, v_cache, slots, kv_lens, n_heads: int, n_kv_heads: int,
                            head_dim: int, variant: str = "serial", *, window: int = 0,
                            scale: float | None = None, out=None, partials=None,
                            num_splits: int | None = None, sinks=None):
    """decode_attention with every per-sequence value in device memory: `slots` and `kv_lens`
    are int tensors [batch] on q's device, read by the kernels, never by the host. So the call
    makes no host round trip and can be captured in a CUDA graph and replayed as the lengths
    grow: the grid is sized for the longest sequence the cache can hold (its capacity, or the
    window), and each sequence uses the splits its own length needs (_split_range). q is
    [batch, n_new, n_heads * head_dim]. The values are the caller's to keep valid (n_new <=
    kv_len <= capacity, slots within the cache): nothing here can check them without reading
    them back. `num_splits`, as decode_attention's, fixes the grid (tests). `sinks` as
    decode_attention's: in a captured step a persistent tensor (a layer's weight), read by the
    merge kernel at replay."""
    q3 = q if q.dim() == 3 else q.unsqueeze(0)
    batch, n_new, _ = q3.shape
    if not all(isinstance(x, torch.Tensor) and x.shape == (batch,) and x.device == q.device
               for x in (slots, kv_lens)):
        raise ValueError(f"slots and kv_lens must be [{batch}] tensors on {q.device}")
    capacity = k_cache.shape[-2]
    span = min(capacity, window + n_new - 1) if window else capacity
    return _launch(q3, k_cache, v_cache, span, n_heads, n_kv_heads, head_dim, variant,
                   num_splits, out=out, partials=partials, window=window, scale=scale,
                   meta=(slots, kv_lens), sinks=sinks)[0]


def slot_meta(slots, kv_lens, device) -> torch.Tensor:
    """The kernel's per-sequence slots and lengths, int32 [2, batch] on `device`: a small
    host-to-device copy, which a caller that decodes many layers of one step can make once."""
    return torch.tensor([[int(s) for s in slots], [int(n) for n in kv_lens]], dtype=torch.int32).to(device)


def _launch(q, k_cache, v_cache, kv_len, n_heads, n_kv_heads, head_dim, variant="serial",
            num_splits=None, block_n=None, block_h=None, out=None, partials=None,
            num_warps=4, num_stages=2, slots=None, window=0, scale=None, meta=None, sinks=None):
    """decode_attention's body; also returns the two kernels' launch handles (compiled kernels
    on CUDA, whose .asm holds the PTX and TTGIR; None under the interpreter). `meta` holds
    the slots and lengths already on the device, to skip the copy: slot_meta's [2, batch], or
    (slots, kv_lens) tensors, with `kv_len` then the longest span a sequence may attend (the
    device path: the values are not read here, so not checked). Without `sinks` the merge
    kernel gets has_sinks 0 and another float32 tensor as the (never read) pointer."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; variants: {', '.join(VARIANTS)}")
    squeeze = q.dim() == 2
    q3, k3, v3 = (x.unsqueeze(0) if x.dim() == 2 else x for x in (q, k_cache, v_cache))
    batch, n_new, q_width = q3.shape
    on_device = isinstance(meta, tuple)
    if on_device:
        span = int(kv_len)
        _check(q3, k3, v3, None, None, window, n_heads, n_kv_heads, head_dim)
    else:
        kv_lens = [int(n) for n in kv_len] if hasattr(kv_len, "__len__") else [int(kv_len)] * batch
        slots = list(range(batch)) if slots is None else [int(s) for s in slots]
        _check(q3, k3, v3, kv_lens, slots, window, n_heads, n_kv_heads, head_dim)
        span = max(min(n, window + n_new - 1) if window else n for n in kv_lens)  # keys to read
    if sinks is not None and not (isinstance(sinks, torch.Tensor) and sinks.shape == (n_heads,)
                                  and sinks.device == q.device and sinks.is_floating_point()
                                  and sinks.is_contiguous()):
        raise ValueError(f"sinks must be a contiguous float tensor [{n_heads}] on {q.device}")
    group = n_heads // n_kv_heads
    rows = group * n_new
    if rows > MAX_ROWS:
        raise ValueError(f"{group} query heads per KV head x {n_new} new tokens = {rows} rows: "
                         f"more than one tile of {MAX_ROWS}")
    block_h = block_h or max(16, triton.next_power_of_2(rows))
    if block_h < rows or block_h & (block_h - 1):
        raise ValueError(f"block_h must be a power of two of at least {rows}, got {block_h}")
    block_n = block_n or default_block_n(head_dim)
    plan = plan_splits(span, batch, n_kv_heads, block_n, num_splits, q.device)
    if partials is None:
        partials = alloc_partials(batch, n_new, n_heads, plan.num_splits, head_dim, q.device)
    part_o, part_m, part_l = partials
    shape = (batch, n_new, n_heads, plan.num_splits)
    if (part_m.shape, part_l.shape, part_o.shape) != (shape, shape, shape + (head_dim,)) or not all(
            p.is_contiguous() and p.dtype == torch.float32 and p.device == q.device for p in partials):
        raise ValueError(f"partials must be contiguous float32 for {plan.num_splits} splits "
                         f"(alloc_partials with plan_splits' count)")
    o3 = torch.empty_like(q3) if out is None else (out.unsqueeze(0) if out.dim() == 2 else out)
    if o3.shape != q3.shape or o3.stride(-1) != 1:
        raise ValueError(f"out must be shaped like q {tuple(q.shape)}, got {tuple(out.shape)}")
    if meta is None:
        meta = slot_meta(slots, kv_lens, q.device)
    slots_t, lens_t = meta

    block_d = max(16, triton.next_power_of_2(head_dim))
    upcast = k3.dtype != q.dtype
    precision = "ieee" if q.dtype == torch.float32 or upcast else "tf32"  # tf32: moot at 16 bits
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    split = _decode_split_kernel[(batch * n_kv_heads, plan.num_splits)](
        q3, k3, v3, slots_t, lens_t, part_o, part_m, part_l,
        int(window), n_kv_heads, n_heads, plan.num_splits, plan.min_blocks, LOG2E * scale,
        q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), v3.stride(0), v3.stride(1),
        GROUP=group, N_NEW=n_new, HEAD_DIM=head_dim, BLOCK_H=block_h, BLOCK_N=block_n,
        BLOCK_D=block_d, PINGPONG=variant == "pingpong", DOT_PRECISION=precision, UPCAST=upcast,
        num_warps=num_warps, num_stages=num_stages)
    merge = _decode_merge_kernel[(batch * n_new * n_heads,)](
        part_o, part_m, part_l, o3, lens_t, part_m if sinks is None else sinks, int(window),
        n_heads, plan.num_splits, plan.min_blocks, int(sinks is not None),
        o3.stride(0), o3.stride(1), N_NEW=n_new, HEAD_DIM=head_dim, BLOCK_N=block_n,
        BLOCK_S=min(MERGE_SPLITS, triton.next_power_of_2(plan.num_splits)), BLOCK_D=block_d,
        num_warps=2 if block_d <= 64 else 4)
    o = o3.squeeze(0) if squeeze and out is None else (out if out is not None else o3)
    return o, (split, merge)


def _check(q, k, v, kv_lens, slots, window, n_heads, n_kv_heads, head_dim):
    batch, n_new, q_width = q.shape
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
    if q_width != n_heads * head_dim or q.stride(-1) != 1 or q.stride(1) != q_width:
        raise ValueError(f"q must be [.., n_new, {n_heads * head_dim}] with contiguous rows, "
                         f"got {tuple(q.shape)}")
    for name, x in (("k_cache", k), ("v_cache", v)):
        if x.dim() != 3 or x.shape[2] != n_kv_heads * head_dim:
            raise ValueError(f"{name} must be [slots, capacity, {n_kv_heads * head_dim}], "
                             f"got {tuple(x.shape)}")
        if x.stride(-1) != 1 or x.dtype != k.dtype or x.device != q.device:
            raise ValueError(f"{name} must have contiguous features, q's device and the other "
                             f"cache's dtype")
        if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"{name} must be float32, float16 or bfloat16, not {x.dtype}")
    if kv_lens is not None and not len(kv_lens) == len(slots) == batch:
        raise ValueError(f"{batch} sequences need as many kv_lens and slots, got "
                         f"{len(kv_lens)} and {len(slots)}")
    for kv_len, slot in zip(kv_lens or (), slots or ()):
        if not n_new <= kv_len <= min(k.shape[1], v.shape[1]):
            raise ValueError(f"kv_len {kv_len} must cover the {n_new} new tokens and fit the "
                             f"cache ({min(k.shape[1], v.shape[1])} rows)")
        if not 0 <= slot < min(k.shape[0], v.shape[0]):
            raise ValueError(f"slot {slot} is outside the cache's {min(k.shape[0], v.shape[0])} slots")
    if window < 0:
        raise ValueError(f"window must be 0 (none) or a number of keys, got {window}")
    if q.device.type == "cpu" and not INTERPRET:
        raise RuntimeError("CPU tensors run under Triton's interpreter: set TRITON_INTERPRET=1 "
                           "before importing inferno.backends.torch.triton_decode")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"the Triton decode kernel runs on CUDA (or the CPU interpreter), "
                         f"not {q.device.type}")


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 2  # the interpreter runs programs one after another: few and long is fastest


def reference_attention(q, k_cache, v_cache, kv_len, n_heads: int, n_kv_heads: int,
                        head_dim: int, slots=None, window: int = 0,
                        scale: float | None = None, sinks=None) -> torch.Tensor:
    """The materialized computation in float64, one sequence at a time (scores, bottom-right
    causal mask and window, softmax, @ V; a head's sink one more column of its scores,
    softmaxed with them and dropped), shaped like q: what the kernel is tested against.
    Arguments as decode_attention's."""
    squeeze = q.dim() == 2
    q3, k3, v3 = (x.unsqueeze(0) if x.dim() == 2 else x for x in (q, k_cache, v_cache))
    batch, n_new, _ = q3.shape
    kv_lens = list(kv_len) if hasattr(kv_len, "__len__") else [kv_len] * batch
    slots = list(range(batch)) if slots is None else list(slots)
    group = n_heads // n_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    o = torch.empty(batch, n_new, n_heads * head_dim, dtype=torch.float64)
    for b, (n, slot) in enumerate(zip(kv_lens, slots)):
        qh = q3[b].double().reshape(n_new, n_heads, head_dim).transpose(0, 1)  # [nh, new, hd]
        kh = k3[slot, :n].double().reshape(n, n_kv_heads, head_dim).transpose(0, 1)  # [nkv, n, hd]
        vh = v3[slot, :n].double().reshape(n, n_kv_heads, head_dim).transpose(0, 1)
        kh, vh = kh.repeat_interleave(group, dim=0), vh.repeat_interleave(group, dim=0)
        scores = qh.cpu() @ kh.cpu().transpose(-1, -2) * scale  # [nh, new, n]
        pos = torch.arange(n_new)[:, None] + (n - n_new)
        keys = torch.arange(n)[None, :]
        hidden = (keys > pos) | ((keys <= pos - window) if window else False)
        scores = scores.masked_fill(hidden, float("-inf"))
        if sinks is None:
            probs = scores.softmax(-1)
        else:
            column = sinks.double().cpu().reshape(n_heads, 1, 1).expand(n_heads, n_new, 1)
            probs = torch.cat((scores, column), -1).softmax(-1)[..., :-1]
        o[b] = (probs @ vh.cpu()).transpose(0, 1).reshape(n_new, n_heads * head_dim)
    o = o.to(q.device)
    return o[0] if squeeze else o
