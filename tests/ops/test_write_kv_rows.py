"""write_kv_rows: a batched decode step's new K or V, one row per sequence, each into its own
slot and position in one call. The bytes equal the reference's write_kv, one row at a time, in
every cache type a backend stores (the rows probe the conversions: f16 overflow, ties, -0.0);
the rest of the buffer stays zero and read_kv gives the rows back rounded as the cache type
rounds. The Numba kernel does not check bounds, so simd and pool do before calling it."""

from __future__ import annotations

import numpy as np
import pytest
from ops.helpers import NUMBA, REF, assert_exact, hard_rows, host, rand, rounded, stored_bytes, stores

from inferno.backends.base import CACHE_TYPES


@pytest.mark.parametrize("cache_type", CACHE_TYPES)
def test_write_kv_rows_scatters_like_write_kv(backend, cache_type):
    if not stores(backend, cache_type):
        return
    x = np.concatenate([hard_rows(), rand(3, 96, seed=5)])[:6]
    slots, positions = np.array([2, 0, 1, 3, 2, 0]), np.array([5, 0, 39, 7, 6, 1])
    got, want = backend.kv_buffer(4, 40, 96, cache_type), REF.kv_buffer(4, 40, 96, cache_type)
    with np.errstate(over="ignore"):
        backend.write_kv_rows(got, slots, positions, backend.from_numpy(x))
        for i in range(len(x)):
            REF.write_kv(want, int(slots[i]), int(positions[i]), x[i:i + 1])
    assert np.array_equal(stored_bytes(got), stored_bytes(want))
    back = [host(backend, backend.read_kv(got, s, p, p + 1)) for s, p in zip(slots, positions)]
    assert_exact(np.concatenate(back), rounded(x, cache_type))


def test_write_kv_rows_takes_index_tensors(backend):
    """slots and positions as the backend's index tensors (the device-resident decode step's):
    the same bytes as with host arrays."""
    x = rand(3, 64, seed=2)
    slots, positions = [1, 0, 1], [3, 0, 9]
    got, want = (backend.kv_buffer(2, 10, 64, backend.default_cache_type) for _ in range(2))
    backend.write_kv_rows(got, backend.indices(slots), backend.indices(positions), backend.from_numpy(x))
    backend.write_kv_rows(want, slots, positions, backend.from_numpy(x))
    assert np.array_equal(stored_bytes(got), stored_bytes(want))


@pytest.mark.backends(*NUMBA)
def test_kernels_refuse_rows_outside_the_buffer(backend):
    buf = backend.kv_buffer(2, 8, 64, "q8_0")
    for slots, positions in [([0, 2], [0, 0]), ([0, 1], [8, 0]), ([0, 1], [0, -1])]:
        with pytest.raises(ValueError, match="outside"):
            backend.write_kv_rows(buf, slots, positions, rand(2, 64))
    with pytest.raises(ValueError, match="2 rows need 2 slots"):
        backend.write_kv_rows(buf, [0], [0, 1], rand(2, 64))
    with pytest.raises(ValueError, match="features"):
        backend.write_kv_rows(buf, [0], [0], rand(1, 96))
