"""Compiling ahead (inferno/ahead.py): the load compiles the first reply's kernels, a helper
process the rest; a load waits for a kernel the helper is compiling rather than compiling it
twice; a helper's mark makes later loads warm up the first reply's paths only."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from inferno import ahead
from inferno.backends.numba import jitcache
from test_jitcache import no_compile

AHEAD_ON = {**os.environ, "INFERNO_COMPILE_AHEAD": "1"}

LOAD = """
import json, sys, time
import inferno
from inferno.backends.numba import jitcache
engine = inferno.load({path!r}, "pool", progress=False)
print(json.dumps({{"helper": engine.helper is not None, "key": engine.plan.key,
                  "misses": jitcache.misses(),
                  "tokens": engine.generate("Hi", max_tokens=4, temperature=0,
                                            logit_bias={{t: -100.0 for t in engine.eos}}).generated_tokens}}))
"""

def run(script: str, env: dict) -> dict:
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.splitlines()[-1])


@pytest.fixture
def own_kernels(tmp_path):
    """An empty kernel cache of the test's own, in the processes it starts (what a new user
    has); the helpers those start are stopped at the end."""
    env = {**AHEAD_ON, "INFERNO_KERNELS": str(tmp_path / "kernels")}
    yield env
    for lock in (tmp_path / "kernels").glob("*/ahead/*.lock"):  # each helper's pid
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(lock.read_text()), 9)


def test_a_helper_compiles_the_rest_then_nothing_compiles(tmp_path_factory, own_kernels):
    """A model on an empty kernel cache: the load compiles a first reply's kernels, starts a
    helper and answers; once the helper has marked the rest, a fresh load starts none and
    compiles nothing, and a long generation, a chat's later turns and batched steps with
    chunked prompts compile nothing either (their kernels load from the cache)."""
    from tiny import make_model
    folder = make_model(tmp_path_factory.mktemp("ahead"), "qwen3", hidden=64, heads=8, kv_heads=2,
                        head_dim=64, max_positions=1024)
    first = run(LOAD.format(path=str(folder)), own_kernels)
    assert first["helper"] and first["misses"] > 0 and first["tokens"] == 4
    marks = Path(own_kernels["INFERNO_KERNELS"])
    deadline = time.monotonic() + 600
    while not list(marks.glob(f"*/ahead/{first['key']}.rest")):
        assert not list(marks.glob(f"*/ahead/{first['key']}.failed")), list(marks.glob("*/ahead/*.log"))[0].read_text()
        assert time.monotonic() < deadline, "the helper did not finish in 10 minutes"
        time.sleep(0.5)
    later = no_compile(folder, "pool", "jitcache.misses", env=own_kernels)
    assert not later["helper"]
    assert later["seen"] == {k: 0 for k in later["seen"]}, later
    again = run(LOAD.format(path=str(folder)), own_kernels)
    assert not again["helper"] and again["misses"] == 0


def test_the_plan_is_the_loads_arguments():
    a = ahead.Plan("/m.gguf", "pool", flash=True, cache_type=None, threads=2)
    assert a.args == {"model": "/m.gguf", "backend": "pool", "flash": True, "threads": 2}
    assert a.key == ahead.Plan("/m.gguf", "pool", threads=2, flash=True).key
    assert a.key != ahead.Plan("/m.gguf", "pool", flash=True, cache_type="q8_0", threads=2).key
    with pytest.raises(TypeError):
        ahead.Plan("/m.gguf", "torch", device=object())  # a helper could not repeat it


def test_warmup_marks_the_model_ready(llama_dir, capsys):
    from inferno.cli import main
    plan = ahead.Plan(str(llama_dir.resolve()), "simd", flash=True)
    plan.clear()
    assert not plan.ready("decode") and not plan.ready("rest")
    assert main(["warmup", "--model", str(llama_dir), "--backend", "simd"]) == 0
    assert plan.ready("decode") and plan.ready("rest")


def test_after_a_failed_helper_the_load_warms_up_every_path(llama_dir, monkeypatch):
    import inferno
    monkeypatch.setenv("INFERNO_COMPILE_AHEAD", "1")
    plan = ahead.Plan(str(llama_dir.resolve()), "simd", flash=True)
    plan.clear()
    plan.mark("failed")
    engine = inferno.load(str(llama_dir), "simd", progress=False)
    assert engine.plan.key == plan.key and engine.helper is None  # no second helper to fail
    assert plan.ready("rest") and not plan.failed()  # every path warmed here, and so marked


# -- waiting for a helper's compile ---------------------------------------------------------------
def kernel(x):
    return x


class FakeCache:
    """What _waited_for_helper uses of Numba's cache: the function."""
    _py_func = kernel

    def __init__(self):
        self.loads = 0

    def _guard_against_spurious_io_errors(self):
        return contextlib.nullcontext()

    def _load_overload(self, sig, target_context):
        self.loads += 1
        return "machine code"


@pytest.fixture
def helper_files(tmp_path, monkeypatch):
    monkeypatch.setattr(jitcache, "CACHE_FOLDER", tmp_path)
    (tmp_path / "compiling").mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield tmp_path / "compiling" / str(sleeper.pid), sleeper
    sleeper.kill()
    sleeper.wait()


def test_a_miss_waits_for_the_kernel_a_helper_is_compiling(helper_files):
    entry, _ = helper_files
    entry.write_text(jitcache._kernel_name(kernel, ("int64",)))
    threading.Timer(0.4, entry.unlink).start()
    t0 = time.monotonic()
    assert jitcache._waited_for_helper(FakeCache(), ("int64",))
    assert time.monotonic() - t0 >= 0.35


def test_a_miss_does_not_wait_for_another_kernel_or_a_dead_helper(helper_files, monkeypatch):
    entry, sleeper = helper_files
    entry.write_text(jitcache._kernel_name(kernel, ("float32",)))
    assert not jitcache._waited_for_helper(FakeCache(), ("int64",))
    entry.write_text(jitcache._kernel_name(kernel, ("int64",)))
    monkeypatch.setattr(jitcache, "_announcing", [True])
    assert not jitcache._waited_for_helper(FakeCache(), ("int64",))  # a helper waits on no one
    monkeypatch.setattr(jitcache, "_announcing", [False])
    os.utime(entry, (time.time() - 2 * jitcache._WAIT_MAX,) * 2)
    assert not jitcache._waited_for_helper(FakeCache(), ("int64",)) and not entry.exists()  # stale
    entry.write_text(jitcache._kernel_name(kernel, ("int64",)))
    sleeper.kill()
    sleeper.wait()
    assert not jitcache._waited_for_helper(FakeCache(), ("int64",))
    assert not entry.exists()  # a dead helper's file is cleared


def test_a_kernel_is_named_with_the_kind_its_entry_was_made_for():
    from inferno.backends.numba import qkernels as Q
    a = Q._path_entry(Q.LEGACY_ROW, int(Q.Q8_0), True).py_func
    b = Q._path_entry(Q.LEGACY_ROW, int(Q.Q4_1), True).py_func
    assert a.__qualname__ == b.__qualname__
    assert jitcache._kernel_name(a, ("x",)) != jitcache._kernel_name(b, ("x",))


def test_a_save_waits_while_another_process_holds_the_folder(tmp_path, monkeypatch):
    """Numba saves a kernel by reading its function's index and writing it back: two processes
    saving two signatures at once could each pick the same data file, one index entry then
    naming the other's machine code. Saves take the keyed folder's lock exclusively (loads
    shared): a save waits while another process holds it."""
    monkeypatch.setattr(jitcache, "CACHE_FOLDER", tmp_path)
    released = tmp_path / "released"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, pathlib, time\n"
        f"f = open({str(tmp_path / '.lock')!r}, 'a')\n"
        "fcntl.flock(f, fcntl.LOCK_SH)\n"
        "print('held', flush=True)\n"
        "time.sleep(0.3)\n"
        f"pathlib.Path({str(released)!r}).write_text('yes')\n")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    saved = []

    class Saving(FakeCache):
        def _save_overload(self, sig, data):
            saved.append(released.exists())

    jitcache._save_overload(Saving(), ("int64",), "machine code")
    holder.wait(timeout=60)
    assert saved == [True]  # it saved only once the reader had let go
