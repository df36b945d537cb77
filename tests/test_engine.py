"""Engine behaviour around the generation loop: streaming and stop conditions."""

from __future__ import annotations

import numpy as np
import pytest

import inferno
import inferno.sequence
from inferno.model.decoder import Segment


@pytest.fixture(scope="module")
def engine(qwen3_dir):
    return inferno.load(qwen3_dir, progress=False)


def forced(monkeypatch, tokens):
    """Make the sampler emit `tokens` in order, whatever the logits."""
    it = iter(tokens)
    monkeypatch.setattr(inferno.sequence, "sample", lambda *args, **kwargs: next(it))


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
        assert stream.result.token_ids == ids[:n] and stream.result.finish_reason == "length"
    assert stream.result.text == whole


def test_eos_stops_and_is_not_part_of_the_text(engine, monkeypatch):
    eos = engine.tokenizer.eos_ids[0]
    ids = engine.tokenizer.encode("Paris", add_special_tokens=False)
    forced(monkeypatch, ids + [eos, 5, 6])
    result = engine.generate("hi", max_tokens=20)
    assert result.finish_reason == "stop" and result.cut_by is None
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
    monkeypatch.setattr(engine.model, "new_cache", lambda n, **kw: sizes.append(n) or new_cache(n, **kw))
    result = engine.generate("hi", max_tokens=7, temperature=0)
    assert sizes == [result.prompt_tokens + 7] and sizes[0] < engine.config.max_position_embeddings


def test_decode_speed_does_not_count_the_consumers_time(engine):
    import time
    stream = engine.stream("Once upon a time", max_tokens=8, temperature=0.0)
    for _ in stream:
        time.sleep(0.05)
    r = stream.result
    assert r.generated_tokens >= 4
    assert r.decode_s < 0.05  # the tiny model decodes in well under a millisecond a token
    assert r.decode_tokens_per_s > 100


def test_a_spent_stream_keeps_its_result(engine):
    stream = engine.stream("hi", max_tokens=3, temperature=0)
    first = "".join(stream)
    assert "".join(stream) == "" and stream.result is not None and stream.result.text == first


def test_weights_that_do_not_match_the_config_are_a_clear_error(qwen3_dir, tmp_path):
    import json
    import shutil

    from inferno.errors import InfernoError
    bad = tmp_path / "bad"
    shutil.copytree(qwen3_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["num_key_value_heads"] = 4
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InfernoError, match=r"k_proj.weight is \[48, 64\], the config implies \[96, 64\]"):
        inferno.load(bad, progress=False)


def test_a_failed_load_gives_the_backend_back():
    from inferno.backends.numba import blas
    from inferno.errors import InfernoError
    before = blas.thread_counts()
    with pytest.raises(InfernoError):
        inferno.load("/no/such/model", backend="pool")
    assert blas.thread_counts() == before


def test_tying_follows_the_weights_when_config_json_is_silent(qwen3_dir, llama_dir, tmp_path):
    """LlamaConfig/Qwen3Config default to untied; a folder with lm_head.weight is untied, one
    without is tied. Logits agree with transformers either way."""
    import json
    import shutil

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM
    for src, tied in ((qwen3_dir, False), (llama_dir, True)):
        folder = tmp_path / src.name
        shutil.copytree(src, folder)
        cfg = json.loads((folder / "config.json").read_text())
        assert cfg.pop("tie_word_embeddings") is tied
        (folder / "config.json").write_text(json.dumps(cfg))
        ours = inferno.load(folder, progress=False)
        assert ours.config.tie_word_embeddings is tied
        ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)  # the untouched original
        ids = [3, 14, 15, 92, 65]
        with torch.no_grad():
            want = ref(torch.tensor([ids])).logits[0].numpy()
        np.testing.assert_allclose(ours.logits(ids), want, atol=2e-4)


def test_decode_bytes_follow_the_weight_dtype(qwen3_dir, engine):
    cfg = engine.config
    per_layer = (cfg.q_width * 2 + cfg.kv_width * 2) * cfg.hidden_size \
        + 3 * cfg.intermediate_size * cfg.hidden_size + 2 * cfg.hidden_size + 2 * cfg.head_dim
    elements = cfg.num_hidden_layers * per_layer + cfg.hidden_size * (cfg.vocab_size + 2)  # lm_head, norm, a row
    assert engine.weight_bytes_per_token == 4 * elements
    bf16 = inferno.load(qwen3_dir, backend="torch", device="cpu", dtype="bf16", progress=False)
    assert bf16.weight_bytes_per_token == 2 * elements


def test_stop_strings_cut_the_reply(engine, monkeypatch):
    ids = engine.tokenizer.encode("Paris is big. Rome", add_special_tokens=False)
    forced(monkeypatch, ids + [5] * 20)
    result = engine.generate("hi", max_tokens=20, stop=[" is", "xyz"])
    assert result.text == "Paris" and result.finish_reason == "stop" and result.stop == " is"
    forced(monkeypatch, ids + [5] * 20)
    assert engine.generate("hi", max_tokens=20, stop=". R").text == "Paris is big"
    with pytest.raises(inferno.InfernoError, match="stop takes non-empty strings"):
        engine.generate("hi", stop=[""])


def test_the_servers_options_reach_the_python_api(engine):
    """logit_bias, penalties and logprobs, as the server has them: the same text as the batch
    engine given the same Options, and logprobs that are the log-softmax of generation's logits."""
    from inferno.sampling import SamplingParams
    from inferno.serve import BatchEngine, Options
    greedy = dict(temperature=0, top_k=0, top_p=1, min_p=0)
    plain = engine.generate("hi", max_tokens=6, logprobs=True, top_logprobs=2, **greedy)
    banned = engine.generate("hi", max_tokens=6, logit_bias={plain.token_ids[0]: -100}, **greedy)
    assert banned.token_ids[0] != plain.token_ids[0]
    ids = engine.encode_prompt("hi")
    logits = engine.logits(ids, cached=True)[-1].astype(np.float64)
    lse = logits.max() + np.log(np.exp(logits - logits.max()).sum())
    assert len(plain.logprobs) == plain.generated_tokens
    assert plain.logprobs[0].token_id == plain.token_ids[0] and len(plain.logprobs[0].top) == 2
    assert plain.logprobs[0].logprob == pytest.approx(logits[plain.token_ids[0]] - lse, abs=1e-5)
    penalised = dict(presence_penalty=1.5, frequency_penalty=0.7)
    alone = engine.generate("hi", max_tokens=12, **penalised, **greedy)
    with BatchEngine(engine, parallel=2, ctx_size=64) as batch:
        events = list(batch.submit(ids, Options(max_tokens=12, sampling=SamplingParams(**greedy), **penalised)))
    assert "".join(e.text for e in events) == alone.text
    with pytest.raises(inferno.InfernoError, match="top_logprobs must be between 0 and 20"):
        engine.generate("hi", logprobs=True, top_logprobs=50)
    with pytest.raises(inferno.InfernoError, match="logit_bias: a token id is out of range"):
        engine.generate("hi", logit_bias={10**6: 1.0})


def test_a_long_prompt_is_prefilled_in_passes(engine, monkeypatch):
    """A prompt longer than decoder.UBATCH goes through the model in passes of UBATCH tokens
    (llama.cpp's n_ubatch), cut by the scheduler: passes as it cuts them give the last row's
    logits and the cache's rows of one pass, to float32 rounding, a prompt that is a multiple of
    the pass after a cache too; and generate cuts a prompt so and answers as with one pass."""
    import inferno.engine
    model, ops = engine.model, engine.ops
    rng = np.random.default_rng(3)
    ids, more = rng.integers(5, engine.config.vocab_size, 23), rng.integers(5, engine.config.vocab_size, 16)
    whole = model.new_cache(48)
    want = ops.to_numpy(model.forward(ids, whole, last_only=True))  # one pass each
    want_more = ops.to_numpy(model.forward(more, whole, last_only=True))
    parts = model.new_cache(48)
    for chunk, start, last in ((ids[:8], 0, False), (ids[8:16], 8, False), (ids[16:], 16, True)):
        got = model.step([Segment(chunk, 0, start, logits=last)], parts)
    got = ops.to_numpy(got)
    model.step([Segment(more[:8], 0, 23, logits=False)], parts)
    got_more = ops.to_numpy(model.step([Segment(more[8:], 0, 31)], parts))
    assert parts.length == whole.length == 39
    for a, b in ((got, want), (got_more, want_more)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())
    for a, b in zip(whole.k + whole.v, parts.k + parts.v):  # stored in the cache's type: a
        want_rows = ops.to_numpy(ops.read_kv(a, 0, 0, 39))  # float32 rounding may tip one f16 ulp
        np.testing.assert_allclose(ops.to_numpy(ops.read_kv(b, 0, 0, 39)), want_rows, rtol=1e-3,
                                   atol=1e-5 * np.abs(want_rows).max())
    with pytest.raises(inferno.InfernoError, match="KV cache full"):
        model.forward(more, parts, last_only=True)
    assert parts.length == 39  # refused before the pass wrote
    steps = []
    step = model.run
    monkeypatch.setattr(model, "run", lambda segments, *a, **kw: steps.append(
        [(s.ids.size, s.start, s.logits) for s in segments]) or step(segments, *a, **kw))
    one = engine.generate(None, prompt_ids=list(map(int, ids)), max_tokens=4, temperature=0)
    steps.clear()
    monkeypatch.setattr(inferno.engine, "UBATCH", 8)
    split = engine.generate(None, prompt_ids=list(map(int, ids)), max_tokens=4, temperature=0)
    assert [s[0][0] for s in steps[:3]] == [8, 8, 7] and split.token_ids == one.token_ids
