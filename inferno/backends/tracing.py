"""`trace`: wraps any backend, counts calls and wall time per op, prints a histogram.

Only calls the model makes through the wrapper are counted: an op that a backend implements
with its own ops (the materialized attention, say) shows up once, under its own name, so the
histogram reads as the model's view of where time goes. Each timed call is bracketed by device
synchronisation, otherwise an asynchronous GPU op would look free and the next one expensive.
"""

from __future__ import annotations

import time
from collections import defaultdict

from inferno.backends.base import OPS, Backend


class TracingBackend:
    """A transparent proxy: the wrapped backend's ops, timed."""

    def __init__(self, inner: Backend):
        self.inner = inner
        self.name = inner.name
        self.calls: dict[str, int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)
        for op in OPS:
            setattr(self, op, self._timed(op, getattr(inner, op)))

    def _timed(self, op, fn):
        sync, clock = self.inner.synchronize, time.perf_counter
        calls, seconds = self.calls, self.seconds

        def timed(*args, **kwargs):
            sync()
            t0 = clock()
            out = fn(*args, **kwargs)
            sync()
            seconds[op] += clock() - t0
            calls[op] += 1
            return out

        timed.__name__ = op
        return timed

    device_step = False

    def decode_graphs(self, *args, **kwargs):
        """None: a traced run decodes op by op, so that every op is timed and counted (a
        captured step would show as one opaque replay, and the tracer's synchronisation
        cannot be captured)."""
        return None

    def __getattr__(self, attr):
        # Everything that is not an op (from_numpy, weight, zeros, ...) passes straight through.
        return getattr(self.inner, attr)

    def reset(self) -> None:
        self.calls.clear()
        self.seconds.clear()

    def histogram(self) -> list[tuple[str, int, float, float]]:
        """(op, calls, total ms, share of traced time), slowest first."""
        total = sum(self.seconds.values()) or 1.0
        rows = [(op, self.calls[op], self.seconds[op] * 1e3, self.seconds[op] / total)
                for op in self.calls]
        return sorted(rows, key=lambda r: -r[2])

    def format_histogram(self) -> str:
        rows = self.histogram()
        total_ms = sum(r[2] for r in rows)
        width = max([len(r[0]) for r in rows] + [len("op")])
        lines = [f"trace ({self.inner.name} backend): {sum(r[1] for r in rows)} calls, "
                 f"{total_ms:.1f} ms in ops",
                 f"{'op':<{width}}  {'calls':>7}  {'total ms':>10}  {'share':>6}"]
        for op, calls, ms, share in rows:
            bar = "#" * max(1, round(share * 30)) if share > 0 else ""
            lines.append(f"{op:<{width}}  {calls:>7}  {ms:>10.2f}  {share:>6.1%}  {bar}")
        return "\n".join(lines)
