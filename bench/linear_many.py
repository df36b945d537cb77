"""pool's linear_many (one launch over the weights that share an input, or one linear each past
dispatch.FEW_MAX rows): microseconds a call, the median of 7 timings of 30 calls, at each row
count, on random blocks (q/k/v of a 2048-wide model: Q4_K 2048, Q4_K 512, Q6_K 512 by default).

    python bench/linear_many.py
    PYTHONPATH=/tmp/base python bench/linear_many.py     # another checkout's inferno
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

from inferno.backends.numba.pool import PoolBackend  # noqa: E402
from inferno.formats.quant import QTYPES  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default="Q4_K:2048,Q4_K:512,Q6_K:512", help="kind:rows of each weight")
    ap.add_argument("--cols", type=int, default=2048)
    ap.add_argument("--rows", default="1,8,15,16", help="activation rows, comma-separated")
    args = ap.parse_args()
    specs = [s.split(":") for s in args.kinds.split(",")]
    if not all(len(p) == 2 and p[0] in QTYPES and p[1].isdigit() and int(p[1]) > 0 for p in specs):
        ap.error(f"--kinds {args.kinds}: each weight is kind:rows, a kind of {', '.join(QTYPES)}")
    if not all(r.isdigit() and int(r) > 0 for r in args.rows.split(",")):
        ap.error(f"--rows {args.rows}: positive whole numbers, comma-separated")
    if args.cols <= 0 or args.cols % 256:
        ap.error(f"--cols {args.cols}: a positive multiple of 256 (a K-quant's block)")
    backend = PoolBackend()
    ws = [random_blocks(k, int(n), args.cols) for k, n in specs]
    got = {}
    for rows in (int(r) for r in args.rows.split(",")):
        x = np.random.default_rng(0).standard_normal((rows, args.cols)).astype(np.float32)
        backend.linear_many(x, ws)  # compiled (or loaded) before timing
        times = []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(30):
                backend.linear_many(x, ws)
            times.append((time.perf_counter() - t) / 30)
        got[rows] = round(statistics.median(times) * 1e6, 1)
    print(" | ".join(f"{rows} rows {us} us" for rows, us in got.items()))


if __name__ == "__main__":
    main()
