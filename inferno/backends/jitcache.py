"""Loading cached kernels without waking Numba's compiler.

Before every cache load Numba refreshes its target context "to ensure it is initialized". The
first refresh imports some forty modules of typing and lowering registries (numba.np.arraymath,
the random and set and list implementations...) and installs them all: 80-130 ms of a warm
0.45 s load of the default model here, for nothing a cache hit uses. A hit takes its machine
code from the cache file and brings its threading layer up through the entry's own reload hooks;
at run time the code calls Numba's C helpers (registered when Numba's context is made) and the
NRT, which is initialised here, as the refresh would have done. A miss compiles as before, and
Numba's compiler refreshes the context itself before it compiles anything.

A miss also prints one notice per process (a model's first run compiles for 30-40 s here,
silently otherwise). Only inferno's own kernels load this way (a test loads them in a fresh
process and checks that the registries stay unimported and the answers match); other Numba code
in the process keeps Numba's own path.
"""

from __future__ import annotations

import functools
import sys

try:
    from numba.core import caching
    from numba.core.dispatcher import Dispatcher
    from numba.core.runtime import rtsys
    _SUPPORTED = all(hasattr(caching.Cache, name) for name in ("_load_overload", "_guard_against_spurious_io_errors"))
except ImportError:  # a Numba whose internals moved: keep its own loading
    _SUPPORTED = False


_told = False  # whether this process has said that it compiles


def _load_overload(cache, sig, target_context):
    """Numba's Cache.load_overload, less the refresh; on a miss (Numba compiles next), one
    notice per process, so that a first run's half minute of compiling is not taken for a hang."""
    global _told
    rtsys.initialize(target_context)  # the one part of the refresh a loaded kernel calls into
    found = None
    with cache._guard_against_spurious_io_errors():
        found = cache._load_overload(sig, target_context)
    if found is None and not _told:
        _told = True
        print("note: compiling inferno's kernels for this CPU and these weight types, once (tens of "
              "seconds; Numba's cache keeps them for later loads)", file=sys.stderr, flush=True)
    return found


def _give_loader(value) -> bool:
    """Whether `value` is a cached kernel that got the loader above just now."""
    if not _SUPPORTED or not isinstance(value, Dispatcher):
        return False
    cache = getattr(value, "_cache", None)
    if not isinstance(cache, caching.Cache) or "load_overload" in vars(cache):
        return False
    cache.load_overload = functools.partial(_load_overload, cache)
    return True


def lazy(dispatcher):
    """`dispatcher` with the loader above (for kernels made at run time, which
    load_kernels_lazily cannot find); returns it."""
    _give_loader(dispatcher)
    return dispatcher


def load_kernels_lazily(package: str = "inferno.backends") -> int:
    """Give every cached Numba kernel defined in `package`'s imported modules the loader above;
    the number of kernels changed (0 once done, or where Numba's internals differ)."""
    return sum(_give_loader(value)
               for name, module in list(sys.modules.items())
               if module is not None and (name == package or name.startswith(package + "."))
               for value in list(vars(module).values()))
