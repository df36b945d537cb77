"""write_rows: dst[start:start + len(src)] = src, in place, exact (a batch's attention rows
assembled); the rows around it are untouched."""

from __future__ import annotations

import pytest
from ops.helpers import assert_exact, host, rand


@pytest.mark.parametrize("start,n", [(0, 1), (3, 4), (7, 3)])
def test_write_rows(backend, start, n):
    before, src = rand(10, 70, seed=1), rand(n, 70, seed=2)
    dst = backend.from_numpy(before.copy())
    backend.write_rows(dst, backend.from_numpy(src), start)
    want = before.copy()
    want[start:start + n] = src
    assert_exact(host(backend, dst), want)
