"""Functions Numba compiled more than once in one process, and the argument types that differ:
each extra specialisation is compile time for nothing when the two differ only by a literal
(`Literal[int](0)` where another caller passes an int64), a layout ('C' against 'A') or a
read-only flag. Run in a fresh process against an empty kernel folder (kernels loaded from the
cache are not compiled, so they do not show).

    python bench/compile_dups.py -t Q4_K,Q8_0           # each kind's linears, serial and parallel
    python bench/compile_dups.py -m smollm2-135m         # a model's load (its whole warm-up), pool and simd

A kind's workload is `run_kind`'s: its linears, linear_many and experts on simd and pool.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-t", "--types", default="", help="weight kinds, comma-separated (Q4_K,Q8_0)")
    ap.add_argument("-m", "--model", action="append", default=[], help="a model to load on pool and simd")
    ap.add_argument("--all", action="store_true", help="list every function compiled twice, not only those "
                    "whose specialisations differ by a literal, a layout or a read-only flag")
    args = ap.parse_args()
    os.environ["INFERNO_KERNELS"] = tempfile.mkdtemp(prefix="inferno-dups-")
    os.environ["INFERNO_COMPILE_AHEAD"] = "0"
    sys.path.insert(0, str(HERE))
    sys.path.insert(1, str(HERE / "tests"))

    from numba.core import event

    seen: dict[str, list[tuple]] = {}

    class Listener(event.Listener):
        def on_start(self, ev):
            pass

        def on_end(self, ev):
            f = ev.data["dispatcher"].py_func
            seen.setdefault(f"{f.__module__}.{f.__qualname__}", []).append(tuple(ev.data["args"]))

    event.register("numba:compile", Listener())
    for name in filter(None, args.types.split(",")):
        run_kind(name)
    for model in args.model:
        from inferno.engine import load
        from inferno.loading.resolve import resolve
        path = resolve(model)
        for backend in ("pool", "simd"):
            load(str(path), backend, progress=False).close()

    wasted = 0
    for name, sigs in sorted(seen.items()):
        if len(sigs) < 2:
            continue
        width = max(map(len, sigs))
        cols = [i for i in range(width) if len({str(s[i]) if i < len(s) else None for s in sigs}) > 1]
        differ = [[str(s[i]) if i < len(s) else "-" for i in cols] for s in sigs]
        trivial = bool(cols) and all(_trivial(col) for col in zip(*differ))
        if trivial or args.all:
            wasted += trivial
            print(f"{name}: {len(sigs)} specialisations{'' if trivial else ' (by design?)'}")
            for d in differ:
                print("    " + ", ".join(x[:60] for x in d))
    print(f"{wasted} functions compiled again for a literal, a layout or a read-only flag")


def _trivial(column) -> bool:
    """Whether one argument's types differ only in what changes no code worth a compile: a
    literal against its plain type, an array's layout or read-only flag. (Different literals, a
    kind's code or a kernel's in each, are specialisations on purpose.)"""
    literals = {c for c in column if c.startswith("Literal[")}
    if len(literals) > 1 or len(literals) == len(set(column)):
        return False
    plain = {re.sub(r"Literal\[(int|bool)\]\([^)]*\)", lambda m: "int64" if m[1] == "int" else "bool", c)
             .replace("'A'", "'C'").replace("True, aligned", "False, aligned").replace("readonly ", "") for c in column}
    return len(plain) == 1


def run_kind(name: str) -> None:
    """The kind's products as the op tests make them, on simd and on pool (two threads, and with
    every op a parallel launch): linear at 1, 3, 20 and 70 rows, linear_many over three such
    weights at 1 and 3, and a mixture of four experts of the kind at 1, 5 and 70 rows."""
    import numpy as np
    from qblocks import random_blocks

    from inferno.backends.numba.pool import PoolBackend
    from inferno.backends.numba.simd import SimdBackend
    eager = PoolBackend(threads=2)
    eager.parallel_min_elements = eager.parallel_min_attention = 0
    rng = np.random.default_rng(0)
    for backend in (SimdBackend(), PoolBackend(threads=2), eager):
        w = backend.weight(random_blocks(name, 64, 512, readonly=True))
        for rows in (1, 3, 20, 70):
            backend.linear(rng.standard_normal((rows, 512), dtype=np.float32), w)
        for rows in (1, 3):
            backend.linear_many(rng.standard_normal((rows, 512), dtype=np.float32), [w, w, w])
        router = rng.standard_normal((4, 256), dtype=np.float32)
        ws = [backend.weight(random_blocks(name, *shape, seed=i, extremes=False, readonly=True))
              for i, shape in enumerate(((4 * 256, 256), (4 * 256, 256), (4 * 256, 256)))]
        for rows in (1, 5, 70):
            x = rng.standard_normal((rows, 256), dtype=np.float32) * 0.01
            backend.moe(x, backend.weight(router), ws, 2, True)
        backend.close()


if __name__ == "__main__":
    main()
