"""How many threads the BLAS libraries in this process may use.

Two OpenBLAS builds are loaded in a numpy + scipy process: numpy's (behind `x @ w.T`) and
scipy's (behind Numba's `np.dot`). Each keeps its own thread pool, sized to the cores. The simd
backend must run on one core, and the pool backend already has one thread per core calling BLAS
on its own slice, so both pin every OpenBLAS to one thread while they are alive: two BLAS
threads under each pool thread would oversubscribe the cores, and OpenBLAS threads spin for a
while after each call, stealing a core from the next parallel region.

NOTE: a BLAS thread count is process state, not per call. `limit_to_one_thread()` is counted,
so two backends alive at once restore the original counts only when both have closed; meanwhile
numpy-only code (the `cpu` backend) also runs its BLAS on one thread.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import os
import sys
import threading

# (set, get) symbol pairs: scipy-openblas (numpy >= 2 with the 64-bit interface, scipy), then a
# plain OpenBLAS.
_SYMBOLS = [
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
    ("openblas_set_num_threads", "openblas_get_num_threads"),
]

_lock = threading.Lock()
_users = 0
_saved: list[tuple[object, int]] = []


CYTHON_BLAS = "scipy.linalg.cython_blas"


def load_cython_blas() -> None:
    """Import scipy.linalg.cython_blas without running scipy.linalg's package init.

    Numba's np.dot reaches sgemm through that module: its runtime imports it by name on the
    first call. The usual import runs scipy/linalg/__init__.py first, which pulls in all of
    scipy.linalg and scipy's array-API layer (60-130 ms, a quarter of a warm load); the
    extension itself needs none of it. So it is loaded from its file under its own name, and
    every later import (Numba's, scipy.linalg's own) finds it in sys.modules. Anything odd about
    the install falls back to the plain import."""
    if CYTHON_BLAS in sys.modules:
        return
    if "scipy.linalg" in sys.modules:  # its init has run already: the plain import costs nothing
        importlib.import_module(CYTHON_BLAS)
        return
    try:
        import scipy
        folder = os.path.join(os.path.dirname(scipy.__file__), "linalg")
        paths = [os.path.join(folder, "cython_blas" + s) for s in importlib.machinery.EXTENSION_SUFFIXES]
        spec = importlib.util.spec_from_file_location(CYTHON_BLAS, next(p for p in paths if os.path.exists(p)))
        module = importlib.util.module_from_spec(spec)
        sys.modules[CYTHON_BLAS] = module
        spec.loader.exec_module(module)
        module.__pyx_capi__["sgemm"]  # what Numba will ask it for
    except Exception:
        sys.modules.pop(CYTHON_BLAS, None)
        importlib.import_module(CYTHON_BLAS)
        return
    sys.meta_path.insert(0, _AttachCythonBlas)


class _AttachCythonBlas:
    """Once scipy.linalg itself is imported, give it the `cython_blas` attribute that the usual
    import of the submodule would have set (an import that finds the submodule in sys.modules
    binds nothing on its parent). Leaves sys.meta_path at the first import of scipy.linalg."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "scipy.linalg":
            return None
        sys.meta_path.remove(_AttachCythonBlas)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and hasattr(spec.loader, "exec_module"):
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                module.cython_blas = sys.modules[CYTHON_BLAS]

            spec.loader.exec_module = exec_module
        return spec


def _openblas_controls() -> list[tuple[object, object]]:
    """(set_num_threads, get_num_threads) for every OpenBLAS mapped into this process."""
    import numpy  # noqa: F401  load both libraries before looking
    load_cython_blas()
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:  # not Linux: leave the libraries' own defaults alone
        return []
    controls = []
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for set_name, get_name in _SYMBOLS:
            if hasattr(lib, set_name) and hasattr(lib, get_name):
                controls.append((getattr(lib, set_name), getattr(lib, get_name)))
                break
    return controls


def limit_to_one_thread() -> None:
    """Pin every OpenBLAS in the process to one thread until the matching `release()`."""
    global _users
    with _lock:
        if _users == 0:
            _saved[:] = [(set_threads, get_threads()) for set_threads, get_threads in _openblas_controls()]
            for set_threads, _ in _saved:
                set_threads(1)
        _users += 1


def release() -> None:
    global _users
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users == 0:
            for set_threads, threads in _saved:
                set_threads(threads)
            _saved.clear()


def thread_counts() -> list[int]:
    """The current thread count of every OpenBLAS found (for tests and reports)."""
    return [get_threads() for _, get_threads in _openblas_controls()]
