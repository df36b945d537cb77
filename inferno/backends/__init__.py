"""Backend registry: names to classes, imported lazily so the CPU backends never need torch."""

from __future__ import annotations

import importlib
from typing import NamedTuple

from inferno.backends.base import OPS, Backend
from inferno.errors import InfernoError


class Entry(NamedTuple):
    module: str
    cls: str
    needs: str  # what to install when the import fails
    options: tuple[str, ...] = ()  # keyword options the constructor takes


REGISTRY = {
    "cpu": Entry("inferno.backends.cpu", "CpuBackend", "numpy"),
    "simd": Entry("inferno.backends.numba.simd", "SimdBackend", "numba and scipy", ("int8_activations",)),
    "pool": Entry("inferno.backends.numba.pool", "PoolBackend", "numba and scipy",
                  ("threads", "int8_activations", "adaptive")),
    "torch": Entry("inferno.backends.torch.torch_backend", "TorchBackend",
                   "torch: on a CPU-only machine its CPU build first (pip install torch --index-url "
                   "https://download.pytorch.org/whl/cpu; PyPI's default is a multi-GB CUDA build), "
                   "then pip install -e '.[torch]' in inferno's folder", ("device", "dtype", "graphs")),
    "gpu": Entry("inferno.backends.torch.gpu", "GpuBackend",
                 "torch and triton on CUDA: pip install -e '.[gpu]' in inferno's folder",
                 ("dtype", "decode", "prefill", "graphs")),
}


# The fastest backend that needs nothing beyond the install: every core, kernels reading the
# weights as stored. `cpu` is the reference the others are pinned to, not a default to run.
DEFAULT_BACKEND = "pool"


def backend_names() -> list[str]:
    return list(REGISTRY)


def create_backend(name: str, **options) -> Backend:
    """Instantiate backend `name`. An option the backend does not take (threads, device, dtype)
    is an error, not silently ignored; None means "not given"."""
    entry = REGISTRY.get(name)
    if entry is None:
        raise InfernoError(f"unknown backend {name!r}; known backends: {', '.join(REGISTRY)}")
    given = {k: v for k, v in options.items() if v is not None}
    for key in given:
        if key not in entry.options:
            takers = [n for n, e in REGISTRY.items() if key in e.options]
            raise InfernoError(f"{key} does not apply to backend {name!r}"
                               + (f" (only to: {', '.join(takers)})" if takers else ""), params=(key,))
    try:
        module = importlib.import_module(entry.module)
    except ImportError as e:
        raise InfernoError(f"backend {name!r} needs {entry.needs} ({e})") from None
    return getattr(module, entry.cls)(**given)


__all__ = ["DEFAULT_BACKEND", "OPS", "Backend", "REGISTRY", "backend_names", "create_backend"]
