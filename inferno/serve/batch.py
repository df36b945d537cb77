"""Continuous batching for the server: one thread owns the engine and runs the generation loop
(inferno/scheduler.py) step after step, for every request.

    batch = BatchEngine(lambda: inferno.load("smollm2-135m", backend="pool"), parallel=8)
    handle = batch.submit(batch.engine.encode_prompt("Hi"), Options(max_tokens=32))
    for event in handle:            # or `async for` with submit(..., loop=...)
        print(event.text, end="")

The KV cache is `parallel` fixed slots of `ctx_size` positions, as llama.cpp's --parallel:
memory is known at start and no sequence waits on another's growth. A request's sequences wait
in a queue until a slot is free; a slot keeps the tokens of the last sequence it held, so a
conversation's next turn, or another client with the same system prompt, prefills only what is
new (scheduler.Slots). Other threads talk to the loop through a queue (submit, cancel, stop);
events go back through each handle's own queue, or with `loop.call_soon_threadsafe` to an
asyncio loop, once a step.

The engine may be given loaded, or as a function that loads it, which then runs on the batch's
own thread. On `pool` that matters: OpenMP gives each thread that launches parallel work its own
team of workers, and two teams on the same cores slow each other (libgomp stops spinning once
its threads outnumber the cores): a step from a thread other than the one that loaded
the model ran at about half speed (bench/RESULTS.md, "Figures behind the kernels' shape").
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import defaultdict
from dataclasses import replace
from typing import Callable, Iterable

import numpy as np

from inferno import embedding
from inferno.embedding import Embedder
from inferno.engine import EMPTY_PROMPT, Engine, check_ctx_size
from inferno.errors import InfernoError
from inferno.scheduler import Scheduler
from inferno.sequence import Event, Options, Sequence
from inferno.serve.metrics import Metrics

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
        self.sequences: list[Sequence] = []
        self.cancelled = False

    def summary(self) -> str:
        """Its tokens and time to first token, for the server's log line."""
        seqs = self.sequences
        firsts = [s.first_token_time - s.arrival for s in seqs if s.first_token_time is not None]
        ttft = f", TTFT {min(firsts) * 1e3:.0f} ms" if firsts else ""
        return (f"prompt {self.prompt_tokens} tokens ({sum(s.cached for s in seqs)} cached), "
                f"generated {sum(len(s.generated) for s in seqs)}{ttft}")

    def timings(self) -> dict:
        """llama-server's `timings` of this request: its prompt's prefill up to the first token
        (queueing included), and the tokens after it; empty before any token."""
        seqs = [s for s in self.sequences if s.first_token_time is not None]
        if not seqs:
            return {}
        first = min(s.first_token_time for s in seqs)
        prompt_ms = (first - min(s.arrival for s in seqs)) * 1e3
        prompt_n = sum(len(s.prompt) - s.cached for s in seqs)
        predicted_n = sum(len(s.sampled) for s in seqs)
        predicted_ms = (max(s.last_token_time for s in seqs) - first) * 1e3
        later = predicted_n - len(seqs)  # the tokens after each sequence's first
        return {"prompt_n": prompt_n, "prompt_ms": prompt_ms,
                "prompt_per_second": prompt_n / prompt_ms * 1e3 if prompt_ms > 0 else None,
                "predicted_n": predicted_n, "predicted_ms": predicted_ms,
                "predicted_per_second": later / predicted_ms * 1e3 if predicted_ms > 0 and later > 0 else None}

    def cancel(self) -> None:
        """Stop generating; the slots are free again after the scheduler's next step."""
        if not self.cancelled:
            self.cancelled = True
            for seq in self.sequences:
                seq.cancelled = True
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
        self.slots = engine.new_slots(parallel, ctx_size)
        self.slots.runner()  # a device-decoding backend's step for 1..parallel sequences, captured now
        self.scheduler = Scheduler(engine, self.slots, chunk, on_token=self._time_token)
        self._lock = threading.Lock()
        self._submitted = 0  # sequences; those not yet in a slot are the pending ones
        self._closed = False

    @property
    def _pending(self) -> int:
        """Sequences submitted and not yet in a slot (nor cancelled while waiting)."""
        return self._submitted - self.scheduler.left_waiting

    @property
    def steps(self) -> int:
        return self.scheduler.steps

    @property
    def cache_bytes(self) -> int:
        return self.slots.cache.nbytes()

    # -- the callers' side (any thread) ---------------------------------------------------------
    def submit(self, prompt_ids, options: Options = Options(), *, n: int = 1,
               loop: asyncio.AbstractEventLoop | None = None) -> Handle:
        """Queue a request: `prompt_ids` is one prompt's token ids or a list of prompts; each
        prompt is sampled `n` times (choice index = prompt number * n + sample number). With
        `loop`, the events go to that asyncio loop (`async for event in handle`)."""
        prompts = [prompt_ids] if len(prompt_ids) == 0 or np.isscalar(prompt_ids[0]) else list(prompt_ids)
        self.engine.check_options(options)
        prompts = [self._check_prompt(p, options.max_tokens) for p in prompts]
        if options.sampling is None:
            options = replace(options, sampling=self.engine.sampling.params())
        if n < 1:
            raise InfernoError(f"n must be at least 1, got {n}", params=("n",))
        count = len(prompts) * n
        if count > self.parallel:
            raise InfernoError(f"n: {count} sequences in one request is more than the server's "
                               f"{self.parallel} slots (parallel): ask for fewer",
                               params=("n", "parallel"))
        handle = Handle(self, count, loop)
        handle.prompt_tokens = sum(map(len, prompts))
        now = time.perf_counter()
        seqs = [Sequence(p, options, self.engine.tokenizer, self.engine.eos, index=i * n + j,
                         owner=handle, arrival=now) for i, p in enumerate(prompts) for j in range(n)]
        handle.sequences = seqs
        with self._lock:
            if self._closed:
                raise Closed("the server is shutting down")
            # Sequences may wait for a slot up to the queue limit; the free slots take more.
            if self._pending + count > self.queue_limit + self.slots.free():
                raise QueueFull(f"all {self.parallel} slots are busy and {self._pending} sequences "
                                f"are queued (limit {self.queue_limit}): retry later")
            self._submitted += count
        self._inbox.put(("add", seqs))
        return handle

    def embed(self, prompts: list[list[int]], embedder: Embedder, *,
              loop: asyncio.AbstractEventLoop | None = None) -> Handle:
        """Queue texts to embed (engine.embed_ids's token ids): they run as prompts beside the
        generations, and each one's final event holds its vector (Event.embedding). The
        texts of one request count against the queue as a generation's sequences do."""
        embedding.check_lengths(prompts, self.ctx_size, f"the context of {self.ctx_size} tokens per slot")
        handle = Handle(self, len(prompts), loop)
        handle.prompt_tokens = sum(map(len, prompts))
        handle.sequences = embedding.sequences(prompts, embedder, self.engine.tokenizer, self.engine.eos,
                                               owner=handle, arrival=time.perf_counter())
        with self._lock:
            if self._closed:
                raise Closed("the server is shutting down")
            if len(prompts) > self.queue_limit + self.parallel:
                raise InfernoError(f"input: {len(prompts)} texts in one request is more than this server runs and "
                                   f"queues ({self.parallel} slots, queue limit {self.queue_limit}): send fewer",
                                   params=("input",))
            if self._pending + len(prompts) > self.queue_limit + self.slots.free():
                raise QueueFull(f"all {self.parallel} slots are busy and {self._pending} sequences "
                                f"are queued (limit {self.queue_limit}): retry later")
            self._submitted += len(prompts)
        self._inbox.put(("add", handle.sequences))
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
        ids = self.engine.check_ids(ids).tolist()
        if not ids:
            raise InfernoError(EMPTY_PROMPT)
        if len(ids) + max_tokens > self.ctx_size:
            raise InfernoError(f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) = "
                               f"{len(ids) + max_tokens} exceeds the context of {self.ctx_size} "
                               f"tokens per slot: shorten the prompt or lower max_tokens", params=("max_tokens",))
        return ids

    def stats(self) -> dict[str, int]:
        sched = self.scheduler
        return dict(running=len(sched.running), waiting=self._pending, slots_used=self.parallel - self.slots.free(),
                    slots=self.parallel)

    def prompt_counts(self) -> tuple[int, int]:
        """(prompt tokens prefilled, prompt tokens whose rows came from the slots' cache)."""
        return self.scheduler.prompt_computed, self.scheduler.prompt_cached

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
        sched, alive = self.scheduler, True
        while alive:
            messages = [self._inbox.get()] if not sched.busy else []
            while True:
                try:
                    messages.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            for kind, arg in messages:  # a "cancel" only wakes the loop: sequences carry the flag
                if kind == "add":
                    sched.add(arg)
                elif kind == "stop":
                    alive = False
            if alive and sched.busy:
                events = sched.step()
                with self.metrics.lock:
                    self.metrics.prompt_tokens, self.metrics.prompt_tokens_cached = self.prompt_counts()
                    self.metrics.generated_tokens = sched.generated
                    self.metrics.drafted_tokens, self.metrics.accepted_tokens = sched.drafted, sched.accepted
                self._deliver(events)
        self._deliver(sched.cancel_all())

    def _time_token(self, seq: Sequence, gap: float | None) -> None:
        with self.metrics.lock:
            if gap is None:
                self.metrics.ttft.observe(seq.last_token_time - seq.arrival)
            else:
                self.metrics.itl.observe(gap)

    @staticmethod
    def _deliver(events: list[tuple[Sequence, Event]]) -> None:
        """Each event to its handle; one wake-up per asyncio loop per step."""
        by_loop = defaultdict(list)
        for seq, event in events:
            handle = seq.owner
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
