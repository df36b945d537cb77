"""The device step's checks that need a CUDA GPU, in a process of their own: the rest of the
suite defines the Triton kernels for the interpreter (TRITON_INTERPRET=1), and a captured graph
needs them compiled. tests/test_device_step.py runs this file where CUDA is at hand; on a GPU
machine it runs alone too:

    python3 tests/cuda_checks.py          # prints each check, exits non-zero on a failure

- graph replay equals the eager step: a server's batch of 1 to 64 sequences (padded to the
  capture sizes, eagerly too, so both multiply the same shapes), greedy and seeded, on a Gemma 3
  with windows shorter than the lengths, at lengths that cross the kernel's split edges;
- the device sampler draws the host sampler's tokens (sampling_cases.py's rows and settings);
- the captured step makes no host round trip: torch's sync debug mode set to error around a
  replay.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from sampling_cases import SETTINGS, logits_rows  # noqa: E402
from tiny import make_model  # noqa: E402

from inferno.backends import create_backend  # noqa: E402
from inferno.backends.torch import sampling as device_sampling  # noqa: E402
from inferno.backends.torch.graphs import DecodeGraphs  # noqa: E402
from inferno.engine import Engine  # noqa: E402
from inferno.loading.loader import open_checkpoint  # noqa: E402
from inferno.sampling import SamplingParams, sample  # noqa: E402
from inferno.serve.batch import BatchEngine  # noqa: E402


def graph_replay_equals_eager(folder: Path) -> None:
    real_init = DecodeGraphs.__init__

    def padded(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.pad = True
    DecodeGraphs.__init__ = padded
    try:
        out = {}
        for graphs in ("on", "eager"):
            eng = Engine(open_checkpoint(folder), create_backend("gpu", graphs=graphs), ctx_size=400)
            with BatchEngine(eng, parallel=64, ctx_size=400) as batch:
                assert batch.slots.runner().captured == (graphs == "on")
                for n in (1, 3, 17, 64):
                    opts = [eng.options(max_tokens=40, temperature=t, seed=i) for i, t in enumerate([0, 1.0] * 32)][:n]
                    handles = [batch.submit(eng.encode_prompt("x " * (3 + 5 * i)), o) for i, o in enumerate(opts)]
                    out[graphs, n] = [[t for e in h for t in e.token_ids] for h in handles]
            eng.close()
        for n in (1, 3, 17, 64):
            assert out["on", n] == out["eager", n], n
    finally:
        DecodeGraphs.__init__ = real_init


def device_sampling_equals_host() -> None:
    vocab, rng = 4000, np.random.default_rng(5)
    rows = logits_rows(rng, 3, vocab)
    for settings in SETTINGS:
        params = SamplingParams(**settings)
        for seed in range(20):
            want = [sample(x, params, np.random.default_rng(seed), [1, 2, 3]) for x in rows]
            draws = [np.random.default_rng(seed).random() if params.temperature > 0 else 0.0 for _ in rows]
            b = len(rows)
            seen = torch.zeros(b, vocab, dtype=torch.bool, device="cuda")
            seen[:, 1:4] = True
            col = lambda v, dt=torch.float64: torch.full((b,), v, dtype=dt, device="cuda")  # noqa: E731
            got = device_sampling.choose(torch.from_numpy(rows).cuda(), seen, col(params.repeat_penalty),
                                         col(params.temperature), col(params.top_k, torch.int64),
                                         col(params.top_p), col(params.min_p), torch.tensor(draws, device="cuda"))
            assert got.tolist() == want, (settings, seed, got.tolist(), want)


def replay_reads_nothing_on_the_host(folder: Path) -> None:
    eng = Engine(open_checkpoint(folder), create_backend("gpu", graphs="on"))
    eng.generate("hello", max_tokens=4, temperature=1.0, seed=1)
    runner = eng._solo.runner()
    assert runner.captured, "the step was not captured"
    graph = runner.graphs[(1, False)][0]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        graph.replay()  # a sync inside would raise; the replay itself must not either
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def main() -> int:
    if not torch.cuda.is_available():
        print("cuda_checks: no CUDA GPU here", file=sys.stderr)
        return 2
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        gemma = make_model(Path(tmp) / "gemma", "gemma3", hidden=64, heads=4, kv_heads=1, head_dim=40,
                           layers=3, tied=True, sliding_window=6, query_pre_attn_scalar=32,
                           layer_types=["sliding_attention", "full_attention", "sliding_attention"])
        for name, check in [("graph replay equals eager", lambda: graph_replay_equals_eager(gemma)),
                            ("device sampling equals host", device_sampling_equals_host),
                            ("replay reads nothing on the host", lambda: replay_reads_nothing_on_the_host(gemma))]:
            try:
                check()
                print(f"ok: {name}")
            except Exception as e:  # report every check, then fail
                failed += 1
                print(f"FAILED: {name}: {type(e).__name__}: {e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
