"""Loading cached kernels without waking Numba's compiler.

Before every cache load Numba refreshes its target context "to ensure it is initialized". The
first refresh imports some forty modules of typing and lowering registries (numba.np.arraymath,
the random and set and list implementations...) and installs them all: a large part of a warm
load (bench/RESULTS.md, load times), for nothing a cache hit uses. A hit takes its machine
code from the cache file and brings its threading layer up through the entry's own reload hooks;
at run time the code calls Numba's C helpers (registered when Numba's context is made) and the
NRT, which is initialised here, as the refresh would have done. A miss compiles as before, and
Numba's compiler refreshes the context itself before it compiles anything.

A miss also prints one notice per process (a model's first run compiles for seconds,
silently otherwise). Only inferno's own kernels load this way (a test loads them in a fresh
process and checks that the registries stay unimported and the answers match); other Numba code
in the process keeps Numba's own path.

Where the cache lives (`use_keyed_cache`): Numba keys a cached kernel on its own file (its
contents, here), not on the files it calls into, so an edit to dense.py, or a `pip install -U`
that changes a callee's file but not its caller's, would leave the caller's machine code stale:
wrong numbers, silently. So inferno's kernels are cached in folders named by hashes of what
they were compiled from. The folder of a platform (`cache_key`): Numba's and llvmlite's
versions, Python's, the CPU's name and features, and the machinery that compiles, saves and
loads the kernels (this file and compiler.py, MACHINERY). Inside it, a folder for each kernel
file (`sources_key`): a hash of that file and of every inferno file it imports, anywhere in it,
through any number of others (`sources_of`, the same walk as tests/test_layers.py's). A kernel
can only run code its file reaches by importing, so an edit below a kernel starts a new folder
for it and for every file above, which compile afresh; the files beside it keep theirs (an
edit to ldot.py leaves the K-quants' qdot and qgemm, which never import it, cached; an edit to
backends/base.py only the kernels that import it). Since the keys say everything the code was
compiled from, the folders do not depend on where the package sits: inferno's cache's
kernels/<key> (INFERNO_KERNELS names another parent), shared by every checkout and every
virtual environment of the same sources on this machine (a clean clone, a worktree of a
release, a reinstall), with the package's own backends/numba/__pycache__ as the fallback where
that cannot be written. Only inferno's own files are cached there (a locator of Numba's cache,
in front of its own); NUMBA_CACHE_DIR, when set, wins (Numba's own keying, then).

A cached kernel holds its machine code (an object file) and its LLVM bitcode, kept for inlining
into kernels compiled later. Numba parses that bitcode at every load, only to list the symbols
the library defines: about 10 ms a kernel here, half of a warm load's kernel time. inferno's
kernels take the list from the object file's symbol table instead (ELF: the same names, less
the private lookup tables nobody asks for), and the bitcode is parsed only if a kernel compiled
later links against them (`_ObjectLibrary`).

A callee's machine code is made only if something runs it (`_later`). Numba compiles a function
that another calls while it types the caller, and makes that callee's machine code at once, to
hand its dispatcher a pointer; but the caller links the callee's IR into its own module,
optimises it there and makes machine code of it again, and runs that. The callee's own code is
run only if Python calls the callee too, which a kernel's callees (a row kernel under a kind's
entry) mostly never are. A prange's body was worse: compiled as its entry is lowered, made into
machine code, wrapped, the wrapper made into machine code with the body inside, then both linked
into the entry and made again: a parallel entry's kernels three times over. So a function
compiled while another is typed, and a prange's body, get a stand-in for their entry point
(`_Callee`), and a library first finalised to be linked (the body's wrapper) waits too; each is
optimised and linked as before, its machine code made on the first call from Python, if one
comes, and it is cached as the bitcode its callers link. That IR is the optimiser's output as it
is (making machine code had rewritten the module in place, LLVM's code generation preparing it,
and callers linked that), so their machine code moves a little; bench/RESULTS.md has the compile
times and the kernels' speed before and after.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import os
import re
import shutil
import struct
import sys
import threading
import time
from pathlib import Path

from inferno.backends.numba import compiler

try:
    import llvmlite.binding as ll
    from numba.core import caching
    from numba.core.codegen import JITCodeLibrary, JITCPUCodegen
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.cpu import CPUContext
    from numba.core.dispatcher import Dispatcher
    from numba.core.environment import lookup_environment
    from numba.core.runtime import rtsys
    _SUPPORTED = all(hasattr(caching.Cache, name) for name in ("_load_overload", "_save_overload", "_guard_against_spurious_io_errors"))
    _LAZY_BITCODE = _SUPPORTED and all(hasattr(JITCodeLibrary, name) for name in (
        "_unserialize", "enable_object_caching", "_set_compiled_object", "_finalize_final_module",
        "_get_module_for_linking"))
    _LATER = _LAZY_BITCODE and all(hasattr(JITCodeLibrary, name) for name in (
        "_finalize_dynamic_globals", "_verify_declare_only_symbols", "serialize_using_bitcode",
        "get_pointer_to_function", "_get_compiled_object")) and all(
        hasattr(Dispatcher, name) for name in ("add_overload", "_insert")) and hasattr(
        CPUContext, "get_executable") and hasattr(JITCPUCodegen, "set_env")
    _SET_ENV = getattr(JITCPUCodegen, "set_env", None)  # (Numba's, _set_env below calls it)
    _LOCATORS = (isinstance(getattr(getattr(caching, "CacheImpl", None), "_locator_classes", None), list)
                 and hasattr(caching, "_SourceFileBackedLocatorMixin") and hasattr(caching, "_CacheLocator"))
except ImportError:  # a Numba whose internals moved: keep its own loading
    _SUPPORTED = _LOCATORS = _LAZY_BITCODE = _LATER = False


try:
    import fcntl
except ImportError:  # no POSIX locks (Windows): the saves go unlocked, as Numba's own
    fcntl = None

PACKAGE = Path(__file__).resolve().parents[2]  # inferno/


def _names_apart() -> None:
    """Numba names a compiled function's symbols (its code's, its environment's) by its
    qualified name, its argument types and a count of the functions this process has compiled,
    from 1. Two closures of one factory with the same argument types (two kinds' row entries
    over uint8 blocks, two cache types' decode attention), compiled in two processes at the
    same count, carry the same names; once both are loaded from the cache into one process,
    the second's code reads the first's environment: another array type's answers, or "'descr'
    is NULL" (numba/numba#10486: the same for forks, which inherit the count). So every process,
    a fork too, counts from a random 64-bit start: two processes' few thousand never meet."""
    try:
        from numba.core.bytecode import FunctionIdentity
    except ImportError:
        return
    if isinstance(getattr(FunctionIdentity, "_unique_ids", None), itertools.count):
        FunctionIdentity._unique_ids = itertools.count(int.from_bytes(os.urandom(8), "little"))


_names_apart()
os.register_at_fork(after_in_child=_names_apart)


_told = False  # whether this process has said that it compiles
_STALE_DAYS = 30  # kernel folders of other sources unused this long are removed


# What compiles, saves and loads the kernels: in every kernel's key (a change may change how they
# are compiled or read), whichever files a kernel imports.
MACHINERY = ("backends/numba/jitcache.py", "backends/numba/compiler.py")


def cache_key() -> str:
    """A hash of what all machine code depends on besides the kernels' own sources: Numba's and
    llvmlite's versions, Python's, the CPU Numba compiles for (NUMBA_CPU_NAME and
    NUMBA_CPU_FEATURES where set, else the host's: code built for one target is never loaded
    for another), and MACHINERY's sources."""
    import llvmlite
    import llvmlite.binding as llvm
    import numba
    from numba.core import config

    from inferno.backends.numba.lanes import target_cpu

    h = hashlib.sha256()
    for name in MACHINERY:
        h.update(name.encode() + b"\0" + (PACKAGE / name).read_bytes())
    h.update(f"numba {numba.__version__} llvmlite {llvmlite.__version__} {sys.version_info[:2]}".encode())
    name = target_cpu()
    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else llvm.get_host_cpu_features().flatten()
    h.update(f"{name} {features}".encode())
    return h.hexdigest()[:20]


def _module_file(name: str) -> Path | None:
    """The file of inferno module `name` (a package's __init__.py), or None."""
    parts = name.split(".")
    if parts[0] != PACKAGE.name:
        return None
    base = PACKAGE.joinpath(*parts[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


# Import statements, read with a pattern rather than a parse (each kernel file's walk is on every
# process's import path; ast.parse of a kernel file's closure took 80 ms): `from m import names`
# (names in parentheses may span lines; m relative where it starts with dots) and `import m`.
_FROM = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]*)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w.]+(?:[ \t]+as[ \t]+\w+)?(?:[ \t]*,[ \t]*[\w.]+(?:[ \t]+as[ \t]+\w+)?)*)", re.M)


@functools.lru_cache(maxsize=None)
def _imports(path: Path) -> frozenset:
    """The inferno files `path` imports, anywhere in it (a `from package import x` names the
    module x where there is one, else the package; tests/test_jitcache.py checks the walk
    against tests/test_layers.py's parse of every file)."""
    text = path.read_text()
    package = ".".join(path.relative_to(PACKAGE.parent).parts[:-1])  # (x/__init__.py's too: x)
    found = set()
    for dots, module, names in _FROM.findall(text):
        if dots:
            up = package.split(".")[: len(package.split(".")) - len(dots) + 1]
            module = ".".join(up + ([module] if module else []))
        for name in names.strip("()").split(","):
            name = name.split()[0] if name.split() else ""
            found.add(f"{module}.{name}" if name and _module_file(f"{module}.{name}") else module)
    for modules in _IMPORT.findall(text):
        found |= {m.split()[0] for m in modules.split(",")}
    return frozenset(f for f in map(_module_file, found) if f is not None and f != path)


def sources_of(py_file) -> list[Path]:
    """`py_file` and every inferno file it imports, through any number of others, sorted."""
    seen, todo = set(), [Path(py_file).resolve()]
    while todo:
        path = todo.pop()
        if path not in seen:
            seen.add(path)
            todo.extend(_imports(path))
    return sorted(seen)


@functools.lru_cache(maxsize=None)
def sources_key(py_file: str) -> str:
    """A hash of `py_file`'s sources_of (the folder of its kernels, inside the platform's)."""
    return _hash_files(sources_of(py_file))


def _hash_files(paths) -> str:
    """A hash of the files' names (relative to the package) and contents, in sorted order."""
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def every_kernel_key() -> str:
    """sources_key over the numba backend's files and all they import, at once: the one folder
    of a Numba whose cache takes no locator of ours (any edit below a kernel recompiles all)."""
    return _hash_files({p for f in (PACKAGE / "backends" / "numba").glob("*.py") for p in sources_of(f)})


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        os.utime(folder)  # in use: not stale
        return os.access(folder, os.W_OK)
    except OSError:
        return False


def kernel_root() -> Path:
    """Where the keyed folders go: INFERNO_KERNELS, else inferno's cache's kernels/."""
    from inferno.paths import cache_dir

    return Path(os.environ["INFERNO_KERNELS"]).expanduser() if os.environ.get("INFERNO_KERNELS") else cache_dir() / "kernels"


if _LOCATORS:
    class _KeyedLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
        """Numba's cache for a kernel of inferno's: the platform's folder, then the source file's
        folder inside the package (so two checkouts of the same sources find each other's), then
        the file's own, named by its sources_key."""

        folder: Path | None = None  # set by use_keyed_cache

        def __init__(self, py_func, py_file):
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            path = Path(py_file).resolve()
            self._cache_path = str(self.folder / path.parent.relative_to(PACKAGE)
                                   / f"{path.stem}-{sources_key(str(path))}")

        def ensure_cache_path(self):
            super().ensure_cache_path()
            os.utime(self._cache_path)  # in use: not stale

        def get_cache_path(self):
            return self._cache_path

        @classmethod
        def from_function(cls, py_func, py_file):
            if cls.folder is None or not Path(py_file).resolve().is_relative_to(PACKAGE):
                return None  # someone else's kernel: Numba's own locators
            return super().from_function(py_func, py_file)


def use_keyed_cache() -> Path | None:
    """Cache the kernels defined from now on in the folder named by cache_key(), each file's in
    its own folder there named by sources_key() (see the module docstring); the platform's
    folder, or None where NUMBA_CACHE_DIR is set or no folder can be written
    (Numba's default then)."""
    import numba

    if os.environ.get("NUMBA_CACHE_DIR"):
        return None
    key = cache_key()
    beside = Path(__file__).parent / "__pycache__" / f"kernels-{key}"
    folder = next((f for f in (kernel_root() / key, beside) if _writable(f)), None)
    if folder is None:
        return None
    if _LOCATORS:
        _KeyedLocator.folder = folder
        if _KeyedLocator not in caching.CacheImpl._locator_classes:
            caching.CacheImpl._locator_classes.insert(0, _KeyedLocator)
    else:  # a Numba without the locator list: every kernel of the process under one folder,
        # keyed on every kernel file's sources at once (no file has a folder of its own here)
        numba.config.CACHE_DIR = str(folder / f"all-{every_kernel_key()}")
    cutoff = time.time() - _STALE_DAYS * 86400
    others = [*folder.parent.glob("kernels-*" if folder == beside else "*"), *folder.glob("backends/*/*-*")]
    for other in others:  # other platforms' folders, and kernel files' folders of other sources
        try:
            if other != folder and other.is_dir() and other.stat().st_mtime < cutoff:
                shutil.rmtree(other, ignore_errors=True)
        except OSError:
            pass
    return folder


CACHE_FOLDER = use_keyed_cache()  # before any kernel module defines its kernels (they import this first)


def elf_defined_symbols(obj: bytes) -> set[str] | None:
    """The names an ELF64 little-endian object file defines (functions and data, local or
    global), from its symbol table; None for any other format (Mach-O, COFF), a file without
    a symbol table or a table that does not read whole, where Numba's own way is taken."""
    try:
        if obj[:6] != b"\x7fELF\x02\x01":
            return None
        (shoff,) = struct.unpack_from("<Q", obj, 0x28)
        entsize, count = struct.unpack_from("<HH", obj, 0x3A)
        # section header: name type flags addr offset size link info align entsize
        sections = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * entsize) for i in range(count)]
        names = set()
        for _, kind, _, _, offset, size, link, _, _, symsize in sections:
            if kind != 2:  # SHT_SYMTAB
                continue
            strings = sections[link][4]
            for at in range(offset, offset + size, symsize):
                name, info, _, section, _, _ = struct.unpack_from("<IBBHQQ", obj, at)
                if name and section != 0 and info & 0xF not in (3, 4):  # defined; not SECTION, FILE
                    names.add(obj[strings + name:obj.index(b"\0", strings + name)].decode())
        return names or None  # no symbol table (or extended numbering): not a file to trust
    except (struct.error, ValueError, IndexError, UnicodeDecodeError):
        return None


_loading = threading.local()  # whether this thread is inside _load_overload


if _LAZY_BITCODE:
    class _ObjectLibrary(JITCodeLibrary):
        """Numba's JIT code library; one of inferno's cached kernels skips the bitcode at load
        (see the module docstring): the engine learns its symbols from the object file, and the
        bitcode waits as bytes for a kernel that links against it. Anything else is Numba's."""

        _linking_bitcode: bytes | None = None
        _later = False  # its machine code made when asked for, not when finalised (a callee's)
        _pending = False  # finalised (linkable) with its machine code not made yet
        _from_bitcode = False  # loaded from a cache entry of bitcode (a callee's, _save_overload)

        @classmethod
        def _unserialize(cls, codegen, state):
            name, kind, data = state
            if kind == "bitcode" and getattr(_loading, "ours", False) and isinstance(data, bytes):
                self = codegen.create_library(name)  # a callee's: its code made when asked for
                self.enable_object_caching()
                self._final_module = ll.parse_bitcode(data)
                self._later = self._from_bitcode = True
                self._finalize_final_module()
                return self
            engine = codegen._engine
            ours = (kind == "object" and getattr(_loading, "ours", False)
                    and isinstance(getattr(engine, "_defined_symbols", None), set)
                    and isinstance(data, tuple) and len(data) == 2  # (object file, bitcode), as Numba 0.68 writes them
                    and all(isinstance(b, bytes) for b in data))
            symbols = elf_defined_symbols(data[0]) if ours else None
            if symbols is None:
                return super()._unserialize(codegen, state)
            self = codegen.create_library(name)
            self.enable_object_caching()
            self._set_compiled_object(data[0])
            self._linking_bitcode = data[1]
            self._finalize_final_module()
            engine._defined_symbols |= symbols
            return self

        def _get_module_for_linking(self):
            if self._shared_module is None and self._linking_bitcode is not None:
                self._shared_module = ll.parse_bitcode(self._linking_bitcode)
                self._linking_bitcode = None
            return super()._get_module_for_linking()

        def _finalize_final_module(self):
            """Numba's, less the machine code where it is to wait (_later): the library is
            then finalised (callers link it) and its code made by _emit, when asked for."""
            if not self._later:
                super()._finalize_final_module()
                self._set_environments()
                return
            self._finalize_dynamic_globals()  # (the cache reads them: such code is not cached)
            self._verify_declare_only_symbols()
            self._finalized = self._pending = True

        def add_linking_library(self, library):
            if isinstance(library, _ObjectLibrary) and _LATER and not library._finalized:
                library._later = True  # finalised to be linked (a prange's wrapper, a subroutine)
            super().add_linking_library(library)

        def _emit(self):
            """The machine code of a library that was waiting for it (_later)."""
            if self._pending:
                self._pending = self._later = False
                del self._dynamic_globals[:]  # (found again)
                super()._finalize_final_module()
                self._set_environments()

        def _set_environments(self):
            """Point each environment this code refers to at its object. Numba sets a function's
            own as it makes the entry point, and a callee's when it makes the callee's (the
            caller's copy of the variable is bound to the one made first), or when it loads a
            caller from the cache (its `referenced_envs`, which _set_env skips while the code
            waits). A callee whose code waited had none made: its caller's copy is set here."""
            for variable in self._final_module.global_variables if _LATER else ():
                if variable.name.startswith("_ZN08NumbaEnv") and not variable.is_declaration:
                    env = lookup_environment(variable.name)
                    if env is not None:
                        _SET_ENV(self._codegen, variable.name, env)

        def get_pointer_to_function(self, name):
            self._ensure_finalized()
            self._emit()
            return super().get_pointer_to_function(name)

        def _get_compiled_object(self):
            self._emit()
            return super()._get_compiled_object()

        def serialize_using_object_code(self):
            self._ensure_finalized()
            if self._pending:  # never run: cached as the bitcode its callers link
                return self.serialize_using_bitcode()
            return super().serialize_using_object_code()


# -- a callee's machine code, made if something runs it (module docstring) ---------------------
_compiles = threading.local()  # .depth: the Dispatcher.compile calls in progress on this thread


def _counted(compile_):
    """Dispatcher.compile, counting the calls in progress (a call inside another is a callee's:
    the caller's typing compiles it, or loads it from the cache)."""
    @functools.wraps(compile_)
    def compile(self, sig):
        _compiles.depth = getattr(_compiles, "depth", 0) + 1
        try:
            return compile_(self, sig)
        finally:
            _compiles.depth -= 1
    compile.counted = True
    return compile


if _LATER and not getattr(Dispatcher.compile, "counted", False):
    Dispatcher.compile = _counted(Dispatcher.compile)


class _Callee:
    """The entry point of a function compiled (or loaded) while another is typed, until Python
    calls it: then Numba's own entry point is made (and with it the machine code) and goes in the
    dispatcher's table, which Python's calls take from then on. Until then Numba's dispatcher
    finds no entry in its table for the types and falls back to the overload's entry point, this
    object, which it calls as a Python callable. (Numba's typing only looks it up: the key of the
    function's implementation.)"""

    def __init__(self, make):
        self._make = make  # () -> Numba's entry point (get_executable's)
        self._real = None
        self._dispatcher = self._cres = None  # (_add_overload)

    def __call__(self, *args, **kws):
        if self._real is None:
            with global_compiler_lock:
                if self._real is None:
                    real = self._make()
                    if self._dispatcher is not None:
                        sig = tuple(self._cres.signature.args)
                        self._dispatcher._insert([t._code for t in sig], real, self._cres.objectmode)
                        self._dispatcher._cache.save_overload(sig, self._cres)  # (its code now)
                    self._real = real
        return self._real(*args, **kws)


_GUFUNC = "__numba_parfor_gufunc"  # the name of a prange's body, compiled as its entry is lowered


def _get_executable(context, library, fndesc, env):
    """CPUContext.get_executable: for a callee (a compile inside another, or a prange's body,
    which its entry links), a _Callee, its library left to make its machine code when asked for."""
    callee = getattr(_compiles, "depth", 0) >= 2 or fndesc.qualname.startswith(_GUFUNC)
    waits = callee and isinstance(library, _ObjectLibrary)
    if waits and not library._finalized:
        library._later = True
    if waits and library._later:
        return _Callee(lambda: _get_executable.original(context, library, fndesc, env))
    return _get_executable.original(context, library, fndesc, env)


def _set_env(codegen, env_name, env):
    """JITCPUCodegen.set_env, skipped for an environment whose code is not made yet (a cached
    callee's, loaded as bitcode: _ObjectLibrary._set_environments sets it when it is)."""
    if codegen._engine.get_global_value_address(env_name):
        _SET_ENV(codegen, env_name, env)


def _add_overload(dispatcher, cres):
    """Dispatcher.add_overload; a _Callee's overload is kept for typing, out of the table."""
    entry = cres.entry_point
    if not isinstance(entry, _Callee):
        return _add_overload.original(dispatcher, cres)
    entry._dispatcher, entry._cres = dispatcher, cres
    dispatcher.overloads[tuple(cres.signature.args)] = cres


def _emit_callees_later() -> None:
    """Install the three patches above, once (before a process's first compile or load)."""
    if _LATER and getattr(CPUContext.get_executable, "original", None) is None:
        _get_executable.original, CPUContext.get_executable = CPUContext.get_executable, _get_executable
        _add_overload.original, Dispatcher.add_overload = Dispatcher.add_overload, _add_overload
        JITCPUCodegen.set_env = _set_env


def _use_object_libraries(target_context) -> None:
    """Have the CPU codegen make _ObjectLibrary objects (they are Numba's own unless loaded by
    the loader below)."""
    codegen = target_context.codegen()
    if _LAZY_BITCODE and getattr(codegen, "_library_class", None) is JITCodeLibrary:
        codegen._library_class = _ObjectLibrary


def _load_overload(cache, sig, target_context):
    """Numba's Cache.load_overload, less the refresh and the bitcode; on a miss (Numba compiles
    next), one notice per process, so that a first run's half minute of compiling is not taken
    for a hang."""
    global _told
    rtsys.initialize(target_context)  # the one part of the refresh a loaded kernel calls into
    _use_object_libraries(target_context)
    _emit_callees_later()
    found, outer = None, getattr(_loading, "ours", False)
    _loading.ours = True
    try:
        for _ in range(2):  # again after a helper's compile of this kernel (_waited_for_helper)
            with _index_lock("shared"), cache._guard_against_spurious_io_errors():
                found = cache._load_overload(sig, target_context)
            if found is not None or not _waited_for_helper(cache, sig):
                break
    finally:
        _loading.ours = outer
    library = getattr(found, "library", None)
    if getattr(library, "_from_bitcode", False) and not library._pending:
        _save_overload(cache, sig, found)  # a callee's bitcode, run after all: its code kept now
    if found is None:
        _misses[0] += 1
        compiler.apply()  # Numba compiles next: its inliner and SSA made to do less (not at
        # import: a warm load never imports Numba's compiler)
    if found is None and not _told:
        _told = True
        last = last_compile()
        took = (f"{last:.0f} s here last time" if last is not None else
                "tens of seconds on 2 cores, the kernels of each weight kind")
        print(f"note: compiling inferno's kernels for this CPU and these weight types, once ({took}; "
              f"Numba's cache keeps them for later loads)", file=sys.stderr, flush=True)
        _Ticker.start()
    return found


# -- a helper process that compiles the same kernels (inferno/ahead.py) ---------------------
_misses = [0]  # the kernels this process compiled itself
_WAIT_POLL = 0.05  # seconds between looks at a helper's compile
_WAIT_MAX = 300.0  # seconds a wait for one kernel lasts at most (the longest compiles in 10-20 s)
_announcing = [False]  # whether this process is a helper (announce_compiles)


def misses() -> int:
    """How many of inferno's kernels this process has compiled (not found in the cache)."""
    return _misses[0]


def _kernel_name(py_func, sig) -> str:
    """A kernel and signature as two processes both name them: the function, the values of
    its closure (the kind a factory's entry was made for) and the argument types."""
    cells = tuple(c.cell_contents for c in (py_func.__closure__ or ())
                  if isinstance(c.cell_contents, (bool, int, str)))
    return f"{py_func.__module__}.{py_func.__qualname__} {cells} {sig}"


def _compiling_folder() -> Path | None:
    return None if CACHE_FOLDER is None else CACHE_FOLDER / "compiling"


def announce_compiles() -> None:
    """In a helper process: name each kernel of inferno's it is about to compile (or load) in
    a file of its own (compiling/<pid>), removed when done, so that a process that misses the
    same kernel meanwhile waits for it (_waited_for_helper) rather than compiling it twice."""
    folder = _compiling_folder()
    if folder is None or getattr(Dispatcher.compile, "_announces", False):
        return
    folder.mkdir(parents=True, exist_ok=True)
    _announcing[0] = True
    mine, compile_ = folder / str(os.getpid()), Dispatcher.compile
    depth = threading.local()

    def compile(self, sig):
        if getattr(depth, "n", 0) or not self.py_func.__module__.startswith("inferno."):
            return compile_(self, sig)
        depth.n = 1
        try:
            mine.write_text(_kernel_name(self.py_func, sig))
            return compile_(self, sig)
        finally:
            depth.n = 0
            mine.unlink(missing_ok=True)
    compile._announces = True
    Dispatcher.compile = compile


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process, alive


def _waited_for_helper(cache, sig) -> bool:
    """After a miss: whether a helper process was compiling this very kernel, and this process
    waited until it was done (up to _WAIT_MAX; its machine code is in the cache then, unless
    it failed). A helper itself never waits (two helpers of two models would wait on each
    other), and a file older than _WAIT_MAX, or of a process gone, is a helper's that died."""
    folder = _compiling_folder()
    py_func = getattr(cache, "_py_func", None)
    if folder is None or py_func is None or _announcing[0] or not folder.is_dir():
        return False
    name = _kernel_name(py_func, sig)
    for entry in folder.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        waited, deadline = False, time.monotonic() + _WAIT_MAX
        while True:
            try:
                text, age = entry.read_text(), time.time() - entry.stat().st_mtime
            except OSError:
                break  # done: the file is gone
            if not _alive(int(entry.name)) or age > _WAIT_MAX:
                entry.unlink(missing_ok=True)
                break
            if (text and text != name) or time.monotonic() > deadline:
                break
            waited = waited or bool(text)  # (empty: being written)
            time.sleep(_WAIT_POLL)
        if waited:
            return True
    return False


# -- how long a compile takes here: said before the next one, shown while it runs -----------
_RECORD = "last-compile.json"


def compiling() -> bool:
    """Whether this process has compiled a kernel (not found it in the cache)."""
    return _told


def last_compile() -> float | None:
    """The seconds the last load that compiled took on this machine, if one was recorded."""
    try:
        return float(json.loads((kernel_root() / _RECORD).read_text())["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


FIRST_RUN_KERNELS = 10  # a load that compiled this many kernels or more: a first run's figure


def compiled(seconds: float) -> None:
    """A load that compiled is over, after `seconds`: stop the progress line and keep the
    figure for the next compile's note (beside the keyed folders: any version's), when it was
    a first run's (a load that compiled one kernel a test had not would say 1 s)."""
    _Ticker.stop()
    if _misses[0] < FIRST_RUN_KERNELS:
        return
    try:
        kernel_root().mkdir(parents=True, exist_ok=True)
        (kernel_root() / _RECORD).write_text(json.dumps({"seconds": round(seconds, 1)}))
    except OSError:
        pass


class _Ticker:
    """A line on a terminal's stderr that counts the seconds of a compile, so that a minute of
    it is seen to move."""
    _thread: threading.Thread | None = None
    _done = threading.Event()

    @classmethod
    def start(cls) -> None:
        if cls._thread is not None or not sys.stderr.isatty():
            return
        t0 = time.monotonic()

        def tick():
            while not cls._done.wait(1.0):
                print(f"\rcompiling: {time.monotonic() - t0:.0f} s", end="", file=sys.stderr, flush=True)
            print("\r\x1b[K", end="", file=sys.stderr, flush=True)
        cls._thread = threading.Thread(target=tick, name="inferno-compile-ticker", daemon=True)
        cls._thread.start()

    @classmethod
    def stop(cls) -> None:
        if cls._thread is not None:
            cls._done.set()
            cls._thread.join(2)


@contextlib.contextmanager
def _index_lock(mode):
    """The keyed folder's lock, shared for a load, exclusive for a save. Numba saves a kernel
    by reading its function's index, adding the key and writing it back, the machine code
    under the first data file name the index it read leaves free: two processes saving two
    signatures of one function at once (a load and its helper, ahead.py; two servers starting)
    would both pick the same name, and the index kept would point one signature at the other's
    machine code. Under the lock the read, the write and the data go together."""
    if CACHE_FOLDER is None or fcntl is None:
        yield
        return
    try:
        f = open(CACHE_FOLDER / ".lock", "a")
    except OSError:
        yield  # a folder that cannot be written is not written to either
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_SH if mode == "shared" else fcntl.LOCK_EX)
        yield


def _save_overload(cache, sig, data):
    """Numba's Cache.save_overload, under the keyed folder's lock (_index_lock)."""
    with _index_lock("exclusive"), cache._guard_against_spurious_io_errors():
        cache._save_overload(sig, data)


def _give_loader(value) -> bool:
    """Whether `value` is a cached kernel that got the loader above (and the saver) just now."""
    if not _SUPPORTED or not isinstance(value, Dispatcher):
        return False
    cache = getattr(value, "_cache", None)
    if not isinstance(cache, caching.Cache) or "load_overload" in vars(cache):
        return False
    cache.load_overload = functools.partial(_load_overload, cache)
    cache.save_overload = functools.partial(_save_overload, cache)
    return True


def lazy(dispatcher):
    """`dispatcher` with the loader above (for kernels made at run time, which
    load_kernels_lazily cannot find); returns it."""
    _give_loader(dispatcher)
    return dispatcher


def load_kernels_lazily(package: str = "inferno.backends") -> int:
    """Give every cached Numba kernel defined in `package`'s imported modules the loader above;
    the number of kernels changed (0 once done, or where Numba's internals differ).

    It walks copies of sys.modules and of each module's namespace, each taken in one step: the
    server loads its model on a thread of its own while others import, and walking the live
    dicts (list(sys.modules.items()), whose building can run other threads' code) failed CI
    twice with "dictionary changed size during iteration"."""
    return sum(_give_loader(value)
               for name, module in sys.modules.copy().items()
               if module is not None and (name == package or name.startswith(package + "."))
               for value in vars(module).copy().values())
