"""The legacy kinds' one-row matvec (ldot.l_rows for one activation row: a decode step's, an
expert's for its one token) through the backends' own entry, on one thread and on the team:

    python bench/one_row.py                          # MXFP4, MXFP4X16, Q4_0, Q4_1, Q8_0
    python bench/one_row.py -t MXFP4 -r 200 --rows 40000
    python bench/one_row.py -B 2,4,8                 # a few activation rows (l_rows' few-row loops)
    PYTHONPATH=/path/to/other/tree python bench/one_row.py   # a before/after, one sitting each

Random blocks (tests/qblocks.py), [rows, 2880] (gpt-oss-20b's width): 2880 rows (4.9 MB of
MXFP4: in L3 here) and --rows more (from DRAM). MXFP4X16 is the same MXFP4 blocks repacked into
panels of sixteen rows (lpanels.py), as the backends keep a mixture's experts. Medians of -r calls, in Gw/s (weights times
activation rows multiplied a second) and GB/s (the weight's bytes read a second).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from qblocks import random_blocks  # noqa: E402

from inferno.backends.numba import lpanels, qkernels  # noqa: E402
from inferno.backends.numba.codes import WeightKind  # noqa: E402
from inferno.backends.numba.dispatch import LEGACY_FEW  # noqa: E402
from inferno.backends.numba.ldot import LEGACY_KINDS  # noqa: E402


def timed(call, repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-t", "--types", default="MXFP4,MXFP4X16,Q4_0,Q4_1,Q8_0")
    p.add_argument("-r", "--repeats", type=int, default=100)
    p.add_argument("--cols", type=int, default=2880)
    p.add_argument("--rows", type=int, default=40000, help="the shape read from DRAM")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("-B", "--batch", default="1", help="activation rows, comma-separated (up to 8: l_rows)")
    args = p.parse_args()
    legacy = sorted(k.name for k in LEGACY_KINDS)
    unknown = [t for t in args.types.split(",") if t not in legacy]
    if unknown:
        p.error(f"-t {unknown[0]!r}: not a legacy kind l_rows takes; one of {', '.join(legacy)}")
    if any(not 1 <= int(b) <= LEGACY_FEW for b in args.batch.split(",")):
        p.error(f"-B {args.batch!r}: l_rows takes 1 to {LEGACY_FEW} activation rows (more go through lgemm)")
    print("| type | rows | activation rows | threads | ms | Gw/s | GB/s |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.types.split(","):
        kind = int(WeightKind[name])
        for rows in (args.cols, args.rows):
            w = random_blocks(name.replace("X16", ""), rows, args.cols, extremes=False)
            w = (lpanels.repack(w) if name.endswith("X16") else w).data
            for B in map(int, args.batch.split(",")):
                x = np.random.default_rng(0).standard_normal((B, args.cols)).astype(np.float32)
                out = np.empty((B, rows), np.float32)
                for threads in (1, args.threads):
                    entry = qkernels._path_entry(qkernels.LEGACY_ROW, kind, threads > 1)
                    call = (lambda: entry(w, x, out, threads)) if threads > 1 else (lambda: entry(w, x, out))
                    t = timed(call, args.repeats)
                    print(f"| {name} | {rows} | {B} | {threads} | {t * 1e3:.3f} | {B * rows * args.cols / t / 1e9:.1f} "
                          f"| {w.nbytes / t / 1e9:.1f} |", flush=True)


if __name__ == "__main__":
    main()
