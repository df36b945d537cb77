"""copy_2d_into_cols, a part of the materialized reference (base.MATERIALIZED_PARTS, not the
model's contract): src written into dst's columns col..col+src.cols, in place, exact; dst is
returned and its other columns are untouched (attention assembles its heads' outputs so)."""

from __future__ import annotations

import pytest
from ops.helpers import assert_exact, host, rand


@pytest.mark.parametrize("col,width", [(0, 64), (64, 64), (120, 24)])
def test_copy_2d_into_cols(backend, col, width):
    before, src = rand(9, 144, seed=1), rand(9, width, seed=2)
    dst = backend.from_numpy(before.copy())
    assert backend.copy_2d_into_cols(dst, backend.from_numpy(src), col) is dst
    want = before.copy()
    want[:, col:col + width] = src
    assert_exact(host(backend, dst), want)
