"""Prefix reuse in the generation loop (inferno/scheduler.py): a slot keeps the tokens whose K/V it
holds, a new prompt takes the slot with the longest common prefix or copies the rows from
another slot, and a reused prefix gives what a fresh prefill gives."""

from __future__ import annotations


import numpy as np
import pytest

import inferno
from inferno.sampling import SamplingParams
from inferno.scheduler import Slots, common_prefix
from inferno.serve import BatchEngine, Options
from tiny import make_model

GREEDY = SamplingParams(temperature=0, top_k=0, top_p=1, min_p=0)
SYSTEM = "You are a helpful assistant who answers questions about cities and rivers in detail. " * 3


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    """Gemma 3 with sliding-window layers (a window of 24, shorter than the prompts here)."""
    return make_model(tmp_path_factory.mktemp("gemma3-window"), "gemma3", hidden=64, heads=4, kv_heads=1,
                      head_dim=40, layers=3, tied=True, sliding_window=24, query_pre_attn_scalar=32,
                      layer_types=["sliding_attention", "full_attention", "sliding_attention"])


@pytest.fixture(scope="module")
def wide_kv_dir(tmp_path_factory):
    """Qwen3 with a KV width of 64, which every cache type takes (q8_0 needs multiples of 32)."""
    return make_model(tmp_path_factory.mktemp("qwen3-kv64"), "qwen3", hidden=64, heads=4, kv_heads=2,
                      head_dim=32)


def test_common_prefix():
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix([1, 2, 3], [1, 2]) == 2
    assert common_prefix([1, 2, 3], [1, 5, 3]) == 1
    assert common_prefix([4], [1, 2]) == 0


def test_slot_choice_longest_prefix_then_least_recently_used(qwen3_dir):
    engine = inferno.load(qwen3_dir, backend="cpu", progress=False)
    slots = engine.new_slots(3, 32)
    for slot, tokens in enumerate([[1, 2, 3, 4], [1, 2, 9], [7, 7, 7]]):
        slots.tokens[slot] = list(tokens)
        slots.cache.lengths[slot] = len(tokens)
    slots.used = [3, 1, 2]  # slot 1 the least recently taken; later takes count from 4
    slots._clock = iter(range(4, 100))
    assert slots.take([1, 2, 3, 4, 5], 8) == (0, 4)  # the longest prefix
    slots.release(0)
    assert slots.take([7, 7, 7], 8) == (2, 2)  # the last token is left to feed: its logits start the reply
    slots.release(2)
    # A prompt that differs at its first token is a clean miss: the least recently used slot
    # (slot 1, last taken at 1), cut back to nothing.
    assert slots.take([5, 6], 8) == (1, 0)
    assert slots.tokens[1] == [] and slots.cache.lengths[1] == 0


def test_rows_are_copied_from_the_slot_that_holds_the_longest_prefix(qwen3_dir):
    engine = inferno.load(qwen3_dir, backend="cpu", progress=False)
    slots = engine.new_slots(2, 16)
    rng = np.random.default_rng(0)
    for buf in slots.cache.k + slots.cache.v:
        buf[1] = rng.standard_normal(buf[1].shape)
    slots.tokens[1] = [1, 2, 3, 4, 5]
    slots.busy[1] = True  # busy: its rows are still lent, not its slot
    slot, held = slots.take([1, 2, 3, 9], 8)
    assert (slot, held) == (0, 3) and slots.tokens[0] == [1, 2, 3] and slots.cache.lengths[0] == 3
    for buf in slots.cache.k + slots.cache.v:
        np.testing.assert_array_equal(buf[0, :3], buf[1, :3])


def test_a_session_slot_grows_and_keeps_its_rows(qwen3_dir):
    engine = inferno.load(qwen3_dir, backend="cpu", progress=False)
    slots = engine.new_slots(1, 4, growable=True)
    slots.tokens[0] = [1, 2, 3]
    for buf in slots.cache.k:
        buf[0, :3] = 1.5
    assert slots.take([1, 2, 3, 4], 10) == (0, 3)
    assert slots.cache.capacity >= 10 and slots.cache.lengths == [3]
    assert all((buf[0, :3] == 1.5).all() for buf in slots.cache.k)
    with pytest.raises(ValueError, match="exceed"):
        engine.new_slots(1, 4).take([1, 2], 10)


def _logprobs(events):
    return [lp.logprob for e in events for lp in (e.logprobs or ())]


def _ask(batch, ids, n=8):
    events = list(batch.submit(ids, Options(max_tokens=n, sampling=GREEDY, logprobs=True)))
    assert not [e.error for e in events if e.error]
    return "".join(e.text for e in events), _logprobs(events), events[-1].cached_tokens


@pytest.mark.parametrize("cache_type", ["f32", "f16", "bf16", "q8_0"])
@pytest.mark.parametrize("backend", ["cpu", "pool"])
def test_the_same_request_cold_and_warm(wide_kv_dir, backend, cache_type):
    engine = inferno.load(wide_kv_dir, backend=backend, cache_type=cache_type, progress=False)
    ids = engine.encode_prompt("What is the longest river in Europe?", system=SYSTEM)
    with BatchEngine(engine, parallel=2, ctx_size=256, chunk=16) as batch:
        cold = _ask(batch, ids)
        warm = _ask(batch, ids)
        assert cold[2] == 0 and warm[2] == len(ids) - 1
        assert warm[0] == cold[0]
        np.testing.assert_allclose(warm[1], cold[1], atol=1e-5)
        computed, cached = batch.prompt_counts()
        assert (computed, cached) == (len(ids) + 1, len(ids) - 1)
    engine.close()


@pytest.mark.parametrize("model", ["qwen3", "llama", "gemma"])
def test_a_prefix_copied_from_another_slot_equals_computing_it(model, request, monkeypatch):
    """Client A holds the shared system prompt in a busy slot; client B's request copies those
    rows into its own slot and prefills only its question: same text and logprobs as B alone on
    a fresh batch. Gemma's sliding-window layers included (the window is shorter than the
    prompt)."""
    import time
    folder = request.getfixturevalue(f"{model}_dir")
    # An f32 cache: with pool's default f16 one, a K or V element whose float32 value differs
    # by a rounding between the two groupings can round to the next f16 (5e-4 of itself), and
    # Gemma's logprobs then moved by 1e-4 here (test_the_same_request_cold_and_warm covers the
    # cache types).
    engine = inferno.load(folder, backend="pool", progress=False, cache_type="f32")
    a = engine.encode_prompt("Tell me about Paris.", system=SYSTEM)
    b = engine.encode_prompt("And what about Rome?", system=SYSTEM)
    with BatchEngine(engine, parallel=2, ctx_size=400, chunk=32) as batch:
        alone = _ask(batch, b)
    shared = common_prefix(a, b)
    assert shared > 30
    step = engine.model.run
    monkeypatch.setattr(engine.model, "run", lambda *a, **k: (time.sleep(0.003), step(*a, **k))[1])
    no_eos = tuple((t, -100.0) for t in engine.eos)  # A keeps decoding: its slot stays busy
    with BatchEngine(engine, parallel=2, ctx_size=400, chunk=32) as batch:
        first = batch.submit(a, Options(max_tokens=100, sampling=GREEDY, logit_bias=no_eos))
        events = iter(first)
        next(events)  # A's prompt is in (a token came out): its slot holds the system prompt
        got = _ask(batch, b)
        assert first.sequences[0].finish_reason is None  # A was still running
        first.cancel()
        list(events)
    assert got[2] == shared
    assert got[0] == alone[0]
    # B decoded beside A here and alone there, and its prompt was cut into other chunks: float32
    # rounding of other groupings, nothing more.
    np.testing.assert_allclose(got[1], alone[1], rtol=1e-5, atol=1e-5)
    engine.close()


def test_waiting_prefills_pick_up_what_the_one_ahead_wrote(qwen3_dir):
    """Four clients with one system prompt arrive together: the first prefills it, the others
    copy its rows once written, and each prefills only its own question."""
    engine = inferno.load(qwen3_dir, progress=False)
    questions = ["Name a city.", "Name a river.", "Name a sea.", "Name a hill."]
    prompts = [engine.encode_prompt(q, system=SYSTEM) for q in questions]
    shared = common_prefix(prompts[0], prompts[1])
    with BatchEngine(engine, parallel=4, ctx_size=256, chunk=16) as batch:
        alone = [_ask(batch, p)[0] for p in prompts[:1]]
        batch.slots.clear()
        handles = [batch.submit(p, Options(max_tokens=8, sampling=GREEDY)) for p in prompts]
        results = [list(h) for h in handles]
        cached = [r[-1].cached_tokens for r in results]
    assert cached[0] == 0 and all(c >= shared - 1 for c in cached[1:]), cached
    assert "".join(e.text for e in results[0]) == alone[0]
    engine.close()


def test_failed_and_cancelled_steps_leave_no_stale_rows(qwen3_dir, monkeypatch):
    engine = inferno.load(qwen3_dir, progress=False)
    ids = engine.encode_prompt("What is the longest river in Europe?", system=SYSTEM)
    with BatchEngine(engine, parallel=1, ctx_size=256, chunk=16) as batch:
        want = _ask(batch, ids)
        batch.slots.clear()
        step, calls = engine.model.run, []

        def faulty(segments, cache, **kw):  # the third prompt chunk fails
            calls.append(segments[0].start)
            if len(calls) == 3:
                raise RuntimeError("injected")
            return step(segments, cache, **kw)
        monkeypatch.setattr(engine.model, "run", faulty)
        events = list(batch.submit(ids, Options(max_tokens=8, sampling=GREEDY)))
        assert events[-1].finish_reason == "error"
        assert batch.slots.tokens[0] == ids[:32]  # the two chunks that were written, no more
        monkeypatch.setattr(engine.model, "run", step)
        again = _ask(batch, ids)
        assert again[2] == 32 and again[0] == want[0]
        np.testing.assert_allclose(again[1], want[1], atol=1e-5)
    engine.close()


def test_session_reuse_never_crosses_engines(qwen3_dir, llama_dir):
    qwen = inferno.load(qwen3_dir, progress=False)
    llama = inferno.load(llama_dir, progress=False)
    session = inferno.Session()
    qwen.generate("Hello there", session=session, max_tokens=4, temperature=0)
    got = llama.generate("Hello there", session=session, max_tokens=4, temperature=0)
    assert got.cached_tokens == 0
    assert got.token_ids == llama.generate("Hello there", max_tokens=4, temperature=0).token_ids


def test_slots_are_not_growable_unless_asked(qwen3_dir):
    engine = inferno.load(qwen3_dir, backend="cpu", progress=False)
    assert isinstance(engine.new_slots(2, 8), Slots) and not engine.new_slots(2, 8).growable


def test_a_sequence_that_cannot_start_fails_alone(qwen3_dir):
    """No slot has room for it (a fixed cache): that sequence ends in an error event, its slot
    stays free, and the loop runs the next one."""
    from inferno.scheduler import Scheduler, Slots
    from inferno.sequence import Sequence
    engine = inferno.load(qwen3_dir, backend="cpu", progress=False)
    try:
        loop = Scheduler(engine, Slots(engine.model, 1, 8))
        big = Sequence([1] * 7 + [2], Options(max_tokens=20, sampling=GREEDY), engine.tokenizer, engine.eos)
        small = Sequence([1, 2, 3], Options(max_tokens=2, sampling=GREEDY), engine.tokenizer, engine.eos)
        loop.add([big, small])
        events = []
        while loop.busy:
            events += loop.step()
        assert events[0][0] is big and events[0][1].finish_reason == "error" and "ValueError" in events[0][1].error
        assert small.finish_reason in ("stop", "length") and loop.slots.free() == 1
    finally:
        engine.close()
