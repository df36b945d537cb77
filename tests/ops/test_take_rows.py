"""take_rows: x[rows] for an index array or list (the rows a step wants logits for), exact, in
any order and with repeats; or for the backend's own index tensor (ops.indices: the decode step's
RoPE rows for its positions)."""

from __future__ import annotations

import numpy as np
import pytest
from ops.helpers import assert_exact, call, rand


@pytest.mark.parametrize("rows", [[4], [9, 0, 3], np.array([2, 2, 7])], ids=["one", "list", "array"])
def test_take_rows(backend, rows):
    x = rand(10, 70, seed=1)
    assert_exact(call(backend, "take_rows", x, rows), x[np.asarray(rows)])
    assert_exact(call(backend, "take_rows", x, backend.indices(rows)), x[np.asarray(rows)])
