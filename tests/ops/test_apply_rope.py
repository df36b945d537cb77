"""apply_rope: rotate-half RoPE on every head of x (the first and second half of a head are the
real and imaginary parts, Hugging Face's layout), against the float64 rotation, at rows on both
sides of the 64-row tile edge, three heads, at far positions (large angles)."""

from __future__ import annotations

import numpy as np
import pytest
from ops.helpers import REF, assert_close, call, f32, rand

SEQS = [1, 17, 63, 64, 65, 100, 200]


@pytest.mark.parametrize("rows", SEQS)
def test_apply_rope(backend, rows):
    head_dim = 32
    positions = np.arange(1000, 1000 + rows)  # far positions: large angles
    cos, sin = REF.rope_tables(positions, 1.0 / 10000 ** (np.arange(0, head_dim, 2) / head_dim))
    x = rand(rows, 3 * head_dim, seed=rows)
    h = x.astype(np.float64).reshape(rows, 3, 2, head_dim // 2)
    c, s = cos[:, None, :].astype(np.float64), sin[:, None, :].astype(np.float64)
    want = np.stack([h[:, :, 0] * c - h[:, :, 1] * s, h[:, :, 1] * c + h[:, :, 0] * s], axis=2)
    assert_close(call(backend, "apply_rope", x, cos, sin, head_dim), f32(want.reshape(rows, -1)))
