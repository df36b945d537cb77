"""How much of this process's cores other processes are taking, read from the kernel's counters.

pool's workers spin between launches and every parallel launch waits for all of them: when
another process keeps one of the cores busy, the OS deschedules a worker and each launch waits
out a time slice for it. Decode then collapses (SmolLM2 on 2 cores: 1-57 tokens/s instead of
~150 on one thread). So pool asks, once a step at most every `interval` seconds, how busy the
cores it may run on are with work that is not its own, and uses only the cores left free.

Linux's /proc/stat gives each CPU's busy time (user, nice, system, irq, softirq, steal: a vCPU's
time taken by the host counts too); the process's own CPU time, all its threads together,
includes pool's spinning workers, so it is subtracted. Elsewhere (no /proc/stat) nothing is
measured and every core stays in use.
"""

from __future__ import annotations

import os
import time

_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system (idle iowait) irq softirq steal
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpus() -> set[int]:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def busy_seconds(cpus: set[int], path: str = "/proc/stat") -> float | None:
    """Seconds the given CPUs have spent busy since boot, all processes; None where unknown."""
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except OSError:
        return None
    total = 0
    for line in lines:
        if line.startswith(b"cpu") and line[3:4].isdigit():
            name, *fields = line.split()
            if int(name[3:]) in cpus:
                total += sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields))
    return total / _TICKS


class Contention:
    """Free cores for `threads` workers, from other processes' load over the last interval.

    Cores go back one at a time and come away one at a time, with hysteresis: a core is taken
    away when others use at least `away` of one, given back when they use under `back`."""

    def __init__(self, threads: int, *, interval: float = 0.1, away: float = 0.6, back: float = 0.3,
                 clock=time.monotonic, cpu=time.process_time, busy=None):
        self.threads, self.interval, self.away, self.back = threads, interval, away, back
        self.clock, self.cpu = clock, cpu
        cpus = _cpus()
        self.busy = busy or (lambda: busy_seconds(cpus))
        self.free = threads
        self.others = 0.0  # cores' worth of other processes' work, over the last interval
        self._last = self._sample()

    def _sample(self):
        return self.clock(), self.cpu(), self.busy()

    def update(self) -> int:
        """The cores to use now (between 1 and threads); cheap when called more often than
        `interval` (one clock read)."""
        now = self.clock()
        if now - self._last[0] < self.interval:
            return self.free
        sample = self._sample()
        (t0, cpu0, busy0), (t1, cpu1, busy1) = self._last, sample
        self._last = sample
        if busy0 is None or busy1 is None or t1 <= t0:
            return self.free
        self.others = max(0.0, (busy1 - busy0) - (cpu1 - cpu0)) / (t1 - t0)
        # The cores others hold, whole, judged with hysteresis around the current choice.
        taken = self.threads - self.free
        if self.others >= taken + self.away:
            taken += 1
        elif taken and self.others < taken - 1 + self.back:
            taken -= 1
        self.free = max(1, self.threads - taken)
        return self.free
