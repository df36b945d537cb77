"""Sampling: greedy is argmax, a seed repeats, each filter does what it says."""

from __future__ import annotations

import numpy as np
import pytest

from inferno.errors import InfernoError
from inferno.sampling import SamplingParams, sample

LOGITS = np.array([1.0, 3.0, 2.9, -1.0, 0.5, 2.0], dtype=np.float32)


def draws(params, n=400, previous=None):
    rng = np.random.default_rng(params.seed)
    return [sample(LOGITS, params, rng, previous) for _ in range(n)]


def test_temperature_zero_is_argmax():
    assert set(draws(SamplingParams(temperature=0.0), n=5)) == {1}


def test_same_seed_same_tokens_different_seed_different():
    a = draws(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=3))
    b = draws(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=3))
    c = draws(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=4))
    assert a == b and a != c
    assert len(set(a)) == len(LOGITS)  # with no filters every token is reachable


def test_top_k_keeps_the_k_likeliest():
    assert set(draws(SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0, seed=0))) == {1, 2}


def test_top_p_keeps_the_smallest_nucleus():
    # softmax(LOGITS) sorted: token 1 holds 0.40 of the mass, with 2 0.76, with 5 0.91
    nucleus = lambda p: set(draws(SamplingParams(temperature=1.0, top_k=0, top_p=p, min_p=0.0, seed=0)))  # noqa: E731
    assert nucleus(0.3) == {1}
    assert nucleus(0.6) == {1, 2}
    assert nucleus(0.8) == {1, 2, 5}


def test_min_p_drops_tokens_below_a_fraction_of_the_top():
    # p(token 5) / p(token 1) = e^-1 ~ 0.37; p(0)/p(1) = e^-2 ~ 0.14
    got = set(draws(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.3, seed=0)))
    assert got == {1, 2, 5}


def test_repeat_penalty_pushes_seen_tokens_down():
    greedy = SamplingParams(temperature=0.0, repeat_penalty=1.5)
    assert sample(LOGITS, greedy, np.random.default_rng(0), previous=[1]) == 2


@pytest.mark.parametrize("bad", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5),
                                 dict(top_k=-1), dict(min_p=1.0), dict(repeat_penalty=0.0)])
def test_out_of_range_values_are_errors(bad):
    with pytest.raises(InfernoError):
        SamplingParams(**bad)


def test_top_p_on_a_flat_distribution_looks_past_the_first_candidates():
    """A nucleus wider than the first 64 candidates: 500 of 1000 equally likely tokens."""
    flat = np.zeros(1000, dtype=np.float32)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=0.5, min_p=0.0, seed=0)
    rng = np.random.default_rng(0)
    got = {sample(flat, params, rng) for _ in range(5000)}
    assert 400 < len(got) <= 501


def test_negative_seed_means_random_as_in_llama_cpp():
    assert SamplingParams(seed=-1).seed is None
