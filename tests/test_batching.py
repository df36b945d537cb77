"""Continuous batching without HTTP: batched steps against single-sequence forwards on every CPU
backend, and the scheduler (inferno.serve.BatchEngine) against the engine's own generation."""

from __future__ import annotations

import numpy as np
import pytest

import inferno
import inferno.sequence
from inferno.model.decoder import Segment
from inferno.sampling import SamplingParams
from inferno.serve import BatchEngine, Options
from inferno.sequence import held_back

GREEDY = SamplingParams(temperature=0, top_k=0, top_p=1, min_p=0)
BACKENDS = [("cpu", {}), ("simd", {}), ("pool", {"threads": 2}), ("torch", {"device": "cpu"})]


@pytest.mark.parametrize("backend,options", BACKENDS, ids=[b for b, _ in BACKENDS])
def test_batched_logits_equal_each_sequence_alone(qwen3_dir, backend, options):
    """Three sequences of different lengths join at different steps, one prefilled in chunks
    beside the others' decoding; every row of every step equals the uncached forward of that
    sequence alone, within float32 rounding."""
    engine = inferno.load(qwen3_dir, backend=backend, cache_type="f32", progress=False, **options)
    model, ops = engine.model, engine.ops
    rng = np.random.default_rng(0)
    tokens = {name: rng.integers(0, engine.config.vocab_size, 40) for name in "abc"}
    # step -> [(sequence, tokens fed)]: a joins first, b at step 1 in chunks of 5, c (a
    # one-token prompt) at step 3; each decodes one token a step once its prompt is in.
    plan = [[("a", 7)], [("a", 1), ("b", 5)], [("a", 1), ("b", 5)], [("b", 3), ("a", 1), ("c", 1)],
            [("c", 1), ("a", 1), ("b", 1)], [("b", 1), ("c", 1), ("a", 1)]]
    slots = {"a": 2, "b": 0, "c": 1}
    cache = model.new_cache(32, slots=3)
    done = dict.fromkeys("abc", 0)
    for step in plan:
        segments = [Segment(tokens[s][done[s]:done[s] + n].astype(np.int64), slots[s], done[s]) for s, n in step]
        got = ops.to_numpy(model.step(segments, cache))  # [len(step), vocab]
        for (s, n), row in zip(step, got):
            done[s] += n
            want = ops.to_numpy(model.forward(tokens[s][:done[s]]))[-1]
            np.testing.assert_allclose(row, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert done == {"a": 12, "b": 15, "c": 3}
    engine.close()


def test_segments_without_logits_skip_the_vocabulary(qwen3_dir):
    """A prompt chunk that is not the prompt's last asks for no logits: the step returns rows
    only for the segments that do, and None when none does."""
    engine = inferno.load(qwen3_dir, cache_type="f32", progress=False)
    model, ids = engine.model, np.arange(3, 30, dtype=np.int64)
    cache = model.new_cache(32, slots=2)
    assert model.step([Segment(ids[:10], 0, 0, logits=False)], cache) is None
    got = model.step([Segment(ids[10:], 0, 10, logits=False), Segment(ids[:5], 1, 0)], cache)
    assert got.shape == (1, engine.config.vocab_size)
    np.testing.assert_allclose(got[0], model.forward(ids[:5])[-1], rtol=1e-5, atol=1e-5)
    assert cache.lengths == [27, 5]


@pytest.fixture(scope="module")
def engine(qwen3_dir):
    return inferno.load(qwen3_dir, progress=False)


PROMPTS = ["Hello there", "Once upon a time there was a baker who baked bread", "The capital of France",
           "def add(a, b):", "Numbers: 0 1 2 3"]


def test_batched_generation_equals_one_at_a_time(engine):
    """More prompts than slots, prompts longer than the prefill chunk: sequences queue, join
    the running batch as slots free, and prefill in chunks between decode steps."""
    want = [engine.generate(p, max_tokens=12, temperature=0, top_k=0, top_p=1, min_p=0).text for p in PROMPTS]
    with BatchEngine(engine, parallel=3, ctx_size=64, chunk=5) as batch:
        assert batch.generate(PROMPTS, Options(max_tokens=12, sampling=GREEDY)) == want
        assert batch.stats() == dict(running=0, waiting=0, slots_used=0, slots=3)


def test_seeds_reproduce_and_each_choice_has_its_own_generator(engine):
    opts = Options(max_tokens=10, sampling=SamplingParams(temperature=1.0, seed=7))
    ids = engine.encode_prompt("Once upon")
    with BatchEngine(engine, parallel=4, ctx_size=64) as batch:
        runs = [[ev for ev in batch.submit(ids, opts, n=2)] for _ in range(2)]
        texts = [[("".join(e.text for e in run if e.index == i)) for i in range(2)] for run in runs]
    assert texts[0] == texts[1] and texts[0][0] != texts[0][1]
    alone = engine.generate("Once upon", max_tokens=10, temperature=1.0, seed=7)
    assert texts[0][0] == alone.text  # choice 0 samples with the seed itself, as the engine does


def test_a_loader_runs_on_the_batch_thread_and_its_errors_reach_the_caller(qwen3_dir):
    """Given a loader, BatchEngine loads on its own thread, the one that runs the steps (one
    OpenMP team on pool); a load error, or a bad setting after the load, is raised to the
    caller and the thread ends (the engine it loaded closed)."""
    import threading

    threads, engines = [], []

    def loader():
        threads.append(threading.current_thread())
        engines.append(inferno.load(qwen3_dir, progress=False))
        return engines[-1]
    with BatchEngine(loader, parallel=2, ctx_size=64) as batch:
        assert batch._thread is threads[0] and batch.engine is engines[0]
        assert batch.generate(["Hello there"], Options(max_tokens=3, sampling=GREEDY))[0]
    engines[0].close()

    def broken():
        raise inferno.InfernoError("no such model")
    with pytest.raises(inferno.InfernoError, match="no such model"):
        BatchEngine(broken)
    with pytest.raises(inferno.InfernoError, match="parallel must be at least 1"):
        BatchEngine(loader, parallel=0)
    threads[-1].join(5)
    assert not threads[-1].is_alive()


def forced(monkeypatch, tokens):
    it = iter(tokens)
    monkeypatch.setattr(inferno.sequence, "sample", lambda *args, **kwargs: next(it))


def run(engine, ids, opts):
    with BatchEngine(engine, parallel=1, ctx_size=64) as batch:
        return list(batch.submit(ids, opts))


def test_text_never_splits_a_character(engine, monkeypatch):
    ids = engine.tokenizer.encode("ok 東京 🙂", add_special_tokens=False)
    forced(monkeypatch, ids)
    events = run(engine, engine.encode_prompt("hi"), Options(max_tokens=len(ids), sampling=GREEDY))
    assert all("\ufffd" not in e.text for e in events)
    assert "".join(e.text for e in events) == "ok 東京 🙂"
    assert sum(len(e.token_ids) for e in events) == len(ids) == events[-1].completion_tokens
    assert events[-1].finish_reason == "length"


def test_a_stop_string_is_cut_and_never_streamed(engine, monkeypatch):
    text = "Paris. The capital of Germany is Berlin."
    ids = engine.tokenizer.encode(text, add_special_tokens=False)
    forced(monkeypatch, ids)
    events = run(engine, engine.encode_prompt("hi"), Options(max_tokens=len(ids), sampling=GREEDY,
                                                            stop=("Germ", "xyz")))
    assert "".join(e.text for e in events) == "Paris. The capital of "
    assert events[-1].finish_reason == "stop" and events[-1].completion_tokens < len(ids)
    assert held_back("of Ge", ("Germ",)) == 2 and held_back("of G", ("xy", "Germ")) == 1
    assert held_back("Germ", ("Germ",)) == 0  # a whole stop string is found, not held


def test_eos_stops_and_penalties_change_the_choice(engine, monkeypatch):
    eos = engine.tokenizer.eos_ids[0]
    forced(monkeypatch, [5, 6, eos, 7])
    events = run(engine, engine.encode_prompt("hi"), Options(max_tokens=10, sampling=GREEDY))
    assert events[-1].finish_reason == "stop" and events[-1].completion_tokens == 2
    monkeypatch.undo()
    ids = engine.encode_prompt("hi")
    plain = run(engine, ids, Options(max_tokens=12, sampling=GREEDY))
    penalised = run(engine, ids, Options(max_tokens=12, sampling=GREEDY, frequency_penalty=2.0,
                                         presence_penalty=2.0))
    first = [t for e in plain for t in e.token_ids]
    again = [t for e in penalised for t in e.token_ids]
    assert len(set(again)) >= len(set(first)) and again != first
    banned = run(engine, ids, Options(max_tokens=3, sampling=GREEDY, logit_bias=((first[0], -100.0),)))
    assert banned[0].token_ids[0] != first[0]


def test_logprobs_are_the_raw_log_softmax(engine):
    ids = engine.encode_prompt("hi")
    events = run(engine, ids, Options(max_tokens=1, sampling=GREEDY, logprobs=True, top_logprobs=3))
    (lp,) = events[-1].logprobs
    logits = engine.logits(ids, cached=True)[-1].astype(np.float64)  # keys read back from its f16 cache
    want = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    assert lp.token_id == int(np.argmax(logits)) == lp.top[0][0]
    np.testing.assert_allclose(lp.logprob, want[lp.token_id], atol=1e-5)
    np.testing.assert_allclose([v for _, v in lp.top], np.sort(want)[::-1][:3], atol=1e-5)


def test_a_cancelled_request_frees_its_slot(engine, monkeypatch):
    """Cancelled while its first step runs (held at a gate), and one still queued behind it:
    both end "cancelled" at the next step and the slot takes the next request."""
    import threading
    gate, step = threading.Event(), engine.model.run
    monkeypatch.setattr(engine.model, "run", lambda *a, **k: (gate.wait(10), step(*a, **k))[1])
    ids = engine.encode_prompt("hi")
    no_eos = tuple((t, -100.0) for t in engine.tokenizer.eos_ids)
    opts = Options(max_tokens=200, sampling=GREEDY, logit_bias=no_eos)
    with BatchEngine(engine, parallel=1, ctx_size=256) as batch:
        running, queued = batch.submit(ids, opts), batch.submit(ids, opts)
        running.cancel()
        queued.cancel()
        gate.set()
        events = list(running)
        assert events[-1].finish_reason == "cancelled" and sum(len(e.token_ids) for e in events) <= 1
        assert [e.finish_reason for e in queued] == ["cancelled"]
        assert batch.generate(["hi"], Options(max_tokens=3, sampling=GREEDY))  # the slot is free
        assert batch.stats() == dict(running=0, waiting=0, slots_used=0, slots=1)


def test_a_failing_sequence_fails_alone(engine, monkeypatch):
    """A forward pass that raises for one sequence's tokens: the batch is rerun one sequence at
    a time and only that one ends, with an error; the others finish as if it never came."""
    ids = engine.encode_prompt("hi")
    poison = ids + [7, 7, 7]
    step = engine.model.run

    def faulty(segments, cache, **kw):
        if any(len(s.ids) > 2 and (s.ids[-3:] == 7).all() for s in segments):
            raise RuntimeError("injected")
        return step(segments, cache, **kw)

    want = run(engine, ids, Options(max_tokens=8, sampling=GREEDY))
    monkeypatch.setattr(engine.model, "run", faulty)
    with BatchEngine(engine, parallel=3, ctx_size=64) as batch:
        a, bad, b = (batch.submit(p, Options(max_tokens=8, sampling=GREEDY)) for p in (ids, poison, ids))
        results = [list(a), list(bad), list(b)]
    assert results[1][-1].finish_reason == "error" and "injected" in results[1][-1].error
    for got in (results[0], results[2]):
        assert [e.text for e in got] == [e.text for e in want] and got[-1].finish_reason == "length"
