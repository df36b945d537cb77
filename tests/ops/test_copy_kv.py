"""copy_kv: dst[dst_slot, start:stop] = src[src_slot, start:stop], elements as stored, no
conversion (a reused prefix is the same rows bit for bit, in every cache type a backend
stores): between two buffers and between slots of one; an empty range copies nothing; every
other position of both stays as it was."""

from __future__ import annotations

import numpy as np
import pytest
from ops.helpers import filled_cache, stored_bytes, stores

from inferno.backends.base import CACHE_TYPES


@pytest.mark.parametrize("cache_type", CACHE_TYPES)
def test_copy_kv(backend, cache_type):
    if not stores(backend, cache_type):
        return
    src, dst = filled_cache(backend, 1, 3, 20, 64, cache_type, scale=3.0)
    before_src, before_dst = stored_bytes(src), stored_bytes(dst)
    backend.copy_kv(dst, 2, src, 0, 3, 17)
    want = before_dst.copy()
    want[2, 3:17] = before_src[0, 3:17]
    assert np.array_equal(stored_bytes(dst), want) and np.array_equal(stored_bytes(src), before_src)
    backend.copy_kv(src, 1, src, 0, 0, 9)  # another slot's prefix, in one buffer
    want_src = before_src.copy()
    want_src[1, :9] = before_src[0, :9]
    assert np.array_equal(stored_bytes(src), want_src)
    backend.copy_kv(dst, 0, src, 1, 5, 5)
    assert np.array_equal(stored_bytes(dst), want)
