"""The `backend` fixture every op test takes: each variant of every backend, one instance per
test module.

- cpu: the numpy reference (Backend unchanged), pinned to textbook formulas here;
- simd: the Numba kernels on one core;
- pool-1, pool-2: the pool on one thread and on two, at its default size thresholds (small
  shapes take the serial path, large ones the parallel kernels);
- pool-eager: two threads with the thresholds at zero, so every op, however small, is a
  parallel launch, and decode cuts each sequence's keys into ranges of 16 or more (the
  split-and-merge path);
- torch: TorchBackend on the CPU, its own tensors (tests go through from_numpy and to_numpy);
- gpu: GpuBackend on the CPU, its Triton decode kernel under Triton's interpreter. Only for the
  ops it overrides itself (the module says `GPU = True`); marked triton_interp, so slow.

`@pytest.mark.backends(*variants)` narrows a test to the variants whose code it exercises (the
kernels' own bounds checks, the 3100-key prefill that crosses simd's query-block switches).
"""

from __future__ import annotations

import importlib
import os

import pytest

from ops.helpers import VARIANTS


def pytest_configure(config):
    config.addinivalue_line("markers", "backends(*variants): run on these backend variants only")


def pytest_generate_tests(metafunc):
    if "backend" not in metafunc.fixturenames:
        return
    variants = VARIANTS + (("gpu",) if getattr(metafunc.module, "GPU", False) else ())
    only = metafunc.definition.get_closest_marker("backends")
    if only is not None:
        unknown = set(only.args) - set(variants)
        assert not unknown, f"{metafunc.definition.name}: no variant {sorted(unknown)} here"
        variants = tuple(v for v in variants if v in only.args)
    params = [pytest.param(v, marks=pytest.mark.triton_interp) if v == "gpu" else v for v in variants]
    metafunc.parametrize("backend", params, indirect=True, scope="module")


def make(variant: str):
    if variant == "cpu":
        from inferno.backends.cpu import CpuBackend
        return CpuBackend()
    if variant == "simd":
        from inferno.backends.numba.simd import SimdBackend
        return SimdBackend()
    if variant.startswith("pool"):
        from inferno.backends.numba.pool import PoolBackend
        backend = PoolBackend(threads=1 if variant == "pool-1" else 2)
        if variant == "pool-eager":
            backend.parallel_min_elements = backend.parallel_min_attention = 0
            backend.decode_min_keys = 16
        return backend
    if variant == "torch":
        from inferno.backends.torch.torch_backend import TorchBackend
        return TorchBackend(device="cpu")
    assert variant == "gpu", variant
    # Set before the kernels are defined (@triton.jit reads it); a module imported earlier in
    # this process for CUDA defines them again.
    os.environ["TRITON_INTERPRET"] = "1"
    from inferno.backends.torch import triton_decode
    if not triton_decode.INTERPRET:
        importlib.reload(triton_decode)
    from inferno.backends.torch.gpu import GpuBackend
    return GpuBackend(device="cpu")


@pytest.fixture(scope="module")
def backend(request):
    ops = make(request.param)
    yield ops
    ops.close()
