"""rope_tables: cos and sin of position x frequency, computed in float64 and rounded once, so far
positions (a long context's angles are large) keep their precision: equal bit for bit to
numpy's float64 cos and sin rounded to float32, on every backend (torch computes them on the
host for that reason)."""

from __future__ import annotations

import numpy as np
import pytest
from ops.helpers import assert_exact, host


@pytest.mark.parametrize("start", [0, 100_000])
def test_rope_tables(backend, start):
    positions = np.arange(start, start + 33)
    inv_freq = 1.0 / 1_000_000 ** (np.arange(0, 128, 2) / 128)  # Qwen3's base, head dim 128
    cos, sin = backend.rope_tables(positions, inv_freq)
    angles = np.outer(positions.astype(np.float64), inv_freq)
    assert_exact(host(backend, cos), np.cos(angles).astype(np.float32))
    assert_exact(host(backend, sin), np.sin(angles).astype(np.float32))
