"""The helper process of ahead.py: `python -m inferno.helper '<the load's arguments, JSON>'`.

It takes its plan's lock (or leaves: another helper works on the plan), loads the model as the
plan says without a warm-up, then warms up and marks each part of ahead.PARTS in turn: the
decode step first, then, at a lower priority, every other path. A failure marks the plan
failed, so that later loads warm up every path themselves rather than start another helper.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time

from inferno.ahead import PARTS, Plan
from inferno.backends.numba import jitcache
from inferno.engine import load


def main(argv: list[str]) -> int:
    args = json.loads(argv[0])
    plan = Plan(**args)
    folder = plan.folder()
    if folder is None:
        return 0
    folder.mkdir(parents=True, exist_ok=True)
    lock = open(folder / f"{plan.key}.lock", "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another helper works on it
    lock.truncate(0)
    lock.write(str(os.getpid()))  # who holds it
    lock.flush()
    jitcache.announce_compiles()
    t0 = time.perf_counter()
    try:
        engine = load(args.pop("model"), args.pop("backend"), progress=False, warm_up=False, **args)
        try:
            for part in PARTS:
                if not plan.ready(part):
                    engine.warm_up(part)
                    plan.mark(part)
                print(f"{time.strftime('%H:%M:%S')} {engine.source} on {engine.backend}: {part} ready, "
                      f"{time.perf_counter() - t0:.1f} s", flush=True)
                if part == "decode":
                    os.nice(10)  # the rest yields to the replies the user is reading
        finally:
            engine.close()
    except BaseException:
        plan.mark("failed")  # later loads warm up every path themselves, with no helper
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
