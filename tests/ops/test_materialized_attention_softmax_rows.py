"""softmax_rows, a part of the materialized reference (base.MATERIALIZED_PARTS, not the
model's contract): each row's softmax, against float64, at rows on both sides of the 64-row tile
edge, with masked (-inf) scores as causal attention has them: those come out exactly 0."""

from __future__ import annotations

import math

import numpy as np
import pytest
from ops.helpers import REF, assert_close, call, f32, rand

SEQS = [1, 17, 63, 64, 65, 100, 200]


@pytest.mark.parametrize("rows", SEQS)
def test_softmax_rows_with_masked_scores(backend, rows):
    scores = REF.fill_strict_upper_tri(rand(rows, rows + 3, seed=rows, scale=4.0), -math.inf, offset=3)
    got = call(backend, "softmax_rows", scores)
    e = np.exp(scores.astype(np.float64) - scores.max(axis=1, keepdims=True))
    assert_close(got, f32(e / e.sum(axis=1, keepdims=True)))
    assert np.all(got[np.isneginf(scores)] == 0.0)
