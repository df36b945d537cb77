"""flash_attention_prefill: softmax(scale * q k^T) v per head, pinned to the textbook attention
(helpers.materialized_reference: scores, scale, mask, softmax, @ v).

Sequence lengths sit on both sides of the 64-key tile edge; head geometries cover GQA groups 1,
2, 3 and 4 with odd head counts (9 query heads over 3 KV heads, as SmolLM2; 6 over 2 at head dim
24, not a multiple of a vector), Qwen3-0.6B's 16:8 at head dim 128 and Gemma 3 270M's 4:1 at
head dim 256. Query offsets are a chunk after a cache (bottom-right causal alignment). Windows
are smaller than the sequence, so they bite. The long prompts (up to 3100 keys) walk simd and
pool's taller query blocks, both sides of each switch: on those variants only (the others have
no such blocks, and the cpu reference's flash at 3100 x 3100 costs seconds a case).

gpu runs torch's fused scaled_dot_product_attention here (its default prefill path).
"""

from __future__ import annotations

import pytest
import numpy as np
from ops.helpers import (NUMBA, assert_close, assert_exact, call, check_attention, materialized_reference,
                         qkv, random_sinks, window_tests)

GPU = True
FLASH = "flash_attention_prefill"
SEQS = [1, 17, 63, 64, 65, 100, 200]
GEOMETRIES = [(4, 4, 16), (4, 2, 32), (9, 3, 64), (6, 2, 24)]  # (n_heads, n_kv_heads, head_dim)


def check(backend, *case):
    check_attention(backend, FLASH, *case)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: f"{g[0]}:{g[1]}x{g[2]}")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("seq", SEQS)
def test_flash_prefill_matches_materialized(backend, seq, causal, geometry):
    check(backend, seq, seq, seq, *geometry, causal)


@pytest.mark.parametrize("seq_q,seq_k", [(1, 64), (17, 100), (64, 65), (65, 200), (63, 127), (40, 40),
                                         (3, 200)])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_flash_prefill_with_query_offset(backend, seq_q, seq_k, causal):
    """A chunk of queries after a cache: row i sees keys 0..(seq_k - seq_q) + i."""
    check(backend, seq_q * 1000 + seq_k, seq_q, seq_k, 9, 3, 64, causal)


@pytest.mark.parametrize("seq", [1, 65, 200])
def test_flash_prefill_qwen3_geometry(backend, seq):
    check(backend, 7, seq, seq, 16, 8, 128, True)


# -- the sliding window and the scale -----------------------------------------------------------
(test_sliding_window_prefill, test_sliding_window_chunk_after_cache, test_window_both_ways,
 test_window_needs_a_size) = (
    window_tests(FLASH, seqs=[63, 64, 65, 127, 129], windows=[1, 5, 64, 100]))


@pytest.mark.parametrize("seq_q,seq_k", [(600, 600), (70, 700)])
def test_gemma3_geometry_and_window(backend, seq_q, seq_k):
    """4 query heads over 1 KV head, head dim 256, window 512, Gemma 3's query_pre_attn_scalar
    (256) as the scale."""
    check(backend, seq_k, seq_q, seq_k, 4, 1, 256, True, 512, 256 ** -0.5)


@pytest.mark.parametrize("causal,window", [(True, 0), (False, 0), (True, 9)])
def test_scale(backend, causal, window):
    check(backend, 5, 70, 75, 9, 3, 64, causal, window, 0.3)


# -- attention sinks (gpt-oss) ----------------------------------------------------------------------
@pytest.mark.parametrize("seq_q,seq_k,geometry,causal,window,scale", [
    (17, 17, (4, 2, 32), True, 0, None), (65, 200, (9, 3, 64), True, 0, None),
    (70, 75, (9, 3, 64), False, 0, 0.3), (64, 130, (8, 2, 128), True, 5, None),
    (130, 800, (4, 1, 256), True, 0, None)], ids=str)
def test_flash_prefill_sinks(backend, seq_q, seq_k, geometry, causal, window, scale):
    """One sink logit per query head joins each row's softmax (head 0's -inf: none; +5s that
    outweigh the keys), over GQA, a chunk after a cache, a window, a scale (not applied to the
    sinks) and simd's second query block. On the Numba kernels all -inf is today's result bit
    for bit: one compiled kernel serves both."""
    h, kv, hd = geometry
    q, k, v = qkv(seq_q + seq_k, seq_q, seq_k, h, kv, hd)
    sinks = random_sinks(h, seed=seq_q)
    want = materialized_reference(q, k, v, h, kv, hd, causal, window, scale, sinks)
    assert_close(call(backend, FLASH, q, k, v, h, kv, hd, causal, window, scale, sinks), want)
    if backend.name in ("simd", "pool"):
        none = np.full(h, -np.inf, np.float32)
        assert_exact(call(backend, FLASH, q, k, v, h, kv, hd, causal, window, scale, none),
                     call(backend, FLASH, q, k, v, h, kv, hd, causal, window, scale))


# -- the query blocks of long prompts (simd and pool) ---------------------------------------------
@pytest.mark.backends(*NUMBA)
@pytest.mark.parametrize("seq_q,seq_k", [(767, 767), (769, 769), (500, 3071), (100, 3080)])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_flash_prefill_taller_query_blocks(backend, seq_q, seq_k, causal):
    """Long prompts walk taller query blocks (attention.query_block): both sides of each switch."""
    check(backend, seq_k, seq_q, seq_k, 4, 2, 32, causal)


@pytest.mark.backends(*NUMBA)
@pytest.mark.parametrize("seq_q,seq_k,window", [(1000, 1000, 800), (3100, 3100, 3080),
                                                (3100, 3100, 100), (300, 3080, 1000)])
def test_flash_prefill_window_picks_query_blocks(backend, seq_q, seq_k, window):
    """With a window, a query block streams about window keys, and its height follows that."""
    check(backend, window, seq_q, seq_k, 4, 2, 32, True, window)


# -- what it refuses ------------------------------------------------------------------------------
def test_causal_needs_enough_keys(backend):
    q, k, v = (backend.from_numpy(a) for a in qkv(1, 10, 5, 4, 2, 16))
    with pytest.raises(ValueError, match="at least as many keys"):
        backend.flash_attention_prefill(q, k, v, 4, 2, 16, True)
