"""Speculative decoding by prompt lookup (inferno/draft.py, Scheduler._draft and _verify).

The oracle is decoding without it: at temperature 0 every token a verifying step gives is the
model's own pick at that row, so the text must be the same, byte for byte, on the backends whose
products do not depend on the rows beside them (simd, pool: a verifying step's k + 1 rows give
the logits k + 1 decode steps would). And the slot must hold no rejected draft's rows."""

from __future__ import annotations

import pytest

import inferno
from inferno.draft import DRAFT_MAX, NgramDrafter, next_length, ngram_draft
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


def test_the_draft_length_follows_the_acceptance():
    assert next_length(8, 8, 8, 8) == 8 and next_length(4, 4, 4, 8) == 6  # all accepted: longer
    assert next_length(4, 4, 1, 8) == 3 and next_length(1, 1, 0, 8) == 1  # a rejection: shorter
    assert next_length(5, 0, 0, 8) == 5  # nothing drafted: unchanged


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


def test_draft_max_out_of_range_is_refused(engine):
    with pytest.raises(InfernoError, match=f"between 0 and {DRAFT_MAX}"):
        engine.options(temperature=0, speculative=DRAFT_MAX + 1)
    assert engine.options(temperature=0, speculative=DRAFT_MAX).speculative == DRAFT_MAX


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
        metrics = httpx.get(url + "/metrics").text
        accepted = [ln for ln in metrics.splitlines() if ln.startswith("inferno_draft_accepted_tokens_total")]
        assert accepted and float(accepted[0].split()[1]) >= details.accepted_prediction_tokens


@pytest.mark.parametrize("flags,message", [(["--draft-max", "99"], "--draft-max must be between 1 and 64")])
def test_the_cli_refuses_what_cannot_run_before_loading(flags, message):
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "inferno", "generate", "-m", "no-such-model", "-p", "hi",
                        "--spec-type", "ngram", *flags], capture_output=True, text=True, timeout=120)
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
