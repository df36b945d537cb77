"""read_kv: positions start..stop of one slot as float32 (a chunk's prefill after a cache reads
the cached rows so), in every cache type a backend stores: what write_kv put there as the cache
type rounds it, for any range of any slot. The Numba kernels do not check bounds, so simd and
pool do before calling them."""

from __future__ import annotations

import pytest
from ops.helpers import NUMBA, assert_exact, host, rand, rounded, stores

from inferno.backends.base import CACHE_TYPES


@pytest.mark.parametrize("cache_type", CACHE_TYPES)
def test_reads_any_range(backend, cache_type):
    if not stores(backend, cache_type):
        return
    rows = [rand(12, 64, seed=slot, scale=3.0) for slot in range(2)]
    buf = backend.kv_buffer(2, 12, 64, cache_type)
    for slot, x in enumerate(rows):
        backend.write_kv(buf, slot, 0, backend.from_numpy(x))
    for slot, start, stop in [(0, 0, 12), (1, 3, 4), (1, 5, 12), (0, 11, 12), (1, 4, 4)]:  # and none
        got = host(backend, backend.read_kv(buf, slot, start, stop))
        assert_exact(got, rounded(rows[slot], cache_type)[start:stop])


@pytest.mark.backends(*NUMBA)
def test_kernels_refuse_rows_outside_the_buffer(backend):
    buf = backend.kv_buffer(2, 8, 64, "q8_0")
    for slot, start, stop in [(0, 3, 9), (2, 0, 1), (0, 5, 4)]:
        with pytest.raises(ValueError, match="outside"):
            backend.read_kv(buf, slot, start, stop)
