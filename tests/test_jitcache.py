"""A warm load takes inferno's kernels from Numba's cache without Numba's compiler set-up
(inferno/backends/jitcache.py), and they compute what they computed before.

Each check runs in a fresh interpreter: this one has compiled and refreshed long ago."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import pytest

import inferno
from inferno.backends import jitcache
from inferno.model.resolve import resolve

SCRIPT = """
import json, sys
import inferno
engine = inferno.load({path!r}, {backend!r}, progress=False)
registries = [m for m in ("numba.np.arraymath", "numba.np.npyimpl", "numba.cpython.listobj") if m in sys.modules]
reply = engine.generate("What is the capital of France?", max_tokens=12, temperature=0)
print(json.dumps(dict(registries=registries, text=reply.text,
                      logits=engine.logits([1, 2, 3, 4, 5])[-1, :8].tolist())))
"""


def fresh_process(path, backend: str) -> dict:
    run = subprocess.run([sys.executable, "-c", SCRIPT.format(path=str(path), backend=backend)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1])


@pytest.mark.parametrize("backend", ["pool", "simd"])
def test_warm_load_skips_numbas_compiler_set_up(backend):
    path = resolve("smollm2-135m")
    fresh_process(path, backend)  # whatever was not in the cache is compiled and saved now
    warm = fresh_process(path, backend)
    assert warm["registries"] == []  # nothing compiled, and Numba's registries never loaded
    here = inferno.load(str(path), backend, progress=False)
    assert warm["text"] == here.generate("What is the capital of France?", max_tokens=12, temperature=0).text
    assert warm["logits"] == here.logits([1, 2, 3, 4, 5])[-1, :8].tolist()
    assert "Paris" in warm["text"]
    here.close()


class FakeCache:
    """What jitcache's loader asks of Numba's cache, with a hit or a miss to give."""

    def __init__(self, found):
        self.found = found

    def _guard_against_spurious_io_errors(self):
        return contextlib.nullcontext()

    def _load_overload(self, sig, target_context):
        return self.found


def test_a_miss_says_once_that_kernels_compile(monkeypatch, capsys):
    from numba.core.registry import cpu_target
    monkeypatch.setattr(jitcache, "_told", False)
    ctx = cpu_target.target_context
    assert jitcache._load_overload(FakeCache("hit"), (), ctx) == "hit"
    assert capsys.readouterr().err == ""
    for _ in range(3):
        assert jitcache._load_overload(FakeCache(None), (), ctx) is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("note: compiling inferno's kernels for this CPU and these weight types, once")
