"""Sampling settings and logits rows that the device sampler is pinned to the host's on
(tests/test_device_step.py on the CPU, tests/cuda_checks.py on a GPU)."""

from __future__ import annotations

import numpy as np

SETTINGS = [
    dict(temperature=0.0),
    dict(temperature=0.0, repeat_penalty=1.5),
    dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
    dict(temperature=0.7, top_k=5, top_p=1.0, min_p=0.0),
    dict(temperature=1.3, top_k=0, top_p=0.6, min_p=0.0),
    dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.2),
    dict(temperature=2.0, top_k=3, top_p=0.5, min_p=0.2, repeat_penalty=0.8),
]


def logits_rows(rng, n, vocab):
    """Random rows, and rows with what breaks careless samplers: ties at every edge (a flat
    row, repeated values), masked (-inf) tokens, fewer finite tokens than top_k."""
    rows = [rng.standard_normal(vocab).astype(np.float32) * s for s in (0.5, 2.0, 6.0)][:n]
    flat = np.zeros(vocab, np.float32)
    steps = np.round(rng.standard_normal(vocab) * 2).astype(np.float32)  # few distinct values
    masked = rng.standard_normal(vocab).astype(np.float32)
    masked[rng.random(vocab) < 0.98] = -np.inf
    two = np.full(vocab, -np.inf, np.float32)
    two[[7, 300]] = [1.0, 1.0]
    return np.stack(rows + [flat, steps, masked, two])
