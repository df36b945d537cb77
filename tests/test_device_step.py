"""The decode step on the device, on the CPU: DecoderModel.decode (every input an index tensor),
the device sampler (backends/torch/sampling.py) and the runner that joins them
(backends/torch/graphs.py), through the same code a GPU captures in CUDA graphs.

- decode gives step's logits, on the numpy reference, torch and gpu (its Triton kernel under the
  interpreter, the grid fixed for the cache's capacity), with windows and many splits;
- the device sampler draws the host sampler's tokens from the same draws, on random logits with
  ties, masked tokens and every filter;
- a generation on torch with the device step (graphs="eager") gives the op-by-op path's tokens
  and log-probabilities: greedy, seeded sampling, penalties, logit bias, a JSON schema; the
  server's batch too, padded up to the capture sizes as on a GPU; a cache that grows;
- the step makes no host round trip between its copy-in and copy-out: a torch function mode
  fails any call that would read a tensor on the host.

The CUDA tests at the end (graph replay against eager at batch sizes 1 to 64, device sampling
against the host's) run wherever a GPU is at hand.
"""

from __future__ import annotations

import importlib
import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are defined: @triton.jit reads it

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from sampling_cases import SETTINGS, logits_rows  # noqa: E402
from tiny import make_model  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

from inferno import engine as engine_module  # noqa: E402
from inferno.backends import create_backend  # noqa: E402
from inferno.backends.torch import sampling as device_sampling  # noqa: E402
from inferno.backends.torch import triton_decode  # noqa: E402
from inferno.backends.torch.gpu import GpuBackend  # noqa: E402
from inferno.backends.torch.graphs import DecodeGraphs, capture_sizes  # noqa: E402
from inferno.backends.torch.torch_backend import TorchBackend  # noqa: E402
from inferno.engine import Engine  # noqa: E402
from inferno.model.decoder import Segment  # noqa: E402
from inferno.loading.loader import open_checkpoint  # noqa: E402
from inferno.sampling import SamplingParams, sample  # noqa: E402
from inferno.sequence import Options  # noqa: E402
from inferno.serve.batch import BatchEngine  # noqa: E402

if not triton_decode.INTERPRET:  # imported earlier in this process for CUDA
    importlib.reload(triton_decode)


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    """Gemma 3 with a window of 6 on two of three layers: shorter than the lengths here."""
    return make_model(tmp_path_factory.mktemp("gemma3-w6"), "gemma3", hidden=64, heads=4, kv_heads=1,
                      head_dim=40, layers=3, tied=True, sliding_window=6, query_pre_attn_scalar=32,
                      layer_types=["sliding_attention", "full_attention", "sliding_attention"])


def backends():
    return {"cpu": lambda: create_backend("cpu"), "torch": lambda: TorchBackend(device="cpu"),
            "gpu": lambda: GpuBackend(device="cpu")}


# -- DecoderModel.decode ------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["cpu", "torch", pytest.param("gpu", marks=pytest.mark.triton_interp)])
@pytest.mark.parametrize("model", ["qwen3_dir", "gemma_dir"])
def test_decode_gives_step_logits(request, monkeypatch, name, model):
    """Three sequences in slots 2, 0, 1 at lengths 5, 17 and 140 (past the window, and over
    several blocks), decoded by both forms from the same cache contents. On gpu the grid is
    many small splits (sized for the 160-row capacity), so each sequence cuts its own keys."""
    monkeypatch.setattr(triton_decode, "PROGRAMS_PER_SM", 8)
    monkeypatch.setattr(triton_decode, "MIN_BLOCKS_PER_SPLIT", 1)
    ops = backends()[name]()
    m = Engine(open_checkpoint(request.getfixturevalue(model)), ops, warm_up=False).model
    rng = np.random.default_rng(0)
    lens = {2: 5, 0: 17, 1: 140}
    caches = [m.new_cache(160, slots=3) for _ in range(2)]
    for slot, n in lens.items():
        ids = rng.integers(0, 300, n)
        for cache in caches:
            m.step([Segment(ids, slot, 0, logits=False)], cache)
    slots = np.array(list(lens))
    ids, pos = rng.integers(0, 300, 3), np.array(list(lens.values()))
    want = ops.to_numpy(m.step([Segment(ids[b:b + 1], int(slots[b]), int(pos[b])) for b in range(3)], caches[0]))
    got = ops.to_numpy(m.decode(ops.indices(ids), ops.indices(pos), ops.indices(slots),
                                ops.indices(pos + 1), caches[1]))
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
    # and the next step reads the K/V the device step wrote
    more = rng.integers(0, 300, 3)
    want = ops.to_numpy(m.step([Segment(more[b:b + 1], int(slots[b]), int(pos[b]) + 1) for b in range(3)], caches[0]))
    got = ops.to_numpy(m.decode(ops.indices(more), ops.indices(pos + 1), ops.indices(slots),
                                ops.indices(pos + 2), caches[1]))
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)


# -- the sampler -------------------------------------------------------------------------------
@pytest.mark.parametrize("settings", SETTINGS, ids=str)
def test_device_sampler_draws_the_host_samplers_tokens(settings):
    vocab, rng = 500, np.random.default_rng(1)
    rows = logits_rows(rng, 3, vocab)
    seen_ids = [rng.integers(0, vocab, 20) for _ in rows]
    params = SamplingParams(**settings)
    for seed in range(40):
        want, draws = [], []
        for x, seen in zip(rows, seen_ids):
            want.append(sample(x, params, np.random.default_rng(seed), seen.tolist()))
            draws.append(np.random.default_rng(seed).random() if params.temperature > 0 else 0.0)
        b = len(rows)
        seen_mask = torch.zeros(b, vocab, dtype=torch.bool)
        for i, s in enumerate(seen_ids):
            seen_mask[i, torch.from_numpy(s)] = True
        col = lambda v, dt=torch.float64: torch.full((b,), v, dtype=dt)  # noqa: E731
        got = device_sampling.choose(torch.from_numpy(rows), seen_mask, col(params.repeat_penalty),
                                     col(params.temperature), col(params.top_k, torch.int64),
                                     col(params.top_p), col(params.min_p), torch.tensor(draws),
                                     greedy_only=params.temperature == 0)
        assert got.tolist() == want, (seed, got.tolist(), want)


def test_adjustments_match_the_sequences():
    """Bias, presence and frequency penalties and the grammar mask, as Sequence._adjusted and
    apply_mask compute them: the same float32 values."""
    from inferno.constrain import apply_mask
    rng = np.random.default_rng(3)
    vocab = 70
    x = rng.standard_normal((2, vocab)).astype(np.float32)
    counts = rng.integers(0, 3, (2, vocab)).astype(np.int32)
    bias = np.zeros((2, vocab), np.float32)
    bias[0, [3, 9]] = [1.5, -2.0]
    masks = rng.integers(-2**31, 2**31, (2, 3), dtype=np.int64).astype(np.int32)
    presence, frequency = np.array([0.5, 0.0], np.float32), np.array([0.25, 1.0], np.float32)
    got = device_sampling.adjust(torch.from_numpy(x), torch.from_numpy(bias), torch.from_numpy(counts),
                                 torch.from_numpy(presence), torch.from_numpy(frequency),
                                 device_sampling.allowed_tokens(torch.from_numpy(masks), vocab),
                                 torch.tensor([True, False])).numpy()
    for r in range(2):
        row = x[r] + bias[r]
        ids = np.flatnonzero(counts[r])
        row[ids] -= np.float32(frequency[r]) * counts[r, ids].astype(np.float32) + np.float32(presence[r])
        want = apply_mask(row, masks[r]) if r == 0 else row
        np.testing.assert_array_equal(got[r], want)


# -- generations: the device step against op by op ---------------------------------------------
GENERATIONS = [
    dict(temperature=0),
    dict(temperature=1.0, seed=3),
    dict(temperature=0.7, top_k=5, top_p=0.8, min_p=0.05, seed=5, repeat_penalty=1.3,
         presence_penalty=0.5, frequency_penalty=0.3, logit_bias={5: 2.0, 7: -100.0}),
    dict(temperature=0.9, seed=1, logprobs=True, top_logprobs=3),
    dict(temperature=0, json_schema={"type": "object", "properties": {"a": {"type": "integer"}},
                                     "required": ["a"], "additionalProperties": False}),
]


def run_all(eng) -> list:
    out = []
    for kw in GENERATIONS:
        r = eng.generate("hello there", max_tokens=24, **kw)
        lps = [(lp.token_id, lp.logprob, lp.top) for lp in r.logprobs or ()]
        out.append((r.token_ids, r.finish_reason, lps))
    return out


def same_generations(got, want):
    for (ids, stop, lps), (ids_w, stop_w, lps_w) in zip(got, want):
        assert (ids, stop) == (ids_w, stop_w)
        for (t, lp, top), (t_w, lp_w, top_w) in zip(lps, lps_w):
            assert t == t_w and abs(lp - lp_w) < 1e-5
            assert [i for i, _ in top] == [i for i, _ in top_w]
            np.testing.assert_allclose([v for _, v in top], [v for _, v in top_w], atol=1e-5)


@pytest.fixture(scope="module")
def host_generations(qwen3_dir):
    return run_all(Engine(open_checkpoint(qwen3_dir), TorchBackend(device="cpu", graphs="off")))


def test_generations_on_the_device_step_match_op_by_op(qwen3_dir, host_generations, monkeypatch):
    eng = Engine(open_checkpoint(qwen3_dir), TorchBackend(device="cpu", graphs="eager"))
    runner = eng._solo.runner()
    assert isinstance(runner, DecodeGraphs) and not runner.captured
    calls = []
    monkeypatch.setattr(runner, "run", lambda rows, real=runner.run: calls.append(len(rows.ids)) or real(rows))
    same_generations(run_all(eng), host_generations)
    assert len(calls) >= 5 * 20  # every decode step of every generation went to the device


def test_a_cache_that_grows_is_captured_again(qwen3_dir, host_generations, monkeypatch):
    """A request longer than the engine's slot: the slot grows, and its runner is made anew
    for the new cache before the reply's first decode step."""
    monkeypatch.setattr(engine_module, "SOLO_CAPACITY", 16)
    eng = Engine(open_checkpoint(qwen3_dir), TorchBackend(device="cpu", graphs="eager"))
    first = eng._solo.runner()
    same_generations(run_all(eng), host_generations)
    assert eng._solo.cache.capacity > 16 and eng._solo.runner() is not first


def test_the_batch_engine_pads_to_the_capture_sizes(qwen3_dir, monkeypatch):
    """The server's loop with five slots, its steps padded up to 8 rows as on a GPU: each
    request gets the tokens it gets alone on the op-by-op path."""
    monkeypatch.setattr(DecodeGraphs, "__init__", padded_init)
    requests = [dict(temperature=0), dict(temperature=1.0, seed=2), dict(temperature=0.8, seed=9, top_k=7),
                dict(temperature=0, repeat_penalty=1.5, logit_bias={3: 5.0}), dict(temperature=1.1, seed=4)]
    texts = {}
    for graphs in ("off", "eager"):
        eng = Engine(open_checkpoint(qwen3_dir), TorchBackend(device="cpu", graphs=graphs))
        with BatchEngine(eng, parallel=5, ctx_size=96) as batch:
            handles = [batch.submit(eng.encode_prompt(f"story {i}"),
                                    eng.options(max_tokens=20, **kw)) for i, kw in enumerate(requests)]
            texts[graphs] = [[t for e in h for t in e.token_ids] for h in handles]
            if graphs == "eager":
                assert batch.slots.runner().sizes == [1, 2, 4, 8]
    assert texts["eager"] == texts["off"]


def test_interleaved_streams_do_not_share_the_engines_slot(qwen3_dir, host_generations):
    """Two streams of one engine iterated in turn: the second must not wait for the slot the
    first holds (it takes a new one), and each gives what it gives alone."""
    eng = Engine(open_checkpoint(qwen3_dir), TorchBackend(device="cpu", graphs="eager"))
    streams = [eng.stream("hello there", max_tokens=24, **GENERATIONS[i]) for i in (0, 1)]
    going = [iter(s) for s in streams]
    while going:
        for it in list(going):
            if next(it, None) is None:
                going.remove(it)
    assert [s.result.token_ids for s in streams] == [host_generations[i][0] for i in (0, 1)]
    assert eng._solo_free  # given back


def test_a_device_failure_reruns_the_step_on_the_host_with_the_same_draws(qwen3_dir, host_generations,
                                                                          monkeypatch):
    eng = Engine(open_checkpoint(qwen3_dir), TorchBackend(device="cpu", graphs="eager"))
    runner, real, fails = eng._solo.runner(), eng._solo.runner().run, iter([True, False, True])

    def flaky(rows):
        if next(fails, False):
            raise RuntimeError("a device fault")
        return real(rows)
    monkeypatch.setattr(runner, "run", flaky)
    got = eng.generate("hello there", max_tokens=24, **GENERATIONS[1]).token_ids
    assert got == host_generations[1][0]


def test_a_grammar_failure_fails_its_sequence_once(qwen3_dir, monkeypatch):
    """The grammar library failing on a device step: the constrained sequence ends with one
    error event, the free one beside it goes on."""
    import inferno.scheduler as scheduler
    eng = Engine(open_checkpoint(qwen3_dir), TorchBackend(device="cpu", graphs="eager"))
    with BatchEngine(eng, parallel=2, ctx_size=64) as batch:
        grammar = eng.constraint(json_schema={"type": "string"})
        real, calls = scheduler.masks_for, []

        def failing(seqs):  # the constrained sequence's second step, whichever step of the loop's it is
            if any(s.matcher is not None for s in seqs):
                calls.append(len(seqs))
                if len(calls) == 2:
                    raise RuntimeError("the grammar library broke")
            return real(seqs)
        monkeypatch.setattr(scheduler, "masks_for", failing)
        free = batch.submit(eng.encode_prompt("a"), eng.options(max_tokens=12, temperature=0))
        bound = batch.submit(eng.encode_prompt("b"), eng.options(max_tokens=12, temperature=0, grammar=grammar))
        free_events, bound_events = list(free), list(bound)
    finals = [e for e in bound_events if e.finish_reason]
    assert [e.finish_reason for e in finals] == ["error"] and "grammar library broke" in finals[0].error
    assert free_events[-1].finish_reason == "length"


def test_outgrown_rope_tables_are_kept(qwen3_dir):
    """A captured step holds a RoPE table's address: a bigger cache's table must not free it."""
    m = Engine(open_checkpoint(qwen3_dir), TorchBackend(device="cpu"), warm_up=False).model
    first = m.rope_table(64)
    assert m.rope_table(50) is first
    bigger = m.rope_table(300)
    assert bigger is not first and first in m._rope_kept


def padded_init(self, *args, **kwargs):
    """DecodeGraphs as on CUDA, padding each batch to the next capture size, without capture."""
    real_init(self, *args, **kwargs)
    self.pad = True


real_init = DecodeGraphs.__init__


def test_capture_sizes():
    assert capture_sizes(1) == [1]
    assert capture_sizes(5) == [1, 2, 4, 8]
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 32, 64]


# -- no host round trip --------------------------------------------------------------------------
class NoHostReads(TorchFunctionMode):
    """Fails every call that reads a tensor's values on the host, or makes a tensor from host
    data, or whose result's shape depends on values (which a GPU must read back to allocate)."""

    FORBIDDEN = {"item", "tolist", "__int__", "__float__", "__bool__", "__index__", "cpu", "numpy",
                 "__array__", "tensor", "as_tensor", "nonzero", "masked_select", "unique",
                 "unique_consecutive", "bincount", "argwhere"}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.FORBIDDEN:
            raise AssertionError(f"the device step read the host: {name}")
        if name == "__getitem__" and any(isinstance(a, torch.Tensor) and a.dtype == torch.bool
                                         for a in (args[1] if isinstance(args[1], tuple) else (args[1],))):
            raise AssertionError("the device step indexed by a boolean mask")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("greedy", [True, False])
def test_the_step_reads_nothing_on_the_host(qwen3_dir, monkeypatch, greedy):
    eng = Engine(open_checkpoint(qwen3_dir), TorchBackend(device="cpu", graphs="eager"))
    eng.generate("hello", max_tokens=3, temperature=0 if greedy else 1.0, seed=1,
                 json_schema={"type": "string"})  # fills the buffers, grammar masks included
    runner = eng._solo.runner()
    monkeypatch.setattr(torch, "from_numpy", lambda *a: pytest.fail("from_numpy in the step"))
    with NoHostReads():
        tokens, logits = runner._body(1, greedy)
    assert tokens.shape == (1,) and logits.shape == (1, eng.config.vocab_size)


def test_the_guard_catches_a_host_read():
    with pytest.raises(AssertionError, match="item"), NoHostReads():
        torch.ones(2).sum().item()
    mask = torch.tensor([True, False, True])
    with pytest.raises(AssertionError, match="boolean"), NoHostReads():
        torch.ones(3)[mask]


def test_graphs_option():
    from inferno.errors import InfernoError
    assert TorchBackend(device="cpu").graphs == "off"  # the CPU decodes op by op by default
    with pytest.raises(InfernoError, match="CUDA graphs need a CUDA device"):
        TorchBackend(device="cpu", graphs="on")
    with pytest.raises(InfernoError, match="graphs 'sometimes'"):
        TorchBackend(device="cpu", graphs="sometimes")


def test_trace_decodes_op_by_op(qwen3_dir):
    """--trace counts every op: no runner, the ops' histogram holds the decode steps."""
    eng = Engine(open_checkpoint(qwen3_dir), TorchBackend(device="cpu", graphs="eager"), trace=True)
    eng.generate("hello", max_tokens=4, temperature=0)
    assert eng._solo is None and eng.ops.calls["decode_attention"] > 0


# -- on a GPU ------------------------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_checks():
    """tests/cuda_checks.py in a process of its own (its kernels compiled, not interpreted):
    graph replay against eager at batch sizes 1 to 64, device sampling against the host's."""
    import subprocess
    import sys
    from pathlib import Path
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(Path(__file__).parent / "cuda_checks.py")], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]


def test_bench_decodes_through_the_device_step(qwen3_dir, monkeypatch):
    """inferno bench's tgN on a backend that decodes on the device times the steps a reply
    takes (the runner's), not the op-by-op forward."""
    from inferno.bench import EngineRunner
    bench = EngineRunner(str(qwen3_dir), "torch", True, device="cpu", graphs="eager")
    runner, calls = bench.engine._solo.runner(), []
    monkeypatch.setattr(runner, "run", lambda rows, real=runner.run: calls.append(1) or real(rows))
    assert bench.decode(bench.first_token, 6) > 0 and len(calls) == 6
    bench.close()
