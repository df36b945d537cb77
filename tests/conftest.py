"""Shared fixtures: tiny random models written once per test session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny import make_model  # noqa: E402

from inferno.backends.numba.jitcache import kernel_root  # noqa: E402

# Tests that point INFERNO_CACHE at a folder of their own (a fresh model cache, one that cannot
# be written) keep the compiled kernels where they are, in this process and the ones it starts.
os.environ.setdefault("INFERNO_KERNELS", str(kernel_root()))
# A load warms up every path itself, as with no helper process (inferno/ahead.py): a suite that
# loads hundreds of models starts no process behind each; tests/test_ahead.py turns it back on.
os.environ["INFERNO_COMPILE_AHEAD"] = "0"


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory) -> Path:
    """Qwen3, head_dim (24) unlike hidden/heads (16), GQA 2, untied, float32."""
    return make_model(tmp_path_factory.mktemp("qwen3"), "qwen3", hidden=64, heads=4, kv_heads=2,
                      head_dim=24, tied=False)


@pytest.fixture(scope="session")
def base_model_dir(qwen3_dir, tmp_path_factory) -> Path:
    """The tiny Qwen3 without a chat template, as a base model ships."""
    import json
    import shutil

    folder = tmp_path_factory.mktemp("base") / "model"
    shutil.copytree(qwen3_dir, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> Path:
    """Llama (SmolLM2-like), 9 query heads over 3 KV heads (GQA 3), tied, BOS on raw prompts."""
    return make_model(tmp_path_factory.mktemp("llama"), "llama", hidden=72, heads=9, kv_heads=3,
                      tied=True, bos=True)


# -- markers: what a test needs, so that a change can run the tests it touches first ---------------
REAL_MODEL_MODULES = {"test_real_model", "test_real_gemma", "test_first_minutes", "test_frameworks"}
REAL_MODEL_FIXTURES = {"real", "gguf_path", "gemma_path", "smollm2"}
TRITON_MODULES = {"test_triton_decode", "test_gpu_backend", "test_gpu_bench"}


def pytest_collection_finish(session):
    """Work that tests only wait for starts now, on the core the suite's compiles leave idle
    (Numba compiles on one): a test module's `start_early(items, config)` hears of its
    selected items (a build for another CPU); and where the kernel tests run, the real models'
    kernels compile ahead (_compile_ahead). On pytest-xdist's workers every worker collects
    every test: the builds start in the one that takes the kernel tests, as it takes them
    (pytest_runtest_setup), and nothing compiles ahead (the other worker runs the real models
    from the start)."""
    if session.config.option.collectonly:
        return
    modules = {}
    for item in session.items:
        if hasattr(item.module, "start_early"):
            modules.setdefault(item.module, []).append(item)
    if _on_worker(session.config):
        session.config.stash[_EARLY] = modules
        return
    for module, items in modules.items():
        module.start_early(items, session.config)
    if any(Path(item.path).parent.name == "ops" for item in session.items):
        _compile_ahead(session.config)


_EARLY = pytest.StashKey[dict]()


def pytest_runtest_setup(item):
    """On the xdist worker that takes the kernel tests, as the first of them starts: the
    builds pytest_collection_finish left for it."""
    modules = item.config.stash.get(_EARLY, None)
    if modules and _group(item.nodeid) == KERNELS:
        item.config.stash[_EARLY] = {}
        for module, items in modules.items():
            module.start_early(items, item.config)


COMPILE_AHEAD = """
import sys
from inferno.backends.numba import jitcache
from inferno.engine import load
jitcache.announce_compiles()
for backend in ("pool", "simd"):
    for path in sys.argv[1:]:
        load(path, backend, progress=False).close()
"""


def _compile_ahead(config) -> None:
    """Every path of SmolLM2 (the legacy kinds' kernels) and Gemma 3 (the K-quants'), on pool
    and simd, warmed up in a process at a lower priority as the session starts, into the
    suite's kernel cache, as inferno's own helper process does (ahead.py): the kernel tests,
    the real-model tests and the server's take the same compiled entries (read-only weights,
    each kind's drivers), and a test that needs a kernel the process is compiling waits for
    it rather than compiling it too (jitcache.announce_compiles). Only the models already in
    inferno's cache: a fetch is the tests' own."""
    import subprocess

    from inferno.loading.resolve import ALIASES, cached_path
    paths = [str(p) for p in (cached_path(ALIASES[name]) for name in ("smollm2-135m", "gemma3-270m")) if p]
    if paths:
        proc = subprocess.Popen([sys.executable, "-c", COMPILE_AHEAD, *paths], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, preexec_fn=lambda: os.nice(10))
        config.add_cleanup(proc.kill)


# With pytest-xdist (./run-tests runs the whole suite on two workers): the tests that compile most
# of the kernels (each weight kind's entries, on every backend) go to one worker together, so that
# no kernel compiles twice, and every other module is a unit of its own, its module-scoped
# fixtures (a model, an oracle) made once (_Spread). The longest modules start first, so that
# neither worker is left with one of them at the end; of those, the Triton interpreter's and the
# draft tests (SmolLM2's legacy kinds) before the real Gemma, whose K-quant kernels the kernel
# tests compile meanwhile (Numba loads a callee the other worker has saved rather than compiling it
# again: the two started together compiled the same ones side by side).
KERNELS = "kernels"
KERNEL_MODULES = {"test_invariance", "test_moe"}  # besides tests/ops (test_moe: ops' experts entries)
LONGEST = ("test_triton_decode", "test_speculative", "test_real_gemma", "test_real_model", "test_gpu_bench",
           "test_page", "test_jitcache", "test_serve_ray", "test_tokenizer_spm", "test_structured")


def _group(nodeid: str) -> str:
    """The unit of work a test goes in on xdist's workers: KERNELS, or its module's path."""
    path = Path(nodeid.split("::")[0])
    return KERNELS if path.parent.name == "ops" or path.stem in KERNEL_MODULES else path.as_posix()


def _on_worker(config) -> bool:
    """Whether this process is one of pytest-xdist's workers."""
    return hasattr(config, "workerinput")


class _Spread:
    """pytest-xdist's scheduler for this suite: LoadScope's, each test's scope its _group (xdist's
    own xdist_group marks no longer reach its scheduler under pytest 9.2, which names a test by
    an id xdist does not rewrite)."""

    @staticmethod
    def pytest_xdist_make_scheduler(config, log):
        from xdist.scheduler import LoadScopeScheduling

        class ByGroup(LoadScopeScheduling):
            def _split_scope(self, nodeid):
                return _group(nodeid)
        return ByGroup(config, log)


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_Spread(), "inferno-spread")


def pytest_collection_modifyitems(config, items):
    """real_model (SmolLM2 or Gemma 3 from PyPI), subprocess (a fresh interpreter: the CLI, a
    server process, a cold cache), ray (a local Ray cluster), triton_interp (Triton's
    interpreter on the CPU); slow is any of them. `./run-tests -m "not slow"` is the quick
    selection. On xdist's workers, the order the units start in."""
    _mark_slow(items)
    rank = {name: i for i, name in enumerate((KERNELS, *LONGEST))} if _on_worker(config) else {}

    def order(item):
        # Tests that wait for a build started early (a module's WAITS_FOR_EARLY) go last: the rest
        # of the suite (on xdist, of their unit) runs meanwhile, rather than a worker waiting
        # minutes for a process at nice 10. (A stable sort: the rest as collected; every worker
        # sorts alike, as xdist requires.)
        waits = getattr(item, "originalname", "") in getattr(item.module, "WAITS_FOR_EARLY", ())
        return waits, rank.get(Path(_group(item.nodeid)).stem, len(rank))
    items.sort(key=order)


def _mark_slow(items):
    import inspect

    sources = {}  # (a function's parametrized items share its source: each read once)
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1]
        if item.function not in sources:
            try:
                sources[item.function] = inspect.getsource(item.function)
            except (OSError, TypeError):
                sources[item.function] = ""
        source = sources[item.function]
        marks = set()
        if module in REAL_MODEL_MODULES or REAL_MODEL_FIXTURES & set(item.fixturenames) or 'resolve("' in source:
            marks.add("real_model")
        if "subprocess" in source or "cli(" in source or "chat(" in source:
            marks.add("subprocess")
        if module == "test_serve_ray":
            marks.add("ray")
        # by module, or marked itself or through a parameter (tests/ops' gpu variant)
        if module in TRITON_MODULES or item.get_closest_marker("triton_interp"):
            marks.add("triton_interp")
        for mark in marks | ({"slow"} if marks else set()):
            item.add_marker(getattr(pytest.mark, mark))
