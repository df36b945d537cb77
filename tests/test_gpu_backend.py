"""The `gpu` backend's logic on the CPU: its decode runs the Triton kernel under the interpreter
(the device="cpu" test hook), so its engine must reproduce the reference logits, cached and
uncached, with either loop variant and either prefill path. Without CUDA the registry refuses it
with a message that names the alternative. Its decode_attention and flash_attention_prefill ops
(a batch in their own slots in one launch, every cache type it stores) are pinned to the
reference in tests/ops/."""

from __future__ import annotations

import importlib
import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are defined: @triton.jit reads it

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from inferno.backends import create_backend
from inferno.backends.torch import triton_decode  # noqa: E402
from inferno.backends.torch.gpu import GpuBackend  # noqa: E402
from inferno.engine import Engine  # noqa: E402
from inferno.errors import InfernoError  # noqa: E402
from inferno.loading.loader import open_checkpoint  # noqa: E402

if not triton_decode.INTERPRET:  # imported earlier in this process for CUDA
    importlib.reload(triton_decode)

IDS = [5, 17, 200, 33, 1, 90, 91, 92, 7, 7, 7, 250, 3, 64, 128, 12, 99, 44, 21, 300] * 4


def engine(model_dir, backend) -> Engine:
    return Engine(open_checkpoint(model_dir), backend)


@pytest.fixture(scope="module")
def cpu_logits(qwen3_dir, llama_dir):
    return {d: engine(d, create_backend("cpu")).logits(IDS) for d in (qwen3_dir, llama_dir)}


@pytest.mark.parametrize("model", ["qwen3_dir", "llama_dir"])
@pytest.mark.parametrize("decode,prefill", [("pingpong", "sdpa"), ("serial", "materialized")])
def test_cached_decode_matches_reference(request, cpu_logits, model, decode, prefill):
    """Qwen3 (head dim 24, GQA 2) and Llama (9 query heads over 3, head dim 8): prefill, a
    chunk after the cache, then token-by-token decode through the kernel."""
    model_dir = request.getfixturevalue(model)
    want = cpu_logits[model_dir]
    eng = engine(model_dir, GpuBackend(decode=decode, prefill=prefill, device="cpu"))
    np.testing.assert_allclose(eng.logits(IDS), want, atol=2e-4)
    m = eng.model
    cache = m.new_cache(len(IDS))
    pieces = [m.forward(IDS[:5], cache), m.forward(IDS[5:70], cache)]
    pieces += [m.forward([t], cache) for t in IDS[70:]]
    cached = np.concatenate([eng.ops.to_numpy(p) for p in pieces])
    np.testing.assert_allclose(cached, want, atol=2e-4)


def test_registry_refuses_without_cuda():
    if torch.cuda.is_available():  # on a GPU machine the same call builds the backend
        assert create_backend("gpu").device.type == "cuda"
        return
    with pytest.raises(InfernoError, match="needs a CUDA GPU; use --backend torch"):
        create_backend("gpu")
    with pytest.raises(InfernoError, match="needs a CUDA GPU"):
        GpuBackend(device="cuda")


def test_bad_options():
    with pytest.raises(InfernoError, match="serial, pingpong"):
        GpuBackend(decode="zigzag", device="cpu")
    with pytest.raises(InfernoError, match="sdpa, materialized"):
        GpuBackend(prefill="flash", device="cpu")
    with pytest.raises(InfernoError, match="does not apply"):
        create_backend("gpu", device="cpu")  # the registry does not take a device for gpu


def test_device_step_generates_the_op_by_op_tokens(qwen3_dir):
    """The decode step on the device (graphs="eager": DecodeGraphs without capture) with the
    Triton kernel reading slots and lengths from device memory: a greedy and a seeded sampled
    reply, token for token the op-by-op path's."""
    got = {}
    for graphs in ("off", "eager"):
        eng = engine(qwen3_dir, GpuBackend(graphs=graphs, device="cpu"))
        got[graphs] = [eng.generate("hello", max_tokens=8, **kw).token_ids
                       for kw in (dict(temperature=0), dict(temperature=1.0, seed=2, top_k=20))]
    assert got["eager"] == got["off"]
