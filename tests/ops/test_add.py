"""add: a + b, exact (one float32 addition per element), for b of a's shape (a residual) and for
b a [features] vector added to every row (a bias)."""

from __future__ import annotations

import pytest
from ops.helpers import assert_exact, call, rand


@pytest.mark.parametrize("rows", [1, 65])
def test_add(backend, rows):
    a, b = rand(rows, 70, seed=rows), rand(rows, 70, seed=rows + 1)
    assert_exact(call(backend, "add", a, b), a + b)


def test_bias_row(backend):
    a, bias = rand(5, 70, seed=1), rand(70, seed=2)
    assert_exact(call(backend, "add", a, bias), a + bias[None, :])
