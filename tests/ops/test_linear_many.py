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

from inferno.backends.numba.dispatch import FEW_MAX


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
@pytest.mark.parametrize("int16", [False, True])
def test_linear_many_int16_rows_beside_others(backend, int16, monkeypatch):
    """One launch over a legacy kind, a K-quant and F16, with and without the legacy kinds' int16
    rows (ldot.py): each weight as it would be alone, whatever its neighbours take; batch 1 and
    3 (the legacy kind's l_rows on one and on a few rows)."""
    monkeypatch.setattr(backend, "int8_activations", True)
    monkeypatch.setattr(backend, "int16_legacy", int16)
    cols = 512
    ws = [random_blocks("Q5_0", 10, cols, seed=4), random_blocks("Q4_K", 6, cols, seed=5),
          random_blocks("F16", 8, cols, seed=6)]
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, cols), dtype=np.float32)
        kept = [backend.weight(w) for w in ws]
        outs = backend.linear_many(backend.from_numpy(x), kept)
        for got, w, k in zip(outs, ws, kept):
            assert_matches(backend, got, x, w)
            np.testing.assert_allclose(got, backend.linear(x, k), rtol=1e-5, atol=1e-6 * np.abs(got).max())


@pytest.mark.backends(*NUMBA)
def test_linear_many_rejects_a_mismatched_width(backend):
    """The kernels read without bounds checks, so the width is checked before any launch."""
    w = backend.weight(random_blocks("Q4_0", 4, 64))
    with pytest.raises(ValueError, match="32 columns"):
        backend.linear_many(np.ones((1, 32), dtype=np.float32), [w, w])


@pytest.mark.backends(*NUMBA)
def test_a_batch_of_gemm_size_in_one_launch(backend, monkeypatch):
    """FEW_MAX rows, where a CPU with VNNI gives the K-quants their GEMM (dispatch.gemm_size: pool's
    launch then has an entry of its own): each weight's product as its own linear gives it. (Q8_0
    in float32: with int16 rows it would take lgemm's GEMM, and one linear each.)"""
    monkeypatch.setattr(backend, "int8_activations", True)
    monkeypatch.setattr(backend, "int16_legacy", False)
    cols = 512
    ws = [random_blocks("Q4_K", 16, cols, seed=7), random_blocks("Q6_K", 9, cols, seed=8),
          random_blocks("Q8_0", 16, cols, seed=9)]
    x = np.random.default_rng(9).standard_normal((FEW_MAX, cols), dtype=np.float32)
    kept = [backend.weight(w) for w in ws]
    outs = backend.linear_many(backend.from_numpy(x), kept)
    for got, w, k in zip(outs, ws, kept):
        assert_matches(backend, got, x, w)
        np.testing.assert_allclose(got, backend.linear(x, k), rtol=1e-5, atol=1e-6 * np.abs(got).max())
