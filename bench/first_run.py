"""A first run on an empty kernel cache, as a new user's: the time to the first answer, the
helper's progress (inferno/ahead.py), the same command again, then the later paths (a chat's
next turns, a long prompt, batched requests) in a fresh process, with the kernels each compiled.

    python bench/first_run.py                  # the default model on pool, one round
    python bench/first_run.py -r 3 --early     # three rounds; --early: the later paths also
                                               # at once, before the helper is done
    python bench/first_run.py --tree /tmp/b/base   # another checkout (a worktree of an earlier
                                               # commit), its own code in every process

Each round uses a new empty folder as INFERNO_KERNELS (the model itself must be fetched
already: `inferno pull smollm2-135m`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "What is the capital of France?"

LATER = """
import json, sys, time
import inferno
from inferno.backends.numba import jitcache
from inferno.sampling import SamplingParams
from inferno.serve import BatchEngine, Options

t0 = time.perf_counter()
engine = inferno.load({model!r}, {backend!r}, progress=False)
out = {{"load_s": round(time.perf_counter() - t0, 2), "compiled_at_load": jitcache.misses()}}
# a chat's turns; a base model's (no chat template) as a transcript it continues
chat = bool(engine.tokenizer.chat_template)
session = inferno.Session()
history = [{{"role": "user", "content": {prompt!r}}}] if chat else "Q: " + {prompt!r} + "\\nA:"
for i, turn in enumerate(("And of Italy?", "And of Spain?")):
    before = jitcache.misses()
    r = engine.generate(history, session=session, max_tokens=24, temperature=0)
    out[f"turn {{i + 1}}"] = dict(ttft_s=round(r.ttft_s, 3), compiled=jitcache.misses() - before)
    if chat:
        history += [{{"role": "assistant", "content": r.text}}, {{"role": "user", "content": turn}}]
    else:
        history += r.text + "\\nQ: " + turn + "\\nA:"
ids = engine.tokenizer.encode(open({readme!r}).read() * 3)[:3000]
before = jitcache.misses()
stream = engine.stream(prompt_ids=list(ids), max_tokens=200, temperature=0,
                       logit_bias={{e: -100.0 for e in engine.eos}})
for _ in stream:
    pass
r = stream.result
out["3000-token prompt, 200 tokens"] = dict(ttft_s=round(r.ttft_s, 2), decode_tok_s=round(r.decode_tokens_per_s, 1),
                                            compiled=jitcache.misses() - before)
before, t = jitcache.misses(), time.perf_counter()
with BatchEngine(engine, parallel=4, ctx_size=512, chunk=64) as batch:
    handles = [batch.submit(engine.encode_prompt("Tell me about " + w),
                            Options(max_tokens=32, sampling=SamplingParams(temperature=0)))
               for w in ("cats", "dogs", "the sea", "mountains")]
    for h in handles:
        list(h)
out["4 batched requests"] = dict(wall_s=round(time.perf_counter() - t, 2), compiled=jitcache.misses() - before)
print(json.dumps(out))
"""


def timed(cmd: list[str], env: dict, tree: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tree)
    if p.returncode != 0:
        sys.exit(p.stderr)
    return time.perf_counter() - t0, p.stderr


def later(model: str, backend: str, env: dict, tree: Path) -> dict:
    readme = str(Path(__file__).resolve().parents[1] / "README.md")
    script = LATER.format(model=model, backend=backend, prompt=PROMPT, readme=readme)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tree)
    if p.returncode != 0:
        sys.exit(p.stderr)
    return json.loads(p.stdout.splitlines()[-1])


def helper_log(folder: Path) -> list[str]:
    return [line for log in folder.glob("*/ahead/*.log") for line in log.read_text().splitlines() if " ready, " in line]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", "-m", default="smollm2-135m")
    ap.add_argument("--backend", "-b", default="pool")
    ap.add_argument("--rounds", "-r", type=int, default=1)
    ap.add_argument("--early", action="store_true", help="also run the later paths before the helper is done")
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1],
                    help="the checkout to run (default: this one)")
    args = ap.parse_args()
    # Its processes run in the tree, with it first on their path: `python -m` and `-c` put the
    # working folder before PYTHONPATH, so a tree named on PYTHONPATH alone, run from another
    # checkout, ran that checkout's code (bench/RESULTS.md, "Fewer layers").
    tree = args.tree.resolve()
    if not (tree / "inferno" / "__init__.py").is_file():
        ap.error(f"--tree {args.tree}: no checkout of inferno there (no inferno/__init__.py)")
    cmd = [sys.executable, "-m", "inferno", "generate", "-m", args.model, "-b", args.backend, "-t", "0",
           "--prompt", PROMPT]
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="inferno-kernels-") as kernels:
            env = {**os.environ, "INFERNO_KERNELS": kernels,
                   "PYTHONPATH": os.pathsep.join(filter(None, (str(tree), os.environ.get("PYTHONPATH"))))}
            wall, err = timed(cmd, env, tree)
            load = re.search(r"load: ([0-9.]+) s", err)
            print(f"round {r + 1}: first answer {wall:.1f} s wall (load {load.group(1) if load else '?'} s)")
            if args.early:
                print("  at once:", json.dumps(later(args.model, args.backend, env, tree)))
            while not list(Path(kernels).glob("*/ahead/*.rest")):
                time.sleep(0.5)
            for line in helper_log(Path(kernels)):
                print("  helper:", line.split(" on ", 1)[1])
            wall, _ = timed(cmd, env, tree)
            print(f"  the same command again: {wall:.2f} s wall")
            print("  later, fresh process:", json.dumps(later(args.model, args.backend, env, tree)))


if __name__ == "__main__":
    main()
