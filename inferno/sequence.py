"""One sequence in the generation loop: its prompt, its sampler, and the text it has streamed.

Every generation is a Sequence, whether `Engine.generate` runs it alone or the server batches it
with others (scheduler.py). Each step feeds it (a prompt chunk, or its last token), and once its
prompt is in the cache each step's logits row goes to `accept`, which samples the next token
with the sequence's own settings and generator and returns an Event when there is something to
say: whole characters of new text (never half a UTF-8 character, never the start of what may
become a stop string), the finish, or both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from inferno.backends.base import DecodeRows, SlotStart
from inferno.constrain import apply_mask, fill_masks
from inferno.draft import DRAFT_MAX, SPEC_TYPES
from inferno.errors import InfernoError
from inferno.sampling import SamplingParams, sample
from inferno.tools import TAGGED, call_guard


def check_max_tokens(max_tokens: int) -> None:
    """The one check of max_tokens (Options.check; the CLI's flags before anything loads)."""
    if max_tokens < 1:
        raise InfernoError(f"max_tokens must be at least 1, got {max_tokens}", params=("max_tokens",))


@dataclass(frozen=True)
class Options:
    """How one request generates."""

    max_tokens: int = 256
    sampling: SamplingParams | None = None  # None: the model's defaults (engine.sampling)
    stop: tuple[str, ...] = ()  # strings that end the text; the match is cut off
    presence_penalty: float = 0.0  # OpenAI's: logit -= presence * (count > 0) + frequency * count,
    frequency_penalty: float = 0.0  # over the tokens generated so far
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    logprobs: bool = False  # each token's log-probability under the raw logits
    top_logprobs: int = 0  # and the k likeliest alternatives
    grammar: object = None  # a constrain.Grammar (JSON schema, GBNF...): each token masked to it
    # tools.FORMATS or harmony: the reply holds calls (a repeated one ends it); harmony's text
    # keeps its tags, the special tokens its parser reads
    tool_format: str | None = None
    speculative: int = 0  # up to this many tokens drafted a step (draft.py)
    spec_type: str = "ngram"  # how: prompt lookup, or "suffix" (earlier requests' replies too)

    def check(self, vocab_size: int) -> None:
        """The values no sampler can take, as one error naming the option."""
        check_max_tokens(self.max_tokens)
        if self.top_logprobs and not 0 < self.top_logprobs <= 20:
            raise InfernoError(f"top_logprobs must be between 0 and 20, got {self.top_logprobs}",
                               params=("top_logprobs",))
        if any(not 0 <= t < vocab_size for t, _ in self.logit_bias):
            raise InfernoError(f"logit_bias: a token id is out of range for a vocabulary of {vocab_size}",
                               params=("logit_bias",))
        if not all(isinstance(s, str) and s for s in self.stop):
            raise InfernoError("stop takes non-empty strings", params=("stop",))
        if not 0 <= self.speculative <= DRAFT_MAX:
            raise InfernoError(f"speculative (--draft-max) must be between 0 and {DRAFT_MAX}, got "
                               f"{self.speculative}", params=("speculative",))
        if self.spec_type not in SPEC_TYPES:
            raise InfernoError(f"spec_type must be one of {', '.join(SPEC_TYPES)}, got {self.spec_type!r}",
                               params=("spec_type",))


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), likeliest first


@dataclass
class Event:
    """What one sequence has to report after a step. `text` is new text, `token_ids` the tokens
    generated since the last event (held-back text keeps them here until it is sent)."""

    index: int  # the choice: prompt number * n + sample number
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None  # "stop", "length", "cancelled" or "error"
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0  # on the final event: all generated tokens, the EOS excepted
    cached_tokens: int = 0  # on the final event: prompt tokens whose K/V came from the cache
    drafted_tokens: int = 0  # on the final event: speculative tokens drafted, and confirmed
    accepted_tokens: int = 0
    embedding: np.ndarray | None = None  # an embedding's final event: its vector(s) (embedding.py)


class Sampler:
    """How a sequence picks its next token: its settings, its own random generator (seeded per
    choice, so n choices differ), the counts its penalties read, and its place in its grammar."""

    def __init__(self, options: Options, index: int):
        self.options = options
        seed = options.sampling.seed
        self.rng = np.random.default_rng(None if seed is None else seed + index)
        # Where the constrained output is in its grammar (constrain.Matcher), or None.
        self.matcher = options.grammar.matcher() if options.grammar is not None else None
        self.counts: dict[int, int] = {}  # generated token -> count, for the penalties
        self._draw: float | None = None  # the next token's uniform draw, once taken (draw())

    def choose(self, logits: np.ndarray, mask: np.ndarray | None, history) -> tuple[int, TokenLogprob | None]:
        """The next token from this step's logits row, with its log-probability when asked;
        `history` (the prompt and the tokens so far) for a repeat penalty."""
        opts = self.options
        row = self._adjusted(logits)
        if mask is not None:
            row = apply_mask(row, mask)
        history = history() if opts.sampling.repeat_penalty != 1.0 else None
        rng = self.rng if self._draw is None else _Drawn(self._draw)
        token = sample(row, opts.sampling, rng, history)
        return token, token_logprob(logits, token, opts.top_logprobs) if opts.logprobs else None

    def draw(self) -> float:
        """The uniform number the next token's draw takes from this generator, as sample()
        would (none when greedy): for a sampler elsewhere, the device's. Taken once per token:
        if that sampler fails, the host's sample takes the same number."""
        if self._draw is None:
            self._draw = self.rng.random() if self.options.sampling.temperature > 0 else 0.0
        return self._draw

    def took(self, token: int, text: bool) -> None:
        """`token` was taken (by this sampler or a device's); `text`: it is not an EOS."""
        self._draw = None
        if self.matcher is not None:
            self.matcher.consume(token)
        if text:
            self.counts[token] = self.counts.get(token, 0) + 1

    def _adjusted(self, logits: np.ndarray) -> np.ndarray:
        opts = self.options
        if not (opts.logit_bias or (self.counts and (opts.presence_penalty or opts.frequency_penalty))):
            return logits
        row = np.array(logits, dtype=np.float32)
        for token, bias in opts.logit_bias:
            row[token] += bias
        if self.counts:
            ids = np.fromiter(self.counts, dtype=np.int64)
            counts = np.fromiter(self.counts.values(), dtype=np.float32)
            row[ids] -= opts.frequency_penalty * counts + opts.presence_penalty
        return row


class Reply:
    """The text a sequence streams: tokens decoded into whole characters, cut at a stop string
    (what may begin one held back), and with tools, cut where a call repeats (tools.CallGuard).
    A format whose tags are special tokens (harmony: tools.TAGGED) keeps them in the text, for
    its parser; otherwise special tokens are not text. `add` takes a token's text and says what
    there is to send."""

    def __init__(self, tokenizer, stops: tuple[str, ...], tool_format: str | None):
        self.tokenizer, self.stops = tokenizer, stops
        self.guard = call_guard(tool_format)
        self.skip_special = tool_format not in TAGGED
        self._decoder = tokenizer.stream(skip_special_tokens=self.skip_special)
        self._decoded = ""  # the stream decoder's text so far
        self.text = ""  # the reply: decoded text, cut at a stop string
        self.sent = 0  # characters of `text` already sent
        self.stop_string: str | None = None  # the stop string that ended it

    def decode(self, token: int) -> str:
        piece = self._decoder.step(token)
        self._decoded += piece
        return piece

    def add(self, piece: str, final: str | None, tokens: list[int]) -> tuple[str, str | None] | None:
        """The new `piece` of text (`tokens`: every text token so far, for the end's whole
        decode); `final`: the sequence ends here ("stop" or "length"). Returns (text to send,
        finish) when there is something to say: a stop string or a repeated call can end it."""
        if final:
            # What a whole decode has beyond the stream's text, as Engine.stream does; a
            # character the end cut in half is dropped.
            piece += self.tokenizer.decode(tokens, skip_special_tokens=self.skip_special)[
                len(self._decoded):].rstrip("\ufffd")
        self.text += piece
        hold = 0
        if self.stops and piece:
            # A stop string can only start in unsent text: what might begin one is held back.
            hits = [(i, s) for i, s in ((self.text.find(s, self.sent), s) for s in self.stops) if i >= 0]
            if hits:
                at, self.stop_string = min(hits)
                self.text, final = self.text[:at], "stop"
            elif not final:
                hold = held_back(self.text, self.stops)
        if self.guard is not None and piece and final != "stop":
            # A repeated tool call ends the reply where it starts (tools.CallGuard), and what
            # may yet turn out to be one is held back until it is known not to be.
            self.guard.feed(piece)
            cut = self.guard.cut()
            if cut is not None:
                self.text, final = self.text[:max(cut, self.sent)], "stop"
            elif not final:
                hold = max(hold, len(self.text) - self.guard.hold())
        end = len(self.text) if final else len(self.text) - hold
        if end <= self.sent and not final:
            return None
        out, self.sent = self.text[self.sent:end], max(self.sent, end)
        return out, final


class Sequence:
    """One generation: its prompt and place in the KV cache, the tokens it has sampled, its
    Sampler and its Reply. `owner` is whoever waits for the events (the server's request
    handle); `index` the choice number within it, which also offsets the seed so that n choices
    differ.

    Finish reasons, one vocabulary for the loop, the API and GenerationResult (OpenAI's, and two
    of the loop's own): "stop" (an end-of-sequence token, the grammar's end, a stop string or a
    repeated tool call), "length" (max_tokens), "cancelled", "error"."""

    def __init__(self, prompt: list[int], options: Options, tokenizer, eos: frozenset[int], *,
                 index: int = 0, owner=None, arrival: float = 0.0):
        self.owner, self.index, self.prompt, self.options = owner, index, prompt, options
        self.eos = eos
        self.sampler = Sampler(options, index)
        self.reply = Reply(tokenizer, options.stop, options.tool_format)
        self.slot: int | None = None
        self.pos = 0  # tokens the slot holds: the prompt's first `pos`, then the generated ones
        self.cached = 0  # prompt tokens whose K/V came from the cache rather than a prefill
        self.cancelled = False  # set from any thread; the scheduler retires it at its next step
        self.sampled: list[int] = []  # every sampled token, the EOS included
        self.generated: list[int] = []  # the ones that are text
        self._ids: list[int] = []  # tokens not yet in an event
        self._lps: list[TokenLogprob] = []
        self.finish_reason: str | None = None
        self.drafted = self.accepted = 0  # speculative tokens proposed, and confirmed by the model
        self.drafter = None  # draft.py's, set by the scheduler at admission where options ask
        self.arrival = arrival
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        # (device runner, tokens its sampling state covers) once it has decoded there
        self.device: tuple[object, int] | None = None
        self.pooler = None  # an embedding's (embedding.Pooler): its prompt's rows, nothing sampled

    @property
    def reuses_prefix(self) -> bool:
        """Whether a slot's cached prefix may stand in for prompt rows: not for an embedding
        that pools rows the cache does not keep (every one, or the first)."""
        return self.pooler is None or self.pooler.reuses_prefix

    @property
    def whole_prompt(self) -> bool:
        """Whether the prompt must go through in one pass (embedding.Pooler.whole)."""
        return self.pooler is not None and self.pooler.whole

    def embedded(self) -> Event:
        """An embedding's final event, once its whole prompt is in: the pooled vector."""
        self.finish_reason = "stop"
        event = self._event("", "stop")
        event.embedding = self.pooler.result()
        return event

    @property
    def matcher(self):
        return self.sampler.matcher

    @property
    def prefilling(self) -> bool:
        return self.pos < len(self.prompt)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def next_ids(self, budget: int) -> np.ndarray:
        """The tokens to feed this step: up to `budget` of the prompt, or the last sampled one."""
        if self.prefilling:
            return np.asarray(self.prompt[self.pos:self.pos + budget], dtype=np.int64)
        return np.asarray(self.sampled[-1:], dtype=np.int64)

    def accept(self, logits: np.ndarray, mask: np.ndarray | None = None) -> Event | None:
        """Sample the next token from this step's logits row [vocab] and take it; `mask`
        [words] is the grammar's allowed tokens for a constrained sequence (constrain.fill_masks)."""
        return self.take(*self.choose(logits, mask))

    def choose(self, logits: np.ndarray, mask: np.ndarray | None = None) -> tuple[int, TokenLogprob | None]:
        """The next token from this step's logits row, with its log-probability when asked."""
        return self.sampler.choose(logits, mask, lambda: self.prompt + self.sampled)

    def draw(self) -> float:
        return self.sampler.draw()

    def logprob_from(self, logprobs, row: int, token: int) -> TokenLogprob | None:
        """This sequence's TokenLogprob from a device runner's (chosen, values, ids) arrays."""
        if not self.options.logprobs:
            return None
        chosen, values, ids = logprobs
        top = self.options.top_logprobs
        alts = [(int(i), float(v)) for i, v in zip(ids[row, :top], values[row, :top])]
        return TokenLogprob(token, float(chosen[row]), alts)

    def take(self, token: int, logprob: TokenLogprob | None = None) -> Event | None:
        """Add the next token, sampled here (choose) or on a device from this sequence's
        settings and draws, and say what there is to say."""
        end = token in self.eos
        self.sampler.took(token, not end)
        self.sampled.append(token)
        self._ids.append(token)
        if self.options.logprobs:
            self._lps.append(logprob)
        if end:
            return self._say("", "stop")
        self.generated.append(token)
        piece = self.reply.decode(token)
        if self.matcher is not None and self.matcher.is_stopped():  # complete: only EOS could follow
            return self._say(piece, "stop")
        if len(self.sampled) >= self.options.max_tokens:
            return self._say(piece, "length")
        return self._say(piece, None)

    def finish(self, reason: str, error: str | None = None) -> Event:
        """The final event of a sequence stopped from outside: cancelled or failed."""
        self.finish_reason = reason
        return self._event("", reason, error)

    def _say(self, piece: str, final: str | None) -> Event | None:
        said = self.reply.add(piece, final, self.generated)
        if said is None:
            return None
        text, final = said
        self.finish_reason = final
        return self._event(text, final)

    def _event(self, text: str, finish: str | None, error: str | None = None) -> Event:
        ev = Event(self.index, text, self._ids, self._lps if self.options.logprobs else None, finish, error)
        self._ids, self._lps = [], []
        if finish:
            ev.prompt_tokens, ev.completion_tokens = len(self.prompt), len(self.generated)
            ev.cached_tokens = self.cached
            ev.drafted_tokens, ev.accepted_tokens = self.drafted, self.accepted
        return ev


class _Drawn:
    """A generator that gives one number already drawn (Sequence.draw's), as sample() takes it."""

    def __init__(self, u: float):
        self.u = u

    def random(self) -> float:
        return self.u


def masks_for(seqs: list[Sequence]) -> list[np.ndarray | None]:
    """The grammar masks of the sequences about to sample, all in one call (llguidance fills
    the rows in parallel); None for an unconstrained one."""
    constrained = [s.matcher for s in seqs if s.matcher is not None]
    if not constrained:
        return [None] * len(seqs)
    bitmask = np.empty((len(constrained), constrained[0].words), dtype=np.int32)  # [n, words]
    fill_masks(constrained, bitmask)
    rows = iter(bitmask)
    return [next(rows) if s.matcher is not None else None for s in seqs]


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that is the start of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


def token_logprob(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    """log softmax of the raw logits (before penalties and temperature, as vLLM reports them)."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max()
    lse = m + np.log(np.exp(x - m).sum())
    alts = []
    if top:
        ids = np.argpartition(-x, top - 1)[:top]
        ids = ids[np.argsort(-x[ids], kind="stable")]
        alts = [(int(i), float(x[i] - lse)) for i in ids]
    return TokenLogprob(int(token), float(x[token] - lse), alts)


def decode_rows(seqs: list[Sequence], masks: list, runner) -> DecodeRows:
    """The host's side of a decode step on a device runner: each sequence's last token, its
    place, its settings and its draw; the masks of the constrained ones; and a SlotStart for
    each whose sampling state the runner does not hold yet (new there, or sampled on the host
    since)."""
    params = [s.options.sampling for s in seqs]
    column = lambda f, dtype=np.float64: np.array([f(p) for p in params], dtype=dtype)  # noqa: E731
    constrained = np.array([m is not None for m in masks])
    rows = None  # [B, words]: every row's mask, all allowed where a row is free
    if constrained.any():
        rows = np.full((len(masks), next(m for m in masks if m is not None).size), -1, dtype=np.int32)
        for b in np.flatnonzero(constrained):
            rows[b] = masks[b]
    starts = [SlotStart(b, np.asarray(s.prompt + s.sampled[:-1], dtype=np.int64),
                        np.asarray(s.generated[:-1], dtype=np.int64), s.options.logit_bias)
              for b, s in enumerate(seqs) if s.device != (runner, len(s.sampled) - 1)]
    asking = [s.options.top_logprobs for s in seqs if s.options.logprobs]
    return DecodeRows(
        ids=np.array([s.sampled[-1] for s in seqs], dtype=np.int64),
        positions=np.array([s.pos for s in seqs], dtype=np.int64),
        slots=np.array([s.slot for s in seqs], dtype=np.int64),
        temperature=column(lambda p: p.temperature), top_k=column(lambda p: p.top_k, np.int64),
        top_p=column(lambda p: p.top_p), min_p=column(lambda p: p.min_p),
        repeat=column(lambda p: p.repeat_penalty),
        presence=np.array([s.options.presence_penalty for s in seqs]),
        frequency=np.array([s.options.frequency_penalty for s in seqs]),
        draws=np.array([s.draw() for s in seqs]),
        masks=rows, constrained=constrained, logprobs=max(asking) if asking else -1, starts=starts)
