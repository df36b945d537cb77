"""linear_many: [linear(x, w) for w in ws], which pool runs as one launch over all the weights'
rows when they are quantized and x has a few rows (q/k/v, gate/up).

Float weights against their float64 products; quantized ones of three types and row counts,
batch 1 and 3, each output as its kernel promises (qblocks.py's bounds): one launch on
pool-eager, and on pool-2 from batch 3 (at batch 1 the work is under its threshold: one linear
per weight).
"""

from __future__ import annotations

import numpy as np
import pytest
from ops.helpers import NUMBA, assert_close, f32, host, rand
from qblocks import assert_matches, random_blocks


def test_float_weights(backend):
    ws = [rand(48, 64, seed=1), rand(16, 64, seed=2), rand(16, 64, seed=3)]
    for rows in (1, 5):
        x = rand(rows, 64, seed=rows)
        outs = backend.linear_many(backend.from_numpy(x), [backend.weight(w) for w in ws])
        assert len(outs) == 3
        for got, w in zip(outs, ws):
            assert_close(host(backend, got), f32(x.astype(np.float64) @ w.T))


def test_linear_many_fuses_mixed_types(backend):
    """q/k/v-like weights of three types and row counts in one launch (pool), batch 1 and 3."""
    cols = 512
    ws = [random_blocks("Q4_1", 9, cols, seed=1), random_blocks("Q6_K", 5, cols, seed=2),
          random_blocks("Q8_0", 16, cols, seed=3, readonly=True)]
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, cols), dtype=np.float32)
        outs = backend.linear_many(backend.from_numpy(x), [backend.weight(w) for w in ws])
        assert len(outs) == 3
        for got, w in zip(outs, ws):
            assert_matches(backend, host(backend, got), x, w)


@pytest.mark.backends(*NUMBA)
def test_linear_many_rejects_a_mismatched_width(backend):
    """The kernels read without bounds checks, so the width is checked before any launch."""
    w = backend.weight(random_blocks("Q4_0", 4, 64))
    with pytest.raises(ValueError, match="32 columns"):
        backend.linear_many(np.ones((1, 32), dtype=np.float32), [w, w])
