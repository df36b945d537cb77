"""Drafts for speculative decoding: tokens guessed cheaply, which one forward pass then checks.

Prompt lookup (n-gram), as prompt-lookup decoding, vLLM's `ngram` and llama.cpp's
`ngram-simple` draft: find the latest earlier place where the sequence's last n tokens (prompt
included) occurred, longest n first, and propose the tokens that followed it there. A reply that
quotes, summarises or edits its prompt repeats long runs of it, and each run the pass accepts is
that many decode steps saved; free chat finds few matches and drafts nothing.

Suffix drafts, as SuffixDecoding (Oliaro et al.) and vLLM's `suffix`: prompt lookup, and also
the replies of earlier requests (a Replies index the engine keeps), so that what agents and tools
repeat from request to request (the same JSON keys, the same tool call, the same code) is drafted
before this sequence has ever said it. The longer context match wins; among earlier replies that
continue one context, the continuation most of them share.

A draft model, as llama.cpp's `-md` and vLLM's `draft_model`: a smaller model that shares the
target's vocabulary proposes its own greedy continuation, from a KV slot of its own that follows
the sequence (ModelDrafter).
"""

from __future__ import annotations

import threading

import numpy as np

from inferno.model.decoder import UBATCH, Segment

NGRAM_MAX, NGRAM_MIN = 3, 2  # the longest and shortest run matched: one token alone drafts badly
DRAFT_MAX = 64
DRAFT_DEFAULT = 16  # --draft-max's default, and a request's that names a spec_type alone
SPEC_TYPES = ("ngram", "suffix", "draft")


def next_length(length: int, drafted: int, accepted: int, most: int) -> int:
    """The next draft's length after one of `drafted` tokens had `accepted` confirmed:
    transformers' heuristic schedule, two more after a wholly accepted draft, one fewer (not
    below one) otherwise."""
    if drafted == 0:
        return length
    return min(most, length + 2) if accepted == drafted else max(1, length - 1)


# The most a lookup may draft, by how many tokens of context its place shares with the
# sequence's end (at least NGRAM_MIN): (shared at least, tokens). The longer the agreement, the
# likelier the continuation holds: of SmolLM2's lookups on grounded tasks, one sharing 2 tokens
# had its first token accepted about half the time and its first four a quarter, one sharing 9
# or more nearly always, while each checked row costs about a fifth of a step
# (bench/RESULTS.md, "Lookup drafts cut to what their match supports").
EARNED = ((NGRAM_MIN, 2), (3, 4), (9, DRAFT_MAX))


def earned(shared: int) -> int:
    """The most tokens a lookup sharing `shared` tokens of context may draft (EARNED)."""
    return max((k for least, k in EARNED if shared >= least), default=0)


class NgramDrafter:
    """One sequence's drafts by prompt lookup (the interface every drafter has: `propose` up to
    some tokens, `learn` from how many the model confirmed). The length follows next_length,
    and a lookup drafts no more than its match supports (`earned`): a long context shared is
    no promise where the reply is about to part from it (an agent's turn that repeats the last
    turn's words up to a new name), and a long run accepted none where the match is new. A
    draft the model rejects from its first token also pauses drafting, for 1, 2, 4 ... up to
    BACKOFF_MAX steps while that goes on, so free text, where lookups rarely hold, pays for few
    checks."""

    BACKOFF_MAX = 16
    # The first draft's length: up to three rows a step go through the few-row kernels, which
    # cost little more than one; longer drafts are earned by acceptance.
    FIRST = 2

    def __init__(self, most: int):
        self.most = most
        self.length = min(most, self.FIRST)
        self.wait = self.backoff = 0
        self.lookup = Lookup()

    def propose(self, tokens: list[int], room: int) -> list[int]:
        """Up to min(length, room) tokens to follow `tokens` (the prompt and the reply so far)."""
        if self.wait:
            self.wait -= 1
            return []
        return self.draft(tokens, min(self.length, room))

    def draft(self, tokens: list[int], k: int) -> list[int]:
        start, shared = self.lookup.place(tokens)
        return tokens[start:start + min(k, earned(shared))] if start else []

    def learn(self, drafted: int, accepted: int) -> None:
        self.length = next_length(self.length, drafted, accepted, self.most)
        if drafted and not accepted:
            self.backoff = min(self.BACKOFF_MAX, 2 * self.backoff or 1)
            self.wait = self.backoff
        elif accepted:
            self.backoff = 0


def ngram_draft(tokens: list[int], k: int, n_max: int = NGRAM_MAX, n_min: int = NGRAM_MIN) -> list[int]:
    """Up to `k` tokens that followed the latest earlier occurrence of the last n of `tokens`
    (n from n_max down to n_min); none where no such occurrence exists."""
    start, _ = ngram_place(tokens, n_max, n_min)
    return tokens[start:start + k] if start and k > 0 else []


def ngram_place(tokens: list[int], n_max: int = NGRAM_MAX, n_min: int = NGRAM_MIN) -> tuple[int, int]:
    """Where the tokens that followed the latest earlier occurrence of the sequence's last n
    tokens begin (n from n_max down to n_min), and how much context it shares (at least n);
    (0, 0) where none occurred."""
    size = len(tokens)
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        tail = tokens[size - n:]
        first = tail[0]
        # the latest start i < size - n with tokens[i:i + n] == tail
        for i in range(size - n - 1, -1, -1):
            if tokens[i] == first and tokens[i:i + n] == tail:
                return i + n, match_length(tokens, size, tokens, i + n)
    return 0, 0


class Lookup:
    """ngram_place for one sequence as it grows, without its scan: the latest end of each of the
    sequence's NGRAM_MIN..NGRAM_MAX-grams, indexed as its tokens arrive, so a step's lookup
    costs the same at 100 tokens as at 16,000 (the scan, back to front every step, took half a
    millisecond there; a server's batch paid it for each sequence that drafts), for about 220
    bytes a token held (3.5 MB at 16,000: a sequence's own KV rows are far more). The same
    answers as ngram_place (tests/test_speculative.py). A sequence that is not the last one
    grown (another first token, a shorter one, another token where the last one ended) is
    indexed afresh; a drafter follows one sequence, and a draft from a stale index could only
    be rejected by its check, never change the text."""

    def __init__(self, n_max: int = NGRAM_MAX, n_min: int = NGRAM_MIN):
        self.ns = range(n_max, n_min - 1, -1)
        self.clear()

    def clear(self) -> None:
        self.ends: dict[int, dict[tuple, int]] = {n: {} for n in self.ns}  # gram -> its latest end
        self.seen = 0  # every gram that ends before this is indexed
        self.first = self.last = None

    def place(self, tokens: list[int]) -> tuple[int, int]:
        """ngram_place(tokens)."""
        size = len(tokens)
        if self.seen and (size < self.seen or tokens[0] != self.first or tokens[self.seen - 1] != self.last):
            self.clear()
        # Grams that end before the last token: each has a token after it to draft.
        for e in range(self.seen, size):
            for n in self.ns:
                if e >= n:
                    self.ends[n][tuple(tokens[e - n:e])] = e
        if size:
            self.seen, self.first, self.last = size, tokens[0], tokens[size - 1]
        for n in self.ns:
            if n < size:
                end = self.ends[n].get(tuple(tokens[size - n:]), 0)
                if end:
                    return end, match_length(tokens, size, tokens, end)
        return 0, 0


def match_length(tokens: list[int], end: int, other: list[int], other_end: int, most: int = 64) -> int:
    """How many tokens before `end` in `tokens` equal those before `other_end` in `other`, up to
    `most`: how much context an earlier occurrence shares."""
    n = 0
    while n < most and n < end and n < other_end and tokens[end - 1 - n] == other[other_end - 1 - n]:
        n += 1
    return n


class Replies:
    """The latest replies of the requests that drafted with it (the scheduler adds those of
    suffix drafts), indexed by their NGRAM_MAX-grams.

    Bounded: at most `budget` tokens are held; adding a reply past it drops the oldest whole,
    with its places in the index, and an n-gram keeps its FANOUT latest places only. A gram is
    one int key and a place one int (reply number, end), a list only where a gram recurs, so a
    held token costs about 200 bytes: the default 65,536 tokens, a few hundred replies, some
    13 MB."""

    FANOUT = 16

    def __init__(self, budget: int = 1 << 16):
        self.budget = budget
        self.held = 0
        self.replies: dict[int, list[int]] = {}  # number -> tokens, oldest first
        self.places: dict[int, int | list[int]] = {}  # gram -> place, or places (latest last)
        self.added = 0
        self.lock = threading.Lock()  # an engine's streams may run in several threads

    def add(self, tokens: list[int]) -> None:
        tokens = list(tokens)
        if len(tokens) <= NGRAM_MAX or len(tokens) > self.budget:
            return
        with self.lock:
            self._add(tokens)

    def _add(self, tokens: list[int]) -> None:
        number, self.added = self.added, self.added + 1
        self.replies[number] = tokens
        self.held += len(tokens)
        for end in range(NGRAM_MAX, len(tokens)):  # each gram with a token after it
            key, place = gram(tokens, end), number << 32 | end
            had = self.places.get(key)
            if had is None:
                self.places[key] = place
            elif isinstance(had, int):
                self.places[key] = [had, place]
            else:
                had.append(place)
                if len(had) > self.FANOUT:
                    del had[0]
        while self.held > self.budget:
            self._drop()

    def _drop(self) -> None:
        old = next(iter(self.replies))
        gone = self.replies.pop(old)
        self.held -= len(gone)
        for end in range(NGRAM_MAX, len(gone)):
            key = gram(gone, end)
            if key not in self.places:
                continue
            kept = [p for p in self.at(key) if p >> 32 != old]
            if not kept:
                del self.places[key]
            else:
                self.places[key] = kept[0] if len(kept) == 1 else kept

    def draft(self, tokens: list[int], k: int) -> tuple[list[int], int]:
        """Up to `k` tokens to follow `tokens`, from the earlier replies that share the longest
        context with its end (at least NGRAM_MAX tokens), and that context's length; ([], 0)
        where none does. Token by token, the continuation a majority of those replies take."""
        if k < 1 or len(tokens) < NGRAM_MAX:
            return [], 0
        with self.lock:
            runs = [(self.replies[p >> 32], p & 0xFFFFFFFF) for p in self.at(gram(tokens, len(tokens)))]
        return vote(tokens, runs, k) if runs else ([], 0)

    def at(self, key: int) -> list[int]:
        """The places (reply number << 32 | end) of a gram, none where it is not held."""
        had = self.places.get(key, ())
        return [had] if isinstance(had, int) else list(had)


def gram(tokens: list[int], end: int) -> int:
    """The NGRAM_MAX tokens before `end` as one int (token ids below 2**24)."""
    key = 0
    for t in tokens[end - NGRAM_MAX:end]:
        key = key << 24 | t
    return key


def vote(tokens: list[int], runs: list[tuple[list[int], int]], k: int) -> tuple[list[int], int]:
    """Of the places (reply, end) that follow a context like `tokens`' end, those sharing the
    longest one; token by token, the continuation a majority of them take, up to `k` tokens.
    Returns the draft and that context's length."""
    scored = [(match_length(tokens, len(tokens), reply, end), reply, end) for reply, end in runs]
    best = max(s for s, _, _ in scored)
    runs = [(reply, end) for s, reply, end in scored if s == best]
    draft: list[int] = []
    while len(draft) < k:
        at = len(draft)
        counts: dict[int, int] = {}
        for reply, end in runs:
            if end + at < len(reply):
                counts[reply[end + at]] = counts.get(reply[end + at], 0) + 1
        if not counts:
            break
        token, votes = max(counts.items(), key=lambda kv: kv[1])
        if len(runs) > 1 and 2 * votes <= len(runs):  # no majority: the replies part here
            break
        draft.append(token)
        runs = [(reply, end) for reply, end in runs if end + at < len(reply) and reply[end + at] == token]
    return draft, best


class SuffixDrafter(NgramDrafter):
    """Prompt lookup over the sequence itself, and the earlier replies in `replies`: whichever
    shares the longer context with the sequence's end drafts (the sequence itself on a tie), no
    more than that context earned; the length and the pauses follow NgramDrafter's rules."""

    def __init__(self, most: int, replies: Replies):
        super().__init__(most)
        self.replies = replies

    def draft(self, tokens: list[int], k: int) -> list[int]:
        own, shared = self.lookup.place(tokens)
        theirs, context = self.replies.draft(tokens, k)
        if theirs and context > shared:
            return theirs[:earned(context)]
        return tokens[own:own + min(k, earned(shared))] if own else []


class ModelDrafter(NgramDrafter):
    """Drafts by a draft model: its greedy continuation of the sequence. `slots` are the draft
    model's, paired with the target's (Slots.paired), and `slot` is the sequence's own slot
    number there, so that a slot's rows follow one sequence and outlive it for the next
    prompt that shares its prefix. Before each draft the slot is cut back to the longest prefix
    it shares with the sequence (the tokens the target rejected go), and what the sequence
    took since is fed in one pass; each drafted token but the last is fed to draft the next.
    The length and the pauses follow NgramDrafter's rules. A catch-up longer than UBATCH
    tokens (a prompt) goes in one pass of UBATCH a step, drafting nothing until it is in, so
    that no step beside other sequences' decode rows carries a whole prompt. The sequences of
    a step draft together (`draft_together`): one pass of the draft model a drafted token for
    all of them, not one for each."""

    def __init__(self, most: int, slots, slot: int, vocab: int):
        super().__init__(most)
        self.slots, self.slot, self.vocab = slots, slot, vocab  # the target's logits

    def wants(self, room: int) -> int:
        """How many tokens `propose` would draft now (0 while paused), counting the pause."""
        if self.wait:
            self.wait -= 1
            return 0
        return min(self.length, room)

    def draft(self, tokens: list[int], k: int) -> list[int]:
        return draft_together([self], [tokens], [k])[0]


def draft_together(drafters: list[ModelDrafter], tokens: list[list[int]], ks: list[int]) -> list[list[int]]:
    """Each drafter's draft of up to ks[i] tokens after tokens[i], all of them in the same
    passes: one step of the draft model feeds every sequence's catch-up (or a prompt's next
    UBATCH tokens, which drafts nothing this time), then one a round feeds each unfinished
    draft's newest token, its row beside the others'. The drafters share one model's slots.
    Each sequence's draft is what it would draft alone (a row's logits do not depend on its
    company, on simd and pool: tests/test_speculative.py)."""
    out: list[list[int]] = [[] for _ in drafters]
    if not drafters:
        return out
    slots = drafters[0].slots
    model = slots.model
    active, feeds, helds = [], {}, {}
    for i, (d, toks, k) in enumerate(zip(drafters, tokens, ks)):
        if k < 1:
            continue
        slots.reserve(len(toks) + k)
        held = slots.keep_prefix(d.slot, toks)
        feed = toks[held:]
        if len(feed) > UBATCH:  # a prompt's next part, logits unwanted: no draft this step
            feed = feed[:UBATCH]
            ks = [*ks[:i], 0, *ks[i + 1:]]
        active.append(i)
        feeds[i], helds[i] = feed, held
    while active:
        segs = [Segment(np.asarray(feeds[i], dtype=np.int64), drafters[i].slot, helds[i], logits=ks[i] > 0)
                for i in active]
        logits = model.step(segs, slots.cache)
        rows = model.ops.to_numpy(logits) if logits is not None else None
        row, going = 0, []
        for i, seg in zip(active, segs):
            slots.wrote(drafters[i].slot, helds[i], seg.ids)
            helds[i] += seg.ids.size
            if ks[i] < 1:
                continue
            out[i].append(int(np.argmax(rows[row, :drafters[i].vocab])))
            row += 1
            feeds[i] = out[i][-1:]
            if len(out[i]) < ks[i]:
                going.append(i)
        active = going
    return out
