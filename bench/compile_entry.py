"""How long a kind's linear entries take to compile from an empty kernel cache: the serial
driver (simd's, `qkernels.linear_for`) and the parallel one (pool's, `linear_par_for`), each
called once on one activation row, in a fresh process with a fresh kernel folder.

    python bench/compile_entry.py -t Q4_K,Q4_1 -r 2
    python bench/compile_entry.py -t Q4_K --base /tmp/b/base   # before/after, alternating
    python bench/compile_entry.py --many Q4_K+Q4_K+Q6_K,Q6_K+Q4_K+Q4_K   # pool's linear_many entries, in turn

`--many` times pool's one launch over three weights (linear_many_par_for) for each group of
kinds, one after another in the one process: the first compiles its kinds' kernels, a later
one over kernels already compiled pays for its entry alone.

`--base` names another checkout of inferno (a worktree of an earlier commit): each round times
it and this one, one after the other, so both see the same machine. Compile times on these
shared hosts swing by 10% and more between runs: compare within rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from inferno.backends.numba.codes import WeightKind

HERE = Path(__file__).resolve().parents[1]

_ONE = r"""
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[2])
from qblocks import random_blocks
from inferno.backends.numba import qkernels as Q
from inferno.backends.numba.codes import WeightKind
got = {}
for name in sys.argv[1].split(","):
    w = random_blocks(name, 64, 512).data
    x = np.random.default_rng(0).standard_normal((1, 512)).astype(np.float32)
    out = np.zeros((1, 64), np.float32)
    t = time.perf_counter()
    Q.linear_for(WeightKind[name])(w, x, out, 64, 1, True)
    serial = time.perf_counter() - t
    t = time.perf_counter()
    Q.linear_par_for(WeightKind[name])(w, x, out, 64, 2, 1, True)
    got[name] = (serial, time.perf_counter() - t)
print(json.dumps(got))
"""

_MANY = r"""
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[2])
from qblocks import random_blocks
from inferno.backends.numba import qkernels as Q
from inferno.backends.numba.codes import WeightKind
got = {}
for group in sys.argv[1].split(","):
    kinds = group.split("+")
    ws = tuple(random_blocks(k, 64, 512).data for k in kinds)
    x = np.random.default_rng(0).standard_normal((1, 512)).astype(np.float32)
    out = np.zeros((1, 64 * len(kinds)), np.float32)
    t = time.perf_counter()
    Q.linear_many_par_for(*(WeightKind[k] for k in kinds))(ws, x, out, 2, 1)
    got[group] = time.perf_counter() - t
print(json.dumps(got))
"""


def cold(tree: Path, kinds: str, script: str = _ONE) -> dict:
    """What `script` prints, run by `tree`'s inferno on an empty kernel folder: {kind: (serial s,
    parallel s)} for _ONE, {group: s} for _MANY."""
    with tempfile.TemporaryDirectory(prefix="inferno-kernels-") as folder:
        env = dict(os.environ, INFERNO_KERNELS=folder, PYTHONPATH=str(tree))
        # (in the tree: `-c` puts the working folder before PYTHONPATH, and run from another
        # checkout it imported that checkout's inferno)
        run = subprocess.run([sys.executable, "-c", script, kinds, str(HERE / "tests")], env=env,
                             capture_output=True, text=True, check=True, cwd=tree)
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-t", "--types", default="Q4_K,Q4_1", help="weight kinds, comma-separated")
    ap.add_argument("-r", "--rounds", type=int, default=1)
    ap.add_argument("--base", type=Path, help="another checkout to time in each round first")
    ap.add_argument("--many", help="groups of three kinds joined by +, comma-separated: pool's linear_many "
                    "entries, timed in turn (instead of -t)")
    args = ap.parse_args()
    if args.many and any(len(g.split("+")) != 3 or not all(k in WeightKind.__members__ for k in g.split("+"))
                         for g in args.many.split(",")):
        ap.error(f"--many {args.many}: each group is three weight kinds joined by +, "
                 f"of {', '.join(WeightKind.__members__)}")
    if args.base and not (args.base / "inferno" / "__init__.py").is_file():
        ap.error(f"--base {args.base}: no checkout of inferno there (no inferno/__init__.py)")
    trees = ([("base", args.base)] if args.base else []) + [("this", HERE)]
    for r in range(args.rounds):
        for label, tree in trees:
            if args.many:
                got = cold(tree, args.many, _MANY)
                row = " | ".join(f"{k} {s:.1f} s" for k, s in got.items())
            else:
                got = cold(tree, args.types)
                row = " | ".join(f"{k} {s:.1f} s, parallel {p:.1f} s" for k, (s, p) in got.items())
            print(f"round {r + 1} {label}: {row}", flush=True)


if __name__ == "__main__":
    main()
