"""Engine: a loaded model on a backend, with generation, streaming, logits and honest timing.

    engine = inferno.load("path/to/model", backend="pool")
    result = engine.generate("What is the capital of France?", max_tokens=64, temperature=0)
    for piece in engine.stream("Tell me a story"):
        print(piece, end="", flush=True)
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from inferno.backends import DEFAULT_BACKEND, create_backend
from inferno.backends.base import CACHE_TYPES
from inferno.formats.quant import QUANTIZERS
from inferno.backends.tracing import TracingBackend
from inferno.constrain import Grammar, Grammars
from inferno import harmony
from inferno.thinking import think_mode
from inferno.tools import HARMONY, detect_format, for_template, supports_tools
from inferno.errors import InfernoError
from inferno.draft import Replies
from inferno import embedding
from inferno.embedding import DEFAULT_POOLING, MAX_INPUTS, Embedder, check_pooling
from inferno.loading.loader import Checkpoint, open_checkpoint
from inferno.model.decoder import UBATCH, DecoderModel, Segment
from inferno.loading.resolve import DEFAULT_MODEL, alias_sampling, resolve
from inferno.sampling import SamplingDefaults
from inferno.scheduler import Scheduler, Slots
from inferno.sequence import Options, Sequence, TokenLogprob

if TYPE_CHECKING:
    from inferno.ahead import Plan


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]  # generated ids, without the stop token
    prompt_tokens: int
    generated_tokens: int
    ttft_s: float  # prompt in -> first token sampled (prefill + one sample)
    prefill_tokens_per_s: float
    decode_tokens_per_s: float  # tokens after the first, per second of decoding
    peak_memory_bytes: int
    finish_reason: str  # as the API's (sequence.py): "stop" or "length"
    decode_s: float = 0.0
    cached_tokens: int = 0  # prompt tokens a Session's cache already held: not prefilled again
    logprobs: list[TokenLogprob] | None = None  # with logprobs=True: one per generated token
    stop: str | None = None  # the stop string that ended it; None where the model ended it
    context_full: bool = False  # "length" where the context ran out, not max_tokens
    drafted_tokens: int = 0  # speculative decoding: tokens drafted, and those the model confirmed
    accepted_tokens: int = 0

    @property
    def cut_by(self) -> str | None:
        """What cut the reply short of the model's own end: "max_tokens", "context", "stop" (a
        stop string), or None where the model ended it (its end-of-sequence token, or the end
        of its grammar)."""
        if self.finish_reason == "length":
            return "context" if self.context_full else "max_tokens"
        return "stop" if self.stop is not None else None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Stream:
    """Iterate for text pieces as they are generated; `result` is set once iteration ends."""

    _pieces: Iterator[str]
    result: GenerationResult | None = field(default=None)
    # The pieces are a harmony reply (gpt-oss's chat: Engine.speaks_harmony), its tags kept:
    # harmony.StreamParser splits them into reasoning, content and calls, harmony.parse the text.
    harmony: bool = False
    # The pieces may open a think block (thinking.TAGS, or OPENED where the prompt opened it: a
    # Qwen3, QwQ or DeepSeek-R1 chat), kept in the text: thinking.ThinkSplit tells it apart.
    think: str | None = None

    def __iter__(self):
        result = yield from self._pieces
        if self.result is None:  # a second pass over a spent stream keeps the first result
            self.result = result


class Session:
    """A conversation's KV cache, kept between calls to `Engine.stream(..., session=s)`.

    It is one slot of the generation loop's cache (scheduler.Slots), grown as the conversation
    does: each call prefills only the prompt tokens after the longest prefix the slot already
    holds (the previous turns, as the chat template renders them again), then decodes as usual.
    """

    def __init__(self):
        self.slots: Slots | None = None
        self._engine = None  # the engine whose model wrote the rows: reuse never crosses models

    @property
    def cache(self):
        return self.slots.cache if self.slots else None

    @property
    def ids(self) -> list[int]:
        """The tokens whose K/V the cache holds, in order."""
        return self.slots.tokens[0] if self.slots else []

    def clear(self) -> None:
        if self.slots is not None:
            self.slots.clear()

    def _slots(self, engine: "Engine", capacity: int) -> Slots:
        if self.slots is None or self._engine is not engine:
            self.slots, self._engine = engine.new_slots(1, capacity, growable=True), engine
        return self.slots


class Engine:
    def __init__(self, checkpoint: Checkpoint, ops, flash: bool = True, load_s: float = 0.0, *,
                 trace: bool = False, warm_up: bool = True, cache_type: str | None = None,
                 ctx_size: int | None = None, ahead: Plan | None = None):
        """`ctx_size` is the default context (prompt + new tokens) of each generation: the
        model's whole context when None. `ahead`: the load's arguments, for a helper process
        that compiles the kernels of the paths a first reply does not take (ahead.py); without
        it the warm-up takes every path here."""
        self.config = checkpoint.config
        self.tokenizer = checkpoint.tokenizer
        self.source = checkpoint.source
        self.file_format = checkpoint.file_format
        self.weight_type = checkpoint.weight_type()
        self.ctx_size = check_ctx_size(ctx_size, self.config)
        self.sampling = SamplingDefaults.layered(*checkpoint.sampling)  # what a call leaves unset
        self.embedding = checkpoint.embedding  # its pooling, if its files name one (embedding.py)
        # Tokens that end a reply: the tokenizer's turn enders and the config's eos ids; for a
        # harmony chat (gpt-oss), its <|return|> and <|call|> too, whatever the config lists.
        self.eos = frozenset(self.tokenizer.eos_ids) | frozenset(self.config.eos_token_ids)
        self.speaks_harmony = harmony.is_harmony(self.tokenizer.chat_template)
        if self.speaks_harmony:
            stops = (self.tokenizer.hf.token_to_id(t) for t in harmony.STOPS)
            self.eos |= frozenset(i for i in stops if i is not None)
        self.backend = ops.name
        t0 = time.perf_counter()
        self.cache_type = check_cache_type(cache_type or getattr(ops, "default_cache_type", "f32"))
        self.model = DecoderModel(self.config, checkpoint.tensors, ops, flash=flash,
                                  cache_type=self.cache_type)
        checkpoint.tensors.clear()  # the backend holds the weights now
        self.weight_bytes_per_token = self.model.weight_bytes_per_token()
        self.parameters, self.active_parameters = self.model.parameters()
        # A backend that decodes on the device keeps one slot for single generations, its
        # decode step captured here, at load: a new cache would mean a new capture.
        self._solo, self._solo_free, self._solo_lock = None, False, threading.Lock()
        if ops.device_step and not trace:
            self._solo = self.new_slots(1, min(self.ctx_size, SOLO_CAPACITY), growable=True)
            self._solo_free = True
        # The load's arguments (ahead.Plan) and the helper process it started, if any.
        self.plan, self.helper = ahead, None
        self.replies = Replies()  # every request's reply, for suffix drafts (draft.py)
        self.draft: Engine | None = None  # a draft model (load's `draft`), for spec_type "draft"
        if warm_up and ops.warms_up:
            self._load_warm_up(ops, ahead)
        # The tracer goes on after the warm-up, so its histogram holds only the user's calls.
        self.ops = self.model.ops = TracingBackend(ops) if trace else ops
        self.load_s = load_s + time.perf_counter() - t0
        ops.loaded(self.load_s)

    @property
    def decodes_on_device(self) -> bool:
        """Whether a single generation's decode steps run on the backend's device runner
        (sampled there, on CUDA captured in graphs) rather than op by op."""
        return self._solo is not None

    @property
    def size_note(self) -> str:
        """For the load line: a mixture of experts' parameters, all and active a token."""
        moe = self.config.experts
        if moe is None:
            return ""
        return (f"; {_count(self.parameters)} parameters, {_count(self.active_parameters)} active a "
                f"token ({moe.top_k} of {moe.count} experts)")

    # -- public API -----------------------------------------------------------------------------
    def logits(self, token_ids, *, cached: bool = False) -> np.ndarray:
        """Logits [len(token_ids), vocab] from one full forward pass, float32: uncached (keys
        and values kept in float32), or with `cached` through a KV cache of the engine's
        cache type, as generation computes them (an f16 cache rounds the keys it stores)."""
        ids = self.check_ids(token_ids)
        cache = self.model.new_cache(max(1, ids.size)) if cached else None
        return self.ops.to_numpy(self.model.forward(ids, cache))

    def encode_prompt(self, prompt: str | list[dict], *, system: str | None = None,
                      think: bool = True, raw: bool = False, tools: list[dict] | None = None,
                      reasoning_effort: str | None = None) -> list[int]:
        """Token ids for a prompt: the chat template applied (a system message first, if given)
        unless `raw`, or a model without a template. A list of messages is used as is; with
        `tools` (OpenAI's function tools), the template renders them, or where it cannot, the
        system message describes them in the generic format (tools.py). A model whose template
        speaks harmony (gpt-oss) has its prompt rendered by harmony.render instead, tools and
        `reasoning_effort` (low, medium, high; None: medium) included; another template takes
        `reasoning_effort` only where it reads that variable (else an InfernoError naming it)."""
        tok = self.tokenizer
        if isinstance(prompt, str) and not prompt.strip():
            raise InfernoError(EMPTY_PROMPT)
        if raw or not tok.chat_template:
            if not isinstance(prompt, str):
                raise InfernoError("a raw prompt must be text, not a list of messages")
            if reasoning_effort is not None:
                raise InfernoError("reasoning_effort needs a chat: a raw prompt has no template to set it in",
                                   params=("reasoning_effort",))
            return tok.encode(prompt, add_special_tokens=True)
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if system is not None:
            messages = [{"role": "system", "content": system}] + messages
        if self.speaks_harmony:  # the tags are special tokens: no BOS, nothing added
            return tok.encode(harmony.render(messages, tools, reasoning_effort=reasoning_effort),
                              add_special_tokens=False)
        native = supports_tools(tok.chat_template)
        messages = for_template(messages, tools, native)
        extra = {"tools": tools} if tools and native else {}
        if reasoning_effort is not None:
            if not takes_reasoning_effort(tok.chat_template):
                raise InfernoError("reasoning_effort: this model's chat template has no reasoning effort to set "
                                   "(gpt-oss's harmony format has; leave it out)", params=("reasoning_effort",))
            if reasoning_effort not in harmony.EFFORTS:
                raise InfernoError(f"reasoning_effort must be one of {', '.join(harmony.EFFORTS)}, not "
                                   f"{reasoning_effort!r}", params=("reasoning_effort",))
            extra["reasoning_effort"] = reasoning_effort
        text = tok.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=think, **extra)
        return tok.encode(text, add_special_tokens=False)

    def embedder(self, pooling: str | None = None, *, normalize: bool = True,
                 dimensions: int | None = None) -> Embedder:
        """How this model turns texts into vectors: `pooling` (embedding.POOLINGS) overrides
        what its files say; a model whose files say nothing pools its last token."""
        spec = self.embedding
        chosen = check_pooling(pooling) if pooling is not None else spec.pooling or DEFAULT_POOLING
        spec.check_dimensions(dimensions, self.config.hidden_size)
        return Embedder(spec, chosen, normalize, dimensions, whole=self.config.bidirectional)

    @property
    def embedding_note(self) -> str | None:
        """What to tell a user who embeds with a model that is not an embedding model."""
        if self.embedding.is_embedding_model:
            return None
        return (f"{Path(self.source).name} is not an embedding model (its files name no pooling): "
                f"embedding with {DEFAULT_POOLING}-token pooling, as vLLM does; a model trained for "
                f"embeddings (Qwen3-Embedding, say) gives better vectors")

    def embed_ids(self, inputs) -> list[list[int]]:
        """Each input's token ids, as sentence-transformers makes them: a text tokenized with
        the special tokens the tokenizer adds (a BOS, Qwen3-Embedding's EOS), or rendered as a
        user message where the model's folder says so (EmbeddingSpec.as_message); a list of
        ids as given."""
        if isinstance(inputs, str) or (len(inputs) and isinstance(inputs[0], (int, np.integer))):
            inputs = [inputs]
        if not 1 <= len(inputs) <= MAX_INPUTS:
            raise InfernoError(f"input: give 1 to {MAX_INPUTS} texts to embed, got {len(inputs)}",
                               params=("input",))
        prompts = []
        for i, x in enumerate(inputs):
            ids = self._embed_text(x) if isinstance(x, str) else self.check_ids(x).tolist()
            if not ids:
                raise InfernoError(f"input {i} is empty: give some text", params=("input",))
            prompts.append(ids)
        return prompts

    def _embed_text(self, text: str) -> list[int]:
        tok = self.tokenizer
        if self.embedding.as_message and tok.chat_template and text:
            text = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=False)
            return tok.encode(text, add_special_tokens=False)
        return tok.encode(text, add_special_tokens=True)

    def embed(self, inputs, *, pooling: str | None = None, normalize: bool = True,
              dimensions: int | None = None, ctx_size: int | None = None):
        """Vectors for a text, a list of texts, or token ids: [n, d] float32, or with pooling
        "none" a list of [tokens, d], one per input. Normalised to unit length unless not
        `normalize`; `dimensions` truncates where the model was trained for it (Matryoshka).
        The texts run as prompts through the generation loop, several at once."""
        embedder = self.embedder(pooling, normalize=normalize, dimensions=dimensions)
        prompts = self.embed_ids(inputs)
        limit = self._context(ctx_size)
        embedding.check_lengths(prompts, limit, f"the context of {limit}")
        slots = self.new_slots(min(len(prompts), EMBED_SLOTS), max(map(len, prompts)))  # (nothing sampled)
        loop = Scheduler(self, slots, chunk=UBATCH)
        seqs = embedding.sequences(prompts, embedder, self.tokenizer, self.eos)
        loop.add(seqs)
        vectors: list = [None] * len(seqs)
        while loop.busy:
            for seq, event in loop.step():
                if event.error:
                    raise InfernoError(f"embedding failed: {event.error}")
                vectors[event.index] = event.embedding
        return vectors if embedder.pooling == "none" else np.stack(vectors)

    @property
    def tool_format(self) -> str:
        """How this model writes tool calls (tools.FORMATS, or harmony): its template's, else
        generic."""
        if self.speaks_harmony:
            return HARMONY
        template = self.tokenizer.chat_template
        return detect_format(template) if supports_tools(template) else "generic"

    @property
    def reply_format(self) -> str | None:
        """The format every chat reply is parsed in, with tools or without: harmony's (its
        channels: reasoning, the answer, calls), or None (the reply is the answer)."""
        return HARMONY if self.speaks_harmony else None

    def think_block(self, prompt_ids) -> str | None:
        """Whether, and how, a reply to this rendered chat prompt may reason in a think block
        (thinking.think_mode: TAGS, OPENED or None); never a harmony reply (its own channels)."""
        if self.speaks_harmony:
            return None
        tail = [int(t) for t in prompt_ids[-8:]]
        return think_mode(self.tokenizer.chat_template, self.tokenizer.decode(tail, skip_special_tokens=False))

    def generate(self, prompt: str | list[dict], *, on_text: Callable[[str], None] | None = None,
                 **options) -> GenerationResult:
        """Generate a reply; the options are stream's. `on_text` receives each piece of text as
        soon as it is complete (never half a UTF-8 character)."""
        stream = self.stream(prompt, **options)
        for piece in stream:
            if on_text is not None:
                on_text(piece)
        return stream.result

    def stream(self, prompt: str | list[dict] | None = None, *, prompt_ids: list[int] | None = None,
               max_tokens: int | None = None, system: str | None = None, think: bool = True,
               raw: bool = False, ctx_size: int | None = None, session: Session | None = None,
               stop: str | list[str] | tuple[str, ...] = (), presence_penalty: float = 0.0,
               frequency_penalty: float = 0.0, logit_bias: dict[int, float] | None = None,
               logprobs: bool = False, top_logprobs: int = 0, json_schema: dict | str | None = None,
               grammar: str | None = None, speculative: int = 0, spec_type: str = "ngram",
               reasoning_effort: str | None = None, **sampling) -> Stream:
        """Generate a reply as an iterator of text pieces; `.result` holds the stats afterwards.

        `max_tokens` None: up to DEFAULT_MAX_TOKENS, or fewer where the context ends first
        (the reply then stops at the context, context_full, as llama.cpp does).
        Sampling: temperature, top_k, top_p, min_p, repeat_penalty, seed; one left out (or None)
        takes the model's default (engine.sampling: its generation config, else llama.cpp's).
        `stop` strings end the reply (the match is cut off); `presence_penalty`,
        `frequency_penalty` and `logit_bias` ({token id: added to its logit}) as OpenAI's;
        `logprobs` records each token's log-probability (and `top_logprobs` alternatives) in
        result.logprobs. `json_schema` (a JSON Schema, as a dict or JSON text) or `grammar`
        (GBNF, as llama.cpp takes it) constrains the reply: every token is masked to what the
        grammar allows, so a complete reply always parses. `speculative` k drafts up to k tokens
        a step by prompt lookup (draft.py; `spec_type="suffix"`: from this engine's earlier
        replies too) and checks them in the step's one forward pass: the
        tokens are taken as plain steps take them (sampling, penalties, stops and grammar alike),
        in fewer steps where the reply repeats its prompt; on backends whose products are
        batch-invariant (simd, pool) the same text as without, greedy or seeded.
        With a `session`, the KV cache of
        earlier calls is reused for the prompt's shared prefix. This runs the same generation
        loop as the server (scheduler.py), with this one sequence in it.
        A harmony model's chat (gpt-oss; not `raw`): `reasoning_effort` (low, medium, high) goes
        into its prompt, the reply ends at <|return|> or <|call|>, and its pieces keep the
        format's tags (Stream.harmony): harmony.StreamParser splits them into reasoning and the
        answer, harmony.parse the result's text."""
        constraint = None
        if json_schema is not None or grammar is not None:
            constraint = self.constraint(json_schema=json_schema, grammar=grammar)
        rendered = prompt_ids is None and not raw and bool(self.tokenizer.chat_template)
        if prompt_ids is None:
            prompt_ids = self.encode_prompt(prompt, system=system, think=think, raw=raw,
                                            reasoning_effort=reasoning_effort)
        ids = self.check_ids(prompt_ids)
        if ids.size == 0:
            raise InfernoError(EMPTY_PROMPT)
        to_context = False
        if max_tokens is None:
            room = self._context(ctx_size) - ids.size
            to_context = room < DEFAULT_MAX_TOKENS
            max_tokens = max(1, min(DEFAULT_MAX_TOKENS, room))
        reply_format = None if raw else self.reply_format
        options = self.options(max_tokens=max_tokens, stop=stop, presence_penalty=presence_penalty,
                               frequency_penalty=frequency_penalty, logit_bias=logit_bias,
                               logprobs=logprobs, top_logprobs=top_logprobs, grammar=constraint,
                               speculative=speculative, spec_type=spec_type, tool_format=reply_format,
                               **sampling)
        self._check_fits(ids.size, max_tokens, ctx_size)
        need = ids.size + max_tokens
        slots = session._slots(self, need) if session is not None else need
        seq = Sequence(ids.tolist(), options, self.tokenizer, self.eos)
        return Stream(self._generate(seq, slots, to_context), harmony=reply_format == HARMONY,
                      think=self.think_block(ids) if rendered else None)

    def new_slots(self, count: int, capacity: int, *, growable: bool = False) -> Slots:
        """`count` KV cache slots of `capacity` positions for the generation loop (Scheduler),
        each remembering the tokens it holds, for prefix reuse."""
        return Slots(self.model, count, capacity, growable=growable)

    @cached_property
    def grammars(self) -> Grammars:
        """Constrained output's view of this model's tokenizer (built on first use)."""
        return Grammars(self.tokenizer, self.config.vocab_size, sorted(self.eos))

    def constraint(self, **spec) -> Grammar:
        """A compiled constraint for `options(grammar=...)`: one of json_schema, grammar
        (GBNF), regex, lark or json_object=True (constrain.Grammars.compile); a bad one is an
        InfernoError naming it."""
        return self.grammars.compile(**spec)

    def options(self, *, max_tokens: int = 256, stop=(), presence_penalty: float = 0.0,
                frequency_penalty: float = 0.0, logit_bias: dict[int, float] | None = None,
                logprobs: bool = False, top_logprobs: int = 0, seed: int | None = None,
                grammar: Grammar | None = None, speculative: int = 0, spec_type: str = "ngram",
                tool_format: str | None = None, **sampling) -> Options:
        """One generation's Options, checked: what stream takes, as the server builds them."""
        stop = (stop,) if isinstance(stop, str) else tuple(stop or ())
        bias = tuple((int(t), float(b)) for t, b in (logit_bias or {}).items())
        opts = Options(max_tokens=max_tokens, sampling=self.sampling.params(seed=seed, **sampling),
                       stop=stop, presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                       logit_bias=bias, logprobs=logprobs, top_logprobs=top_logprobs, grammar=grammar,
                       speculative=speculative, spec_type=spec_type, tool_format=tool_format)
        self.check_options(opts)
        return opts

    def check_options(self, opts: Options) -> None:
        """Options no generation of this model can take, as one error naming the option; and
        no generation at all from a model that attends both ways (an embedding model)."""
        if self.config.bidirectional:
            raise InfernoError(f"{Path(self.source).name} attends both ways (an embedding model, such as "
                               f"EmbeddingGemma): it embeds texts (inferno embed, /v1/embeddings) but "
                               f"generates nothing; load a chat model to generate")
        opts.check(self.config.vocab_size)
        if opts.speculative and opts.spec_type == "draft" and self.draft is None:
            raise InfernoError("spec_type draft needs a draft model: load it with the target (--model-draft; "
                               "inferno.load(..., draft=...))", params=("spec_type",))

    def close(self) -> None:
        try:
            if self.draft is not None:
                self.draft.close()
        finally:
            self.ops.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- internals ------------------------------------------------------------------------------
    def _load_warm_up(self, ops, plan: Plan | None) -> None:
        """The load's warm-up: every path (`rest`), or, on a backend that compiles its kernels
        into a cache other processes share, the first reply's paths (`prefill`, `decode`) with a
        helper process for the rest until it is all compiled (ahead.py)."""
        if getattr(ops, "compiles_ahead", False):
            from inferno import ahead
            ahead.load_warm_up(self, plan)
        else:
            self.warm_up("rest")

    WARM_PROMPT = 32  # tokens of the warm-up's prompt: a short chat turn's, past dispatch.FEW_MAX

    def warm_up(self, part: str = "rest") -> None:
        """Run one part of the warm-up, so that JIT compilation, kernel caches (Numba's,
        Triton's) and device libraries load during load(), never in the middle of a reply
        (llama.cpp warms up too):
        - `prefill`: a prompt of WARM_PROMPT tokens, as a short first turn takes;
        - `decode`: a decode step of one sequence (on the device runner where there is one);
        - `rest`: every path a generation can take: two short prompts, a short chunk after a
          cache alone, then beside a decode, a decode beside a long chunk, a decode of four
          sequences, and the two above;
          with each op's own choice by size, then with every op on the path that long prompts
          and contexts take (ops.every_path: pool's parallel kernels)."""
        model, ops = self.model, self.model.ops
        zeros = lambda k: np.zeros(k, np.int64)  # noqa: E731
        n = max(1, min(self.WARM_PROMPT, self.config.max_position_embeddings - 1))
        if part == "prefill":
            ops.to_numpy(model.step([Segment(zeros(n), 0, 0)], model.new_cache(n + 1)))
        elif part == "decode":  # after a position left unwritten, not a prompt: a helper
            # compiles this while the load compiles that (a token at 0 would be a prompt)
            ops.to_numpy(model.step([Segment(zeros(1), 0, 1)], model.new_cache(2)))
            if self._solo is not None:
                self._solo.runner()  # the decode step of one sequence, captured
        elif part == "rest":
            # each op's own choice by size first (a chat's next turn, the likeliest path after a
            # first reply), then its parallel kernels (long prompts, long contexts)
            chunk = max(1, min(n, self.config.max_position_embeddings - 5))
            for every in (False, True):
                with ops.every_path() if every else contextlib.nullcontext():
                    cache = model.new_cache(chunk + 5, slots=2)
                    model.step([Segment(zeros(3), 0, 0, logits=False), Segment(zeros(2), 1, 0, logits=False)], cache)
                    ops.to_numpy(model.step([Segment(zeros(2), 0, 3)], cache))  # a chunk after a cache
                    ops.to_numpy(model.step([Segment(zeros(1), 0, 4), Segment(zeros(2), 1, 2)], cache))
                    ops.to_numpy(model.step([Segment(zeros(1), 0, 5), Segment(zeros(chunk), 1, 4)], cache))
                    # a batched decode: the head over four rows (a server's step, a draft's check)
                    ops.to_numpy(model.step([Segment(zeros(1), s, 1) for s in range(4)], model.new_cache(2, slots=4)))
                    self.warm_up("prefill")
                    self.warm_up("decode")
        else:
            raise ValueError(f"no warm-up part {part!r}: prefill, decode or rest")

    def _claim_slots(self, need: int) -> Slots:
        """A single generation's KV cache slot: the engine's own (its device runner captured
        at load, the cache grown when a request needs more room) when there is one and no
        other stream holds it; else a new one sized for the request. Claimed when the stream
        starts, given back when it ends (_generate)."""
        with self._solo_lock:
            solo = self._solo if self._solo_free else None
            self._solo_free = False
        if solo is None:
            return self.new_slots(1, need)
        solo.clear()  # as a new one: no rows reused across calls (a Session reuses them)
        return solo

    def _context(self, ctx_size: int | None) -> int:
        return check_ctx_size(ctx_size, self.config) if ctx_size is not None else self.ctx_size

    def _check_fits(self, prompt_tokens: int, max_tokens: int, ctx_size: int | None) -> None:
        """The prompt and the reply must fit the context; the error names the limit, where it
        came from, and every way out."""
        limit = self._context(ctx_size)
        if prompt_tokens + max_tokens <= limit:
            return
        model_max = self.config.max_position_embeddings
        over = (f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) = "
                f"{prompt_tokens + max_tokens} tokens")
        if limit < model_max:
            raise InfernoError(f"{over} exceeds the context of {limit} set by ctx_size: raise "
                               f"ctx_size (the model allows up to {model_max}), lower max_tokens "
                               f"or shorten the prompt", params=("max_tokens", "ctx_size"))
        raise InfernoError(f"{over} exceeds the model's context of {model_max} tokens: lower "
                           f"max_tokens or shorten the prompt", params=("max_tokens",))

    def check_ids(self, token_ids) -> np.ndarray:
        """Token ids as int64 [n], each checked against the vocabulary."""
        try:
            ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        except (OverflowError, ValueError, TypeError):
            raise InfernoError(f"token ids must be integers in [0, {self.config.vocab_size})") from None
        if ids.size and (ids.min() < 0 or ids.max() >= self.config.vocab_size):
            raise InfernoError(f"token id out of range for a vocabulary of {self.config.vocab_size}")
        return ids

    def _generate(self, seq: Sequence, slots: Slots | int, to_context: bool = False):
        """`slots` a Session's, or the positions a single generation needs (its slot is
        claimed here, as the stream starts); `to_context`: max_tokens is what the context had
        room for (context_full)."""
        ops = self.ops
        if isinstance(slots, int):
            slots = self._claim_slots(slots)
        loop = Scheduler(self, slots, chunk=UBATCH)  # a long prompt in passes of UBATCH tokens
        loop.add([seq])
        pieces, lps = [], []
        waited = 0.0  # time the consumer held a piece: not decode time
        ops.synchronize()
        t0 = time.perf_counter()
        try:
            while loop.busy:
                for _, event in loop.step():
                    if event.error:
                        raise InfernoError(f"generation failed: {event.error}")
                    lps += event.logprobs or ()
                    if event.text:
                        pieces.append(event.text)
                        t_out = time.perf_counter()
                        yield event.text
                        waited += time.perf_counter() - t_out
        finally:
            loop.cancel_all()  # an abandoned stream frees its slot; the rows it wrote stay claimed
            if slots is self._solo:
                self._solo_free = True
        t_end = time.perf_counter()
        t_first = seq.first_token_time
        ttft = t_first - t0
        decode_s = t_end - t_first - waited
        decoded = len(seq.sampled) - 1
        return GenerationResult(
            text="".join(pieces),
            token_ids=list(seq.generated),
            prompt_tokens=len(seq.prompt),
            generated_tokens=len(seq.generated),
            ttft_s=ttft,
            prefill_tokens_per_s=(len(seq.prompt) - seq.cached) / ttft if ttft > 0 else float("inf"),
            decode_tokens_per_s=decoded / decode_s if decode_s > 0 and decoded > 0 else 0.0,
            peak_memory_bytes=ops.peak_memory_bytes(),
            finish_reason=seq.finish_reason,
            stop=seq.reply.stop_string,
            decode_s=decode_s,
            cached_tokens=seq.cached,
            logprobs=lps if seq.options.logprobs else None,
            context_full=to_context and seq.finish_reason == "length",
            drafted_tokens=seq.drafted,
            accepted_tokens=seq.accepted,
        )


EMPTY_PROMPT = "the prompt is empty: give some text"
EMBED_SLOTS = 4  # texts engine.embed runs side by side
# Positions of the slot single generations share on a backend that decodes on the device: a
# request that needs more grows it (and captures its step again) up to the context.
SOLO_CAPACITY = 4096
DEFAULT_MAX_TOKENS = 256  # a reply's length when max_tokens is not given and the context allows


def _count(n: int) -> str:
    """A parameter count as model cards write it: 30.5B, 135M, 12K."""
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


def takes_reasoning_effort(chat_template: str | None) -> bool:
    """Whether a chat template reads a `reasoning_effort` variable (gpt-oss's Jinja template
    does; harmony.render always takes one)."""
    return harmony.is_harmony(chat_template) or "reasoning_effort" in (chat_template or "")


def check_ctx_size(ctx_size: int | None, config=None) -> int | None:
    """ctx_size at least 1 and, once the model's config is known, at most its context; None
    means the model's context."""
    if ctx_size is None:
        return config.max_position_embeddings if config is not None else None
    if ctx_size < 1:
        raise InfernoError(f"ctx_size must be at least 1, got {ctx_size}", params=("ctx_size",))
    if config is not None and ctx_size > config.max_position_embeddings:
        raise InfernoError(f"ctx_size {ctx_size} exceeds the model's context of "
                           f"{config.max_position_embeddings} tokens", params=("ctx_size",))
    return ctx_size


def quantize_weights(checkpoint: Checkpoint, qtype: str, ops) -> None:
    """Every float matrix of the checkpoint (float32, or 16-bit kept as stored) quantized to
    `qtype` in place by the backend `ops`, rows of whole 32-weight blocks only; one line on
    stderr says what it did."""
    t0 = time.perf_counter()
    done = kept = 0
    for name, w in checkpoint.tensors.items():
        is_float = isinstance(w, np.ndarray) or w.qtype.name in ("F16", "BF16")
        if len(w.shape) != 2 or not is_float:
            continue
        if w.shape[1] % 32:
            kept += 1
            continue
        dense = w if isinstance(w, np.ndarray) else w.dequantize()
        checkpoint.tensors[name] = ops.quantize_weight(dense, qtype)
        done += 1
    note = f", {kept} left as they were (rows not a multiple of 32)" if kept else ""
    print(f"note: quantized {done} matrices to {qtype.upper()} at load in "
          f"{time.perf_counter() - t0:.1f} s{note}", file=sys.stderr)
    if done:
        checkpoint.metadata.pop("general.file_type", None)  # the type column names the new type


def check_cache_type(cache_type: str) -> str:
    if cache_type not in CACHE_TYPES:
        raise InfernoError(f"cache_type must be one of {', '.join(CACHE_TYPES)}, got {cache_type!r}",
                           params=("cache_type",))
    return cache_type


def load(model: str | None = None, backend: str = DEFAULT_BACKEND, *, flash: bool = True, trace: bool = False,
         progress: bool | None = None, cache_type: str | None = None, ctx_size: int | None = None,
         weights: str | None = None, warm_up: bool = True, draft: str | None = None,
         **backend_options) -> Engine:
    """Load `model` onto `backend` (pool, the default; simd; cpu, the numpy reference; torch;
    gpu). `model` is a folder, a .gguf file, a hub id or an alias; None is the default model
    (smollm2-135m), fetched on first use.
    Backend options: threads (pool), device and dtype (torch). `flash=False` runs prefill with
    materialized scores; `trace=True` wraps the backend in the tracing backend
    (engine.ops.format_histogram()). `cache_type` stores the KV cache as f32, f16, bf16 or q8_0
    (default: the backend's, f16 on simd and pool). `ctx_size` is each generation's context
    (default: the model's). `weights` ("q8_0" or "q4_0") quantizes the float weights at load
    (a Hugging Face folder's bf16, say), as llama.cpp's quantizer would; weights a GGUF already
    holds in blocks stay as they are. Values that do not depend on the model are checked before
    anything loads; ctx_size against the model's context right after its config is read.
    `warm_up` False skips the warm-up (Engine._load_warm_up): the first reply then compiles or
    loads its kernels as it goes. `draft` names a draft model for speculative decoding
    (spec_type="draft"), loaded the same way; its vocabulary must be the target's."""
    check_ctx_size(ctx_size)
    if cache_type is not None:
        check_cache_type(cache_type)
    if weights is not None and weights not in QUANTIZERS:
        raise InfernoError(f"weights must be one of {', '.join(QUANTIZERS)}, got {weights!r}",
                           params=("weights",))
    if progress is None:
        progress = sys.stderr.isatty()
    path = resolve(model)  # a first-use download is not load time
    t0 = time.perf_counter()
    ops = create_backend(backend, **backend_options)
    try:
        checkpoint = open_checkpoint(path, progress=progress)
        check_ctx_size(ctx_size, checkpoint.config)  # before any weight reaches the backend
        if weights is not None:
            quantize_weights(checkpoint, weights, ops)
        alias = alias_sampling(model)
        if alias:
            checkpoint.sampling.append(alias)
        engine = Engine(checkpoint, ops, flash=flash, load_s=time.perf_counter() - t0, trace=trace,
                        cache_type=cache_type, ctx_size=ctx_size, warm_up=warm_up,
                        ahead=_plan(path, backend, flash, cache_type, weights, backend_options))
    except BaseException:
        ops.close()  # give back threads, BLAS settings, device memory
        raise
    if draft is not None:
        try:
            engine.draft = load(draft, backend, flash=flash, progress=progress, cache_type=cache_type,
                                weights=weights, warm_up=warm_up, **backend_options)
            check_same_vocabulary(engine, engine.draft, model, draft)
        except BaseException:
            engine.close()
            raise
    return engine


def check_same_vocabulary(target: Engine, draft: Engine, target_name, draft_name) -> None:
    """A draft model's tokens must mean the target's: the same vocabulary, token for token
    (llama.cpp's check), else one error naming both. Their logits may differ in number (an
    embedding table padded to a round size): the drafts are taken among the target's."""
    a, b = target.tokenizer.hf.get_vocab(with_added_tokens=True), draft.tokenizer.hf.get_vocab(with_added_tokens=True)
    if a != b:
        differ = len(a.items() ^ b.items()) // 2
        raise InfernoError(f"the draft model {draft_name} ({len(b)} tokens) does not share the vocabulary of "
                           f"{target_name or DEFAULT_MODEL} ({len(a)} tokens; {differ} differ): speculative "
                           f"decoding needs a draft with the target's tokenizer", params=("draft",))


def _plan(path, backend: str, flash: bool, cache_type, weights, backend_options: dict):
    """The load's arguments for a helper process that repeats it (ahead.py); None where they do
    not go into JSON (a backend option that is an object)."""
    from inferno.ahead import Plan
    try:
        return Plan(str(Path(path).resolve()), backend, flash=flash, cache_type=cache_type, weights=weights,
                    **backend_options)
    except TypeError:
        return None
