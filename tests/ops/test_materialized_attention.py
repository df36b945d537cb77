"""materialized_attention: the backend's own textbook path (what --flash off runs): scores = q
k^T, scale, mask, softmax, @ v, through its own matmul, scale, fill_strict_upper_tri, transpose
and softmax ops, pinned to helpers.materialized_reference (whose mask is built without them).

Queries after a cache (more keys than queries: the bottom-right causal diagonal), odd head
counts over GQA 3 (9:3, SmolLM2's), windows on both sides of the 64-key tile edge over the
window geometries up to Gemma 3 270M's 4:1 at head dim 256, and a scale of the model's own.
"""

from __future__ import annotations

import pytest
from ops.helpers import (assert_close, call, check_attention, materialized_reference, qkv, random_sinks,
                         window_tests)

MATERIALIZED = "materialized_attention"


def check(backend, *case):
    check_attention(backend, MATERIALIZED, *case)


@pytest.mark.parametrize("seq", [1, 17, 70, 100])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_materialized_attention_op(backend, seq, causal):
    check(backend, 3, seq, seq + 5, 9, 3, 64, causal)


(test_sliding_window_prefill, test_sliding_window_chunk_after_cache, test_window_both_ways,
 test_window_needs_a_size) = (
    window_tests(MATERIALIZED, seqs=[65, 129], windows=[1, 64]))


@pytest.mark.parametrize("causal,window", [(True, 0), (False, 0), (True, 9)])
def test_scale(backend, causal, window):
    check(backend, 5, 70, 75, 9, 3, 64, causal, window, 0.3)


@pytest.mark.parametrize("seq_q,seq_k,geometry,causal,window,scale", [
    (17, 22, (9, 3, 64), True, 0, None), (70, 75, (9, 3, 64), False, 0, 0.3),
    (65, 129, (4, 1, 256), True, 64, None)], ids=str)
def test_sinks(backend, seq_q, seq_k, geometry, causal, window, scale):
    """gpt-oss's attention sinks: one more column per head's scores, softmaxed and dropped
    (head 0's -inf: none; +5s that outweigh the keys)."""
    h, kv, hd = geometry
    q, k, v = qkv(seq_q + seq_k, seq_q, seq_k, h, kv, hd)
    sinks = random_sinks(h, seed=seq_q)
    want = materialized_reference(q, k, v, h, kv, hd, causal, window, scale, sinks)
    assert_close(call(backend, MATERIALIZED, q, k, v, h, kv, hd, causal, window, scale, sinks), want)
