"""matmul, a part of the materialized reference (base.MATERIALIZED_PARTS, not the
model's contract): a [m, k] @ b [k, n] (attention's q k^T and p v), against the float64 product, at m on
both sides of the 64-row tile edge and an n (70) that is not a multiple of a vector."""

from __future__ import annotations

import numpy as np
import pytest
from ops.helpers import assert_close, call, f32, rand


@pytest.mark.parametrize("rows", [1, 17, 65])
def test_matmul(backend, rows):
    a, b = rand(rows, 64, seed=5), rand(64, 70, seed=6)
    assert_close(call(backend, "matmul", a, b), f32(a.astype(np.float64) @ b))
