"""What the op tests share: the backend variants, random inputs, the float32-rounding comparison,
the textbook attention every attention op is pinned to, and K/V caches filled (and poisoned)
through a backend's own ops."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from inferno.backends.cpu import CpuBackend
from inferno.errors import InfernoError
from inferno.formats import cache_types

# Every variant of conftest.py's `backend` fixture but gpu, which only the ops it overrides get.
VARIANTS = ("cpu", "simd", "pool-1", "pool-2", "pool-eager", "torch")
NUMBA = ("simd", "pool-1", "pool-2", "pool-eager")  # the Numba kernels: simd's and pool's
REF = CpuBackend()


def rand(*shape, seed=0, scale=1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def host(backend, t) -> np.ndarray:
    """A backend's float32 tensor as a numpy array. Checked on the backend's side: to_numpy
    would turn a float64 result into float32 silently."""
    assert str(t.dtype).removeprefix("torch.") == "float32", t.dtype
    return backend.to_numpy(t)


def call(backend, op: str, *args):
    """backend.<op>(*args) on host arrays, its result on the host: float32 arrays go in through
    from_numpy, anything else (ids, positions, slots, inv_freq, scalars) as it is."""
    args = [backend.from_numpy(a) if isinstance(a, np.ndarray) and a.dtype == np.float32 else a
            for a in args]
    return host(backend, getattr(backend, op)(*args))


def assert_close(got, want, tol=2e-6):
    """Equal within float32 rounding, relative to the output's scale; non-finite where the
    reference is, and only there."""
    assert got.dtype == np.float32 and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    assert np.array_equal(np.isfinite(got), np.isfinite(want))
    finite = np.isfinite(want)
    err = np.abs(got[finite] - want[finite]).max(initial=0.0)
    scale = max(1.0, np.abs(want[finite]).max(initial=0.0))
    assert err <= tol * scale, f"max abs diff {err:.3g} (scale {scale:.3g})"


def assert_exact(got, want):
    """Equal bit for bit (NaN where the reference has NaN): for the ops that only move values."""
    assert got.dtype == np.float32 and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    assert np.array_equal(got, want, equal_nan=True)


def f32(x64) -> np.ndarray:
    """A float64 textbook result rounded once to float32: what a float32 op is compared with."""
    return np.asarray(x64, dtype=np.float64).astype(np.float32)


# -- attention ------------------------------------------------------------------------------------
def qkv(seed, seq_q, seq_k, n_heads, n_kv_heads, head_dim):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((seq_q, n_heads * head_dim), dtype=np.float32)
    k = rng.standard_normal((seq_k, n_kv_heads * head_dim), dtype=np.float32)
    v = rng.standard_normal((seq_k, n_kv_heads * head_dim), dtype=np.float32)
    return q, k, v


def random_sinks(n_heads: int, seed: int) -> np.ndarray:
    """Attention sinks for a test: random logits, head 0's -inf (no sink), and +5 on every third
    head from head 1, which outweigh the keys."""
    sinks = rand(n_heads, seed=seed, scale=2.0)
    sinks[0], sinks[1::3] = -np.inf, 5.0
    return sinks


def materialized_reference(q, k, v, n_heads, n_kv_heads, head_dim, causal, window=0, scale=None,
                           sinks=None):
    """The textbook path from the cpu backend's ops, per head: scores = q k^T, scale, mask
    (causal bottom-right aligned: query row i at position p = seq_k - seq_q + i sees keys
    p - window < j <= p; not causal, |p - j| < window), softmax, @ v. The mask is built here,
    not with the op under test.
    `sinks` (float32 [n_heads]): head h's sink is one more column of its scores, softmaxed with
    them and dropped (transformers' gpt-oss eager attention)."""
    seq_q, seq_k = q.shape[0], k.shape[0]
    group = n_heads // n_kv_heads
    pos = np.arange(seq_q)[:, None] + (seq_k - seq_q)  # each query row's position
    keys = np.arange(seq_k)[None, :]
    front = keys > pos if causal else (window > 0) & (keys >= pos + window)  # past the newest seen
    hidden = front | ((window > 0) & (keys <= pos - window))  # [seq_q, seq_k]
    out = REF.zeros(seq_q, n_heads * head_dim)
    for h in range(n_heads):
        kv = (h // group) * head_dim
        q_h = REF.copy_2d_from_cols(q, head_dim, h * head_dim)
        k_h = REF.copy_2d_from_cols(k, head_dim, kv)
        v_h = REF.copy_2d_from_cols(v, head_dim, kv)
        scores = REF.matmul(q_h, REF.transpose_2d(k_h))
        scores = REF.scale(scores, 1.0 / math.sqrt(head_dim) if scale is None else scale)
        scores = np.where(hidden, np.float32(-np.inf), scores)
        if sinks is None:
            p = REF.softmax_rows(scores)
        else:
            p = REF.softmax_rows(np.concatenate([scores, np.full((seq_q, 1), sinks[h], np.float32)], 1))[:, :-1]
        out = REF.copy_2d_into_cols(out, REF.matmul(p, v_h), h * head_dim)
    return out


@functools.cache
def attention_case(seed, seq_q, seq_k, n_heads, n_kv_heads, head_dim, causal, window=0, scale=None):
    """(q, k, v, the textbook answer), computed once for all the variants (not to be written)."""
    q, k, v = qkv(seed, seq_q, seq_k, n_heads, n_kv_heads, head_dim)
    return q, k, v, materialized_reference(q, k, v, n_heads, n_kv_heads, head_dim, causal, window, scale)


# -- K/V caches -----------------------------------------------------------------------------------
def stores(backend, cache_type: str) -> bool:
    """Whether the backend keeps caches of `cache_type`. Where it does not (q8_0 on torch and
    gpu), it refuses with a message naming the backends that do."""
    if backend.name in ("torch", "gpu") and cache_type == "q8_0":
        with pytest.raises(InfernoError, match="cpu, simd, pool"):
            backend.kv_buffer(1, 4, 64, cache_type)
        return False
    return True


def stored_bytes(buf) -> np.ndarray:
    """A copy of a cache buffer's elements as stored, as uint8 [slots, capacity, bytes per row]:
    a numpy buffer's own bytes, a torch tensor's (f32, f16 and bf16 are IEEE layouts in both)."""
    if isinstance(buf, np.ndarray):
        return buf.view(np.uint8).copy()
    import torch
    return buf.view(torch.uint8).cpu().numpy().copy()


def hard_rows(width=96) -> np.ndarray:
    """Rows that probe the conversions: zero blocks, huge and tiny values (f16 subnormals,
    overflow past f16's range), exact rounding ties for Q8_0 (x / d = k + 0.5) and for f16/bf16,
    negative zero, and plain random rows."""
    rows = [np.zeros(width), rand(width, seed=1), rand(width, seed=2, scale=1e-6),
            rand(width, seed=3, scale=3e4), np.full(width, -0.0)]
    tie = np.tile(np.arange(-63.5, 64.5, 1.0)[:32], width // 32) / 127 * 2.0
    tie[0] = 2.0  # max |x| = 2: d = 2/127, so x / d lands on halves
    rows.append(tie)
    rows.append(np.resize([1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 1.0 + 2.0 ** -8, 65520.0, 1e-8], width))
    return np.array(rows, dtype=np.float32)


def rounded(x, cache_type: str) -> np.ndarray:
    """float32 rows as a cache of `cache_type` gives them back (the numpy reference's codec)."""
    with np.errstate(over="ignore"):  # f16 overflows to inf
        return cache_types.decode(cache_types.encode(x, cache_type))


def filled_cache(backend, seed, slots, capacity, width, cache_type=None, scale=1.0):
    """K and V buffers with every position of every slot written (random rows)."""
    rng = np.random.default_rng(seed)
    bufs = [backend.kv_buffer(slots, capacity, width, cache_type) for _ in range(2)]
    for buf in bufs:
        for slot in range(slots):
            rows = (rng.standard_normal((capacity, width)) * scale).astype(np.float32)
            backend.write_kv(buf, slot, 0, backend.from_numpy(rows))
    return bufs


def poison_unread(backend, bufs, width, slots, kv_lens, window):
    """NaN in every position a decode step must not read: unused slots, positions at or past a
    sequence's length, and (with a window) older than it. A kernel that loads one and weights it
    by 0 still poisons its output (0 * NaN)."""
    capacity = bufs[0].shape[1]
    nan = backend.from_numpy(np.full((capacity, width), np.nan, np.float32))
    for buf in bufs:
        for slot in range(buf.shape[0]):
            if slot not in slots:
                backend.write_kv(buf, slot, 0, nan)
        for slot, n in zip(slots, kv_lens):
            backend.write_kv(buf, slot, n, backend.rows(nan, n, capacity))
            if window and n > window:
                backend.write_kv(buf, slot, 0, backend.rows(nan, 0, n - window))


def decode_reference(backend, q, k_buf, v_buf, slots, kv_lens, h, kv, hd, window=0, scale=None,
                     sinks=None):
    """Each row on its own: the textbook attention over the rows its slot holds, read back
    through the backend (read_kv), so a narrow cache type's rounding is in the reference too.
    `sinks` (float32 [h] or None) as materialized_reference takes them."""
    rows = []
    for b, (slot, n) in enumerate(zip(slots, kv_lens)):
        k = host(backend, backend.read_kv(k_buf, slot, 0, n))
        v = host(backend, backend.read_kv(v_buf, slot, 0, n))
        rows.append(materialized_reference(q[b:b + 1], k, v, h, kv, hd, True, window, scale, sinks))
    return np.concatenate(rows)


# -- the cases flash and materialized prefill share ------------------------------------------------
WINDOW_GEOMETRIES = [(9, 3, 64), (8, 2, 128), (4, 1, 256)]  # SmolLM2's 9:3, a 4:1, Gemma 3 270M's


def check_attention(backend, op, seed, seq_q, seq_k, h, kv, hd, causal, window=0, scale=None):
    """`op` (a prefill attention) on a random case, pinned to the textbook reference."""
    q, k, v, want = attention_case(seed, seq_q, seq_k, h, kv, hd, causal, window, scale)
    assert_close(call(backend, op, q, k, v, h, kv, hd, causal, window, scale), want)


def window_tests(op: str, seqs, windows):
    """The sliding-window tests of a prefill attention op (its module binds them to its own
    test_ names): a whole prompt (lengths `seqs` x `windows`, over the window geometries), a
    chunk after a cache, a window on both sides of each row (not causal: EmbeddingGemma), and
    what a window refuses."""
    @pytest.mark.parametrize("geometry", WINDOW_GEOMETRIES, ids=lambda g: f"{g[0]}:{g[1]}x{g[2]}")
    @pytest.mark.parametrize("window", windows)
    @pytest.mark.parametrize("seq", seqs)
    def prompt(backend, seq, window, geometry):
        check_attention(backend, op, seq * 7 + window, seq, seq, *geometry, True, window)

    @pytest.mark.parametrize("window", [1, 5, 64, 100])
    @pytest.mark.parametrize("seq_q,seq_k", [(1, 200), (17, 100), (64, 130), (65, 300), (3, 129)])
    def chunk_after_cache(backend, seq_q, seq_k, window):
        """Query row i sits at position seq_k - seq_q + i: its window is counted from there."""
        check_attention(backend, op, seq_q + seq_k + window, seq_q, seq_k, 9, 3, 64, True, window)

    @pytest.mark.parametrize("geometry", WINDOW_GEOMETRIES, ids=lambda g: f"{g[0]}:{g[1]}x{g[2]}")
    @pytest.mark.parametrize("window", windows)
    @pytest.mark.parametrize("seq", sorted({seqs[0], seqs[-1]}))
    def both_ways(backend, seq, window, geometry):
        """Not causal: row i sees keys j with |i - j| < window, the later ones too."""
        check_attention(backend, op, seq * 5 + window, seq, seq, *geometry, False, window)

    def refused(backend):
        q, k, v = (backend.from_numpy(a) for a in qkv(1, 8, 8, 4, 2, 16))
        for causal in (True, False):
            with pytest.raises(ValueError, match="window"):
                getattr(backend, op)(q, k, v, 4, 2, 16, causal, -1)

    return prompt, chunk_after_cache, both_ways, refused
