"""Engine behaviour around the generation loop: streaming and stop conditions."""

from __future__ import annotations

import pytest

import inferno
import inferno.engine


@pytest.fixture(scope="module")
def engine(qwen3_dir):
    return inferno.load(qwen3_dir, progress=False)


def forced(monkeypatch, tokens):
    """Make the sampler emit `tokens` in order, whatever the logits."""
    it = iter(tokens)
    monkeypatch.setattr(inferno.engine, "sample", lambda *args, **kwargs: next(it))


def test_a_character_cut_by_the_token_limit_is_not_printed(engine, monkeypatch):
    ids = engine.tokenizer.encode("ok 東京", add_special_tokens=False)
    assert len(ids) >= 3
    whole = engine.tokenizer.decode(ids)
    for n in range(1, len(ids) + 1):
        forced(monkeypatch, ids)
        stream = engine.stream("hi", max_tokens=n, temperature=0)
        pieces = list(stream)
        assert "".join(pieces) == stream.result.text
        assert "\ufffd" not in stream.result.text
        assert whole.startswith(stream.result.text)
        assert stream.result.token_ids == ids[:n] and stream.result.stop_reason == "length"
    assert stream.result.text == whole


def test_eos_stops_and_is_not_part_of_the_text(engine, monkeypatch):
    eos = engine.tokenizer.eos_ids[0]
    ids = engine.tokenizer.encode("Paris", add_special_tokens=False)
    forced(monkeypatch, ids + [eos, 5, 6])
    result = engine.generate("hi", max_tokens=20)
    assert result.stop_reason == "eos"
    assert result.token_ids == ids and result.text == "Paris"
    assert result.generated_tokens == len(ids)


def test_same_seed_same_text(engine):
    a = engine.generate("Once upon", max_tokens=16, temperature=1.0, seed=11)
    b = engine.generate("Once upon", max_tokens=16, temperature=1.0, seed=11)
    c = engine.generate("Once upon", max_tokens=16, temperature=1.0, seed=12)
    assert a.token_ids == b.token_ids != c.token_ids


def test_cache_is_sized_for_the_request_not_the_model(engine, monkeypatch):
    sizes = []
    new_cache = engine.model.new_cache
    monkeypatch.setattr(engine.model, "new_cache", lambda n: sizes.append(n) or new_cache(n))
    result = engine.generate("hi", max_tokens=7, temperature=0)
    assert sizes == [result.prompt_tokens + 7] and sizes[0] < engine.config.max_position_embeddings
