"""transpose_2d, a part of the materialized reference (base.MATERIALIZED_PARTS, not the
model's contract): x.T as a contiguous tensor, exact, for a row, a column and a non-square block
that is not a multiple of a tile either way."""

from __future__ import annotations

import pytest
from ops.helpers import assert_exact, call, rand


@pytest.mark.parametrize("shape", [(1, 70), (70, 1), (63, 65)])
def test_transpose_2d(backend, shape):
    x = rand(*shape, seed=shape[0])
    assert_exact(call(backend, "transpose_2d", x), x.T)
