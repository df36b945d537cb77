"""Speculative decoding by prompt lookup and suffix drafts (inferno/draft.py, Scheduler._draft
and _verify).

The oracle is decoding without it: at temperature 0 every token a verifying step gives is the
model's own pick at that row, so the text must be the same, byte for byte, on the backends whose
products do not depend on the rows beside them (simd, pool: a verifying step's k + 1 rows give
the logits k + 1 decode steps would). And the slot must hold no rejected draft's rows."""

from __future__ import annotations

import numpy as np
import pytest

import inferno
from inferno.draft import (DRAFT_MAX, Lookup, NgramDrafter, Replies, SuffixDrafter, earned, next_length, ngram_draft,
                          ngram_place)
from inferno.errors import InfernoError
from inferno.loading.resolve import resolve
from inferno.scheduler import Scheduler
from inferno.sequence import Sequence

PASSAGE = ("The Rhine is a river that begins in the Swiss Alps, flows through Germany and the "
           "Netherlands, and empties into the North Sea. It is about 1,230 kilometres long. Cities "
           "along the Rhine include Basel, Strasbourg, Cologne, Düsseldorf and Rotterdam.")
PROMPTS = [PASSAGE + "\n\nRepeat the text above word for word.",
           PASSAGE + "\n\nWhich cities lie on the Rhine? Answer from the text.",
           "def area(width, height):\n    return width * height\n\nRename width to w in this code.",
           "Write a short poem about the sea."]  # free: few drafts, and still the same text


def test_ngram_draft_proposes_what_followed_the_latest_match():
    assert ngram_draft([1, 2, 3, 4, 5, 1, 2, 3], 3) == [4, 5, 1]  # the 3-gram 1 2 3
    assert ngram_draft([7, 2, 3, 9, 5, 2, 3], 2) == [9, 5]  # the 2-gram 2 3
    assert ngram_draft([1, 9, 8, 1, 9], 5) == [8, 1, 9]  # no more than there is
    assert ngram_draft([4, 1, 4, 2, 4, 1], 1) == [4]  # the latest of two matches
    assert ngram_draft([1, 9, 8, 1], 5) == []  # one token alone is no match (NGRAM_MIN)
    assert ngram_draft([1, 2, 3], 4) == [] and ngram_draft([1, 2, 1, 2], 0) == []


def test_the_growing_index_finds_what_the_scan_finds():
    """Lookup.place, indexed as the sequence grows (a prompt at once, then a token or a few a
    step), gives ngram_place's answer at every step, on sequences of few distinct tokens (many
    matches, of every length) and of many; a sequence that is not the last one grown is indexed
    afresh."""
    rng = np.random.default_rng(0)
    for vocab in (3, 5, 50):
        tokens = [int(t) for t in rng.integers(0, vocab, 30)]
        lookup = Lookup()
        for _ in range(60):
            assert lookup.place(tokens) == ngram_place(tokens), (vocab, len(tokens))
            tokens += [int(t) for t in rng.integers(0, vocab, rng.integers(1, 4))]
        for other in (tokens[:40], [tokens[0] + 1, *tokens[1:]], tokens[:-1] + [vocab], []):
            assert lookup.place(other) == ngram_place(other)
    assert Lookup().place([1, 2]) == (0, 0) and Lookup().place([1, 2, 1, 2]) == (2, 2)


def test_the_draft_length_follows_the_acceptance():
    assert next_length(8, 8, 8, 8) == 8 and next_length(4, 4, 4, 8) == 6  # all accepted: longer
    assert next_length(4, 4, 1, 8) == 3 and next_length(1, 1, 0, 8) == 1  # a rejection: shorter
    assert next_length(5, 0, 0, 8) == 5  # nothing drafted: unchanged


def test_a_lookup_drafts_no_more_than_its_shared_context_supports():
    """Whatever length acceptance has earned, a lookup whose place shares two tokens of context
    drafts at most two; three to eight, four; nine or more, all the length allows (and no more
    than followed the match)."""
    assert [earned(n) for n in (0, 1, 2, 3, 8, 9, 64)] == [0, 0, 2, 4, 4, DRAFT_MAX, DRAFT_MAX]
    run = list(range(100, 140))
    d = NgramDrafter(16)
    assert d.draft([7, 8, *run, 1, 7, 8], 16) == [100, 101]  # 7 8: two shared
    assert d.draft([6, 7, 8, *run, 1, 6, 7, 8], 16) == run[:4]  # 6 7 8: three
    assert d.draft([*run, 1, *run[:9]], 16) == run[9:25]  # nine shared: all 16
    assert d.draft([*run[:12], 1, *run[:9]], 16) == [*run[9:12], 1, *run[:9]]  # all that followed it
    d.length = 6  # earned by acceptance, and here by the match too
    assert d.propose([*run, 1, *run[:9]], 20) == run[9:15] and d.propose([6, 7, 8, *run, 1, 6, 7, 8], 20) == run[:4]
    s = SuffixDrafter(16, Replies())
    s.replies.add([5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17])
    assert s.draft([0, 6, 7, 8], 16) == [9, 10, 11, 12]  # a reply sharing three tokens: four
    assert s.draft([5, 6, 7, 8, 9, 10, 11, 12, 13], 16) == [14, 15, 16, 17]  # nine: all there is


def test_drafts_that_keep_failing_pause_drafting_longer_each_time():
    d = NgramDrafter(4)
    tokens = [1, 2, 3, 1, 2]  # the 2-gram 1 2 drafts 3 1 2
    waits, sizes = [], []
    for _ in range(4):
        draft = d.propose(tokens, 10)
        sizes.append(len(draft))
        d.learn(len(draft), 0)
        waits.append(d.wait)
        while d.wait:
            assert d.propose(tokens, 10) == []
    assert waits == [1, 2, 4, 8] and sizes == [2, 1, 1, 1]
    d.learn(1, 1)
    assert d.backoff == 0 and d.propose(tokens, 1) == [3]


def test_earlier_replies_draft_what_most_of_them_said_next():
    r = Replies()
    r.add([5, 6, 7, 8, 9, 10, 11])
    r.add([1, 6, 7, 8, 9, 10, 12])
    r.add([2, 6, 7, 8, 9, 10, 11, 13])
    assert r.draft([0, 7, 8, 9], 5) == ([10, 11], 3)  # 11 twice against 12 once; then they part
    assert r.draft([6, 7, 8, 9], 5) == ([10, 11], 4)  # (the context shared, 4 tokens)
    assert r.draft([0, 1, 2, 3], 5) == ([], 0) and r.draft([7, 8, 9], 0) == ([], 0)
    r.add([4, 4, 7, 8, 9, 20, 21])
    assert r.draft([4, 4, 7, 8, 9], 5) == ([20, 21], 5)  # the longest shared context wins over a majority


def test_earlier_replies_hold_no_more_than_their_budget():
    r = Replies(budget=40)
    for i in range(10):
        r.add(list(range(100 + 10 * i, 110 + 10 * i)))
    assert r.held == 40 and list(r.replies) == [6, 7, 8, 9]  # the oldest dropped whole
    places = [p for key in r.places for p in r.at(key)]
    assert {p >> 32 for p in places} == set(r.replies)  # their places gone with them
    assert len(r.places) == 4 * (10 - 3)
    assert r.draft([103, 104, 105], 4) == ([], 0)
    assert r.draft([193, 194, 195], 9) == ([196, 197, 198, 199], 3)
    r.add(list(range(41)))  # longer than the whole budget: not kept
    assert r.held == 40


def test_suffix_drafts_come_from_whichever_shares_the_longer_context():
    r = Replies()
    r.add([7, 1, 2, 3, 4, 50, 51, 52])
    d = SuffixDrafter(8, r)
    assert d.draft([9, 2, 3, 4], 3) == [50, 51, 52]  # only an earlier reply knows 2 3 4
    assert d.draft([5, 1, 2, 3, 4, 60, 7, 1, 2, 3, 4], 3) == [50, 51, 52]  # 5 shared against 4
    assert d.draft([1, 2, 3, 4, 60, 9, 1, 2, 3, 4], 3) == [60, 9, 1]  # 4 against 4: its own
    assert d.draft([8, 8, 8], 3) == [8] and d.draft([0, 1], 3) == []


@pytest.fixture(scope="module", params=["simd", "pool"])
def engine(request):
    return inferno.load(str(resolve("smollm2-135m")), request.param, progress=False)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_text_is_the_same_with_drafts(engine, prompt):
    plain = engine.generate(prompt, max_tokens=96, temperature=0)
    fast = engine.generate(prompt, max_tokens=96, temperature=0, speculative=8)
    assert fast.token_ids == plain.token_ids and fast.text == plain.text
    assert fast.finish_reason == plain.finish_reason and plain.drafted_tokens == 0
    assert 0 <= fast.accepted_tokens <= fast.drafted_tokens
    if prompt.endswith("word for word."):
        assert fast.accepted_tokens >= len(fast.token_ids) // 2  # most of a quote is drafted right


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_seeded_sampling_gives_the_same_text_with_drafts(engine, prompt):
    """Each token is drawn from its row as a plain step would draw it, one draw a token, and
    kept while it equals the draft: the same draws on the same logits, so the same text (and
    so the same distribution, which for a one-token-a-position draft is the
    distribution-preserving rule's)."""
    for seed in (1, 2):
        plain = engine.generate(prompt, max_tokens=64, temperature=0.8, seed=seed)
        fast = engine.generate(prompt, max_tokens=64, temperature=0.8, seed=seed, speculative=8)
        assert fast.token_ids == plain.token_ids and fast.drafted_tokens > 0


def test_the_slot_keeps_no_rejected_rows_and_a_neighbour_is_unchanged(engine):
    """Through the loop itself: a speculating sequence beside a plain one in the same steps;
    each gives what it gives alone, and each slot's rows are exactly its own tokens."""
    def run(specs):
        slots = engine.new_slots(len(specs), 512)
        loop = Scheduler(engine, slots, chunk=64)
        seqs = []
        for i, (prompt, k) in enumerate(specs):
            ids = engine.encode_prompt(prompt)
            opts = engine.options(max_tokens=60, temperature=0, speculative=k)
            seqs.append(Sequence(ids, opts, engine.tokenizer, engine.eos, index=i))
        loop.add(seqs)
        while loop.busy:
            loop.step()
        for s in seqs:
            # the slot holds the prompt and every sampled token but the last (never fed)
            assert slots.tokens[s.slot] == s.prompt + s.sampled[:-1]
            assert slots.cache.lengths[s.slot] == len(slots.tokens[s.slot])
        return [s.generated for s in seqs], loop
    (alone_spec,), _ = run([(PROMPTS[0], 8)])
    (alone_free,), _ = run([(PROMPTS[3], 0)])
    together, loop = run([(PROMPTS[0], 8), (PROMPTS[3], 0)])
    assert together == [alone_spec, alone_free] and loop.accepted > 0


@pytest.mark.parametrize("options", [dict(presence_penalty=0.2, frequency_penalty=0.1), dict(repeat_penalty=1.05),
                                     dict(logprobs=True, top_logprobs=3), dict(stop=["Rotterdam", "Basel"])])
def test_penalties_logprobs_and_stops_see_every_token_a_draft_adds(engine, options):
    """A verifying step takes its tokens one at a time, as plain steps take them: penalties
    count each accepted token before the next row is picked, so the text is the same."""
    plain = engine.generate(PROMPTS[0], max_tokens=64, temperature=0, **options)
    fast = engine.generate(PROMPTS[0], max_tokens=64, temperature=0, speculative=8, **options)
    assert fast.token_ids == plain.token_ids and fast.text == plain.text and fast.drafted_tokens > 0
    assert fast.accepted_tokens <= len(fast.token_ids)  # never counted past the reply's end
    if options.get("logprobs"):
        assert [(lp.token_id, lp.logprob) for lp in fast.logprobs] == [(lp.token_id, lp.logprob) for lp in plain.logprobs]


def test_a_grammar_rejects_a_draft_that_breaks_it(engine):
    schema = {"type": "object", "properties": {"river": {"type": "string"}, "cities": {
        "type": "array", "items": {"type": "string"}}}, "required": ["river", "cities"]}
    prompt = PASSAGE + "\n\nGive the river and its cities as JSON."
    plain = engine.generate(prompt, max_tokens=96, temperature=0, json_schema=schema)
    fast = engine.generate(prompt, max_tokens=96, temperature=0, json_schema=schema, speculative=8)
    assert fast.token_ids == plain.token_ids and fast.drafted_tokens > 0


def test_suffix_drafts_an_earlier_requests_reply(engine, monkeypatch):
    """A free prompt that prompt lookup drafts little of, asked twice with suffix drafts: the
    second time the first reply drafts it (most of it accepted), and the text is the same."""
    monkeypatch.setattr(engine, "replies", Replies())
    ask = dict(max_tokens=48, temperature=0, speculative=8)
    plain = engine.generate(PROMPTS[3], max_tokens=48, temperature=0)
    looked_up = engine.generate(PROMPTS[3], **ask)
    first = engine.generate(PROMPTS[3], **ask, spec_type="suffix")
    held = engine.replies.held  # the reply kept, with its EOS where it ended with one
    second = engine.generate(PROMPTS[3], **ask, spec_type="suffix")
    assert plain.token_ids == looked_up.token_ids == first.token_ids == second.token_ids
    assert held - len(first.token_ids) == (first.finish_reason == "stop")
    assert second.accepted_tokens >= len(second.token_ids) // 2 > looked_up.accepted_tokens


@pytest.fixture(scope="module")
def drafted(engine):
    """The engine's model with itself as the draft model: every draft is the target's own
    greedy continuation, so every drafted token must be accepted."""
    model = str(resolve("smollm2-135m"))
    with inferno.load(model, engine.backend, progress=False, draft=model) as e:
        yield e


@pytest.mark.parametrize("prompt", PROMPTS[2:])
def test_a_draft_model_drafts_in_step_with_the_sequence(drafted, prompt):
    """The draft model's slot follows the sequence (its prompt in one pass, then each
    accepted token, rejected rows cut away): drafting with the target itself, greedy, every
    drafted token is the target's pick, on a free prompt that prompt lookup drafts little of."""
    plain = drafted.generate(prompt, max_tokens=64, temperature=0)
    fast = drafted.generate(prompt, max_tokens=64, temperature=0, speculative=8, spec_type="draft")
    assert fast.token_ids == plain.token_ids and fast.text == plain.text
    assert fast.accepted_tokens == fast.drafted_tokens >= len(fast.token_ids) // 2
    again = drafted.generate(prompt + " Be brief.", max_tokens=24, temperature=0.8, seed=3, speculative=8,
                             spec_type="draft")  # sampled: drafts accepted where they equal the draws
    assert again.token_ids == drafted.generate(prompt + " Be brief.", max_tokens=24, temperature=0.8,
                                               seed=3).token_ids


def drafting_loop(e, max_tokens: int):
    """Three prompts as sequences that draft with e's draft model in one loop (a server's
    batch), and each one's plain greedy tokens: (loop, sequences, plain)."""
    from inferno.model.decoder import UBATCH
    prompts = PROMPTS[1:4]
    plain = [e.generate(p, max_tokens=max_tokens, temperature=0).token_ids for p in prompts]
    opts = e.options(max_tokens=max_tokens, temperature=0, speculative=4, spec_type="draft")
    ids = [e.encode_prompt(p) for p in prompts]
    seqs = [Sequence(x, opts, e.tokenizer, e.eos, index=i) for i, x in enumerate(ids)]
    return Scheduler(e, e.new_slots(3, max(map(len, ids)) + 40), chunk=UBATCH), seqs, plain


def test_sequences_draft_together(drafted, monkeypatch):
    """Three sequences drafting with the draft model in one loop (a server's batch): each
    gives its plain greedy tokens with every drafted token accepted, and the draft model takes
    one pass a drafted token for all of them (draft.draft_together), not one for each."""
    loop, seqs, plain = drafting_loop(drafted, 24)
    widths, step = [], drafted.draft.model.step

    def counted(segments, *args, **kwargs):
        widths.append(len(segments))
        return step(segments, *args, **kwargs)
    monkeypatch.setattr(drafted.draft.model, "step", counted)
    loop.add(seqs)
    steps = 0
    while loop.busy:
        loop.step()
        steps += 1
    for seq, want in zip(seqs, plain):
        assert [t for t in seq.sampled if t not in drafted.eos] == want
        assert seq.accepted == seq.drafted > 0
    assert max(widths) == 3  # a pass carried every sequence's row
    assert len(widths) <= 4 * steps  # a pass a drafted token (the first with the catch-up), for all


def test_a_failing_draft_pass_drops_only_its_sequence(drafted, monkeypatch):
    """Where the shared pass fails, the sequences draft again one at a time: the one whose pass
    fails goes on without drafts, the others keep theirs, and every text is the plain one."""
    loop, seqs, plain = drafting_loop(drafted, 16)
    step = drafted.draft.model.step

    def failing(segments, *args, **kwargs):
        if any(s.slot == seqs[1].slot for s in segments):
            raise RuntimeError("the draft model's pass failed")
        return step(segments, *args, **kwargs)
    monkeypatch.setattr(drafted.draft.model, "step", failing)
    loop.add(seqs)
    while loop.busy:
        loop.step()
    assert [[t for t in s.sampled if t not in drafted.eos] for s in seqs] == plain
    assert seqs[1].drafter is None and seqs[1].drafted == 0
    assert seqs[0].drafted > 0 and seqs[2].drafted > 0


def test_a_long_prompt_reaches_the_draft_model_a_chunk_a_step(drafted):
    """A prompt past UBATCH tokens is fed to the draft model one pass of UBATCH a step: the
    first drafts wait for it, then every drafted token is the target's own pick."""
    from inferno.model.decoder import UBATCH
    prompt = " ".join([PASSAGE] * 12) + "\n\nRepeat the last sentence above."
    assert len(drafted.encode_prompt(prompt)) > UBATCH
    plain = drafted.generate(prompt, max_tokens=32, temperature=0)
    fast = drafted.generate(prompt, max_tokens=32, temperature=0, speculative=8, spec_type="draft")
    assert fast.token_ids == plain.token_ids
    assert fast.accepted_tokens == fast.drafted_tokens >= len(fast.token_ids) // 3


@pytest.fixture(scope="module")
def tiny_pair(qwen3_dir, tmp_path_factory):
    """The tiny Qwen3 (its weights as Q8_0, whose products are batch-invariant) and a draft
    of another size and seed with the same tokenizer: drafts that are mostly wrong."""
    from tiny import make_model
    draft = make_model(tmp_path_factory.mktemp("draft"), "qwen3", hidden=32, heads=2, kv_heads=1, seed=7)
    with inferno.load(str(qwen3_dir), "simd", weights="q8_0", draft=str(draft), progress=False) as e:
        yield e


def test_a_wrong_draft_model_changes_nothing(tiny_pair):
    for prompt in ("hello there", "the cat sat on the mat and the cat"):
        plain = tiny_pair.generate(prompt, max_tokens=40, temperature=0, raw=True)
        fast = tiny_pair.generate(prompt, max_tokens=40, temperature=0, raw=True, speculative=4, spec_type="draft")
        assert fast.token_ids == plain.token_ids and fast.drafted_tokens > fast.accepted_tokens


def test_a_draft_model_with_another_vocabulary_is_refused(qwen3_dir):
    draft = str(resolve("smollm2-135m"))
    with pytest.raises(InfernoError, match="does not share the vocabulary") as e:
        inferno.load(str(qwen3_dir), "simd", draft=draft, progress=False, warm_up=False)
    assert draft in str(e.value) and str(qwen3_dir) in str(e.value)


def test_a_drafter_that_fails_is_dropped_and_the_reply_goes_on(engine):
    """A drafter's failure (a draft model's pass that raises) costs that sequence its drafts,
    not its reply: the scheduler's step goes on, and the text is the plain one."""
    class Broken:
        def propose(self, tokens, room):
            raise RuntimeError("the draft model's cache is gone")

    ids = engine.encode_prompt(PROMPTS[0])
    loop = Scheduler(engine, engine.new_slots(1, 512), chunk=64)
    seq = Sequence(ids, engine.options(max_tokens=24, temperature=0, speculative=4), engine.tokenizer, engine.eos)
    loop.add([seq])
    loop.step()
    seq.drafter = Broken()
    while loop.busy:
        loop.step()
    assert seq.drafter is None and seq.finish_reason == "length"
    assert seq.generated == engine.generate(PROMPTS[0], max_tokens=24, temperature=0).token_ids


def test_draft_max_out_of_range_is_refused(engine):
    with pytest.raises(InfernoError, match=f"between 0 and {DRAFT_MAX}"):
        engine.options(temperature=0, speculative=DRAFT_MAX + 1)
    assert engine.options(temperature=0, speculative=DRAFT_MAX).speculative == DRAFT_MAX
    with pytest.raises(InfernoError, match="spec_type must be one of ngram, suffix, draft"):
        engine.options(temperature=0, speculative=4, spec_type="eagle")
    with pytest.raises(InfernoError, match="needs a draft model"):
        engine.options(temperature=0, speculative=4, spec_type="draft")


def test_the_server_drafts_for_every_request_that_can_take_it():
    """--spec-type ngram on the server: the same text as a request that turns it off, its
    drafts in usage (as OpenAI counts predicted outputs) and /metrics; a request's own
    `speculative` out of range is a 400."""
    import httpx
    import openai
    from test_serve import running, wait_healthy

    from inferno.serve.app import ServerConfig, build_app

    app = build_app(ServerConfig(model=str(resolve("smollm2-135m")), model_id="m", parallel=2,
                                 ctx_size=1024, speculative=8))
    with running(app) as url:
        wait_healthy(url)
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        ask = dict(model="m", messages=[{"role": "user", "content": PROMPTS[0]}], temperature=0, max_tokens=80)
        fast = client.chat.completions.create(**ask)
        plain = client.chat.completions.create(**ask, extra_body={"speculative": 0})
        assert fast.choices[0].message.content == plain.choices[0].message.content
        details = fast.usage.completion_tokens_details
        assert details.accepted_prediction_tokens > 0 and details.rejected_prediction_tokens >= 0
        assert plain.usage.completion_tokens_details is None
        assert details.accepted_prediction_tokens <= fast.usage.completion_tokens
        with pytest.raises(openai.BadRequestError, match="speculative"):
            client.chat.completions.create(**ask, extra_body={"speculative": 1000})
        suffix = [client.chat.completions.create(**ask, extra_body={"spec_type": "suffix"}) for _ in range(2)]
        assert {s.choices[0].message.content for s in suffix} == {plain.choices[0].message.content}
        assert (suffix[1].usage.completion_tokens_details.accepted_prediction_tokens
                >= suffix[0].usage.completion_tokens_details.accepted_prediction_tokens)
        with pytest.raises(openai.BadRequestError, match="spec_type"):
            client.chat.completions.create(**ask, extra_body={"spec_type": "eagle"})
        with pytest.raises(openai.BadRequestError, match="needs a draft model"):
            client.chat.completions.create(**ask, extra_body={"spec_type": "draft"})
        metrics = httpx.get(url + "/metrics").text
        accepted = [ln for ln in metrics.splitlines() if ln.startswith("inferno_draft_accepted_tokens_total")]
        assert accepted and float(accepted[0].split()[1]) >= details.accepted_prediction_tokens


@pytest.mark.parametrize("flags,message", [(["--spec-type", "ngram", "--draft-max", "99"], "--draft-max must be between 1 and 64"),
                                           (["--spec-type", "draft"], "--spec-type draft needs --model-draft")])
def test_the_cli_refuses_what_cannot_run_before_loading(flags, message):
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "inferno", "generate", "-m", "no-such-model", "-p", "hi", *flags],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and message in p.stderr and "load:" not in p.stderr


def test_chat_turns_with_drafts_give_the_same_replies(engine):
    """inferno chat's loop (a Session across turns, its prefix reused) with drafts."""
    import io

    from inferno.chat import run_chat

    turns = PROMPTS[0] + "\nNow repeat its first sentence only.\n"
    outs = []
    for k in (0, 8):
        out, err = io.StringIO(), io.StringIO()
        run_chat(engine, stdin=io.StringIO(turns), stdout=out, stderr=err, max_tokens=60, temperature=0,
                 speculative=k)
        outs.append(out.getvalue())
    assert outs[0] == outs[1] and "Rhine" in outs[1]


def test_the_cli_drafts_with_a_draft_model():
    """-md alone turns drafting on (--spec-type draft), the draft's load is shown, and the
    stats line counts its drafts."""
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "inferno", "generate", "-t", "0", "-n", "24", "-md", "smollm2-135m",
                        "-p", "Write a short poem about the sea."], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "draft: " in p.stderr and "drafted tokens accepted" in p.stderr and p.stdout.strip()
