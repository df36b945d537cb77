"""scale: x * s, exact: one float32 multiplication by s rounded to float32, also for an s that
float32 does not hold (0.3), at rows on both sides of the 64-row tile edge."""

from __future__ import annotations

import numpy as np
import pytest
from ops.helpers import assert_exact, call, rand


@pytest.mark.parametrize("s", [0.125, 0.3])
@pytest.mark.parametrize("rows", [1, 64, 100])
def test_scale_is_exact(backend, rows, s):
    x = rand(rows, 70, seed=rows)
    assert_exact(call(backend, "scale", x, s), x * np.float32(s))
