"""fill_strict_upper_tri, a part of the materialized reference (base.MATERIALIZED_PARTS, not the
model's contract): a copy of x with every element above diagonal `offset` (col > row +
offset) set to a value, exact; offsets above, on and below the main diagonal (causal attention's
chunk after a cache has a positive one), rows on both sides of the 64-row tile edge."""

from __future__ import annotations

import math

import numpy as np
import pytest
from ops.helpers import assert_exact, call, rand


@pytest.mark.parametrize("offset", [0, 3, -2])
@pytest.mark.parametrize("rows", [1, 64, 100])
def test_mask_is_exact(backend, rows, offset):
    x = rand(rows, 70, seed=rows)
    above = np.triu(np.ones(x.shape, bool), offset + 1)
    assert_exact(call(backend, "fill_strict_upper_tri", x, -math.inf, offset), np.where(above, -np.inf, x))
    assert_exact(call(backend, "fill_strict_upper_tri", x, 7.5, offset), np.where(above, np.float32(7.5), x))
