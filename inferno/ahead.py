"""The first reply on a machine that has not compiled inferno's kernels yet, sooner: the load
compiles what that reply takes, a helper process the rest.

A load of a model on simd or pool warms up every path a generation can take, so that no reply
ever waits on a compile (Engine.warm_up). From an empty kernel cache that was every kernel
family at once, before the first answer. Now, until this model's kernels are all cached:
- the load starts a helper process (`python -m inferno.helper`) with the load's own arguments
  (a Plan); it compiles the decode step's kernels first, on the second core, while the load
  compiles those of a prompt's prefill on the first; then, at a lower priority, every other
  path (a chat's next turn first, then batched steps, long prompts and contexts), into the
  same cache;
- the load then runs one decode step: its kernels are in the cache by then, or the helper is
  compiling them and the load waits for that kernel alone (jitcache._waited_for_helper)
  rather than compiling it a second time;
- a later path the helper has not reached yet compiles where it is first taken, before the
  reply's first token (or waits for the helper, if the helper is on it).
When the helper is done it leaves a mark (`rest`); a later load of the same plan sees it and
warms up the first reply's paths only: the other kernels load from the cache when first taken
(milliseconds: loads, not compiles). If those two paths compiled anyway (the cache emptied by
hand), the marks go and a helper starts again.

The load warms up every path itself, with no helper, where INFERNO_COMPILE_AHEAD=0 (as
`inferno warmup` does, which marks the plan done for later loads), where there are no POSIX
file locks, where a helper cannot start or the memory available would not hold the model's
files twice (the helper loads the model too), and after a helper of the plan failed (its log,
beside the marks in the kernel folder's ahead/, says why).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

PARTS = ("decode", "rest")  # what the helper compiles, in that order, each marked when done


def enabled() -> bool:
    """Whether a load may start a helper: not with INFERNO_COMPILE_AHEAD=0, nor without POSIX
    file locks (the helpers' lock and the kernel cache's)."""
    try:
        import fcntl  # noqa: F401
    except ImportError:
        return False
    return os.environ.get("INFERNO_COMPILE_AHEAD", "1") != "0"


def load_warm_up(engine, plan: "Plan | None") -> None:
    """Engine._load_warm_up for a backend whose kernels compile into a cache other processes
    share (the module docstring says how)."""
    from inferno.backends.numba import jitcache

    def every_path_here() -> None:
        engine.warm_up("rest")
        if plan is not None:
            for part in PARTS:
                plan.mark(part)

    if plan is None or plan.folder() is None or not enabled() or plan.failed():
        every_path_here()  # (and, for a failed helper, no second try)
        return
    if plan.ready("rest"):
        before = jitcache.misses()
        engine.warm_up("prefill")
        engine.warm_up("decode")
        if jitcache.misses() == before:
            return
        plan.clear()  # marked, yet compiled: the kernels went (a cache emptied by hand)
    engine.helper = plan.start_helper()
    if engine.helper is None and not plan.helper_running():
        every_path_here()  # no helper could start (see start_helper)
        return
    if engine.helper is not None:
        print(f"note: a helper process (pid {engine.helper.pid}) compiles the kernels of the other paths "
              f"(long contexts, batched steps, a chat's next turn) for later replies", file=sys.stderr, flush=True)
    engine.warm_up("prefill")
    engine.warm_up("decode")


class Plan:
    """A load's arguments, as a helper repeats them (JSON), and where its marks go."""

    def __init__(self, model: str, backend: str, **options):
        self.args = dict(model=model, backend=backend, **{k: v for k, v in options.items() if v is not None})
        text = json.dumps(self.args, sort_keys=True)  # a TypeError for anything a helper cannot repeat
        self.key = hashlib.sha256(text.encode()).hexdigest()[:16]

    @staticmethod
    def folder() -> Path | None:
        """The marks' folder: beside the kernels of these sources (a change of any kernel
        source starts a new folder, and the marks with it); None where the kernels are kept
        by Numba's own keying (NUMBA_CACHE_DIR), which the marks could not follow."""
        from inferno.backends.numba import jitcache
        return None if jitcache.CACHE_FOLDER is None else jitcache.CACHE_FOLDER / "ahead"

    def mark_path(self, part: str) -> Path | None:
        folder = self.folder()
        return None if folder is None else folder / f"{self.key}.{part}"

    def ready(self, part: str) -> bool:
        path = self.mark_path(part)
        return path is not None and path.exists()

    def mark(self, part: str) -> None:
        path = self.mark_path(part)
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(self.args))
                if part == PARTS[-1]:
                    self.mark_path("failed").unlink(missing_ok=True)
            except OSError:
                pass

    def failed(self) -> bool:
        """Whether a helper of this plan failed (its log beside the marks says why)."""
        return self.ready("failed")

    def clear(self) -> None:
        for part in PARTS:
            path = self.mark_path(part)
            if path is not None:
                path.unlink(missing_ok=True)

    def helper_running(self) -> bool:
        folder = self.folder()
        return folder is not None and _locked(folder / f"{self.key}.lock")

    def _fits_twice(self) -> bool:
        """Whether the memory available holds the model's files a second time (the helper loads
        the model too): where it may not, no helper starts and the load warms up every path."""
        try:
            path = Path(self.args["model"])
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size
            meminfo = Path("/proc/meminfo").read_text()
        except OSError:
            return True  # no figures (a hub id still to resolve, no /proc): assume it does
        available = next((int(line.split()[1]) * 1024 for line in meminfo.splitlines()
                          if line.startswith("MemAvailable:")), None)
        return available is None or 2 * size < available

    def start_helper(self) -> subprocess.Popen | None:
        """The helper process, in a session of its own (it outlives a one-shot generate, to
        finish the cache); None where one already works on this plan (its lock) or none can
        start. Its output goes to a log beside the marks."""
        folder = self.folder()
        if folder is None or not self._fits_twice():
            return None
        here = str(Path(__file__).resolve().parents[1])  # the helper imports this very package
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (here, os.environ.get("PYTHONPATH"))))}
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if self.helper_running():
                return None
            with open(folder / f"{self.key}.log", "ab") as log:
                helper = subprocess.Popen([sys.executable, "-m", "inferno.helper", json.dumps(self.args)],
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                          start_new_session=True)
        except OSError:
            return None
        threading.Thread(target=helper.wait, name="inferno-helper-reaper", daemon=True).start()
        return helper


def _locked(path: Path) -> bool:
    """Whether another process holds the lock at `path` (a helper at work)."""
    import fcntl
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False
