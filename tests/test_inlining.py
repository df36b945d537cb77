"""inlining.py: Numba's inliner patched to copy a callee's IR once per call site. Pinned: the
patch takes on the Numba this project installs (or that Numba no longer copies block by block,
so nothing is left to patch), and functions built from inlined helpers compute as before:
helpers inlined at several sites, in branches and loops, their variables kept apart."""

from __future__ import annotations

import inspect

import numba as nb
import numpy as np
import pytest

from inferno.backends.numba import inlining


def test_the_patch_takes_or_numba_no_longer_needs_it():
    from numba.core import inline_closurecall
    applied = inlining.apply()
    method = inline_closurecall.InlineWorker.inline_ir
    if applied:
        assert method.patched_by == inlining.__name__
    else:  # a Numba whose inliner changed: the per-block copy must be gone with it
        assert "copy.deepcopy(the_ir.blocks[block_label])" not in inspect.getsource(method)


@nb.njit(inline="always")
def _scaled(v, k):
    t = v * k  # a local of the same name at every site
    if t > 10.0:
        t = t - 10.0
    return t


@nb.njit(inline="always")
def _twice(v, k):
    t = _scaled(v, k)  # inlined inside an inlined helper
    return _scaled(t, k) + t


@nb.njit
def _many_sites(x, k):
    total = 0.0
    for i in range(x.shape[0]):
        t = x[i]
        if i % 2:
            total += _twice(t, k)
        else:
            total += _scaled(t, k) - _twice(t, 1.5)
    return total, t


def _reference(x, k):
    def scaled(v, k):
        t = v * k
        return t - 10.0 if t > 10.0 else t

    def twice(v, k):
        t = scaled(v, k)
        return scaled(t, k) + t
    total = 0.0
    for i, t in enumerate(x):
        total += twice(t, k) if i % 2 else scaled(t, k) - twice(t, 1.5)
    return total, x[-1]


def test_inlined_helpers_compute_as_written():
    inlining.apply()  # (as the first kernel to miss the cache would)
    x = np.linspace(-4.0, 9.0, 27)
    for k in (0.5, 2.0, 3.0):
        got, last = _many_sites(x, k)
        want, want_last = _reference(x, k)
        assert last == want_last
        assert np.isclose(got, want, rtol=1e-12, atol=0)


def test_a_kernel_that_misses_the_cache_applies_it_first(monkeypatch, capsys):
    """jitcache applies the patch when a kernel misses the cache (Numba compiles next), not at
    import: a warm load never imports Numba's compiler."""
    from numba.core import inline_closurecall
    from numba.core.registry import cpu_target
    from test_jitcache import FakeCache

    from inferno.backends.numba import jitcache
    if not inlining.apply():
        pytest.skip("this Numba's inliner needs no patch (the first test checks that it copies no more per block)")
    worker = inline_closurecall.InlineWorker
    monkeypatch.setattr(worker, "inline_ir", worker.inline_ir.original)
    monkeypatch.setattr(inlining, "_applied", None)
    monkeypatch.setattr(jitcache, "_told", True)  # (no note: test_jitcache checks it)
    ctx = cpu_target.target_context
    assert jitcache._load_overload(FakeCache("hit"), (), ctx) == "hit"
    assert not hasattr(worker.inline_ir, "patched_by")
    assert jitcache._load_overload(FakeCache(None), (), ctx) is None
    assert worker.inline_ir.patched_by == inlining.__name__
