"""Decode tokens/s of one GGUF on pool under each way the Q4_K/Q6_K matvecs take activations,
interleaved in one process (so a noisy host moves them all alike):

    python bench/int8_modes.py ~/.cache/inferno/bench/qwen3-1.7b-shape.Q4_K_M.gguf -r 5

float32; one int8 row everywhere (ggml's Q8_K); the default (a remainder row for the weights the
decoder marks outlier_inputs: o_proj, down_proj); two rows everywhere. Each round decodes -n
tokens after a 4-token prompt, and prefills a -p-token prompt into an empty cache (int8 rows go
through Q4_K/Q6_K's prefill too); the table holds medians over rounds.

Q4_K matrices the backend repacked into panels at load (kpanels.py; pool does where it takes
int8 rows, the default on x86) were made for int8 rows and take them in every mode: on such a
file the float32 row is float32 for the other kinds only (and for a linear_many that holds no
panels). It says so when it runs.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import inferno
from inferno.backends.numba.kpanels import PanelTensor
from inferno.formats.quant import QuantTensor

MODES = ["float32", "one int8 row everywhere", "default (remainder row on o_proj, down_proj)",
         "two int8 rows everywhere"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("-r", "--rounds", type=int, default=3)
    p.add_argument("-n", "--tokens", type=int, default=32)
    p.add_argument("-p", "--prompt", type=int, default=512, help="prefill tokens (0: none)")
    args = p.parse_args()
    engine = inferno.load(args.model, backend="pool", progress=False)
    model, ops = engine.model, engine.ops
    mats = [m for layer in model.layers
            for m in (*layer.qkv, layer.o_proj, *layer.gate_up, layer.down_proj)] + [model.lm_head]
    mats = [m for m in mats if isinstance(m, QuantTensor)]
    marked = {id(m): m.outlier_inputs for m in mats}
    panels = sum(isinstance(m, PanelTensor) for m in mats)
    if panels:
        print(f"note: {panels} of {len(mats)} matrices are Q4_K panels: int8 rows in every mode")

    def use(mode: str) -> None:
        ops.int8_activations = mode != "float32"
        for m in mats:
            m.outlier_inputs = {MODES[1]: False, MODES[3]: True}.get(mode, marked[id(m)])

    def decode() -> float:
        cache = model.new_cache(args.tokens + 8)
        model.forward(np.arange(4), cache, last_only=True)
        t0 = time.perf_counter()
        for _ in range(args.tokens):
            ops.to_numpy(model.forward([7], cache, last_only=True))
        return args.tokens / (time.perf_counter() - t0)

    def prefill() -> float:
        cache = model.new_cache(args.prompt)
        t0 = time.perf_counter()
        ops.to_numpy(model.forward(np.arange(args.prompt) % 1000, cache, last_only=True))
        return args.prompt / (time.perf_counter() - t0)

    runs = {mode: [] for mode in MODES}
    fills = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            use(mode)
            runs[mode].append(decode())
            if args.prompt:
                fills[mode].append(prefill())
    base = np.median(runs["float32"])
    pbase = np.median(fills["float32"]) if args.prompt else float("nan")
    print(f"| activations | tg{args.tokens} tokens/s | vs float32 | pp{args.prompt} tokens/s | vs float32 |\n"
          "| --- | ---: | ---: | ---: | ---: |")
    for mode in MODES:
        pp = np.median(fills[mode]) if args.prompt else float("nan")
        print(f"| {mode} | {np.median(runs[mode]):.2f} | {np.median(runs[mode]) / base:.2f}x | {pp:.1f} | {pp / pbase:.2f}x |")
    engine.close()


if __name__ == "__main__":
    main()
