"""The forward pass of the decoder families inferno runs (Llama, Qwen2, Qwen3, Gemma 3, gpt-oss),
written against `ops` only.

    x = embed(tokens)                                  # x sqrt(hidden) for Gemma
    for each layer:
        x = x + post_norm(attention(rms_norm(x)))      # q/k norms, RoPE, GQA, sliding window
        x = x + post_norm(mlp(rms_norm(x)))            # SwiGLU or GeGLU, or a mixture of experts
    logits = lm_head(rms_norm(x))

`post_norm` is Gemma's sandwich norm and nothing for the others. gpt-oss adds biases to every
attention projection, a sink logit per head to each softmax, and experts with biases and a
clamped SwiGLU. What differs between families
is a handful of named flags (config.Family) read once into each Layer, so this one forward walks
them all: a flag is a weight that is present or None, never an `if gemma:`.

One step runs a batch: segments of tokens from several sequences, each continuing its own KV
cache slot at its own position. The linears see all rows at once (every weight read once per
step, whatever the batch size); RoPE takes each row's position; attention runs per sequence
against its own slot, the decoding ones together in one decode_attention call. A single
sequence is the batch of one.

Weights keep their Hugging Face names and `[out, in]` layout, as float32 arrays or quantized
blocks (ops.weight decides how each backend keeps them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from inferno.formats.quant import QuantTensor, as_float32
from inferno.errors import InfernoError
from inferno.model.config import ModelConfig
from inferno.model.kv_cache import KVCache


# Prompt tokens per forward pass of a long prefill, as llama.cpp's n_ubatch: a pass's
# activations then stay below glibc's 32 MiB mmap ceiling (above it every op's output is mapped
# fresh and page-faults on each page it writes: simd.reuse_freed_activations) and nearer the
# caches (measured: bench/RESULTS.md, "Long prompts in passes of 512").
UBATCH = 512


def check_room(cache: KVCache, start: int, n: int) -> None:
    """One clear error where n tokens from position `start` would not fit the cache."""
    if start + n > cache.capacity:
        raise InfernoError(f"KV cache full: {start} + {n} tokens exceed its {cache.capacity} positions")


@dataclass(frozen=True)
class Segment:
    """Tokens of one sequence in a step: `ids` continue cache slot `slot` from position `start`
    (the slot already holds positions 0..start-1). `logits` False skips the vocabulary
    projection for it: a prompt chunk that is not the prompt's last needs none; `every_row`
    asks for every row's (a speculative step checks a drafted token at each). `hidden` asks for
    every row's hidden state after the final norm instead, the head skipped: what an embedding
    pools (`DecoderModel.run`)."""

    ids: np.ndarray  # [n] int64
    slot: int = 0
    start: int = 0
    logits: bool = True
    every_row: bool = False
    hidden: bool = False


class StepOutput(NamedTuple):
    """A step's results: the logits rows its segments asked for, [n, vocab] in the order given
    (None when none did), and the hidden rows of its `hidden` segments, [rows, hidden] segment
    by segment (None when none did)."""

    logits: object
    hidden: object


def heavy_tailed_inputs(t):
    """t, marked as a linear weight whose inputs are heavy-tailed: the attention's output, the
    MLP's gated product, and the final norm's output that the head takes. int8 activations take
    a remainder row for these: one int8 row of such inputs moves the logits enough to change
    greedy answers, the remainder row brings them back within float32's (bench/RESULTS.md,
    "Remainder rows for heavy-tailed inputs"). The other matrices keep one row."""
    if isinstance(t, QuantTensor):
        t.outlier_inputs = True
    return t


class Layer:
    """One decoder block's weights, as backend tensors; an absent piece is None."""

    def __init__(self, ops, cfg: ModelConfig, tensors: dict, i: int):
        p = f"model.layers.{i}."
        fam = cfg.family
        w = lambda name: ops.linear_weight(tensors.pop(p + name))  # noqa: E731  [out, in] linear weight
        v = lambda name: ops.from_numpy(tensors.pop(p + name))  # noqa: E731  vector
        norm = lambda name: ops.from_numpy(np.asarray(tensors.pop(p + name), np.float32))  # noqa: E731

        def outliers_in(name):
            return ops.linear_weight(heavy_tailed_inputs(tensors.pop(p + name)))

        def stack(name, outliers=False):  # an expert's matrices stacked: as ops.moe takes them
            t = tensors.pop(p + name)
            return ops.experts_weight(heavy_tailed_inputs(t) if outliers else t, cfg.experts.count)

        self.window = cfg.window(i)  # keys in the sliding window; 0: global attention
        self.attn_norm = norm("input_layernorm.weight")  # [hidden]
        # [n_heads * hd, hidden], [n_kv * hd, hidden] x 2
        self.qkv = [w(f"self_attn.{x}_proj.weight") for x in "qkv"]
        self.qkv_bias = [v(f"self_attn.{x}_proj.bias") for x in "qkv"] if fam.qkv_bias else None
        self.q_norm = norm("self_attn.q_norm.weight") if fam.qk_norm else None  # [hd]
        self.k_norm = norm("self_attn.k_norm.weight") if fam.qk_norm else None
        self.o_proj = outliers_in("self_attn.o_proj.weight")  # [hidden, n_heads * hd]
        self.o_bias = v("self_attn.o_proj.bias") if fam.o_bias else None  # [hidden]
        self.sinks = v("self_attn.sinks") if fam.sinks else None  # [n_heads]: ops' `sinks`
        if fam.sandwich_norms:
            self.post_attn_norm = norm("post_attention_layernorm.weight")
            self.mlp_norm = norm("pre_feedforward_layernorm.weight")
            self.post_mlp_norm = norm("post_feedforward_layernorm.weight")
        else:  # Llama's post_attention_layernorm is the norm before the MLP
            self.post_attn_norm = self.post_mlp_norm = None
            self.mlp_norm = norm("post_attention_layernorm.weight")
        if cfg.sparse(i):  # a mixture of experts: a router, and each matrix of every expert stacked
            n_exp = cfg.experts.count
            self.router = w("mlp.gate.weight")  # [n_expert, hidden]
            self.experts = (stack("mlp.experts.gate_proj.weight"), stack("mlp.experts.up_proj.weight"),
                            stack("mlp.experts.down_proj.weight", outliers=True))  # ops.moe's shapes
            # [1, n_expert], then [n_expert, inter] x 2 and [n_expert, hidden]: ops.moe's biases
            self.expert_biases = (tuple(ops.from_numpy(as_float32(tensors.pop(p + n)).reshape(rows, -1))
                                        for n, rows in (("mlp.gate.bias", 1), ("mlp.experts.gate_proj.bias", n_exp),
                                                        ("mlp.experts.up_proj.bias", n_exp),
                                                        ("mlp.experts.down_proj.bias", n_exp)))
                                  if cfg.experts.bias else None)
            self.gate_up = self.down_proj = None
        else:
            self.router = self.experts = self.expert_biases = None
            self.gate_up = [w("mlp.gate_proj.weight"), w("mlp.up_proj.weight")]  # [inter, hidden] x 2
            self.down_proj = outliers_in("mlp.down_proj.weight")  # [hidden, intermediate]


class _Batch:
    """A step's segments laid out as rows: decoding segments (one token after a cache) first,
    so their queries are one contiguous block for decode_attention."""

    def __init__(self, segments: list[Segment], cached: bool):
        decoding = [cached and s.ids.size == 1 and s.start > 0 for s in segments]
        decode = [j for j, d in enumerate(decoding) if d]
        prefill = [j for j, d in enumerate(decoding) if not d]
        self.order = decode + prefill  # processing order -> index into `segments`
        self.segments = [segments[j] for j in self.order]
        self.n_decode = len(decode)
        sizes = [s.ids.size for s in self.segments]
        self.row0 = np.concatenate([[0], np.cumsum(sizes)]).astype(int)  # segment k: rows row0[k]..row0[k+1]
        self.ids = np.concatenate([s.ids for s in self.segments])  # [rows]
        self.positions = np.concatenate([np.arange(s.start, s.start + s.ids.size) for s in self.segments])
        self.slots = np.array([s.slot for s in self.segments[:self.n_decode]], dtype=np.int64)
        self.kv_lens = np.array([s.start + 1 for s in self.segments[:self.n_decode]], dtype=np.int64)
        # Every row's slot and keys (its position + 1): the whole step as decode_attention takes it.
        self.row_slots = np.concatenate([np.full(s.ids.size, s.slot, np.int64) for s in self.segments])
        self.row_kv_lens = self.positions + 1


class DecoderModel:
    def __init__(self, cfg: ModelConfig, tensors: dict, ops, flash: bool = True,
                 cache_type: str = "f32"):
        """Takes ownership of `tensors` (HF names; float32 arrays or QuantTensors): each is
        handed to the backend and dropped, so host copies do not outlive their conversion.
        `cache_type` is new caches' element type (f32, f16, bf16, q8_0)."""
        self.cfg, self.ops, self.flash, self.cache_type = cfg, ops, flash, cache_type
        tensors = dict(tensors)
        check_weights(cfg, tensors)
        fam = cfg.family
        embed = tensors.pop("model.embed_tokens.weight")  # [vocab, hidden]
        if cfg.tie_word_embeddings:  # the head's inputs; a lookup of rows takes no activations
            embed = heavy_tailed_inputs(embed)
        self.embed_tokens = ops.weight(embed)
        self.lm_head = (self.embed_tokens if cfg.tie_word_embeddings
                        else ops.linear_weight(heavy_tailed_inputs(tensors.pop("lm_head.weight"))))
        # Gemma scales embeddings by sqrt(hidden), rounded to the embedding's dtype (float32 here).
        self.embed_scale = float(np.float32(math.sqrt(cfg.hidden_size))) if fam.scaled_embedding else None
        # What multiplies q k^T (None: 1/sqrt(head_dim)). YaRN scales cos and sin by a factor,
        # so q and k by it, so the scores by its square: applied here, not to the cached keys.
        self.scale = cfg.attention_scale
        if cfg.rope_attention_factor != 1.0:
            self.scale = (cfg.attention_scale or cfg.head_dim ** -0.5) * cfg.rope_attention_factor ** 2
        self.layers = [Layer(ops, cfg, tensors, i) for i in range(cfg.num_hidden_layers)]
        self.norm = ops.from_numpy(np.asarray(tensors.pop("model.norm.weight"), np.float32))
        # RoPE frequencies per kind of layer: global, and the sliding-window layers' own base.
        self.inv_freq = {False: cfg.inv_freq()}  # [hd / 2]
        if any(layer.window for layer in self.layers):
            self.inv_freq[True] = cfg.inv_freq(local=True)
        self._rope_rows = 0  # positions the decode step's RoPE tables cover (see rope_table)
        self._rope_table: dict = {}
        self._rope_kept: list[dict] = []  # tables outgrown, which captured steps still read

    def new_cache(self, capacity: int, slots: int = 1, cache_type: str | None = None) -> KVCache:
        """A KV cache of `slots` x `capacity` positions, in the model's cache type unless given."""
        return KVCache(self.ops, self.cfg.num_hidden_layers, capacity, self.cfg.kv_width,
                       slots=slots, cache_type=cache_type or self.cache_type)

    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode step reads, as the backend stores them: every matrix and
        norm once, the chosen experts' share of the stacked experts (top_k of n_expert), and one
        embedding row (a tied lm_head is the embedding, read whole)."""
        nbytes = self.ops.weight_nbytes
        embed_row = nbytes(self.embed_tokens) // self.cfg.vocab_size
        return round(sum(nbytes(m) * share for m, share in self._matrices())
                     + (0 if self.cfg.tie_word_embeddings else embed_row))

    def parameters(self) -> tuple[int, int]:
        """(all, active a token): the weights' element count, and what one token multiplies
        (the chosen experts' share of the experts; the embedding counted whole in both, as
        model cards count them)."""
        mats = self._matrices()  # a tied lm_head is the embedding
        if not self.cfg.tie_word_embeddings:
            mats.append((self.embed_tokens, 1.0))
        size = lambda m: int(np.prod(m.shape))  # noqa: E731
        return sum(size(m) for m, _ in mats), round(sum(size(m) * share for m, share in mats))

    def _matrices(self) -> list[tuple[object, float]]:
        """(weight, share one token reads) for every weight the forward reads but the
        embedding: 1 for all but the stacked experts, top_k / n_expert for those."""
        moe = self.cfg.experts
        mats = [(self.lm_head, 1.0), (self.norm, 1.0)]
        for layer in self.layers:
            dense = [*layer.qkv, layer.o_proj, layer.attn_norm, layer.mlp_norm, *(layer.qkv_bias or ()),
                     *(n for n in (layer.q_norm, layer.k_norm, layer.post_attn_norm, layer.post_mlp_norm,
                                   layer.o_bias, layer.sinks) if n is not None)]
            if layer.experts is None:
                dense += [*layer.gate_up, layer.down_proj]
            else:
                dense.append(layer.router)
                mats += [(m, moe.top_k / moe.count) for m in layer.experts]
            mats += [(m, 1.0) for m in dense]
        return mats

    def forward(self, token_ids, cache: KVCache | None = None, last_only: bool = False):
        """Logits for one sequence's `token_ids`, [n, vocab] (or [1, vocab] with `last_only`), as
        a backend tensor, in one pass. Without a cache the pass is uncached; with one, the tokens
        continue slot 0 at position cache.length, and their K/V are appended. (A prompt cut into
        passes of UBATCH tokens is the scheduler's: Engine.generate, which `inferno bench` times.)"""
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        start = cache.length if cache is not None else 0
        return self.step([Segment(ids, 0, start)], cache, all_logits=not last_only)

    def step(self, segments: list[Segment], cache: KVCache | None, all_logits: bool = False):
        """One forward pass over a batch of segments. Returns the last-token logits of each
        segment that asks for them, [n, vocab] in the order given (None when none does), or
        every row's of a segment with `every_row` (of all of them with `all_logits`), segment by
        segment. Each segment's K/V are written into its
        cache slot and the slot's length set to its end."""
        return self.run(segments, cache, all_logits).logits

    def run(self, segments: list[Segment], cache: KVCache | None, all_logits: bool = False) -> StepOutput:
        """`step`, with the hidden rows of the segments that ask for them (Segment.hidden)."""
        ops, cfg = self.ops, self.cfg
        if not segments:
            raise InfernoError("a step needs at least one segment")
        if cache is None and (len(segments) != 1 or segments[0].start):
            raise InfernoError("an uncached forward takes one sequence from position 0")
        for s in segments:
            if s.ids.size == 0:
                raise InfernoError("a segment needs at least one token")
            if cache is not None:
                check_room(cache, s.start, s.ids.size)
        ops.begin_step()
        batch = _Batch(segments, cached=cache is not None)
        rope = {local: ops.rope_tables(batch.positions, inv) for local, inv in self.inv_freq.items()}
        x = self._blocks(self._embed(batch.ids), lambda layer, i, h: self.attention(
            layer, i, h, rope[layer.window > 0], batch, cache))
        if cache is not None:
            for s in segments:
                cache.lengths[s.slot] = s.start + s.ids.size
        processed = np.argsort(batch.order)  # caller's j -> processed k
        hidden = None
        seg_of = processed[[s.hidden for s in segments]]
        if seg_of.size:  # every row of each, normed as the head's inputs are (row by row)
            rows = np.concatenate([np.arange(batch.row0[k], batch.row0[k + 1]) for k in seg_of])
            hidden = ops.rms_norm(self._rows(x, rows, batch.ids.size), self.norm, cfg.rms_norm_eps)
        # Rows whose logits are wanted, in the caller's segment order.
        seg_of = processed[[s.logits and not s.hidden for s in segments]]
        if seg_of.size == 0:
            return StepOutput(None, hidden)
        every = [all_logits or batch.segments[k].every_row for k in seg_of]
        if any(every):
            rows = np.concatenate([np.arange(batch.row0[k] if e else batch.row0[k + 1] - 1, batch.row0[k + 1])
                                   for k, e in zip(seg_of, every)])
        else:
            rows = batch.row0[seg_of + 1] - 1  # each segment's last row
        x = ops.rms_norm(self._rows(x, rows, batch.ids.size), self.norm, cfg.rms_norm_eps)
        return StepOutput(ops.linear(x, self.lm_head), hidden)  # [len(rows), vocab]

    def _rows(self, x, rows, n: int):
        """x's `rows` ([len(rows), hidden]), x itself where they are all its n rows in order."""
        if len(rows) != n or np.any(rows != np.arange(len(rows))):
            return self.ops.take_rows(x, rows)
        return x

    def decode(self, ids, positions, slots, kv_lens, cache: KVCache):
        """The decode step with no host value in it: one new token for each sequence of a
        batch, `ids` at `positions` of cache `slots`, whose lengths become `kv_lens` (positions
        + 1). Every input is an index tensor [B] (ops.indices) that the ops read where it lies,
        and RoPE takes its rows from tables made beforehand (rope_table), so on a GPU the step
        is launches only: it can be captured once and replayed (backends/torch/graphs.py). The
        caller keeps the values valid (positions within the cache, slots its own) and the
        cache's host lengths; `step` on the same batch gives the same logits [B, vocab]."""
        ops, cfg = self.ops, self.cfg
        rope = {local: (ops.take_rows(cos, positions), ops.take_rows(sin, positions))
                for local, (cos, sin) in self.rope_table(cache.capacity).items()}

        def attention(layer, i, h):
            q, k, v = self._qkv(layer, h, rope[layer.window > 0])
            ops.write_kv_rows(cache.k[i], slots, positions, k)
            ops.write_kv_rows(cache.v[i], slots, positions, v)
            ctx = ops.decode_attention(q, cache.k[i], cache.v[i], slots, kv_lens, cfg.num_attention_heads,
                                       cfg.num_key_value_heads, cfg.head_dim, window=layer.window,
                                       scale=self.scale, sinks=layer.sinks)
            return self._out(layer, ctx)

        x = self._blocks(self._embed(ids), attention)
        return ops.linear(ops.rms_norm(x, self.norm, cfg.rms_norm_eps), self.lm_head)  # [B, vocab]

    def rope_table(self, positions: int) -> dict:
        """cos and sin for positions 0..positions-1 at least, per kind of layer (global, and
        the windowed layers' base), as backend tensors: the decode step takes a batch's rows
        from them. Made once on the host, in float64 like every step's, so both agree bit for
        bit; remade only for a bigger cache. An outgrown table is kept, not freed: a step
        captured in a CUDA graph holds its address, not a reference."""
        if positions > self._rope_rows:
            if self._rope_table:
                self._rope_kept.append(self._rope_table)
            self._rope_rows = max(positions, min(2 * self._rope_rows, self.cfg.max_position_embeddings))
            every = np.arange(self._rope_rows)
            self._rope_table = {local: self.ops.rope_tables(every, inv) for local, inv in self.inv_freq.items()}
        return self._rope_table

    def _embed(self, ids):
        x = self.ops.embedding(self.embed_tokens, ids)  # [rows, hidden]
        return x if self.embed_scale is None else self.ops.scale(x, self.embed_scale)

    def _blocks(self, x, attention):
        """Every decoder block over x [rows, hidden]; attention(layer, i, h) is the attention
        line's output for the normed rows h."""
        ops, eps = self.ops, self.cfg.rms_norm_eps
        for i, layer in enumerate(self.layers):
            h = ops.rms_norm(x, layer.attn_norm, eps)
            x = ops.add(x, self._post_norm(attention(layer, i, h), layer.post_attn_norm))
            h = ops.rms_norm(x, layer.mlp_norm, eps)
            x = ops.add(x, self._post_norm(self.mlp(layer, h), layer.post_mlp_norm))
        return x

    def _qkv(self, layer: Layer, h, rope):
        """q, k, v of the normed rows h: the projections, biases, q/k norms and RoPE."""
        ops, cfg = self.ops, self.cfg
        q, k, v = ops.linear_many(h, layer.qkv)  # [rows, nh * hd], [rows, nkv * hd] x 2
        if layer.qkv_bias is not None:
            q, k, v = (ops.add(t, b) for t, b in zip((q, k, v), layer.qkv_bias))
        if layer.q_norm is not None:
            q = ops.rms_norm(q, layer.q_norm, cfg.rms_norm_eps)  # per head: len(q_norm) == hd
            k = ops.rms_norm(k, layer.k_norm, cfg.rms_norm_eps)
        cos, sin = rope
        return ops.apply_rope(q, cos, sin, cfg.head_dim), ops.apply_rope(k, cos, sin, cfg.head_dim), v

    def attention(self, layer: Layer, i: int, h, rope, batch: _Batch, cache: KVCache | None):
        ops, cfg = self.ops, self.cfg
        hd, nh, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        q, k, v = self._qkv(layer, h, rope)
        attend = ops.flash_attention_prefill if self.flash else ops.materialized_attention
        window, scale, sinks = layer.window, self.scale, layer.sinks  # 0, None, None: global, 1/sqrt(hd), none
        causal = not cfg.bidirectional
        if cache is None:
            ctx = attend(q, k, v, nh, nkv, hd, causal, window=window, scale=scale, sinks=sinks)
            return self._out(layer, ctx)

        r = batch.row0
        if batch.n_decode:  # one row per decoding sequence, each into its own slot, in one call
            ops.write_kv_rows(cache.k[i], batch.slots, batch.kv_lens - 1, ops.rows(k, 0, batch.n_decode))
            ops.write_kv_rows(cache.v[i], batch.slots, batch.kv_lens - 1, ops.rows(v, 0, batch.n_decode))
        for j in range(batch.n_decode, len(batch.segments)):
            s = batch.segments[j]
            ops.write_kv(cache.k[i], s.slot, s.start, ops.rows(k, r[j], r[j + 1]))
            ops.write_kv(cache.v[i], s.slot, s.start, ops.rows(v, r[j], r[j + 1]))
        if ops.batch_invariant and self.flash and causal:
            # Every row against its slot's keys up to its own position, as a decode step reads
            # them: a prompt's row then comes out the same whatever chunk it came in. (flash
            # off asks for materialized scores, below, and gets them; a model that attends
            # both ways sees later keys too, which a decode step does not read.)
            ctx = ops.decode_attention(q, cache.k[i], cache.v[i], batch.row_slots, batch.row_kv_lens,
                                       nh, nkv, hd, window=window, scale=scale, sinks=sinks)
            return self._out(layer, ctx)
        parts = []  # (first row, [rows, nh * hd]) per attention call
        if batch.n_decode:
            # Every decoding sequence at once, each against its own slot, read in place.
            parts.append((0, ops.decode_attention(ops.rows(q, 0, batch.n_decode), cache.k[i], cache.v[i],
                                                  batch.slots, batch.kv_lens, nh, nkv, hd,
                                                  window=window, scale=scale, sinks=sinks)))
        # A cache that rounds (f16, bf16, q8_0) is read back even for a chunk's own keys: every
        # query then sees the stored rows, so a prompt's logits do not depend on how it was cut
        # into chunks or how much of it a slot already held (prefix reuse), and decode sees the
        # same keys as the prefill did.
        rounds = cache.cache_type != "f32"
        for j in range(batch.n_decode, len(batch.segments)):
            s, n = batch.segments[j], batch.segments[j].ids.size
            if s.start == 0 and not rounds:
                ks, vs = ops.rows(k, r[j], r[j + 1]), ops.rows(v, r[j], r[j + 1])
            else:
                # A chunk after a cache: attend over the cached rows too, from the first key the
                # window lets the chunk's first query see. The causal diagonal is bottom-right
                # aligned, so row t sees keys up to start + t.
                k0 = max(0, s.start - window + 1) if window else 0
                ks = ops.read_kv(cache.k[i], s.slot, k0, s.start + n)  # [start + n - k0, nkv * hd]
                vs = ops.read_kv(cache.v[i], s.slot, k0, s.start + n)
            parts.append((r[j], attend(ops.rows(q, r[j], r[j + 1]), ks, vs, nh, nkv, hd, causal,
                                       window=window, scale=scale, sinks=sinks)))
        if len(parts) == 1:
            ctx = parts[0][1]
        else:
            ctx = ops.zeros(int(r[-1]), nh * hd)  # [rows, nh * hd]
            for row, part in parts:
                ops.write_rows(ctx, part, int(row))
        return self._out(layer, ctx)

    def _out(self, layer: Layer, ctx):
        """The attention's output projection of ctx [rows, n_heads * hd], with its bias."""
        out = self.ops.linear(ctx, layer.o_proj)
        return out if layer.o_bias is None else self.ops.add(out, layer.o_bias)

    def mlp(self, layer: Layer, h):
        ops = self.ops
        if layer.experts is not None:
            moe = self.cfg.experts
            return ops.moe(h, layer.router, layer.experts, moe.top_k, moe.norm_topk,
                           biases=layer.expert_biases, clamp=moe.clamp)  # [rows, hidden]
        gate, up = ops.linear_many(h, layer.gate_up)  # [rows, intermediate] x 2
        act = ops.gelu_mul(gate, up) if self.cfg.activation == "gelu_tanh" else ops.silu_mul(gate, up)
        return ops.linear(act, layer.down_proj)  # [rows, hidden]

    def _post_norm(self, x, w):
        return x if w is None else self.ops.rms_norm(x, w, self.cfg.rms_norm_eps)


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the forward pass reads, by Hugging Face name, with its shape."""
    hidden, inter, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    fam = cfg.family
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, hidden), "model.norm.weight": (hidden,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, hidden)
    layer = {
        "input_layernorm.weight": (hidden,),
        "self_attn.q_proj.weight": (cfg.q_width, hidden),
        "self_attn.k_proj.weight": (cfg.kv_width, hidden),
        "self_attn.v_proj.weight": (cfg.kv_width, hidden),
        "self_attn.o_proj.weight": (hidden, cfg.q_width),
        "post_attention_layernorm.weight": (hidden,),
        "mlp.gate_proj.weight": (inter, hidden),
        "mlp.up_proj.weight": (inter, hidden),
        "mlp.down_proj.weight": (hidden, inter),
    }
    if fam.qk_norm:
        layer.update({"self_attn.q_norm.weight": (hd,), "self_attn.k_norm.weight": (hd,)})
    if fam.qkv_bias:
        layer.update({"self_attn.q_proj.bias": (cfg.q_width,), "self_attn.k_proj.bias": (cfg.kv_width,),
                      "self_attn.v_proj.bias": (cfg.kv_width,)})
    if fam.o_bias:
        layer["self_attn.o_proj.bias"] = (hidden,)
    if fam.sinks:
        layer["self_attn.sinks"] = (cfg.num_attention_heads,)
    if fam.sandwich_norms:
        layer.update({"pre_feedforward_layernorm.weight": (hidden,),
                      "post_feedforward_layernorm.weight": (hidden,)})
    sparse = {k: v for k, v in layer.items() if not k.startswith("mlp.")}
    if cfg.experts is not None:
        n, inter = cfg.experts.count, cfg.experts.intermediate_size
        sparse.update({"mlp.gate.weight": (n, hidden),
                       "mlp.experts.gate_proj.weight": (n * inter, hidden),
                       "mlp.experts.up_proj.weight": (n * inter, hidden),
                       "mlp.experts.down_proj.weight": (n * hidden, inter)})
        if cfg.experts.bias:
            sparse.update({"mlp.gate.bias": (n,), "mlp.experts.gate_proj.bias": (n, inter),
                           "mlp.experts.up_proj.bias": (n, inter), "mlp.experts.down_proj.bias": (n, hidden)})
    for i in range(cfg.num_hidden_layers):
        block = sparse if cfg.sparse(i) else layer
        shapes.update({f"model.layers.{i}.{name}": shape for name, shape in block.items()})
    return shapes


def check_weights(cfg: ModelConfig, tensors: dict) -> None:
    """Every tensor present with the shape the config implies, or a one-line error naming the
    first that is not: a mismatch would otherwise surface as a broadcast error mid-forward."""
    expected = expected_shapes(cfg)
    for name, shape in expected.items():
        if name not in tensors:
            missing = sum(n not in tensors for n in expected)
            raise InfernoError(f"weights do not match the config: {missing} tensors missing "
                               f"(first: {name})")
        if tuple(tensors[name].shape) != shape:
            moe = cfg.experts
            why = (f" (the file's metadata or config.json says {moe.count} experts of "
                   f"{moe.intermediate_size} features)" if ".mlp.gate." in name or ".experts." in name else "")
            raise InfernoError(f"weights do not match the config: {name} is "
                               f"{list(tensors[name].shape)}, the config implies {list(shape)}{why}")
