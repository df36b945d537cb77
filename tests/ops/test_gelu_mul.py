"""gelu_mul: GeGLU with the tanh approximation (Gemma's gelu_pytorch_tanh), 0.5 g (1 +
tanh(sqrt(2/pi) (g + 0.044715 g^3))) * up, against float64, with gates where tanh saturates
(|g| of 10 and 100: g^3 is large) and around 0."""

from __future__ import annotations

import math

import numpy as np
import pytest
from ops.helpers import assert_close, call, f32, rand


@pytest.mark.parametrize("rows", [1, 17, 65])
def test_gelu_mul(backend, rows):
    gate, up = rand(rows, 200, seed=rows, scale=3.0), rand(rows, 200, seed=rows + 1)
    gate[0, :5] = [-100.0, 100.0, 0.0, -10.0, 10.0]
    g = gate.astype(np.float64)
    want = 0.5 * g * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g ** 3))) * up
    assert_close(call(backend, "gelu_mul", gate, up), f32(want))
