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


def _openblas_controls() -> list[tuple[object, object]]:
    """(set_num_threads, get_num_threads) for every OpenBLAS mapped into this process."""
    import numpy  # noqa: F401  load both libraries before looking
    import scipy.linalg.cython_blas  # noqa: F401
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
