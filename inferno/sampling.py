"""Next-token sampling: a small pure function of the logits, the settings and a generator.

Order follows transformers' logits processors: repetition penalty, temperature, top-k, top-p,
min-p, then a draw. Temperature 0 is greedy. A seeded numpy Generator makes runs repeatable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inferno.errors import InfernoError


TINY = 1e-30  # the least temperature or repeat penalty (and 1 / TINY the most penalty) taken


@dataclass(frozen=True)
class SamplingParams:
    # llama.cpp's defaults; temperature 0 (greedy) with the rest at their "off" values is exact
    # argmax decoding.
    temperature: float = 0.8
    top_k: int = 40  # 0: off
    top_p: float = 0.95  # 1: off
    min_p: float = 0.05  # 0: off
    repeat_penalty: float = 1.0  # 1: off
    seed: int | None = None  # None, or negative as llama.cpp's -1: a fresh random seed

    def __post_init__(self):
        if self.seed is not None and self.seed < 0:
            object.__setattr__(self, "seed", None)
        checks = [
            ("temperature", self.temperature >= 0, "must be >= 0 (0 is greedy)"),
            # Below TINY the logits divided by it overflow float64 (a fuzzer's 5e-324 did).
            ("temperature", self.temperature == 0 or self.temperature >= TINY,
             f"must be 0 (greedy) or at least {TINY:g}"),
            ("top_k", self.top_k >= 0, "must be >= 0 (0 turns it off)"),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("min_p", 0 <= self.min_p < 1, "must be in [0, 1)"),
            ("repeat_penalty", self.repeat_penalty > 0, "must be > 0 (1 turns it off)"),
            ("repeat_penalty", TINY <= self.repeat_penalty <= 1 / TINY, f"must be in [{TINY:g}, {1 / TINY:g}]"),
        ]
        for name, ok, rule in checks:
            if not ok:  # NaN fails every comparison, so it lands here too
                raise InfernoError(f"{name} {rule}, got {getattr(self, name)}", params=(name,))


SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty")
LLAMA_CPP = "llama.cpp's default"


@dataclass(frozen=True)
class SamplingDefaults:
    """The sampling settings a model runs with when the caller sets none: each field's value
    and where it came from (the model's own generation settings, an alias, or llama.cpp)."""

    values: dict  # field -> value
    sources: dict  # field -> where the value came from

    @classmethod
    def layered(cls, *layers: tuple[str, dict]) -> "SamplingDefaults":
        """llama.cpp's defaults overlaid by each (source, {field: value}) in turn."""
        base = SamplingParams()
        values = {f: getattr(base, f) for f in SAMPLING_FIELDS}
        sources = dict.fromkeys(SAMPLING_FIELDS, LLAMA_CPP)
        for source, layer in layers:
            for field, value in layer.items():
                if field in values and value is not None:
                    values[field], sources[field] = _number(field, value, source), source
        SamplingParams(**values)  # a model's own bad value is an error at load, not mid-reply
        return cls(values, sources)

    def params(self, seed: int | None = None, **given) -> SamplingParams:
        """SamplingParams with the caller's settings (None: not given) over these defaults."""
        unknown = set(given) - set(SAMPLING_FIELDS)
        if unknown:
            raise TypeError(f"unknown sampling option {sorted(unknown)[0]!r}")
        return SamplingParams(**{**self.values, **{k: v for k, v in given.items() if v is not None}},
                              seed=seed)

    def describe(self, given: dict | None = None) -> str:
        """One line: each field's value in force, grouped by where it came from; `given` are
        the caller's own settings (None: not given), which win."""
        given = {f: v for f, v in (given or {}).items() if v is not None}
        by_source: dict[str, list[str]] = {}
        for field in SAMPLING_FIELDS:
            if field in given:
                source, value = "given", given[field]
            else:
                source, value = self.sources[field], self.values[field]
            by_source.setdefault(source, []).append(f"{field} {value:g}")
        return "; ".join(f"{', '.join(fields)} ({source})" for source, fields in by_source.items())


def _number(field: str, value, source: str):
    """A model file's sampling value as the number SamplingParams takes (top_k an int), or one
    line naming the file when it is something else."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and field == "top_k":
        ok = float(value).is_integer()
        value = int(value) if ok else value
    if not ok:
        raise InfernoError(f"{source}: {field} is {value!r:.40}, not a number; fix or remove it")
    return value


def generation_config_sampling(generation: dict) -> dict:
    """The sampling fields of a Hugging Face generation_config.json. `do_sample: false` means
    greedy decoding, as in transformers."""
    out = {"temperature": generation.get("temperature"), "top_k": generation.get("top_k"),
           "top_p": generation.get("top_p"), "min_p": generation.get("min_p"),
           "repeat_penalty": generation.get("repetition_penalty")}
    if generation.get("do_sample") is False:
        out["temperature"] = 0.0
    return {k: v for k, v in out.items() if v is not None}


def gguf_sampling(meta: dict) -> dict:
    """The `general.sampling.*` settings some GGUF files carry (llama.cpp reads them too)."""
    keys = {"temp": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
            "penalty_repeat": "repeat_penalty"}
    return {ours: meta[f"general.sampling.{k}"] for k, ours in keys.items()
            if f"general.sampling.{k}" in meta}


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator,
           previous: list[int] | None = None) -> int:
    """One token id from `logits` [vocab].

    Every step is defined by values, with ties broken by token id, never by the order a sort
    happened to leave, so that the device sampler (backends/torch/sampling.py) draws the same
    token from the same uniform draw: top-k keeps the k largest logits, top-p the likeliest
    candidates up to the one where their mass reaches top_p, each keeping the lower ids of a
    tie at its edge (`first_of`); min-p those at least min_p times the likeliest; the draw
    walks the survivors in token-id order. One draw per token, none when greedy.

    The filters run on a shrinking candidate set, not the whole vocabulary: top-k is one
    partition over the vocabulary, and only candidates that may hold the nucleus are sorted.
    Sorting all 151,936 of Qwen3's logits for every token would cost more than a decode step's
    attention.
    """
    logits = np.asarray(logits, dtype=np.float64)
    if params.repeat_penalty != 1.0 and previous:
        seen = np.unique(np.asarray(previous, dtype=np.int64))
        vals = logits[seen]
        logits = logits.copy()
        # transformers' rule: shrink positive logits, push negative ones further down.
        logits[seen] = np.where(vals > 0, vals / params.repeat_penalty, vals * params.repeat_penalty)
    if params.temperature == 0:
        return int(np.argmax(logits))
    if params.top_k and params.top_k < logits.size:
        ids = np.argpartition(logits, -params.top_k)[-params.top_k:]  # the k likeliest, unordered
        kth = logits[ids].min()
        if np.count_nonzero(logits >= kth) == params.top_k:
            ids.sort()  # by id
        else:  # a tie straddles the k-th: which of it stay is decided by id
            ids = np.flatnonzero(first_of(logits, kth, params.top_k))
    else:
        ids = np.arange(logits.size)
    z = logits[ids] / params.temperature
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    keep = None  # every candidate, unless top-p or min-p drop some
    if params.top_p < 1.0:
        # The nucleus ends at the smallest likeliest-first prefix whose mass reaches top_p (at
        # least one token). Find candidates that hold it by partitioning (64, then 4x more
        # while their mass falls short), and sort only those.
        m = min(ids.size, 64)
        while True:
            top = np.argpartition(-probs, m - 1)[:m] if m < ids.size else np.arange(ids.size)
            if m == ids.size or probs[top].sum() >= params.top_p:
                break
            m = min(ids.size, 4 * m)
        ordered = np.sort(probs[top])[::-1]
        cut = min(int(np.searchsorted(np.cumsum(ordered), params.top_p)), ordered.size - 1)
        keep = first_of(probs, ordered[cut], cut + 1)
    if params.min_p > 0.0:
        above = probs >= params.min_p * probs.max()
        keep = above if keep is None else keep & above
    if keep is not None:
        ids, probs = ids[keep], probs[keep]
    # One uniform draw against the cumulative mass (inverse CDF), in token-id order.
    cdf = np.cumsum(probs)
    pick = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    if pick == ids.size:  # the draw rounded up to the total: the last likely candidate
        pick = int(np.flatnonzero(probs)[-1])
    return int(ids[pick])


def first_of(x: np.ndarray, edge: float, n: int) -> np.ndarray:
    """Which n of `x` a cut at value `edge` keeps: every value above it, and of those equal to
    it the lowest indices, up to n in all. # [len(x)] bool"""
    keep = x >= edge
    extra = np.count_nonzero(keep) - n
    if extra > 0:  # a tie straddles the edge: its highest ids go
        tie = np.flatnonzero(x == edge)
        keep[tie[tie.size - extra:]] = False
    return keep
