"""The one generation loop: sequences in KV cache slots, and a step that admits, runs and
retires them (nano-vllm's scheduler, with chunked prefill and prefix reuse).

    slots = Slots(engine.model, count=4, capacity=2048)
    loop = Scheduler(engine, slots, chunk=256)
    loop.add([Sequence(ids, options, engine.tokenizer, engine.eos)])
    while loop.busy:
        for seq, event in loop.step(): ...

`Engine.generate` runs one sequence through it (the batch of one, its prompt in passes of
decoder.UBATCH tokens, as llama.cpp's n_ubatch);
the server's BatchEngine runs it on its own thread for every request. Each step:
  1. retire the cancelled, and give waiting sequences free slots, each with the longest cached
     prefix of its prompt (see Slots);
  2. one forward pass (model.step) over every running sequence: one token each for those
     decoding, and for those still prefilling up to `chunk` prompt tokens in all, oldest first,
     so a long prompt enters over several steps and the running streams never stall behind it
     (but for a text of a model that attends both ways, whole in one step: Sequence.whole_prompt);
  3. sample each sequence's next token from its own row, with its own settings and generator;
  4. retire the finished, keeping the tokens their slots hold for the next prompt.

An exception in a step fails only the sequence that raised it: the step is rerun one sequence
at a time, which rewrites the same cache rows, and the ones that fail again are retired. A
failed segment's rows are never offered to a later prompt: a slot's tokens grow only after the
forward that wrote their rows returned.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque

import numpy as np

from inferno.draft import ModelDrafter, NgramDrafter, SuffixDrafter, draft_together
from inferno.errors import InfernoError
from inferno.model.decoder import Segment
from inferno.sequence import Event, Sequence, decode_rows, masks_for

log = logging.getLogger("inferno.serve")


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


class Slots:
    """KV cache slots that remember which tokens' rows they hold.

    A slot keeps its tokens after its sequence ends. A new prompt takes the free slot whose
    tokens share the longest prefix with it, else the least recently used one, as llama.cpp's
    server does; and when another slot, busy or free, holds a longer prefix, those rows are
    copied over (a copy is far cheaper than a prefill), so clients that share a system prompt
    prefill it once. Rows are the same whichever slot holds them: every cache position is kept
    (sliding windows are loop bounds in attention, not a ring buffer), so this holds for
    Gemma 3's windowed layers too.

    `growable` (a Session's single slot): the cache is reallocated, twice as large, when a
    prompt needs more positions than it has, up to the model's context."""

    def __init__(self, model, count: int, capacity: int, *, growable: bool = False):
        self.model, self.growable = model, growable
        self.cache = model.new_cache(capacity, slots=count)
        self.tokens: list[list[int]] = [[] for _ in range(count)]  # rows each slot holds, in order
        self.busy = [False] * count
        self.used = [0] * count  # when each slot was last taken: least recently used goes first
        self._clock = itertools.count(1)
        self._runner: tuple = (None, None)  # (the cache it was made for, the device runner)
        self._paired: Slots | None = None  # a draft model's slots (paired)

    @property
    def count(self) -> int:
        return len(self.tokens)

    def free(self) -> int:
        return self.busy.count(False)

    def take(self, prompt: list[int], need: int, reuse: bool = True) -> tuple[int, int]:
        """A free slot for `prompt` (with room for `need` positions), holding as long a prefix of
        it as any slot can give: (slot, prompt tokens already in it). At least the prompt's
        last token is left to feed: its logits start the reply. Without `reuse`, the free slot
        holding fewest tokens (the least recently used of those), emptied."""
        self.reserve(need)  # (before a slot is taken: a request too big leaves them all free)
        free = [s for s in range(self.count) if not self.busy[s]]
        if reuse:
            shared = {s: min(common_prefix(self.tokens[s], prompt), len(prompt) - 1) for s in free}
            slot = max(free, key=lambda s: (shared[s], -self.used[s]))  # ties: the least recently used
        else:  # the slot holding least, so that others' prefixes stay for their next turns
            shared = dict.fromkeys(free, 0)
            slot = min(free, key=lambda s: (len(self.tokens[s]), self.used[s]))
        self.busy[slot], self.used[slot] = True, next(self._clock)
        self.truncate(slot, shared[slot])
        return slot, self.borrow(slot, prompt) if reuse else 0

    def reserve(self, need: int) -> None:
        """Room for `need` positions in every slot (a growable cache grows; else ValueError)."""
        if need > self.cache.capacity:
            self._grow(need)

    def keep_prefix(self, slot: int, tokens: list[int]) -> int:
        """Cut `slot` back to the longest prefix of `tokens` it holds, short of the last token
        (whose logits are wanted, so it is fed again); returns the positions kept."""
        n = min(common_prefix(self.tokens[slot], tokens), len(tokens) - 1)
        self.truncate(slot, n)
        return n

    def paired(self, model) -> "Slots":
        """Slots of a draft `model` paired with these: as many, as large, growable alike; made
        on first use and kept with these, so a session's next turn finds its draft rows too."""
        if self._paired is None or self._paired.model is not model:
            self._paired = Slots(model, self.count, self.cache.capacity, growable=self.growable)
        return self._paired

    def borrow(self, slot: int, prompt: list[int]) -> int:
        """Copy into `slot` the rows of the longest prefix of `prompt` another slot holds beyond
        what `slot` has; returns how many prompt tokens `slot` now holds."""
        have = len(self.tokens[slot])
        best, donor = have, None
        for s in range(self.count):
            if s != slot and len(self.tokens[s]) > best:
                n = min(common_prefix(self.tokens[s], prompt), len(prompt) - 1)
                if n > best:
                    best, donor = n, s
        if donor is not None:
            ops, cache = self.model.ops, self.cache
            for bufs in (cache.k, cache.v):
                for buf in bufs:
                    ops.copy_kv(buf, slot, buf, donor, have, best)
            self.tokens[slot] = self.tokens[donor][:best]
            cache.lengths[slot] = best
        return best

    def runner(self):
        """The backend's device runner for this cache (Backend.decode_graphs: the decode step
        sampled on the device, on CUDA captured in graphs), made on first use and again after
        the cache grows; None where the backend decodes op by op, or the model cannot (a
        mixture of experts' routing reads its choices on the host)."""
        if self._runner[0] is not self.cache:
            model, cache = self.model, self.cache
            runner = None
            if model.cfg.experts is None:
                runner = model.ops.decode_graphs(
                    lambda ids, positions, slots, kv_lens: model.decode(ids, positions, slots, kv_lens, cache),
                    self.count, cache.capacity, model.cfg.vocab_size, self.count)
            self._runner = (cache, runner)
        return self._runner[1]

    def wrote(self, slot: int, start: int, ids) -> None:
        """The forward that wrote `ids`' rows at `start` returned: the slot holds them now."""
        tokens = self.tokens[slot]
        assert len(tokens) == start, (len(tokens), start)
        tokens.extend(int(t) for t in ids)

    def truncate(self, slot: int, n: int) -> None:
        del self.tokens[slot][n:]
        self.cache.lengths[slot] = n

    def release(self, slot: int) -> None:
        self.busy[slot] = False

    def clear(self) -> None:
        for slot in range(self.count):
            self.truncate(slot, 0)

    def _grow(self, need: int) -> None:
        """A cache of at least `need` positions (double the old, so a long chat reallocates
        O(log n) times), with every slot's rows copied over."""
        old = self.cache
        if not self.growable:
            raise ValueError(f"{need} positions exceed the slots' {old.capacity}")
        capacity = max(need, min(2 * old.capacity, self.model.cfg.max_position_embeddings))
        self.cache = self.model.new_cache(capacity, slots=self.count)
        ops = self.model.ops
        for bufs_new, bufs_old in ((self.cache.k, old.k), (self.cache.v, old.v)):
            for new, buf in zip(bufs_new, bufs_old):
                for slot, tokens in enumerate(self.tokens):
                    if tokens:
                        ops.copy_kv(new, slot, buf, slot, 0, len(tokens))
        self.cache.lengths = [len(t) for t in self.tokens]
        if self._runner[1] is not None:  # captured now, not between a reply's tokens
            self.runner()


class Scheduler:
    """Runs sequences in `slots`, step by step, on the calling thread. `chunk` caps the prompt
    tokens prefilled per step (None: a whole prompt at once; a generation alone passes
    decoder.UBATCH)."""

    def __init__(self, engine, slots: Slots, chunk: int | None = None, on_token=None):
        """`on_token(seq, gap)`, if given, hears of each token sampled: `gap` is the seconds
        since the sequence's previous token, None for its first (the server's latency metrics)."""
        self.model, self.slots, self.chunk, self.on_token = engine.model, slots, chunk, on_token
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.steps = 0
        self.left_waiting = 0  # sequences that left the queue: given a slot, or cancelled there
        self.prompt_computed = 0  # prompt tokens prefilled
        self.prompt_cached = 0  # prompt tokens whose rows came from a slot's cache
        self.generated = 0
        self.drafted = self.accepted = 0  # speculative tokens proposed, and confirmed
        self.shared: dict[tuple[Sequence, Sequence], int] = {}  # _shared's, by pair
        self.replies = engine.replies  # earlier requests' replies, for suffix drafts (draft.py)
        self.draft = engine.draft  # a draft model's Engine, or None

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    def add(self, seqs: list[Sequence]) -> None:
        self.waiting.extend(seqs)

    def step(self) -> list[tuple[Sequence, Event]]:
        """One step; the events it produced, in order."""
        events: list[tuple[Sequence, Event]] = []
        for seq in [s for s in itertools.chain(self.running, self.waiting) if s.cancelled and not s.finished]:
            events.append((seq, seq.finish("cancelled")))
        self._retire()
        while self.waiting and self.slots.free():
            seq = self.waiting.popleft()
            self.left_waiting += 1
            try:
                self._admit(seq)
            except Exception as e:  # no room in a slot for it, say: this sequence only
                log.error("a sequence could not start: %s: %s", type(e).__name__, e)
                events.append((seq, seq.finish("error", f"{type(e).__name__}: {e}")))

        batch = self._plan()
        if not batch:
            return events
        self.steps += 1
        picks = self._on_device(batch, events)
        if picks is None:  # (without the sequences the device path already failed)
            picks = self._on_host([(seq, seg) for seq, seg in batch if not seq.finished], events)
        for seq, token, logprob in picks:
            if isinstance(token, Segment):  # a draft to check: `logprob` holds its rows' logits
                self._verify(seq, token, logprob, events)
            else:
                self._take(seq, token, logprob, events)
        self._retire()
        return events

    def _take(self, seq: Sequence, token: int, logprob, events: list) -> bool:
        """`seq` takes its next token; False where it failed."""
        try:
            event = seq.take(token, logprob)
        except Exception as e:  # a detokenizer fault: this sequence only
            self._fail(seq, e, events)
            return False
        self.generated += 1
        now, before = time.perf_counter(), seq.last_token_time
        seq.last_token_time = now
        if before is None:
            seq.first_token_time = now
        if self.on_token is not None:
            self.on_token(seq, None if before is None else now - before)
        if event is not None:
            events.append((seq, event))
        return True

    def cancel_all(self) -> list[tuple[Sequence, Event]]:
        events = [(s, s.finish("cancelled")) for s in itertools.chain(self.running, self.waiting) if not s.finished]
        for seq in self.running:
            self.slots.release(seq.slot)
        self.running, self.waiting = [], deque()
        return events

    # -- internals ------------------------------------------------------------------------------
    def _plan(self) -> list[tuple[Sequence, Segment]]:
        batch, budget = [], self.chunk if self.chunk is not None else float("inf")
        decoding = [seq for seq in self.running if not seq.prefilling]
        for seq, draft in zip(decoding, self._drafts(decoding)):  # one token each, and any draft
            ids = np.concatenate([seq.next_ids(1), draft]) if draft.size else seq.next_ids(1)
            batch.append((seq, Segment(ids, seq.slot, seq.pos, every_row=draft.size > 0)))
        ahead: list[Sequence] = []  # prefilling sequences already given a chunk this step
        for seq in self.running:  # then prompt chunks, oldest first, within the budget
            if seq.prefilling and budget > 0:
                if not self._catch_up(seq, ahead):
                    continue
                left = len(seq.prompt) - seq.pos
                if seq.whole_prompt and left > budget and batch:
                    continue  # a step of its own, or one with room for all of it
                ahead.append(seq)
                ids = seq.next_ids(left if seq.whole_prompt else int(min(budget, left)))
                budget -= ids.size
                last = seq.pos + ids.size == len(seq.prompt)  # only the last chunk samples
                embeds = seq.pooler is not None  # an embedding: every chunk's hidden rows, no logits
                batch.append((seq, Segment(ids, seq.slot, seq.pos, logits=last and not embeds, hidden=embeds)))
        return batch

    # -- prefix reuse: every decision of the loop's is here (Slots keeps the rows) -----------
    def _admit(self, seq: Sequence) -> None:
        """A slot for a waiting sequence, holding as long a prefix of its prompt as any slot
        can give (Slots.take): those rows are not prefilled."""
        need = len(seq.prompt) + (0 if seq.pooler is not None else seq.options.max_tokens)  # an embedding samples nothing
        seq.slot, seq.pos = self.slots.take(seq.prompt, need, reuse=seq.reuses_prefix)
        self._reused(seq, seq.pos)
        if seq.options.speculative:
            try:
                seq.drafter = self._drafter(seq)
            except Exception as e:  # a draft model's cache that does not fit, say
                log.warning("no drafts for a sequence (%s: %s)", type(e).__name__, e)
        self.running.append(seq)

    def _catch_up(self, seq: Sequence, ahead: list[Sequence]) -> bool:
        """Before a prefilling sequence's next chunk: rows another sequence wrote since it was
        admitted (a shared system prompt, prefilled by the client ahead of it) are copied, not
        recomputed; and while one `ahead` of it this step is still writing rows they share,
        it waits for them (False). An embedding that pools every row takes no rows."""
        if not seq.reuses_prefix:
            return True
        got = self.slots.borrow(seq.slot, seq.prompt)
        if got > seq.pos:
            self._reused(seq, got - seq.pos)
            seq.pos = got
        return not any(o.pos < self._shared(o, seq) and self._shared(o, seq) > seq.pos for o in ahead)

    def _shared(self, a: Sequence, b: Sequence) -> int:
        """Prompt tokens two sequences share (prompts do not change: computed once a pair,
        forgotten when either retires)."""
        key = (a, b)
        if key not in self.shared:
            self.shared[key] = min(common_prefix(a.prompt, b.prompt), len(b.prompt) - 1)
        return self.shared[key]

    # -- speculative decoding: drafts checked in the step's one forward pass --------------------
    def _drafter(self, seq: Sequence):
        """The drafter (draft.py) of a sequence whose options ask for drafts."""
        kind, most = seq.options.spec_type, seq.options.speculative
        if kind == "suffix":
            return SuffixDrafter(most, self.replies)
        if kind == "draft":
            if self.draft is None:  # (Engine.check_options refuses it first)
                raise InfernoError("spec_type draft needs a draft model")
            return ModelDrafter(most, self.slots.paired(self.draft.model), seq.slot, self.model.cfg.vocab_size)
        return NgramDrafter(most)

    def _drafts(self, seqs: list[Sequence]) -> list[np.ndarray]:
        """Tokens to check after each sequence's last one this step (draft.py's drafters), as
        many as its options allow and its reply and slot have room for; none for most
        sequences. The draft model's sequences draft together (draft.draft_together: one pass
        a drafted token for all; where that fails, one at a time). A drafter that fails (a draft
        model's pass) is dropped: its sequence decodes on without."""
        out = [np.empty(0, np.int64) for _ in seqs]
        together: list[tuple[int, Sequence, int]] = []  # (index, sequence, tokens it wants)
        for i, seq in enumerate(seqs):
            room = min(seq.options.max_tokens - len(seq.sampled) - 1, self.slots.cache.capacity - seq.pos - 1)
            if seq.drafter is None or room < 1:
                continue
            if isinstance(seq.drafter, ModelDrafter):
                together.append((i, seq, seq.drafter.wants(room)))
                continue
            try:
                out[i] = np.asarray(seq.drafter.propose(seq.prompt + seq.sampled, room), dtype=np.int64)
            except Exception as e:
                self._no_drafts(seq, e)
        if together:
            try:
                drafts = draft_together([seq.drafter for _, seq, _ in together],
                                        [seq.prompt + seq.sampled for _, seq, _ in together], [k for *_, k in together])
            except Exception:  # the shared pass: again one sequence at a time, to drop only the failing
                drafts = []
                for _, seq, k in together:
                    try:
                        drafts.append(draft_together([seq.drafter], [seq.prompt + seq.sampled], [k])[0])
                    except Exception as e:
                        self._no_drafts(seq, e)
                        drafts.append([])
            for (i, _, _), draft in zip(together, drafts):
                out[i] = np.asarray(draft, dtype=np.int64)
        return out

    @staticmethod
    def _no_drafts(seq: Sequence, e: Exception) -> None:
        log.warning("drafting failed (%s: %s): the sequence goes on without drafts", type(e).__name__, e)
        seq.drafter = None

    def _verify(self, seq: Sequence, seg: Segment, rows: np.ndarray, events: list) -> None:
        """A verifying segment's tokens, taken one at a time as plain steps would take them:
        the pick at each row (under the sequence's grammar and penalties, which have seen
        every token taken before it) while it equals the draft there, then the pick where they
        part, or after a wholly accepted draft; never past the reply's end. The slot keeps the
        rows of the accepted draft tokens only: no later step reads a rejected token's keys."""
        draft = seg.ids[1:]
        accepted = 0
        mask = np.empty((1, seq.matcher.words), np.int32) if seq.matcher is not None else None
        for i in range(rows.shape[0]):
            try:
                if mask is not None:
                    seq.matcher.fill(mask)
                token, logprob = seq.choose(rows[i], None if mask is None else mask[0])
            except Exception as e:  # a sampler or grammar fault: this sequence only
                self._fail(seq, e, events)
                break
            matched = i < draft.size and token == int(draft[i])
            if not self._take(seq, token, logprob, events):
                break
            accepted += matched
            if not matched or seq.finished:
                break
        seq.drafted += draft.size
        seq.accepted += accepted
        seq.drafter.learn(draft.size, accepted)
        self.drafted += draft.size
        self.accepted += accepted
        seq.pos = seg.start + 1 + accepted
        self.slots.truncate(seq.slot, seq.pos)

    def _reused(self, seq: Sequence, n: int) -> None:
        seq.cached += n
        self.prompt_cached += n

    def _on_host(self, batch, events) -> list[tuple[Sequence, int, object]]:
        """The step op by op: a forward pass, its logits rows to the host, each sampled there.
        (sequence, token, logprob) for each sequence that samples."""
        if not batch:
            return []
        sampling = []
        for seq, seg, row in self._forward(batch, events):
            self._wrote(seq, seg)
            if seq.pooler is not None:  # an embedding: its rows pooled, its vector once all are in
                self._pool(seq, seg, row, events)
            elif not seq.prefilling:
                sampling.append((seq, seg, row))
        # (A sequence with a draft to check fills its own masks, row by row, in _verify.)
        masks = iter(self._masks([seq for seq, seg, _ in sampling if not seg.every_row], events))
        picks = []
        for seq, seg, row in sampling:
            mask = None if seg.every_row else next(masks)
            if seq.finished:  # its grammar failed
                continue
            try:
                if seg.every_row:  # a draft to check, token by token as they are taken (step)
                    picks.append((seq, seg, row))
                else:
                    picks.append((seq, *seq.choose(row, mask)))
            except Exception as e:  # a sampler fault: this sequence only
                self._fail(seq, e, events)
        return picks

    def _on_device(self, batch, events) -> list[tuple[Sequence, int, object]] | None:
        """A step where every sequence decodes, on the device runner of the slots' cache when
        the backend has one (Backend.decode_graphs): the rows' values go in, one token each
        comes back. None when the step is not for the device (a prompt chunk in it, or no
        runner) or the device failed it: then it runs on the host."""
        if any(seq.prefilling or seg.every_row for seq, seg in batch):
            return None
        runner = self.slots.runner()
        if runner is None:
            return None
        masks = self._masks([seq for seq, _ in batch], events)
        kept = [(seq, seg, mask) for (seq, seg), mask in zip(batch, masks) if not seq.finished]
        if not kept:
            return []
        batch = [(seq, seg) for seq, seg, _ in kept]
        rows = decode_rows([seq for seq, _ in batch], [mask for *_, mask in kept], runner)
        try:
            tokens, logprobs = runner.run(rows)
        except Exception as e:
            log.warning("a decode step failed on the device (%s: %s): running it op by op",
                        type(e).__name__, e, exc_info=e)
            return None
        picks = []
        for b, (seq, seg) in enumerate(batch):
            self._wrote(seq, seg)
            self.slots.cache.lengths[seq.slot] = seq.pos
            seq.device = (runner, len(seq.sampled))  # its state there covers every token so far
            token = int(tokens[b])
            picks.append((seq, token, seq.logprob_from(logprobs, b, token) if logprobs else None))
        return picks

    def _pool(self, seq: Sequence, seg: Segment, rows: np.ndarray, events: list) -> None:
        try:
            seq.pooler.add(rows, seg.start)
            if not seq.prefilling:
                events.append((seq, seq.embedded()))
        except Exception as e:  # a Dense layer's shape, say: this sequence only
            self._fail(seq, e, events)

    def _wrote(self, seq: Sequence, seg: Segment) -> None:
        self.slots.wrote(seq.slot, seg.start, seg.ids)
        seq.pos += seg.ids.size
        if seg.start < len(seq.prompt):
            self.prompt_computed += seg.ids.size

    def _masks(self, seqs: list[Sequence], events) -> list:
        """The grammar masks of the sequences about to sample, in one call; where the grammar
        library fails, its sequences fail and the rest go on."""
        try:
            return masks_for(seqs)
        except Exception as e:
            for seq in seqs:
                if seq.matcher is not None:
                    self._fail(seq, e, events)
            return [None] * len(seqs)

    def _forward(self, batch, events):
        """(sequence, segment, logits row) for each item whose forward pass succeeded: its
        hidden rows for an embedding's segment."""
        model, cache = self.model, self.slots.cache
        to_numpy = model.ops.to_numpy
        try:
            out = model.run([seg for _, seg in batch], cache)
            rows, at, done = to_numpy(out.logits) if out.logits is not None else None, 0, []
            hidden, h = to_numpy(out.hidden) if out.hidden is not None else None, 0
            for seq, seg in batch:  # a segment's last row, or every row of one that asks
                if seg.hidden:
                    done.append((seq, seg, hidden[h:h + seg.ids.size]))
                    h += seg.ids.size
                    continue
                n = (seg.ids.size if seg.every_row else 1) if seg.logits else 0
                done.append((seq, seg, (rows[at:at + n] if seg.every_row else rows[at]) if n else None))
                at += n
            return done
        except Exception as e:
            if len(batch) == 1:
                self._fail(batch[0][0], e, events)
                return []
            log.warning("a batched step failed (%s): rerunning its %d sequences one by one", e, len(batch))
        done = []
        for seq, seg in batch:
            try:
                out = model.run([seg], cache)
                if seg.hidden:
                    done.append((seq, seg, to_numpy(out.hidden)))
                    continue
                rows = to_numpy(out.logits) if seg.logits else None
                done.append((seq, seg, None if rows is None else rows if seg.every_row else rows[0]))
            except Exception as e:
                self._fail(seq, e, events)
        return done

    def _fail(self, seq: Sequence, e: Exception, events: list) -> None:
        log.error("a sequence failed: %s: %s", type(e).__name__, e, exc_info=e)
        # Its rows past what the slot already held may be half written: they are not claimed.
        self.slots.truncate(seq.slot, len(self.slots.tokens[seq.slot]))
        events.append((seq, seq.finish("error", f"{type(e).__name__}: {e}")))

    def _retire(self) -> None:
        """Free the finished sequences' slots (their tokens stay) and forget the cancelled
        waiting ones."""
        for seq in self.running:
            if seq.finished:
                self.slots.release(seq.slot)
                if isinstance(seq.drafter, SuffixDrafter) and seq.finish_reason in ("stop", "length"):
                    self.replies.add(seq.sampled)
        self.running = [s for s in self.running if not s.finished]
        if self.shared:
            self.shared = {k: v for k, v in self.shared.items() if not (k[0].finished or k[1].finished)}
        if any(s.finished for s in self.waiting):
            self.left_waiting += sum(s.finished for s in self.waiting)
            self.waiting = deque(s for s in self.waiting if not s.finished)
