"""silu_mul: SwiGLU, gate / (1 + exp(-gate)) * up, against float64, at rows on both sides of the
64-row tile edge, with gates far past float32 exp's range either way (the kernels' own exp)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from ops.helpers import assert_close, call, f32, rand

SEQS = [1, 17, 63, 64, 65, 100, 200]


@pytest.mark.parametrize("rows", SEQS)
def test_silu_mul(backend, rows):
    gate, up = rand(rows, 200, seed=rows, scale=6.0), rand(rows, 200, seed=rows + 1)
    gate[0, :4] = [-100.0, 100.0, 0.0, -87.5]  # beyond exp's range either way
    g = gate.astype(np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # exp(100) is inf and silu(-100) -0.0: no warning for it
        got = call(backend, "silu_mul", gate, up)
    assert_close(got, f32(g / (1.0 + np.exp(-g)) * up))
