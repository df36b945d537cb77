"""Every flash, materialized and decode attention implementation, pinned to materialized
attention.

The reference is the textbook path rebuilt here from the cpu backend's ops: per head, scores =
q k^T, scale, mask (causal, bottom-right aligned, and the sliding window: query at position p
sees keys p - window < j <= p), softmax, @ v. Sequence lengths sit on both sides of the 64-key
tile edge; head geometries cover GQA groups 1, 2, 3 and 4 (9 query heads over 3 KV heads, as
SmolLM2), Qwen3-0.6B's 16:8 at head dim 128 and Gemma 3 270M's 4:1 at head dim 256. Windows
are smaller than the sequence, so they bite. Decode runs a batch of sequences in different
cache slots with different lengths, in each backend's default cache type, against the
reference on the rows the cache holds (read_kv): so the comparison is float32-tight.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from inferno.backends import create_backend
from inferno.backends.cpu import CpuBackend

BACKENDS = ["cpu", "simd", "pool", "torch"]
OPTIONS = {"torch": {"device": "cpu"}}
SEQS = [1, 17, 63, 64, 65, 100, 200]
GEOMETRIES = [  # (n_heads, n_kv_heads, head_dim)
    (4, 4, 16),  # group 1
    (4, 2, 32),  # group 2
    (9, 3, 64),  # group 3, odd head counts
]


def materialized_reference(q, k, v, n_heads, n_kv_heads, head_dim, causal, window=0, scale=None):
    ops = CpuBackend()
    seq_q, seq_k = q.shape[0], k.shape[0]
    group = n_heads // n_kv_heads
    pos = np.arange(seq_q)[:, None] + (seq_k - seq_q)  # each query row's position
    keys = np.arange(seq_k)[None, :]
    hidden = (causal & (keys > pos)) | ((window > 0) & (keys <= pos - window))  # [seq_q, seq_k]
    out = ops.zeros(seq_q, n_heads * head_dim)
    for h in range(n_heads):
        kv = (h // group) * head_dim
        q_h = ops.copy_2d_from_cols(q, head_dim, h * head_dim)
        k_h = ops.copy_2d_from_cols(k, head_dim, kv)
        v_h = ops.copy_2d_from_cols(v, head_dim, kv)
        scores = ops.matmul(q_h, ops.transpose_2d(k_h))
        scores = ops.scale(scores, 1.0 / math.sqrt(head_dim) if scale is None else scale)
        scores = np.where(hidden, np.float32(-np.inf), scores)
        out = ops.copy_2d_into_cols(out, ops.matmul(ops.softmax_rows(scores), v_h), h * head_dim)
    return out


@pytest.fixture(scope="module", params=BACKENDS)
def ops(request):
    backend = create_backend(request.param, **OPTIONS.get(request.param, {}))
    yield backend
    backend.close()


def qkv(seed, seq_q, seq_k, n_heads, n_kv_heads, head_dim):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((seq_q, n_heads * head_dim), dtype=np.float32)
    k = rng.standard_normal((seq_k, n_kv_heads * head_dim), dtype=np.float32)
    v = rng.standard_normal((seq_k, n_kv_heads * head_dim), dtype=np.float32)
    return q, k, v


def run(ops, fn, *arrays_then_args):
    n = sum(isinstance(a, np.ndarray) for a in arrays_then_args)
    tensors = [ops.from_numpy(a) for a in arrays_then_args[:n]]
    return ops.to_numpy(getattr(ops, fn)(*tensors, *arrays_then_args[n:]))


def assert_close(got, want, what):
    assert got.shape == want.shape, what
    assert np.all(np.isfinite(got)), f"{what}: non-finite output"
    err = np.abs(got - want).max()
    assert err < 2e-5, f"{what}: max abs diff {err:.3g}"


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: f"{g[0]}:{g[1]}x{g[2]}")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("seq", SEQS)
def test_flash_prefill_matches_materialized(ops, seq, causal, geometry):
    h, kv, hd = geometry
    q, k, v = qkv(seq, seq, seq, h, kv, hd)
    want = materialized_reference(q, k, v, h, kv, hd, causal)
    got = run(ops, "flash_attention_prefill", q, k, v, h, kv, hd, causal)
    assert_close(got, want, f"{ops.name} flash seq={seq}")


@pytest.mark.parametrize("seq_q,seq_k", [(1, 64), (17, 100), (64, 65), (65, 200), (63, 127), (40, 40)])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_flash_prefill_with_query_offset(ops, seq_q, seq_k, causal):
    """A chunk of queries after a cache: row i sees keys 0..(seq_k - seq_q) + i."""
    h, kv, hd = 9, 3, 64
    q, k, v = qkv(seq_q * 1000 + seq_k, seq_q, seq_k, h, kv, hd)
    want = materialized_reference(q, k, v, h, kv, hd, causal)
    got = run(ops, "flash_attention_prefill", q, k, v, h, kv, hd, causal)
    assert_close(got, want, f"{ops.name} flash {seq_q} queries over {seq_k} keys")


@pytest.mark.parametrize("seq", [1, 65, 200])
def test_flash_prefill_qwen3_geometry(ops, seq):
    q, k, v = qkv(7, seq, seq, 16, 8, 128)
    want = materialized_reference(q, k, v, 16, 8, 128, True)
    assert_close(run(ops, "flash_attention_prefill", q, k, v, 16, 8, 128, True), want, "16:8x128")


# -- the sliding window and the scale -----------------------------------------------------------
WINDOW_GEOMETRIES = [(9, 3, 64), (8, 2, 128), (4, 1, 256)]  # SmolLM2's 9:3, a 4:1, Gemma 3 270M's
# flash everywhere; the materialized op (the --flash off path) on a subset of the same cases
FLASH, MATERIALIZED = "flash_attention_prefill", "materialized_attention"
WINDOW_CASES = [(FLASH, seq, w) for seq in [63, 64, 65, 127, 129] for w in [1, 5, 64, 100]] + [
    (MATERIALIZED, seq, w) for seq in [65, 129] for w in [1, 64]]


@pytest.mark.parametrize("geometry", WINDOW_GEOMETRIES, ids=lambda g: f"{g[0]}:{g[1]}x{g[2]}")
@pytest.mark.parametrize("op,seq,window", WINDOW_CASES, ids=lambda c: str(c)[:5])
def test_sliding_window_prefill(ops, op, seq, window, geometry):
    h, kv, hd = geometry
    q, k, v = qkv(seq * 7 + window, seq, seq, h, kv, hd)
    want = materialized_reference(q, k, v, h, kv, hd, True, window)
    assert_close(run(ops, op, q, k, v, h, kv, hd, True, window), want, f"{ops.name} {op} W={window}")


@pytest.mark.parametrize("op", [FLASH, MATERIALIZED], ids=["flash", "materialized"])
@pytest.mark.parametrize("window", [1, 5, 64, 100])
@pytest.mark.parametrize("seq_q,seq_k", [(1, 200), (17, 100), (64, 130), (65, 300), (3, 129)])
def test_sliding_window_chunk_after_cache(ops, op, seq_q, seq_k, window):
    """Query row i sits at position seq_k - seq_q + i: its window is counted from there."""
    q, k, v = qkv(seq_q + seq_k + window, seq_q, seq_k, 9, 3, 64)
    want = materialized_reference(q, k, v, 9, 3, 64, True, window)
    assert_close(run(ops, op, q, k, v, 9, 3, 64, True, window), want, f"{ops.name} {op}")


@pytest.mark.parametrize("seq_q,seq_k", [(600, 600), (70, 700)])
def test_gemma3_geometry_and_window(ops, seq_q, seq_k):
    """4 query heads over 1 KV head, head dim 256, window 512, Gemma 3's query_pre_attn_scalar
    (256) as the scale."""
    q, k, v = qkv(seq_k, seq_q, seq_k, 4, 1, 256)
    want = materialized_reference(q, k, v, 4, 1, 256, True, 512, 256 ** -0.5)
    got = run(ops, "flash_attention_prefill", q, k, v, 4, 1, 256, True, 512, 256 ** -0.5)
    assert_close(got, want, f"{ops.name} gemma3")


@pytest.mark.parametrize("op", [FLASH, MATERIALIZED], ids=["flash", "materialized"])
@pytest.mark.parametrize("causal,window", [(True, 0), (False, 0), (True, 9)])
def test_scale(ops, op, causal, window):
    q, k, v = qkv(5, 70, 75, 9, 3, 64)
    want = materialized_reference(q, k, v, 9, 3, 64, causal, window, 0.3)
    assert_close(run(ops, op, q, k, v, 9, 3, 64, causal, window, 0.3), want, f"{ops.name} scale")


def test_window_needs_causal_and_a_size(ops):
    q, k, v = (ops.from_numpy(a) for a in qkv(1, 8, 8, 4, 2, 16))
    with pytest.raises(ValueError, match="causal"):
        ops.flash_attention_prefill(q, k, v, 4, 2, 16, False, 4)
    with pytest.raises(ValueError, match="window"):
        ops.flash_attention_prefill(q, k, v, 4, 2, 16, True, -1)


# -- batched decode over cache slots --------------------------------------------------------------
def filled_cache(ops, seed, slots, capacity, width, cache_type=None):
    """K and V buffers with every position of every slot written (random rows)."""
    rng = np.random.default_rng(seed)
    bufs = [ops.kv_buffer(slots, capacity, width, cache_type) for _ in range(2)]
    for buf in bufs:
        for slot in range(slots):
            rows = rng.standard_normal((capacity, width), dtype=np.float32)
            ops.write_kv(buf, slot, 0, ops.from_numpy(rows))
    return bufs


def poison_unread(ops, bufs, width, slots, kv_lens, window):
    """NaN in every position a decode step must not read: unused slots, positions at or past a
    sequence's length, and (with a window) older than it. A kernel that loads one and weights it
    by 0 still poisons its output (0 * NaN)."""
    capacity = bufs[0].shape[1]
    nan = ops.from_numpy(np.full((capacity, width), np.nan, np.float32))
    for buf in bufs:
        for slot in range(buf.shape[0]):
            if slot not in slots:
                ops.write_kv(buf, slot, 0, nan)
        for slot, n in zip(slots, kv_lens):
            ops.write_kv(buf, slot, n, ops.rows(nan, n, capacity))
            if window and n > window:
                ops.write_kv(buf, slot, 0, ops.rows(nan, 0, n - window))


def decode_reference(ops, q, k_buf, v_buf, slots, kv_lens, h, kv, hd, window=0, scale=None):
    """Each row on its own: the materialized reference over the rows its slot holds."""
    rows = []
    for b, (slot, n) in enumerate(zip(slots, kv_lens)):
        k = ops.to_numpy(ops.read_kv(k_buf, slot, 0, n))
        v = ops.to_numpy(ops.read_kv(v_buf, slot, 0, n))
        rows.append(materialized_reference(q[b:b + 1], k, v, h, kv, hd, True, window, scale))
    return np.concatenate(rows)


DECODE_BATCHES = [  # (slots, kv_lens): different slots, lengths on both sides of tile edges
    ([3, 0, 2], [1, 64, 129]),
    ([1, 2, 0, 3], [65, 127, 200, 63]),
]


@pytest.mark.parametrize("geometry", WINDOW_GEOMETRIES + [(16, 8, 128), (4, 4, 16)],
                         ids=lambda g: f"{g[0]}:{g[1]}x{g[2]}")
@pytest.mark.parametrize("window", [0, 1, 5, 64, 100])
@pytest.mark.parametrize("batch", DECODE_BATCHES, ids=["B3", "B4"])
def test_decode_attention_batch(ops, batch, window, geometry):
    slots, kv_lens = batch
    h, kv, hd = geometry
    k_buf, v_buf = filled_cache(ops, window + hd, 4, 210, kv * hd)
    q = np.random.default_rng(hd).standard_normal((len(slots), h * hd), dtype=np.float32)
    want = decode_reference(ops, q, k_buf, v_buf, slots, kv_lens, h, kv, hd, window)
    poison_unread(ops, (k_buf, v_buf), kv * hd, slots, kv_lens, window)
    got = ops.to_numpy(ops.decode_attention(ops.from_numpy(q), k_buf, v_buf, slots, kv_lens, h,
                                            kv, hd, window))
    assert_close(got, want, f"{ops.name} decode W={window}")
    # the batch is only a batch: each row equals its own single-sequence step
    for b in range(len(slots)):
        one = ops.decode_attention(ops.from_numpy(q[b:b + 1]), k_buf, v_buf, slots[b:b + 1],
                                   kv_lens[b:b + 1], h, kv, hd, window)
        assert np.abs(ops.to_numpy(one) - got[b:b + 1]).max() < 1e-6


def test_decode_attention_scale(ops):
    k_buf, v_buf = filled_cache(ops, 1, 2, 150, 256)
    q = np.random.default_rng(2).standard_normal((2, 4 * 256), dtype=np.float32)
    want = decode_reference(ops, q, k_buf, v_buf, [1, 0], [140, 9], 4, 1, 256, 64, 0.0625)
    got = ops.decode_attention(ops.from_numpy(q), k_buf, v_buf, [1, 0], [140, 9], 4, 1, 256, 64, 0.0625)
    assert_close(ops.to_numpy(got), want, f"{ops.name} decode scale")


def test_decode_attention_checks_its_batch(ops):
    k_buf, v_buf = filled_cache(ops, 1, 2, 10, 32)
    q = ops.from_numpy(np.zeros((2, 64), np.float32))
    for slots, lens in [([0], [3]), ([0, 2], [3, 3]), ([0, 1], [3, 11]), ([0, 1], [0, 3])]:
        with pytest.raises(ValueError, match="slots|outside"):
            ops.decode_attention(q, k_buf, v_buf, slots, lens, 2, 1, 32)
    with pytest.raises(ValueError, match="heads"):
        ops.decode_attention(q, k_buf, v_buf, [0, 1], [3, 3], 3, 1, 32)  # q holds 2 heads, not 3
    with pytest.raises(ValueError, match="one shape"):
        ops.decode_attention(q, k_buf, ops.kv_buffer(2, 12, 32), [0, 1], [3, 3], 2, 1, 32)


@pytest.mark.parametrize("seq", [1, 17, 100])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_materialized_attention_op(ops, seq, causal):
    """The backend's own materialized path (what --flash off runs) agrees too."""
    q, k, v = qkv(3, seq, seq + 5, 9, 3, 64)
    want = materialized_reference(q, k, v, 9, 3, 64, causal)
    assert_close(run(ops, "materialized_attention", q, k, v, 9, 3, 64, causal), want, "materialized")
