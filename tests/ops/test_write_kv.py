"""write_kv: float32 rows into one slot of a K or V buffer from a position on, converted to the
buffer's cache type: f32, f16, bf16 and q8_0 on the numpy backends; torch stores the first
three and refuses q8_0.

The bytes are the numpy reference's (cache_types.py, itself pinned to numpy's, torch's and
gguf's rounding in test_kv_cache.py) on rows that probe the conversions (zero blocks, f16
subnormals and overflow, exact rounding ties, -0.0); the positions and slots around them stay
zero, and read_kv gives the rows back as float32, exactly the reference's decoding. The Numba
kernels do not check bounds, so simd and pool do before calling them.
"""

from __future__ import annotations

import numpy as np
import pytest
from ops.helpers import NUMBA, hard_rows, host, rand, stored_bytes, stores

from inferno.backends.base import CACHE_TYPES
from inferno.formats import cache_types


def buffer_dtype(backend, cache_type):
    if backend.name == "torch":
        from inferno.backends.torch.torch_backend import CACHE_DTYPES
        return CACHE_DTYPES[cache_type]
    return cache_types.DTYPES[cache_type]


@pytest.mark.parametrize("cache_type", CACHE_TYPES)
def test_write_and_read_round_trip(backend, cache_type):
    """Bytes equal to the reference's, read back exactly, neighbours untouched."""
    if not stores(backend, cache_type):
        return
    x = np.concatenate([hard_rows(), rand(20, 96, seed=4)])
    buf = backend.kv_buffer(3, 40, 96, cache_type)
    assert buf.shape == (3, 40, cache_types.row_elements(cache_type, 96))
    assert buf.dtype == buffer_dtype(backend, cache_type)
    with np.errstate(over="ignore"):
        backend.write_kv(buf, 1, 9, backend.from_numpy(x))
        stored = cache_types.encode(x, cache_type)
    raw = stored_bytes(buf)
    assert np.array_equal(raw[1, 9:9 + len(x)], stored.view(np.uint8))
    assert not raw[1, :9].any() and not raw[1, 9 + len(x):].any() and not raw[[0, 2]].any()
    got = host(backend, backend.read_kv(buf, 1, 9, 9 + len(x)))
    assert got.shape == x.shape
    assert np.array_equal(got, cache_types.decode(stored), equal_nan=True)
    if cache_type == "f32":
        assert np.array_equal(got, x)


@pytest.mark.backends(*NUMBA)
def test_kernels_refuse_rows_outside_the_buffer(backend):
    """The Numba kernels do not check bounds: the backend does, before it calls them."""
    buf = backend.kv_buffer(2, 8, 64, "q8_0")
    for slot, start, rows in [(2, 0, rand(1, 64)), (0, 7, rand(2, 64)), (0, -1, rand(1, 64))]:
        with pytest.raises(ValueError, match="outside"):
            backend.write_kv(buf, slot, start, rows)
    with pytest.raises(ValueError, match="features"):
        backend.write_kv(buf, 0, 0, rand(1, 96))
