"""Next-token sampling: a small pure function of the logits, the settings and a generator.

Order follows transformers' logits processors: repetition penalty, temperature, top-k, top-p,
min-p, then a draw. Temperature 0 is greedy. A seeded numpy Generator makes runs repeatable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inferno.errors import InfernoError


@dataclass(frozen=True)
class SamplingParams:
    # llama.cpp's defaults; temperature 0 (greedy) with the rest at their "off" values is exact
    # argmax decoding.
    temperature: float = 0.8
    top_k: int = 40  # 0: off
    top_p: float = 0.95  # 1: off
    min_p: float = 0.05  # 0: off
    repeat_penalty: float = 1.0  # 1: off
    seed: int | None = None

    def __post_init__(self):
        if not (self.temperature >= 0):
            raise InfernoError(f"--temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.top_k < 0:
            raise InfernoError(f"--top-k must be >= 0 (0 turns it off), got {self.top_k}")
        if not (0 < self.top_p <= 1):
            raise InfernoError(f"--top-p must be in (0, 1], got {self.top_p}")
        if not (0 <= self.min_p < 1):
            raise InfernoError(f"--min-p must be in [0, 1), got {self.min_p}")
        if not (self.repeat_penalty > 0):
            raise InfernoError(f"--repeat-penalty must be > 0 (1 turns it off), got {self.repeat_penalty}")


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator,
           previous: list[int] | None = None) -> int:
    """One token id from `logits` [vocab]."""
    logits = np.asarray(logits, dtype=np.float64)
    if params.repeat_penalty != 1.0 and previous:
        seen = np.unique(np.asarray(previous, dtype=np.int64))
        vals = logits[seen]
        logits = logits.copy()
        # transformers' rule: shrink positive logits, push negative ones further down.
        logits[seen] = np.where(vals > 0, vals / params.repeat_penalty, vals * params.repeat_penalty)
    if params.temperature == 0:
        return int(np.argmax(logits))
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.size:
        kth = np.partition(logits, -params.top_k)[-params.top_k]
        logits = np.where(logits < kth, -np.inf, logits)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        cut = int(np.searchsorted(cumulative, params.top_p)) + 1
        keep = np.zeros_like(probs, dtype=bool)
        keep[order[:cut]] = True
        probs = np.where(keep, probs, 0.0)
    if params.min_p > 0.0:
        probs = np.where(probs >= params.min_p * probs.max(), probs, 0.0)
    probs /= probs.sum()
    return int(rng.choice(probs.size, p=probs))
