"""Continuous batching: one thread owns the engine and runs the batch, step after step.

    batch = BatchEngine(lambda: inferno.load("smollm2-135m", backend="pool"), parallel=8)
    handle = batch.submit(batch.engine.encode_prompt("Hi"), Options(max_tokens=32))
    for event in handle:            # or `async for` with submit(..., loop=...)
        print(event.text, end="")

The KV cache is `parallel` fixed slots of `ctx_size` positions, as llama.cpp's --parallel:
memory is known at start and no sequence waits on another's growth. A request's sequences wait
in a queue until a slot is free. Each step (nano-vllm's scheduler, with chunked prefill):
  1. drop the cancelled and admit waiting sequences into free slots;
  2. one forward pass (model.step) over every running sequence: one token each for those
     decoding, and for those still prefilling up to `chunk` prompt tokens in all, so a long
     prompt enters over several steps and the running streams never stall behind it;
  3. sample each sequence's next token from its own row, with its own settings and generator;
  4. retire the finished, freeing their slots for the next step, and hand the events over.
Other threads talk to the loop through a queue (submit, cancel, stop); events go back through
each handle's own queue, or with `loop.call_soon_threadsafe` to an asyncio loop, once a step.

The engine may be given loaded, or as a function that loads it, which then runs on the batch's
own thread. On `pool` that matters: OpenMP gives each thread that launches parallel work its own
team of workers, and two teams on the same cores slow each other (libgomp stops spinning once
its threads outnumber the cores). Measured here (2 cores, SmolLM2 Q4_1, 2 threads): a decode
step from the loading thread 7.6 ms, from another thread while the loading one lives 13.6 ms,
loaded on the batch thread 8.3 ms.

An exception in a step fails only the sequence that raised it: the step is rerun one sequence
at a time, which rewrites the same cache rows, and the ones that fail again are retired.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections import defaultdict, deque
from dataclasses import replace
from typing import Callable, Iterable

import numpy as np

from inferno.engine import EMPTY_PROMPT, Engine, check_ctx_size, check_max_tokens
from inferno.errors import InfernoError
from inferno.model.decoder import Segment
from inferno.serve.metrics import Metrics
from inferno.serve.sequence import Event, Options, Sequence

log = logging.getLogger("inferno.serve")


class QueueFull(InfernoError):
    """Every slot is busy and the queue is at its limit: try again later (HTTP 429)."""


class Closed(InfernoError):
    """The engine is shutting down and takes no new requests (HTTP 503)."""


class Handle:
    """A submitted request's events, for all its sequences; iterate (sync or async) until each
    sequence's final event has arrived, or `cancel()`."""

    def __init__(self, batch: "BatchEngine", n: int, loop: asyncio.AbstractEventLoop | None):
        self.batch, self.n, self.loop = batch, n, loop
        self.queue = asyncio.Queue() if loop is not None else queue.SimpleQueue()
        self.prompt_tokens = 0  # all its prompts', each counted once
        self.cancelled = False

    def cancel(self) -> None:
        """Stop generating; the slots are free again after the scheduler's next step."""
        if not self.cancelled:
            self.cancelled = True
            self.batch._inbox.put(("cancel", self))

    def __iter__(self):
        if self.loop is not None:
            raise TypeError("this handle delivers to an asyncio loop: use `async for`")
        return self._drain(self.queue.get)

    def _drain(self, get):
        left = self.n
        while left:
            event = get()
            left -= event.finish_reason is not None
            yield event

    async def __aiter__(self):
        left = self.n
        while left:
            event = await self.queue.get()
            left -= event.finish_reason is not None
            yield event


class BatchEngine:
    def __init__(self, engine: Engine | Callable[[], Engine], *, parallel: int = 4,
                 ctx_size: int | None = None, queue_limit: int = 64, chunk: int = 256,
                 metrics: Metrics | None = None):
        """`engine`: an Engine, or a function that loads one on the batch's thread (see the
        module docstring; its exceptions are raised here)."""
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._go = threading.Event()  # set once the setup is done: the loop may start
        self._abandoned = False
        ours = callable(engine) and not isinstance(engine, Engine)
        engine = self._start(engine if ours else lambda: engine)
        try:
            self._setup(engine, parallel, ctx_size, queue_limit, chunk, metrics)
        except BaseException:
            self._abandoned = True  # the thread ends without looping
            self._go.set()
            if ours:
                engine.close()
            raise
        self._go.set()

    def _start(self, load: Callable[[], Engine]) -> Engine:
        """Start the batch thread with `load`: the engine it returns, once loaded."""
        box, loaded = {}, threading.Event()

        def run():
            try:
                box["engine"] = load()
            except BaseException as e:  # noqa: BLE001  raised again in the caller
                box["error"] = e
            loaded.set()
            if "engine" in box:
                self._go.wait()
                if not self._abandoned:
                    self._loop()
        self._thread = threading.Thread(target=run, name="inferno-batch", daemon=True)
        self._thread.start()
        loaded.wait()
        if "error" in box:
            raise box["error"]
        return box["engine"]

    def _setup(self, engine: Engine, parallel, ctx_size, queue_limit, chunk, metrics) -> None:
        model_max = engine.config.max_position_embeddings
        ctx_size = min(2048, model_max) if ctx_size is None else check_ctx_size(ctx_size, engine.config)
        for name, value, least in (("parallel", parallel, 1), ("chunk", chunk, 1), ("queue_limit", queue_limit, 0)):
            if value < least:
                raise InfernoError(f"{name} must be at least {least}, got {value}", params=(name,))
        self.engine, self.parallel, self.ctx_size = engine, parallel, ctx_size
        self.queue_limit, self.chunk = queue_limit, chunk
        self.metrics = metrics or Metrics()
        self.cache = engine.model.new_cache(ctx_size, slots=parallel)
        self.free = list(range(parallel - 1, -1, -1))  # slot numbers, popped from the end
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.steps = 0
        self._lock = threading.Lock()
        self._pending = 0  # sequences submitted and not yet in a slot
        self._closed = False

    # -- the callers' side (any thread) ---------------------------------------------------------
    def submit(self, prompt_ids, options: Options = Options(), *, n: int = 1,
               loop: asyncio.AbstractEventLoop | None = None) -> Handle:
        """Queue a request: `prompt_ids` is one prompt's token ids or a list of prompts; each
        prompt is sampled `n` times (choice index = prompt number * n + sample number). With
        `loop`, the events go to that asyncio loop (`async for event in handle`)."""
        prompts = [prompt_ids] if len(prompt_ids) == 0 or np.isscalar(prompt_ids[0]) else list(prompt_ids)
        prompts = [self._check_prompt(p, options.max_tokens) for p in prompts]
        if options.sampling is None:
            options = replace(options, sampling=self.engine.sampling.params())
        if n < 1:
            raise InfernoError(f"n must be at least 1, got {n}", params=("n",))
        check_max_tokens(options.max_tokens)
        if options.top_logprobs and not 0 < options.top_logprobs <= 20:
            raise InfernoError(f"top_logprobs must be between 0 and 20, got {options.top_logprobs}",
                               params=("top_logprobs",))
        vocab = self.engine.config.vocab_size
        if any(not 0 <= t < vocab for t, _ in options.logit_bias):
            raise InfernoError(f"logit_bias: a token id is out of range for a vocabulary of {vocab}",
                               params=("logit_bias",))
        count = len(prompts) * n
        if count > self.parallel:
            raise InfernoError(f"n: {count} sequences in one request is more than the server's "
                               f"{self.parallel} slots (parallel): ask for fewer",
                               params=("n", "parallel"))
        handle = Handle(self, count, loop)
        handle.prompt_tokens = sum(map(len, prompts))
        now = time.perf_counter()
        seqs = [Sequence(handle, i * n + j, p, options, self.engine.tokenizer, self.engine.eos, now)
                for i, p in enumerate(prompts) for j in range(n)]
        with self._lock:
            if self._closed:
                raise Closed("the server is shutting down")
            # Sequences may wait for a slot up to the queue limit; the free slots take more.
            if self._pending + count > self.queue_limit + len(self.free):
                raise QueueFull(f"all {self.parallel} slots are busy and {self._pending} sequences "
                                f"are queued (limit {self.queue_limit}): retry later")
            self._pending += count
        self._inbox.put(("add", seqs))
        return handle

    def generate(self, prompts: Iterable[str | list[dict]], options: Options = Options(), *,
                 raw: bool = False) -> list[str]:
        """Convenience: each prompt (text, or chat messages) through the chat template unless
        `raw`, all in the batch at once; the replies' text in order."""
        handles = [self.submit(self.engine.encode_prompt(p, raw=raw), options) for p in prompts]
        texts = []
        for h in handles:
            events = list(h)
            errors = [e.error for e in events if e.error]
            if errors:
                raise InfernoError(f"generation failed: {errors[0]}")
            texts.append("".join(e.text for e in events))
        return texts

    def _check_prompt(self, ids, max_tokens: int) -> list[int]:
        ids = self.engine._check_ids(ids).tolist()
        if not ids:
            raise InfernoError(EMPTY_PROMPT)
        if len(ids) + max_tokens > self.ctx_size:
            raise InfernoError(f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) = "
                               f"{len(ids) + max_tokens} exceeds the context of {self.ctx_size} "
                               f"tokens per slot: shorten the prompt or lower max_tokens", params=("max_tokens",))
        return ids

    def stats(self) -> dict[str, int]:
        return dict(running=len(self.running), waiting=self._pending, slots_used=self.parallel - len(self.free),
                    slots=self.parallel)

    def close(self, timeout: float | None = None) -> None:
        """Stop taking requests, cancel what is left and stop the loop. The engine is the
        caller's to close."""
        with self._lock:
            self._closed = True
        self._inbox.put(("stop", None))
        self._thread.join(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- the loop (its own thread) --------------------------------------------------------------
    def _loop(self) -> None:
        alive = True
        while alive:
            idle = not (self.running or self.waiting)
            messages = [self._inbox.get()] if idle else []
            while True:
                try:
                    messages.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            for kind, arg in messages:  # a "cancel" only wakes the loop: handles carry the flag
                if kind == "add":
                    self.waiting.extend(arg)
                elif kind == "stop":
                    alive = False
            if alive and (self.running or self.waiting):
                self._step()
        events = [(s.handle, s.finish("cancelled")) for s in itertools.chain(self.running, self.waiting)]
        self.running, self.waiting = [], deque()
        self._deliver(events)

    def _step(self) -> None:
        events: list[tuple[Handle, Event]] = []
        for seq in [s for s in itertools.chain(self.running, self.waiting) if s.handle.cancelled]:
            events.append((seq.handle, seq.finish("cancelled")))
        self._retire()
        while self.free and self.waiting:
            seq = self.waiting.popleft()
            seq.slot = self.free.pop()
            self.running.append(seq)
            with self._lock:
                self._pending -= 1

        batch, budget = [], self.chunk
        for seq in self.running:  # decoding sequences: one token each
            if not seq.prefilling:
                batch.append((seq, Segment(seq.next_ids(1), seq.slot, seq.pos)))
        for seq in self.running:  # then prompt chunks, oldest first, within the budget
            if seq.prefilling and budget > 0:
                ids = seq.next_ids(budget)
                budget -= ids.size
                last = seq.pos + ids.size == len(seq.prompt)  # only the last chunk samples
                batch.append((seq, Segment(ids, seq.slot, seq.pos, logits=last)))
        if not batch:
            self._deliver(events)
            return
        self.steps += 1
        rows = self._forward(batch, events)
        now = time.perf_counter()
        new_tokens = prompt_tokens = 0
        for seq, seg, row in rows:
            seq.pos += seg.ids.size
            prompt_tokens += seg.ids.size if seg.start < len(seq.prompt) else 0
            if seq.prefilling:
                continue
            try:
                event = seq.accept(row)
            except Exception as e:  # a sampler or detokenizer fault: this sequence only
                self._fail(seq, e, events)
                continue
            new_tokens += 1
            self._time_token(seq, now)
            if event is not None:
                events.append((seq.handle, event))
        with self.metrics.lock:
            self.metrics.prompt_tokens += prompt_tokens
            self.metrics.generated_tokens += new_tokens
        self._retire()
        self._deliver(events)

    def _forward(self, batch, events):
        """(sequence, segment, logits row) for each item whose forward pass succeeded."""
        ops, model = self.engine.ops, self.engine.model
        try:
            out = model.step([seg for _, seg in batch], self.cache)
            rows = iter(ops.to_numpy(out) if out is not None else ())
            return [(seq, seg, next(rows) if seg.logits else None) for seq, seg in batch]
        except Exception as e:
            if len(batch) == 1:
                self._fail(batch[0][0], e, events)
                return []
            log.warning("a batched step failed (%s): rerunning its %d sequences one by one", e, len(batch))
        rows = []
        for seq, seg in batch:
            try:
                out = model.step([seg], self.cache)
                rows.append((seq, seg, ops.to_numpy(out)[0] if seg.logits else None))
            except Exception as e:
                self._fail(seq, e, events)
        return rows

    @staticmethod
    def _fail(seq: Sequence, e: Exception, events: list) -> None:
        log.error("a request's sequence failed: %s: %s", type(e).__name__, e, exc_info=e)
        events.append((seq.handle, seq.finish("error", f"{type(e).__name__}: {e}")))

    def _time_token(self, seq: Sequence, now: float) -> None:
        with self.metrics.lock:
            if seq.last_token_time is None:
                self.metrics.ttft.observe(now - seq.arrival)
            else:
                self.metrics.itl.observe(now - seq.last_token_time)
        seq.last_token_time = now

    def _retire(self) -> None:
        """Free the finished sequences' slots and forget the cancelled waiting ones."""
        for seq in self.running:
            if seq.finished:
                self.free.append(seq.slot)
        self.running = [s for s in self.running if not s.finished]
        gone = sum(s.finished for s in self.waiting)
        if gone:
            self.waiting = deque(s for s in self.waiting if not s.finished)
            with self._lock:
                self._pending -= gone

    @staticmethod
    def _deliver(events: list[tuple[Handle, Event]]) -> None:
        """Each event to its handle; one wake-up per asyncio loop per step."""
        by_loop = defaultdict(list)
        for handle, event in events:
            if handle.loop is None:
                handle.queue.put(event)
            else:
                by_loop[handle.loop].append((handle, event))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the loop is closed: nobody is listening
                pass


def _put_all(items) -> None:
    for handle, event in items:
        handle.queue.put_nowait(event)
