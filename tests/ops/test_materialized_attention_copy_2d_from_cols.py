"""copy_2d_from_cols, a part of the materialized reference (base.MATERIALIZED_PARTS, not the
model's contract): columns col..col+width of x as a tensor of their own (attention takes a
head's q, k and v with it): exact, and a copy, so writing x afterwards leaves it as it was."""

from __future__ import annotations

import pytest
from ops.helpers import assert_exact, host, rand


@pytest.mark.parametrize("col,width", [(0, 64), (64, 64), (120, 24)])
def test_copy_2d_from_cols(backend, col, width):
    x = rand(9, 144, seed=col)
    src = backend.from_numpy(x.copy())
    got = backend.copy_2d_from_cols(src, width, col)
    src[:] = 0.0
    assert_exact(host(backend, got), x[:, col:col + width])
