"""rms_norm: x / sqrt(mean(x^2) + eps) * w over each group of len(w) features: the whole row (a
layer norm) or each head (Qwen3's q_norm/k_norm), against the float64 formula, at rows on both
sides of the 64-row tile edge."""

from __future__ import annotations

import numpy as np
import pytest
from ops.helpers import assert_close, call, f32, rand

SEQS = [1, 17, 63, 64, 65, 100, 200]


@pytest.mark.parametrize("group", [96, 24], ids=["row", "per-head"])
@pytest.mark.parametrize("rows", SEQS)
def test_rms_norm(backend, rows, group):
    x, w = rand(rows, 96, seed=rows, scale=3.0), rand(group, seed=7) + 1.0
    g = x.astype(np.float64).reshape(rows, -1, group)
    want = g / np.sqrt(np.mean(g * g, axis=-1, keepdims=True) + 1e-6) * w
    assert_close(call(backend, "rms_norm", x, w, 1e-6), f32(want.reshape(rows, 96)))
