"""`inferno bench`: throughput in the manner of llama-bench, one table for one model on one or
more backends.

    inferno bench -m smollm2-135m -b cpu,simd,pool -p 512 -n 128 -r 5

Tests, as llama-bench names them:
- ppN: prefill of a synthetic N-token prompt (random ids, fixed seed) into an empty cache, up to
  the first token picked from the last position's logits. tokens/s = N / that time, which is
  also the time to first token.
- tgN: N tokens decoded one at a time from an empty cache, each the argmax of the last. GB/s =
  weight bytes one decode step reads (engine.weight_bytes_per_token) x tokens/s.

Each test runs once to warm up (JIT compilation, caches, page faults), then `reps` times; the
table shows mean ± sample standard deviation. Every backend runs in a fresh process (spawned, not
forked: an OpenMP runtime does not survive a fork), so its peak memory is its own and no thread
pool or BLAS setting carries over to the next.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial

import numpy as np


@dataclass
class Row:
    """One line of the table: one test of one backend, every repetition kept."""

    model: str
    weight_type: str  # as llama-bench's `type`: Q4_1, Q4_K_M, BF16, F32
    backend: str
    threads: int | None
    flash: bool | None  # None: not ours to switch (a peer)
    test: str  # "pp512", "tg128"
    n_tokens: int
    seconds: list[float]  # one per repetition
    weight_bytes_per_token: int
    peak_memory_bytes: int
    load_s: float
    extra: dict = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> list[float]:
        return [self.n_tokens / s for s in self.seconds]

    @property
    def is_prefill(self) -> bool:
        return self.test.startswith("pp")

    def to_dict(self) -> dict:
        d = asdict(self)
        tps = self.tokens_per_s
        d.update(tokens_per_s_mean=_mean(tps), tokens_per_s_std=_std(tps))
        if self.is_prefill:
            d.update(ttft_ms_mean=_mean(self.seconds) * 1e3, ttft_ms_std=_std(self.seconds) * 1e3)
        else:
            d.update(decode_gb_per_s=self.weight_bytes_per_token * _mean(tps) / 1e9)
        return d


def _mean(xs) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def _std(xs) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def model_label(model) -> str:
    """A short name for the table: an alias or hub id as given, a path by its last part."""
    from pathlib import Path

    from inferno.loading.resolve import DEFAULT_MODEL
    if model is None:
        return DEFAULT_MODEL
    path = Path(str(model))
    if not path.exists():
        return str(model)
    return path.name.removesuffix(".gguf")


def synthetic_prompt(vocab_size: int, n: int, seed: int = 0) -> list[int]:
    """n random token ids, the same for every backend and repetition."""
    return np.random.default_rng(seed).integers(0, vocab_size, n).tolist()


class EngineRunner:
    """One of our backends behind the interface `measure` drives (peers implement it too):
    prefill(ids) and decode(first, n) return their own elapsed seconds, excluding set-up."""

    def __init__(self, model, backend: str, flash: bool = True, **options):
        from inferno.engine import load
        # Every path compiled in the load, none by a helper process behind the timings (ahead.py).
        os.environ["INFERNO_COMPILE_AHEAD"] = "0"
        self.engine = load(model, backend=backend, flash=flash, progress=False, **options)
        self.model_name = model_label(model)
        self.weight_type = self.engine.weight_type
        self.backend = backend
        self.flash = flash
        self.threads = getattr(self.engine.ops, "threads", None)
        self.vocab_size = self.engine.config.vocab_size
        self.first_token = self.engine.config.bos_token_id or 0
        self.weight_bytes_per_token = self.engine.weight_bytes_per_token
        self.load_s = self.engine.load_s

    # Both through the generation loop (Engine.generate), as a user's reply runs: the prompt cut
    # into passes by the scheduler, each step sampled, on a device backend the captured step.
    def prefill(self, ids: list[int]) -> float:
        """The prompt's passes and its first token's sample (the reply's time to first token)."""
        return self.engine.generate(None, prompt_ids=list(ids), max_tokens=1, temperature=0).ttft_s

    def decode(self, first: int, n: int, context: list[int] = ()) -> float:
        """n decode steps after `context` (the depth, prefilled untimed) and `first`: its decode_s
        counts the n steps after the token the prefill samples; EOS is banned so that every step
        runs."""
        ban = {int(e): -1e30 for e in self.engine.eos}
        r = self.engine.generate(None, prompt_ids=list(context) + [first], max_tokens=n + 1, temperature=0,
                                 logit_bias=ban)
        return r.decode_s

    def peak_memory_bytes(self) -> int:
        return self.engine.ops.peak_memory_bytes()

    def close(self) -> None:
        self.engine.close()


def measure(runner, n_prompts: list[int], n_gens: list[int], reps: int, seed: int = 0,
            log=None, depth: int = 0) -> list[Row]:
    """Warm up, then time each test `reps` times on `runner`. With `depth`, the tg tests decode
    after a synthetic context of that many tokens (llama-bench's `-d`): "tg128@d4000"."""
    results = []
    context = synthetic_prompt(runner.vocab_size, depth, seed + 1) if depth else []
    tests = [("pp", n) for n in n_prompts if n > 0] + [("tg", n) for n in n_gens if n > 0]
    for kind, n in tests:
        if kind == "pp":
            run, name = partial(runner.prefill, synthetic_prompt(runner.vocab_size, n, seed)), f"pp{n}"
        else:
            run = partial(runner.decode, runner.first_token, n, context)
            name = f"tg{n}" + (f"@d{depth}" if depth else "")
        if log:
            log(f"{runner.backend}: {name} warm-up + {reps} runs")
        run()
        seconds = [run() for _ in range(reps)]
        results.append([name, n, seconds])
    peak = runner.peak_memory_bytes()
    return [Row(model=runner.model_name, weight_type=runner.weight_type, backend=runner.backend,
                threads=runner.threads, flash=runner.flash, test=name, n_tokens=n, seconds=seconds,
                weight_bytes_per_token=runner.weight_bytes_per_token, peak_memory_bytes=peak,
                load_s=runner.load_s)
            for name, n, seconds in results]


def _measure_in_child(factory, factory_args: tuple, factory_kwargs: dict, n_prompts, n_gens,
                      reps, seed, depth=0) -> list[Row]:
    runner = factory(*factory_args, **factory_kwargs)
    try:
        return measure(runner, n_prompts, n_gens, reps, seed, log=_log, depth=depth)
    finally:
        runner.close()


def measure_isolated(factory, *args, n_prompts, n_gens, reps, seed=0, depth=0,
                     **kwargs) -> list[Row]:
    """`measure(factory(*args, **kwargs), ...)` in a fresh spawned process. `factory` must be
    importable (a module-level class or function) for the child to find it."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as ex:
        return ex.submit(_measure_in_child, factory, args, kwargs, n_prompts, n_gens, reps,
                         seed, depth).result()


def _log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def run(model, backends: list[str], *, flash: list[bool] = (True,), n_prompts=(512,),
        n_gens=(128,), reps: int = 5, seed: int = 0, isolate: bool = True,
        backend_options: dict | None = None, load_options: dict | None = None,
        depth: int = 0) -> list[Row]:
    """Every backend x flash setting on one model. `backend_options` (threads, device, dtype) go
    to the backends that take them and are left out for the others; `load_options`
    (cache_type, weights: load()'s) to all."""
    from inferno.backends import REGISTRY
    from inferno.errors import InfernoError

    unknown = [b for b in backends if b not in REGISTRY]
    if unknown:
        raise InfernoError(f"unknown backend {unknown[0]!r}; known backends: {', '.join(REGISTRY)}")
    if reps < 1:
        raise InfernoError(f"--repetitions must be at least 1, got {reps}")
    if not any(n > 0 for n in list(n_prompts) + list(n_gens)):
        raise InfernoError("nothing to measure: give a prompt size (-p) or a generation size (-n) above 0")
    if depth < 0:
        raise InfernoError(f"--depth must be 0 or more, got {depth}")
    rows = []
    for backend in backends:
        options = {k: v for k, v in (backend_options or {}).items()
                   if v is not None and k in REGISTRY[backend].options}
        for fl in flash:
            kw = {"n_prompts": list(n_prompts), "n_gens": list(n_gens), "reps": reps, "seed": seed,
                  "depth": depth}
            options.update((k, v) for k, v in (load_options or {}).items() if v is not None)
            if isolate:
                rows += measure_isolated(EngineRunner, model, backend, fl, **options, **kw)
            else:
                rows += _measure_in_child(EngineRunner, (model, backend, fl), options, **kw)
    return rows


# -- flags ----------------------------------------------------------------------------------------
def parse_names(values: list[str]) -> list[str]:
    """["cpu,simd", "pool"] -> ["cpu", "simd", "pool"]: comma lists, the flag repeated, or both."""
    return [n.strip() for v in values for n in v.split(",") if n.strip()]


def parse_sizes(text: str, flag: str) -> list[int]:
    from inferno.errors import InfernoError
    try:
        sizes = [int(n) for n in parse_names([text])]
    except ValueError:
        raise InfernoError(f"{flag} takes token counts separated by commas, got {text!r}") from None
    if not sizes or min(sizes) < 0:
        raise InfernoError(f"{flag} takes token counts of 0 or more, got {text!r}")
    return sizes


def parse_flash(text: str) -> list[bool]:
    from inferno.errors import InfernoError
    values = parse_names([text])
    if not values or any(v not in ("on", "off") for v in values):
        raise InfernoError(f"--flash takes on, off or on,off; got {text!r}")
    return [v == "on" for v in dict.fromkeys(values)]


# -- output ---------------------------------------------------------------------------------------
COLUMNS = ["model", "type", "backend", "threads", "flash", "test", "t/s", "ttft ms", "GB/s",
           "peak MiB", "load s"]


def _pm(xs, scale=1.0, digits=2) -> str:
    return f"{_mean(xs) * scale:.{digits}f} ± {_std(xs) * scale:.{digits}f}"


def table_cells(row: Row) -> list[str]:
    flash = "-" if row.flash is None else ("on" if row.flash else "off")
    return [
        row.model, row.weight_type, row.backend, "-" if row.threads is None else str(row.threads),
        flash, row.test,
        _pm(row.tokens_per_s),
        _pm(row.seconds, 1e3, 1) if row.is_prefill else "",
        "" if row.is_prefill else f"{row.weight_bytes_per_token * _mean(row.tokens_per_s) / 1e9:.1f}",
        f"{row.peak_memory_bytes / 2**20:.0f}",
        f"{row.load_s:.2f}",
    ]


def format_table(rows: list[Row]) -> str:
    """A markdown table, right-aligned numbers, as llama-bench prints."""
    body = [table_cells(r) for r in rows]
    widths = [max([len(c)] + [len(b[i]) for b in body]) for i, c in enumerate(COLUMNS)]
    numeric = {"threads", "t/s", "ttft ms", "GB/s", "peak MiB", "load s"}

    def line(cells):
        return "| " + " | ".join(c.rjust(w) if COLUMNS[i] in numeric else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    rule = "| " + " | ".join(("-" * (w - 1) + ":") if c in numeric else "-" * w
                             for c, w in zip(COLUMNS, widths)) + " |"
    return "\n".join([line(COLUMNS), rule] + [line(b) for b in body])


def to_json(rows: list[Row]) -> str:
    return json.dumps([r.to_dict() for r in rows], indent=2)


def ratio(rows: list[Row], ours: str, theirs: str, test: str) -> float | None:
    """Mean tokens/s of backend `ours` over backend `theirs` on `test` (None if either is absent)."""
    def tps(name):
        found = [r for r in rows if r.backend == name and r.test == test]
        return _mean(found[0].tokens_per_s) if found else None
    a, b = tps(ours), tps(theirs)
    return a / b if a and b else None
