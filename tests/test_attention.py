"""Every flash and fused attention implementation, pinned to materialized attention.

The reference is the textbook path rebuilt here from the cpu backend's ops: per head, scores =
q k^T, scale, causal mask (bottom-right aligned), softmax, @ v. Sequence lengths sit on both
sides of the 64-key tile edge; head geometries cover GQA groups 1, 2 and 3 (9 query heads over
3 KV heads, as SmolLM2) and Qwen3-0.6B's 16:8 at head dim 128.
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


def materialized_reference(q, k, v, n_heads, n_kv_heads, head_dim, causal):
    ops = CpuBackend()
    seq_q, seq_k = q.shape[0], k.shape[0]
    group = n_heads // n_kv_heads
    out = ops.zeros(seq_q, n_heads * head_dim)
    for h in range(n_heads):
        kv = (h // group) * head_dim
        q_h = ops.copy_2d_from_cols(q, head_dim, h * head_dim)
        k_h = ops.copy_2d_from_cols(k, head_dim, kv)
        v_h = ops.copy_2d_from_cols(v, head_dim, kv)
        scores = ops.scale(ops.matmul(q_h, ops.transpose_2d(k_h)), 1.0 / math.sqrt(head_dim))
        if causal:
            scores = ops.fill_strict_upper_tri(scores, -math.inf, offset=seq_k - seq_q)
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


@pytest.mark.parametrize("geometry", GEOMETRIES + [(16, 8, 128)], ids=lambda g: f"{g[0]}:{g[1]}x{g[2]}")
@pytest.mark.parametrize("kv_len,new", [(n, 1) for n in SEQS] + [(n, 4) for n in SEQS if n >= 4])
def test_fused_decode_matches_materialized(ops, kv_len, new, geometry):
    """Decode reads the first kv_len rows of a larger cache in place; the rows past kv_len are
    NaN, so reading one poisons the output."""
    h, kv, hd = geometry
    q, k, v = qkv(kv_len + new, new, kv_len, h, kv, hd)
    capacity = kv_len + 37
    k_cache = np.full((capacity, kv * hd), np.nan, dtype=np.float32)
    v_cache = np.full((capacity, kv * hd), np.nan, dtype=np.float32)
    k_cache[:kv_len], v_cache[:kv_len] = k, v
    want = materialized_reference(q, k, v, h, kv, hd, causal=True)
    got = run(ops, "fused_attention", q, k_cache, v_cache, kv_len, h, kv, hd)
    assert_close(got, want, f"{ops.name} fused kv_len={kv_len} new={new}")


@pytest.mark.parametrize("seq", [1, 17, 100])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_materialized_attention_op(ops, seq, causal):
    """The backend's own materialized path (what --flash off runs) agrees too."""
    q, k, v = qkv(3, seq, seq + 5, 9, 3, 64)
    want = materialized_reference(q, k, v, 9, 3, 64, causal)
    assert_close(run(ops, "materialized_attention", q, k, v, 9, 3, 64, causal), want, "materialized")
