"""rows: rows start..stop of x (a view where the backend can; not required), exact, including an
empty range and the last row."""

from __future__ import annotations

import pytest
from ops.helpers import assert_exact, call, rand


@pytest.mark.parametrize("start,stop", [(0, 1), (3, 9), (9, 10), (4, 4)])
def test_rows(backend, start, stop):
    x = rand(10, 70, seed=start)
    assert_exact(call(backend, "rows", x, start, stop), x[start:stop])
