"""pool under a busy machine: the thread team shrinks to the cores other processes leave free
(inferno/backends/contention.py), and the results do not depend on the team."""

from __future__ import annotations

import numpy as np

import inferno
from inferno.backends.numba.contention import Contention, busy_seconds


class Fake:
    """A clock, this process's CPU time and the cores' busy time, moved by hand."""

    def __init__(self):
        self.t = self.ours = self.busy = 0.0

    def run(self, seconds: float, ours: float, others: float) -> None:
        self.t += seconds
        self.ours += ours * seconds
        self.busy += (ours + others) * seconds


def monitor(threads=2, **kw):
    f = Fake()
    return f, Contention(threads, clock=lambda: f.t, cpu=lambda: f.ours, busy=lambda: f.busy, **kw)


def test_a_busy_core_leaves_the_team_and_comes_back():
    f, c = monitor()
    f.run(0.2, ours=2.0, others=0.0)  # our spinning workers are ours, not contention
    assert c.update() == 2
    f.run(0.2, ours=1.0, others=1.0)  # another process holds a core
    assert c.update() == 1 and abs(c.others - 1.0) < 1e-9
    f.run(0.2, ours=1.0, others=0.9)
    assert c.update() == 1  # still taken (hysteresis)
    f.run(0.2, ours=1.0, others=0.1)
    assert c.update() == 2


def test_half_a_core_is_not_contention_and_updates_wait_for_the_interval():
    f, c = monitor()
    f.run(0.2, ours=2.0, others=0.5)
    assert c.update() == 2
    f.run(0.05, ours=1.0, others=1.0)  # under the interval: no new reading
    assert c.update() == 2 and abs(c.others - 0.5) < 1e-9


def test_never_below_one_thread_and_more_cores():
    f, c = monitor(threads=8)
    f.run(0.2, ours=1.0, others=7.0)
    for _ in range(10):
        f.run(0.2, ours=1.0, others=7.0)
        c.update()
    assert c.free == 1
    f, c = monitor(threads=1)
    f.run(0.2, ours=1.0, others=1.0)
    assert c.update() == 1


def test_no_reading_keeps_every_core(tmp_path):
    f = Fake()
    c = Contention(2, clock=lambda: f.t, cpu=lambda: f.ours, busy=lambda: None)
    f.run(1.0, ours=1.0, others=1.0)
    assert c.update() == 2
    assert busy_seconds({0}, str(tmp_path / "missing")) is None


def test_proc_stat_is_read():
    assert busy_seconds({0}) > 0  # Linux, as CI is


def test_results_do_not_depend_on_the_team(qwen3_dir):
    """The jobs are cut as for every thread; only who runs them changes."""
    engine = inferno.load(qwen3_dir, backend="pool", threads=2, cache_type="f32", progress=False)
    ops = engine.ops
    ops.parallel_min_elements = ops.parallel_min_attention = 0  # every op launches
    ops.decode_min_keys = 4
    want = engine.generate("Once upon a time", max_tokens=12, temperature=0, logprobs=True)
    ops._contention = None
    ops.team = 1  # as a busy core would leave it
    got = engine.generate("Once upon a time", max_tokens=12, temperature=0, logprobs=True)
    assert got.token_ids == want.token_ids
    np.testing.assert_array_equal([lp.logprob for lp in got.logprobs], [lp.logprob for lp in want.logprobs])
    engine.close()
