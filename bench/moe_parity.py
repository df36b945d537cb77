"""Mixtures of experts against llama.cpp on the same GGUF: tiny random Qwen3-MoE and Mixtral
models (and a dense Qwen3 of the same size, the baseline), quantized by llama.cpp's own
quantizer, their logits from llama.cpp's library and from inferno.

    python bench/moe_parity.py                     # F32, Q8_0 and Q4_K_M; pool and simd
    python bench/moe_parity.py --types q4_k_m -n 64 --families qwen3moe

Each model is written as transformers' save_pretrained writes it (tests/tiny.py), then as a
F32 GGUF the way llama.cpp's converter lays one out (tests/tiny_gguf.py: the gguf package's
writer, experts stacked [n_expert, out, in]), then requantised with llama-quantize
(bench/quantize.py). Every layer has experts (llama.cpp's qwen3moe has no dense layers), every
matrix's rows are 256 wide (whole K-quant super-blocks), and the top-k weights are renormalised
(llama.cpp always renormalises these two families).

llama.cpp's logits come from bench/llama_logits.c, compiled here against the vendored build of
../shared/bin/llama-server.sh: one llama_decode over all the ids, every position's logits, and
each MoE layer's chosen experts (its "ffn_moe_topk" tensors). Both engines read the same blocks;
what separates them is arithmetic (llama.cpp multiplies K-quants with int8 activations too, in
its own order) and, rarely, a router near-tie that a rounding tips the other way (a flip changes
that token's output, and a little every later one that attends to it). So each line says how
many of the layers' routing choices the engines made differently, the inferno router's margin
at each (the probability of the last expert taken less that of the first left, against the
median margin), and the figures again over the positions routed alike in every layer; the
verdict is taken there. Beside them, llama.cpp against itself (the same file token by token,
its decode kernels, against its one batch) shows how far its own two paths are apart, near-ties
included. Reported per file and backend: max |difference| over max |logit| (the issue's target:
2e-2) and top-1 agreement (97%); the dense baseline says how far apart the two engines are on
the same kind of random model without any routing. The weights are N(0, 0.02) by default, as
transformers initialises a model; at 0.05 every layer moves its input more, and the differences
(the dense baseline's too) grow past the target (bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # tiny.py, tiny_gguf.py
sys.path.insert(0, str(HERE))  # quantize.py

FAMILIES = {
    "qwen3": dict(arch="qwen3", hidden=256, heads=4, kv_heads=2, head_dim=64, layers=4, intermediate=256),
    "qwen3moe": dict(arch="qwen3_moe", hidden=256, heads=4, kv_heads=2, head_dim=64, layers=4,
                     intermediate=256, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
                     norm_topk_prob=True),
    "mixtral": dict(arch="mixtral", hidden=256, heads=4, kv_heads=2, layers=4, intermediate=256,
                    num_local_experts=4, num_experts_per_tok=2),
}


def llama_home() -> Path:
    ver = os.environ.get("LLAMA_CPP_PYTHON", "0.3.36")
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / f"llama.cpp-vendored-{ver}"


def build_helper(work: Path) -> Path:
    home = llama_home()
    lib = home / "build" / "bin"
    if not (lib / "libllama.so").exists():
        raise SystemExit(f"no llama.cpp build at {home}: run ../shared/bin/llama-server.sh first")
    exe = work / "llama_logits"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(HERE / "llama_logits.c"), f"-I{home / 'include'}",
                    f"-I{home / 'ggml' / 'include'}", f"-L{lib}", "-lllama", f"-Wl,-rpath,{lib}"], check=True)
    return exe


def llama_logits(exe: Path, model: Path, ids: list[int], work: Path) -> tuple[np.ndarray, list[np.ndarray]]:
    """llama.cpp's logits [len(ids), vocab], and its routing: each MoE layer's chosen experts
    [len(ids), top_k], in layer order (none for a dense model)."""
    out, route = work / "logits.f32", work / "routing.i32"
    env = dict(os.environ, LLAMA_ROUTING=str(route))
    subprocess.run([str(exe), str(model), str(out), *map(str, ids)], check=True, capture_output=True, env=env)
    raw, layers = np.fromfile(route, dtype=np.int32), {}
    while raw.size:  # one record a layer and micro-batch, in the order computed
        layer, used, tokens = raw[:3]
        layers.setdefault(int(layer), []).append(raw[3:3 + used * tokens].reshape(tokens, used))
        raw = raw[3 + used * tokens:]
    return (np.fromfile(out, dtype=np.float32).reshape(len(ids), -1),
            [np.concatenate(layers[k]) for k in sorted(layers)])


def inferno_logits(path: Path, backend: str, ids: list[int]) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """inferno's logits, and its routing as it decides it (one call a MoE layer for the whole
    sequence: base.ExpertPlan.route on cpu, experts.route on simd and pool): each layer's chosen
    experts [len(ids), top_k], and the margin of each choice, the softmax probability of the
    last expert taken less that of the first left."""
    import inferno
    from inferno.backends.base import ExpertPlan
    from inferno.backends.numba import experts

    chosen, margins = [], []

    def record(logits, top_k, picked):
        logits = np.asarray(logits, dtype=np.float64)
        z = np.exp(logits - logits.max(axis=1, keepdims=True))
        p = np.sort(z / z.sum(axis=1, keepdims=True), axis=1)[:, ::-1]
        chosen.append(np.array(picked))
        margins.append(p[:, top_k - 1] - p[:, top_k] if top_k < p.shape[1] else np.ones(len(p)))

    plan_route, fast_route = ExpertPlan.route.__func__, experts.route

    def reference(cls, logits, top_k, norm_topk):
        plan = plan_route(cls, logits, top_k, norm_topk)
        record(logits, top_k, plan.chosen)
        return plan

    def fast(logits, top_k, norm_topk):
        arrays = fast_route(logits, top_k, norm_topk)
        record(logits, top_k, arrays[1])
        return arrays

    ExpertPlan.route, experts.route = classmethod(reference), fast
    try:
        engine = inferno.load(str(path), backend=backend, progress=False)
        chosen.clear(), margins.clear()  # the load's warm-up routes too
        got = engine.logits(ids)
    finally:
        ExpertPlan.route, experts.route = classmethod(plan_route), fast_route
    return got, chosen, margins


def routing_flips(ours: list[np.ndarray], theirs: list[np.ndarray]) -> np.ndarray:
    """[layers, tokens] True where the two engines chose different sets of experts."""
    if len(ours) != len(theirs):
        raise SystemExit(f"routing of {len(ours)} layers against llama.cpp's {len(theirs)}")
    return np.array([[set(a) != set(b) for a, b in zip(o, t)] for o, t in zip(ours, theirs)], dtype=bool)


def main(argv=None) -> int:
    from quantize import quantize
    from tiny import make_model
    from tiny_gguf import write_gguf

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--types", default="f32,q8_0,q4_k_m", help="f32: the converter's file as it is")
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--backends", default="pool,simd")
    p.add_argument("-n", type=int, default=48, help="tokens in the sequence")
    p.add_argument("--init-std", type=float, default=0.02,
                   help="the random weights' spread (0.02: transformers' initializer_range)")
    args = p.parse_args(argv)
    ids = list(np.random.default_rng(0).integers(5, 300, args.n))
    worst = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        exe = build_helper(work)
        print(f"{'family':<9} {'type':<7} {'backend':<7} {'max|d|/max|l|':>14} {'top-1':>6}")
        for family in args.families.split(","):
            folder = make_model(work / family, **FAMILIES[family], init_std=args.init_std)
            f32 = write_gguf(folder, work / f"{family}.f32.gguf", pre="qwen2")
            for qtype in args.types.split(","):
                path = f32 if qtype == "f32" else quantize(f32, work / f"{family}.{qtype}.gguf", qtype)
                want, their_route = llama_logits(exe, path, ids, work)
                os.environ["LLAMA_UBATCH"] = "1"  # llama.cpp against itself: token by token
                try:
                    own, own_route = llama_logits(exe, path, ids, work)
                finally:
                    del os.environ["LLAMA_UBATCH"]
                line = (f"{family:<9} {qtype:<7} {'(llama.cpp token by token)':<28} "
                        f"{float(np.abs(own - want).max() / np.abs(want).max()):.2e} "
                        f"{float((own.argmax(-1) == want.argmax(-1)).mean()):.1%}")
                if their_route:
                    line += f", {int(routing_flips(own_route, their_route).sum())} routing choices differ"
                print(line)
                for backend in args.backends.split(","):
                    got, our_route, margins = inferno_logits(path, backend, ids)
                    rel = float(np.abs(got - want).max() / np.abs(want).max())
                    top1 = float((got.argmax(-1) == want.argmax(-1)).mean())
                    flips = routing_flips(our_route, their_route)
                    alike = ~flips.any(axis=0)  # positions routed alike in every layer
                    rel_a = float(np.abs(got[alike] - want[alike]).max() / np.abs(want).max())
                    top1_a = float((got[alike].argmax(-1) == want[alike].argmax(-1)).mean())
                    worst.append((rel_a, top1_a))
                    line = f"{family:<9} {qtype:<7} {backend:<7} {rel:>14.2e} {top1:>6.1%}"
                    if our_route:
                        m = np.concatenate(margins)
                        flipped = np.array(margins)[flips]
                        line += (f"  {int(flips.sum())} of {flips.size} choices differ, at margins "
                                 f"{', '.join(f'{v:.0e}' for v in sorted(flipped)) or '-'} (median margin "
                                 f"{np.median(m):.0e}); the {int(alike.sum())} positions routed alike: "
                                 f"{rel_a:.2e} {top1_a:.1%}")
                    print(line)
    ok = all(rel <= 2e-2 and top1 >= 0.97 for rel, top1 in worst)
    print("within the targets (2e-2, 97%) where the engines routed alike" if ok else
          "OUTSIDE the targets (2e-2, 97%) where the engines routed alike")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
