"""A warm load takes inferno's kernels from Numba's cache without Numba's compiler set-up
(inferno/backends/numba/jitcache.py), and they compute what they computed before.

Each check runs in a fresh interpreter: this one has compiled and refreshed long ago."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import pytest

import inferno
from inferno.backends.numba import jitcache
from inferno.loading.resolve import resolve

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
    import numpy as np

    path = resolve("smollm2-135m")
    first = fresh_process(path, backend)  # whatever was not in the cache is compiled and saved now
    warm = fresh_process(path, backend)
    assert warm["registries"] == []  # nothing compiled, and Numba's registries never loaded
    # The same answers, not bit for bit: a process that compiles some kernels itself runs
    # machine code that may order float32 sums otherwise than the cached code a warm process
    # picks for the same call, and the int8 and int16 activations turn a last-bit difference into
    # one rounding step of a row. It is deterministic (a cold cache gives the same first and the
    # same warm logits every time): measured 1.8e-5 of their size with everything compiled in
    # the first process, 2.5e-4 after a cold suite that had compiled part of it. A wrong kernel
    # from the cache moves them by far more than 1e-3.
    assert warm["text"] == first["text"]
    np.testing.assert_allclose(warm["logits"], first["logits"], rtol=1e-3)
    here = inferno.load(str(path), backend, progress=False)
    assert warm["text"] == here.generate("What is the capital of France?", max_tokens=12, temperature=0).text
    np.testing.assert_allclose(warm["logits"], here.logits([1, 2, 3, 4, 5])[-1, :8], rtol=1e-3)
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


class ImportingMeanwhile(dict):
    """A dict that gains an entry while it is being walked, as sys.modules does when another
    thread imports (and a module's namespace while it is being imported): walking it live
    raises "dictionary changed size during iteration", as it did in CI."""

    def items(self):
        for i, item in enumerate(dict.items(self)):
            if i == 1:
                self[f"inferno.backends.imported_meanwhile_{len(self)}"] = None
            yield item

    def values(self):
        return (value for _, value in self.items())


class FakeModule:
    pass


def test_kernels_are_found_while_other_threads_import(monkeypatch):
    """load_kernels_lazily walks copies of sys.modules and of each module's namespace: the
    server loads its model on a thread of its own while others import, and walking the live
    dicts failed CI twice."""
    import types
    from inferno.backends.numba import qkernels
    module = FakeModule()
    module.__dict__ = ImportingMeanwhile(kernel=qkernels.quantize_par, other=1)
    modules = ImportingMeanwhile(sys.modules, **{"inferno.backends.fake": module})
    with pytest.raises(RuntimeError, match="changed size"):
        list(ImportingMeanwhile(modules).items())  # what walking the live dict does
    monkeypatch.setattr(jitcache, "sys", types.SimpleNamespace(modules=modules))
    jitcache.load_kernels_lazily()
    assert "load_overload" in vars(qkernels.quantize_par._cache)  # and the kernels have their loader


NO_COMPILE = """
import gc, json, sys
import inferno
from numba.core.dispatcher import Dispatcher
from inferno.backends.numba import jitcache
from inferno.sampling import SamplingParams
from inferno.serve import BatchEngine, Options


def kernels():
    # every signature every kernel of inferno's holds, compiled or loaded from the cache, with
    # the kind a factory's entry was made for (its closure's values)
    return {{(d.py_func.__module__, d.py_func.__qualname__, str(sig),
             str([c.cell_contents for c in d.py_func.__closure__ or () if isinstance(c.cell_contents, (bool, int, str))]))
            for d in gc.get_objects() if isinstance(d, Dispatcher) and d.py_func.__module__.startswith("inferno.")
            for sig in d.overloads}}


measure = {measure}
engine = inferno.load({path!r}, {backend!r}, progress=False)
ban = {{t: -100.0 for t in engine.eos}}
seen, before = {{}}, measure()
engine.generate("Once upon a time", max_tokens=600, temperature=0, logit_bias=ban)  # past 2 x 256 keys
seen["a long generation"], before = measure() - before, measure()
engine.generate(None, prompt_ids=list(range(10, 310)), max_tokens=4, temperature=0)  # a prefill's 300 rows at once
seen["a long prompt"], before = measure() - before, measure()
session, messages = inferno.Session(), [{{"role": "user", "content": "Hello there"}}]
for turn in ("And then?", "Why?"):
    reply = engine.generate(messages, session=session, max_tokens=6, temperature=0)
    messages += [{{"role": "assistant", "content": reply.text}}, {{"role": "user", "content": turn}}]
seen["a chat's next turns"], before = measure() - before, measure()
with BatchEngine(engine, parallel=4, ctx_size=256, chunk=8) as batch:
    handles = [batch.submit(engine.encode_prompt("word " * (3 + 9 * i)),
                            Options(max_tokens=5 + 3 * i, sampling=SamplingParams(temperature=0)))
               for i in range(4)]
    for h in handles:
        list(h)
seen["batched steps with chunked prompts"], before = measure() - before, measure()
with BatchEngine(engine, parallel=4, ctx_size=256, chunk=64) as batch:
    handles = [batch.submit(engine.encode_prompt("Tell me about " + w),
                            Options(max_tokens=6, sampling=SamplingParams(temperature=0)))
               for w in ("cats", "dogs", "the sea", "hills")]
    for h in handles:
        list(h)
seen["four requests in step"] = measure() - before
print(json.dumps({{"helper": engine.helper is not None,
                  "seen": {{k: sorted(map(list, v)) if isinstance(v, set) else v for k, v in seen.items()}}}}))
"""


def no_compile(path, backend: str, measure: str, env=None) -> dict:
    """NO_COMPILE in a fresh process: what each path took that the load had not (`measure`:
    kernels, the signatures loaded; jitcache.misses, the kernels compiled)."""
    script = NO_COMPILE.format(path=str(path), backend=backend, measure=measure)
    run = subprocess.run([sys.executable, "-c", script],
                         capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1])


@pytest.mark.parametrize("model", ["tiny", pytest.param("smollm2-135m", marks=[pytest.mark.real_model, pytest.mark.slow])])
def test_nothing_compiles_during_generation(tmp_path_factory, model):
    """After the load, a generation past the context where pool's decode goes parallel, a long
    prompt, a chat's later turns and batched steps with chunked prompts take no kernel the load
    did not:
    nothing is compiled, and nothing is even loaded from the cache (every inferno kernel's
    signatures, before and after), in a fresh process. (pool: the backend whose kernels change
    with the sizes.) A tiny float32 model, and the default model: its Q8_0 head is its one
    matrix of that kind, so the head's kernels for a batched step's four rows of logits are
    its own (a warm-up without that step left them to the first batched request)."""
    if model == "tiny":
        from tiny import make_model
        folder = make_model(tmp_path_factory.mktemp("compile-once"), "qwen3", hidden=64, heads=8, kv_heads=2,
                            head_dim=64, max_positions=1024)
    else:
        from inferno.loading.resolve import resolve
        folder = resolve(model)
    taken = no_compile(folder, "pool", "kernels")["seen"]
    assert taken == {k: [] for k in taken}, taken


LINKING = """
import json
import numpy as np
from numba import njit
from inferno.backends.numba import dense, jitcache

jitcache.load_kernels_lazily()  # as the backends do when they are made
x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(3, 8)
direct = np.empty_like(x)
dense.softmax_rows(x, direct, 0, 3)  # from the cache, on the second run
library = next(iter(dense.softmax_rows.overloads.values())).library
lazy = type(library).__name__ == "_ObjectLibrary" and library._shared_module is None


@njit
def caller(x, out, r0):  # compiled here, never cached: Numba links the kernel's bitcode into it
    dense.softmax_rows(x, out, r0, x.shape[0])


linked = np.empty_like(x)
caller(x, linked, 0)  # the signature loaded above (a literal 0 in caller would type as another)
print(json.dumps(dict(lazy=lazy, parsed=library._shared_module is not None,
                      same=bool(np.array_equal(direct, linked)), sums=linked.sum(axis=1).tolist())))
"""


ELF_ONLY = pytest.mark.skipif(not sys.platform.startswith("linux"),
                              reason="object files are ELF on Linux only; elsewhere Numba's own loading runs")


@ELF_ONLY
def test_a_cached_kernels_bitcode_waits_for_a_kernel_that_links_it(tmp_path):
    """A cached kernel loads without its bitcode being parsed; a kernel compiled afterwards that
    calls it still links (the bitcode is parsed then) and computes the same. Fresh processes on
    a kernel cache of their own: the first compiles, the second loads."""
    import os
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(INFERNO_KERNELS=str(tmp_path / "kernels"))

    def run():
        p = subprocess.run([sys.executable, "-c", LINKING], capture_output=True, text=True, timeout=600, env=env)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout.splitlines()[-1])
    first, second = run(), run()
    assert not first["lazy"]  # compiled in that process (and its bitcode parsed to be cached)
    assert second["lazy"] and second["parsed"] and second["same"]
    assert first["sums"] == pytest.approx([1.0] * 3, rel=1e-6) and second["sums"] == first["sums"]


@ELF_ONLY
def test_symbols_from_the_object_file_are_the_bitcodes():
    """The names elf_defined_symbols reads from a kernel's object file are those Numba would
    list from its bitcode, less private ones (lookup tables, which no one looks up by name)."""
    import llvmlite.binding as ll
    import numpy as np
    from numba import njit

    from inferno.backends.numba import dense

    @njit
    def kernel(x, out):
        dense.softmax_rows(x, out, 0, x.shape[0])
        return np.sum(out)

    table = np.arange(7, dtype=np.int64) ** 2

    @njit
    def lookup(i):
        return table[i % 7] + (3, 5, 8, 13)[i % 4]

    kernel(np.ones((2, 4), np.float32), np.empty((2, 4), np.float32))
    lookup(5)
    # compiled here: a library loaded from a cache has handed its object file to LLVM
    for library in [cres.library for f in (kernel, lookup) for cres in f.overloads.values()]:
        _, kind, (obj, bitcode) = library.serialize_using_object_code()
        module = ll.parse_bitcode(bitcode)
        named = {g.name for items in (module.functions, module.global_variables) for g in items
                 if not g.is_declaration and g.linkage != ll.Linkage.private}
        got = jitcache.elf_defined_symbols(obj)
        assert kind == "object" and got is not None and len(got) > 1
        assert got == named
    assert jitcache.elf_defined_symbols(b"\xcf\xfa\xed\xfe" + bytes(60)) is None  # Mach-O: Numba's way
    assert jitcache.elf_defined_symbols(b"\x7fELF\x02\x01" + bytes(10)) is None  # cut short
    assert jitcache.elf_defined_symbols(b"\x7fELF\x02\x01" + bytes(58)) is None  # no sections: no symbol table


CALLEES = """
import json, sys
import numpy as np
from numba import njit
from inferno.backends.numba import dense, jitcache, pool
if sys.argv[1] == "numba":
    jitcache._LATER = False  # Numba's way: every compiled function's machine code made at once
jitcache.load_kernels_lazily()
x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(3, 8)


@njit
def caller(x, out, r0):  # never cached: softmax_rows (and exp_into below it) compile as callees
    dense.softmax_rows(x, out, r0, x.shape[0])


linked = np.empty_like(x)
caller(x, linked, 0)
callee = next(iter(dense.softmax_rows.overloads.values()))
before = dict(entry=type(callee.entry_point).__name__, waits=bool(getattr(callee.library, "_pending", False)))
direct = np.empty_like(x)
dense.softmax_rows(x, direct, 0, 3)  # from Python now: its code made (and put in the cache)
dense.softmax_rows(x, direct, 0, 3)  # from the dispatcher's table
shared = np.empty_like(x)
pool._softmax(x, shared, 2)  # an entry with a prange: its body and the body's wrapper only linked
body = next(iter(pool._softmax.overloads.values())).library._linking_libraries
print(json.dumps(dict(before=before, waits=bool(getattr(callee.library, "_pending", False)),
                      linked=linked.tolist(), direct=direct.tolist(), shared=shared.tolist(),
                      body={lib.name: bool(getattr(lib, "_pending", False)) for lib in body})))
"""


def test_a_callees_machine_code_is_made_when_python_calls_it(tmp_path):
    """A kernel compiled while another is typed (softmax_rows, under a caller of the test's) gets
    no machine code of its own: the caller runs its own copy of the callee's IR, as it did, and
    computes what it computed with Numba's way. Called from Python, the callee's code is made
    then and computes the same; its cache entry holds bitcode until then and its code after (the
    next process loads that), and a callee that no Python calls (exp_into, below softmax_rows)
    stays bitcode. An entry with a prange (pool's) links its body's library and the body's
    wrapper's, which make no code of their own either. Fresh processes, kernel caches of their
    own."""
    import os
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}

    def run(how, cache):
        p = subprocess.run([sys.executable, "-c", CALLEES, how], capture_output=True, text=True, timeout=600,
                           env={**env, "INFERNO_KERNELS": str(tmp_path / cache)})
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout.splitlines()[-1])

    def kinds(cache):  # each cached kernel's name -> how its machine code is kept
        import pickle
        found = {}
        for data in (tmp_path / cache).rglob("*.nbc"):
            libdata = pickle.loads(data.read_bytes())[0]  # (name, kind, what it holds)
            found[data.name.split("-")[0]] = libdata[1]
        return found

    numba, later = run("numba", "a"), run("later", "b")
    assert numba["before"] == dict(entry="builtin_function_or_method", waits=False)
    assert later["before"] == dict(entry="_Callee", waits=True) and not later["waits"]
    assert later["linked"] == numba["linked"] and later["direct"] == later["linked"]
    assert later["shared"] == later["linked"] == numba["shared"]
    made = {name: dict(sorted(out["body"].items())) for name, out in (("numba", numba), ("later", later))}
    assert [n.split("_0x")[0] for n in made["later"]] == ["__numba_parfor_gufunc", "nrt", "parallelgufuncwrapper"]
    assert not any(made["numba"].values())  # Numba's way: each made its machine code
    assert [made["later"][n] for n in made["later"]] == [True, False, True]  # (nrt: made as Numba starts)
    assert kinds("a") == {"dense.softmax_rows": "object", "dense.exp_into": "object", "pool._softmax": "object"}
    assert kinds("b") == {"dense.softmax_rows": "object", "dense.exp_into": "bitcode", "pool._softmax": "object"}
    again = run("later", "b")  # softmax_rows loaded, exp_into's bitcode never needed
    assert again["before"] == dict(entry="builtin_function_or_method", waits=False)
    assert again["linked"] == later["linked"] and kinds("b")["dense.exp_into"] == "bitcode"


CLOSURES = """
import json, sys
import numpy as np
from numba import njit
from inferno.backends.numba import jitcache


def scaled(k):  # a factory, as the kinds' entries are: one closure per k, the same argument types
    @njit(cache=True)
    def scale(x):
        y = x * k
        return y.astype(np.float32) if k == 2 else y  # another return type: another environment
    return jitcache.lazy(scale)


fs = [scaled(int(k)) for k in sys.argv[1:]]
for f in fs:  # every one loaded (or compiled) before any runs
    f.compile("(float64[::1],)")
print(json.dumps([[str(y.dtype), y.tolist()] for y in (f(np.arange(3.0)) for f in fs)]))
"""


def test_closures_compiled_in_two_processes_run_side_by_side(tmp_path):
    """Two closures of one factory, each compiled in a process of its own at the same point
    (Numba's names for them once equal), then both loaded from the cache into a third: each
    runs its own code with its own environment (jitcache._names_apart; before it, the second
    returned float32 zeros, or float64 garbage the other way round)."""
    (tmp_path / "closures.py").write_text(CLOSURES)

    def run(*ks):
        p = subprocess.run([sys.executable, "closures.py", *map(str, ks)], capture_output=True, text=True,
                           timeout=300, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout.splitlines()[-1])
    two, three = ["float32", [0.0, 2.0, 4.0]], ["float64", [0.0, 3.0, 6.0]]
    assert run(2) == [two] and run(3) == [three]  # each compiles and saves
    assert run(2, 3) == [two, three] and run(3, 2) == [three, two]  # both loaded


STALE = """
import numpy as np
from numba.core.event import install_recorder
from inferno.backends.numba import dense, jitcache, pool
x = np.ones((4, 8), np.float32)
with install_recorder("numba:compile") as rec:
    pool._softmax(x, np.empty_like(x), 2)  # calls dense.softmax_rows, in another file
compiled = sorted({e[1].data["dispatcher"].py_func.__name__ for e in rec.buffer if e[1].is_start})
print(pool._softmax._cache._cache_path, dense.softmax_rows._cache._cache_path, ",".join(compiled) or "-",
      pool.__file__)
"""


def test_a_changed_callee_recompiles_its_callers(tmp_path):
    """Numba keys a cached kernel on its own file: an edit to a file it calls into (dense.py,
    below pool's wrappers) would leave its machine code stale. inferno's kernel cache keys each
    file's kernels on every file it imports, so the caller compiles again; a kernel whose file
    does not import the edited one stays cached; and since the keys are all the code was
    compiled from, another checkout of the same sources finds the kernels compiled. On copies of
    the package, in fresh processes, with an empty kernel cache of their own."""
    import os
    import shutil
    from pathlib import Path
    copy, other = tmp_path / "pkg", tmp_path / "another checkout"
    for where in (copy, other):
        shutil.copytree(Path(inferno.__file__).parent, where / "inferno",
                        ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(INFERNO_KERNELS=str(tmp_path / "kernels"))

    def run(pkg):
        p = subprocess.run([sys.executable, "-c", STALE], capture_output=True, text=True, timeout=600,
                           env={**env, "PYTHONPATH": str(pkg)}, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        caller, callee, compiled, where = p.stdout.strip().split(maxsplit=3)
        assert where.startswith(str(pkg)), where  # the copy, not the installed package
        assert caller.startswith(str(tmp_path / "kernels")), caller
        return caller, callee, set(compiled.split(",")) - {"-"}
    first = run(copy)
    assert {"_softmax", "softmax_rows"} <= first[2]  # an empty cache: it compiles
    assert run(copy) == (*first[:2], set())  # cached
    assert run(other) == (*first[:2], set())  # the same sources elsewhere: the same kernels
    numba_dir = copy / "inferno" / "backends" / "numba"
    above = numba_dir / "ldot.py"  # pool imports it (through qkernels), dense does not
    above.write_text(above.read_text() + "\n# an edit beside dense, below pool\n")
    second = run(copy)
    assert second[0] != first[0] and second[1] == first[1]
    assert "_softmax" in second[2] and "softmax_rows" not in second[2]  # the callee loaded
    below = numba_dir / "dense.py"
    below.write_text(below.read_text() + "\n# an edit below pool's wrappers\n")
    third = run(copy)
    assert third[0] not in (first[0], second[0]) and third[1] != first[1]
    assert {"_softmax", "softmax_rows"} <= third[2]  # new folders, compiled afresh
    assert Path(first[0]).is_dir() and Path(first[1]).is_dir()  # the old ones stay


def test_the_key_names_the_target_numba_compiles_for(monkeypatch):
    """NUMBA_CPU_NAME / NUMBA_CPU_FEATURES (an AVX2-only target on an AVX-512 host, say) give
    their own folder: machine code for one target is never loaded for another."""
    from numba.core import config

    host = jitcache.cache_key()
    monkeypatch.setattr(config, "CPU_NAME", "haswell")
    named = jitcache.cache_key()
    monkeypatch.setattr(config, "CPU_FEATURES", "+avx2,-avx512f")
    assert len({host, named, jitcache.cache_key()}) == 3
    monkeypatch.setattr(config, "CPU_NAME", None)
    monkeypatch.setattr(config, "CPU_FEATURES", None)
    assert jitcache.cache_key() == host


def test_a_files_key_reads_what_it_imports_and_nothing_else(monkeypatch, tmp_path):
    """A kernel file's key (its folder) changes with an edit to it or to any file it imports,
    through others, in function bodies, in parentheses over lines, relative or absolute; an
    edit elsewhere (the torch backends, a file reader, base.py where nothing imports it) leaves
    it. The machinery that compiles and loads kernels is in every platform key."""
    files = {
        "backends/numba/k.py": "from inferno.backends.numba import mid\n\ndef f():\n    import inferno.backends.numba.late\n",
        "backends/numba/mid.py": "from inferno.formats.quant import (\n    X,\n    Y,\n)\nfrom .near import z\n",
        "backends/numba/near.py": "z = 1\n",
        "backends/numba/late.py": "x = 1\n",
        "formats/quant.py": "X = Y = 1\n",
        "formats/gguf_file.py": "x = 1\n",
        "backends/base.py": "x = 1\n",
        "backends/torch/t.py": "from inferno.backends.numba import k\n",
        **{name: "x = 1\n" for name in jitcache.MACHINERY},
    }
    root = tmp_path / "inferno"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    monkeypatch.setattr(jitcache, "PACKAGE", root)

    def key():
        jitcache._imports.cache_clear()
        jitcache.sources_key.cache_clear()
        return jitcache.sources_key(str(root / "backends/numba/k.py"))
    kernel, every = key(), jitcache.every_kernel_key()  # (every: where Numba takes no locator)
    assert {p.relative_to(root).as_posix() for p in jitcache.sources_of(root / "backends/numba/k.py")} == {
        "backends/numba/k.py", "backends/numba/mid.py", "backends/numba/near.py", "backends/numba/late.py",
        "formats/quant.py"}
    for name in ("backends/torch/t.py", "formats/gguf_file.py", "backends/base.py"):
        (root / name).write_text("x = 2\n")
        assert key() == kernel and jitcache.every_kernel_key() == every
    for name in ("backends/numba/k.py", "backends/numba/mid.py", "backends/numba/near.py",
                 "backends/numba/late.py", "formats/quant.py"):
        (root / name).write_text((root / name).read_text() + "changed = True\n")
        assert key() != kernel and jitcache.every_kernel_key() != every
        kernel, every = key(), jitcache.every_kernel_key()
    platform = jitcache.cache_key()
    for name in jitcache.MACHINERY:
        (root / name).write_text("changed = True\n")
        assert jitcache.cache_key() != platform
        platform = jitcache.cache_key()


def test_a_compile_is_timed_for_the_next_note(monkeypatch, tmp_path):
    """How long a load that compiled took is kept beside the kernel folders, for the next
    compile's note to say (rather than a guess)."""
    monkeypatch.setenv("INFERNO_KERNELS", str(tmp_path))
    assert jitcache.last_compile() is None
    monkeypatch.setattr(jitcache, "_misses", [jitcache.FIRST_RUN_KERNELS - 1])
    jitcache.compiled(1.2)  # a load that compiled a kernel or two: not a first run's figure
    assert jitcache.last_compile() is None
    monkeypatch.setattr(jitcache, "_misses", [jitcache.FIRST_RUN_KERNELS])
    jitcache.compiled(83.4)
    assert jitcache.last_compile() == 83.4
    (tmp_path / "last-compile.json").write_text("not json")
    assert jitcache.last_compile() is None


def test_the_key_walks_the_imports_as_the_layers_test_parses_them():
    """jitcache reads import statements with a pattern (fast, on every process's import path):
    for every file of the package it finds the modules tests/test_layers.py's parse finds."""
    from test_layers import graph, modules

    files = modules()
    for name, deps in graph().items():
        assert set(jitcache._imports(files[name].resolve())) == {files[d].resolve() for d in deps}, name
