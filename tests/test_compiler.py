"""compiler.py: Numba's inliner, SSA reconstruction and branch pruning patched to do less for the
same code.
Pinned: the patches take on the Numba this project installs (or that Numba no longer does what
they remove); functions built from inlined helpers compute as before (helpers inlined at several
sites, in branches and loops, their variables kept apart); a callee's untyped pipeline runs once
however many its sites; and the SSA reconstruction makes the very IR Numba's own makes, on
functions with loops, branches and inlined helpers; a literal kind's other branches are never
typed."""

from __future__ import annotations

import copy
import inspect
import io

import numba as nb
import numpy as np
import pytest

from inferno.backends.numba import compiler


def test_the_patches_take_or_numba_no_longer_needs_them():
    from numba.core import inline_closurecall, ssa
    applied = compiler.apply()
    method = inline_closurecall.InlineWorker.inline_ir
    if applied:
        assert method.patched_by == compiler.__name__
        assert inline_closurecall.InlineWorker.inline_function.patched_by == compiler.__name__
    else:  # a Numba whose inliner changed: the per-block copy must be gone with it
        assert "copy.deepcopy(the_ir.blocks[block_label])" not in inspect.getsource(method)
    if getattr(ssa._run_ssa, "patched_by", None) != compiler.__name__:
        # another Numba's SSA: it must no longer pass over every block for each variable
        assert "for varname in violators" not in inspect.getsource(ssa._run_ssa)


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


def _many_sites_py(x, k):
    total = 0.0
    for i in range(x.shape[0]):
        t = x[i]
        if i % 2:
            total += _twice(t, k)
        else:
            total += _scaled(t, k) - _twice(t, 1.5)
    return total, t


_many_sites = nb.njit(_many_sites_py)


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
    compiler.apply()  # (as the first kernel to miss the cache would)
    x = np.linspace(-4.0, 9.0, 27)
    for k in (0.5, 2.0, 3.0):
        got, last = _many_sites(x, k)
        want, want_last = _reference(x, k)
        assert last == want_last
        assert np.isclose(got, want, rtol=1e-12, atol=0)


def test_a_callees_untyped_pipeline_runs_once(monkeypatch):
    """_twice is inlined at two sites and _scaled at three (two more inside _twice): each
    function's untyped IR is made once, in a fresh compile."""
    from numba.core import inline_closurecall
    if not compiler.apply():
        pytest.skip("this Numba's inliner is not the one compiler.py patches (the first test checks why)")
    compiler._untyped.clear()
    worker = inline_closurecall.InlineWorker
    made = []
    run = worker.run_untyped_passes
    monkeypatch.setattr(worker, "run_untyped_passes",
                        lambda self, func, *a, **k: made.append(func.__name__) or run(self, func, *a, **k))
    fresh = nb.njit(_many_sites_py)
    x = np.linspace(-4.0, 9.0, 27)
    assert fresh(x, 2.0) == _reference(x, 2.0)
    assert sorted(made) == ["_scaled", "_twice"]


def _loops(x, n):
    acc, best, at = 0.0, -1e300, -1
    for i in range(n):
        v = x[i % x.shape[0]]
        if v > best:
            best, at = v, i
        elif v < 0:
            acc -= v
            continue
        j = 0
        while j < 3:
            acc += v * j
            if acc > 1e6:
                break
            j += 1
    return acc, best, at


def _tuples(x):
    a = b = c = d = 0.0
    for i in range(0, x.shape[0] - 3, 4):
        a, b, c, d = a + x[i], b + x[i + 1], c + x[i + 2], d + x[i + 3]
        if a > b:
            a, b = b, a
    total = 0.0
    for v in (a, b, c, d):
        total += _scaled(v, 2.0)
    return total


def _dump(blocks) -> str:
    out = io.StringIO()
    for label in sorted(blocks):
        print(f"label {label}:", file=out)
        blocks[label].dump(file=out)
    return out.getvalue()


@pytest.mark.parametrize("func", [_loops, _tuples, _many_sites_py], ids=lambda f: f.__name__)
def test_ssa_is_numbas_own(monkeypatch, func):
    """Every SSA reconstruction of a fresh compile, run on copies of its blocks by Numba's own
    _run_ssa and by compiler.run_ssa: the same IR, fresh names included."""
    from numba.core import ssa
    compiler.apply()
    if getattr(ssa._run_ssa, "patched_by", None) != compiler.__name__:
        pytest.skip("this Numba's SSA is not the one compiler.py patches (the first test checks why)")
    pairs = []

    def both(blocks):
        theirs, mine = copy.deepcopy(blocks), copy.deepcopy(blocks)  # (each its own Scope copy)
        pairs.append((_dump(compiler.run_ssa.original(theirs)), _dump(compiler.run_ssa(mine))))
        return compiler.run_ssa(blocks)

    monkeypatch.setattr(ssa, "_run_ssa", both)
    fresh = nb.njit(func)
    if func is _loops:
        fresh(np.array([1.0, -2.0, 3.0, 0.5]), 11)
    elif func is _tuples:
        fresh(np.linspace(-3.0, 5.0, 19))
    else:
        fresh(np.linspace(-4.0, 9.0, 27), 2.0)
    assert pairs and any(".1" in mine for _, mine in pairs)  # (variables were renamed)
    for theirs, mine in pairs:
        assert mine == theirs


def test_a_branch_on_a_literal_kind_is_pruned_before_typing():
    """A kernel made for one kind (a closure's literal, as the drivers are made) types and compiles
    no other kind's branch, in its own body or in an inlined helper's: the callees there are never
    compiled. Each kind still computes as written."""
    compiler.apply()
    seven = nb.njit(lambda v: v * 7.0)
    nine = nb.njit(lambda v: v * 9.0)

    @nb.njit(inline="always")
    def helper(kind, v):
        if kind == 9:
            return nine(v)
        return v

    @nb.njit
    def body(kind, v):
        if kind == 7:
            return seven(v)
        return helper(kind, v) + 1.0

    def made_for(kind):
        @nb.njit
        def entry(v):
            return body(kind, v)
        return entry

    assert made_for(3)(2.0) == 3.0
    assert not seven.signatures and not nine.signatures
    assert made_for(9)(2.0) == 19.0
    assert not seven.signatures and nine.signatures
    assert made_for(7)(2.0) == 14.0


def test_a_kernel_that_misses_the_cache_applies_it_first(monkeypatch, capsys):
    """jitcache applies the patches when a kernel misses the cache (Numba compiles next), not at
    import: a warm load never imports Numba's compiler."""
    from numba.core import inline_closurecall
    from numba.core.registry import cpu_target
    from test_jitcache import FakeCache

    from inferno.backends.numba import jitcache
    if not compiler.apply():
        pytest.skip("this Numba's inliner needs no patch (the first test checks that it copies no more per block)")
    worker = inline_closurecall.InlineWorker
    monkeypatch.setattr(worker, "inline_ir", worker.inline_ir.original)
    monkeypatch.setattr(worker, "inline_function", worker.inline_function.original)
    monkeypatch.setattr(compiler, "_applied", None)
    monkeypatch.setattr(jitcache, "_told", True)  # (no note: test_jitcache checks it)
    ctx = cpu_target.target_context
    assert jitcache._load_overload(FakeCache("hit"), (), ctx) == "hit"
    assert not hasattr(worker.inline_ir, "patched_by")
    assert jitcache._load_overload(FakeCache(None), (), ctx) is None
    assert worker.inline_ir.patched_by == compiler.__name__
    assert worker.inline_function.patched_by == compiler.__name__
