"""materialized_attention: the backend's own textbook path (what --flash off runs): scores = q
k^T, scale, mask, softmax, @ v, through its own matmul, scale, fill_strict_upper_tri, transpose
and softmax ops, pinned to helpers.materialized_reference (whose mask is built without them).

Queries after a cache (more keys than queries: the bottom-right causal diagonal), odd head
counts over GQA 3 (9:3, SmolLM2's), windows on both sides of the 64-key tile edge over the
window geometries up to Gemma 3 270M's 4:1 at head dim 256, and a scale of the model's own.
"""

from __future__ import annotations

import pytest
from ops.helpers import check_attention, window_tests

MATERIALIZED = "materialized_attention"


def check(backend, *case):
    check_attention(backend, MATERIALIZED, *case)


@pytest.mark.parametrize("seq", [1, 17, 70, 100])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_materialized_attention_op(backend, seq, causal):
    check(backend, 3, seq, seq + 5, 9, 3, 64, causal)


test_sliding_window_prefill, test_sliding_window_chunk_after_cache, test_window_needs_causal_and_a_size = (
    window_tests(MATERIALIZED, seqs=[65, 129], windows=[1, 64]))


@pytest.mark.parametrize("causal,window", [(True, 0), (False, 0), (True, 9)])
def test_scale(backend, causal, window):
    check(backend, 5, 70, 75, 9, 3, 64, causal, window, 0.3)
