"""The forward pass of Qwen3 and Llama-family decoders, written against `ops` only.

    x = embed(tokens)
    for each layer:
        x = x + attention(rms_norm(x))      # q_norm/k_norm on each head for Qwen3, RoPE, GQA
        x = x + mlp(rms_norm(x))            # SwiGLU
    logits = lm_head(rms_norm(x))

Weights keep their Hugging Face names and `[out, in]` layout. Every tensor operation goes through
the backend, so the same code runs on numpy, Numba, a thread pool or a GPU, and the tracing
backend sees every call.
"""

from __future__ import annotations

import numpy as np

from inferno.errors import InfernoError
from inferno.model.config import ModelConfig
from inferno.model.kv_cache import KVCache


class Layer:
    """One decoder block's weights, as backend tensors."""

    def __init__(self, ops, cfg: ModelConfig, tensors: dict, i: int):
        p = f"model.layers.{i}."
        w = lambda name: ops.weight(tensors.pop(p + name))  # noqa: E731  [out, in] linear weight
        v = lambda name: ops.from_numpy(tensors.pop(p + name))  # noqa: E731  norm vector
        self.input_norm = v("input_layernorm.weight")  # [hidden]
        self.q_proj = w("self_attn.q_proj.weight")  # [n_heads * hd, hidden]
        self.k_proj = w("self_attn.k_proj.weight")  # [n_kv * hd, hidden]
        self.v_proj = w("self_attn.v_proj.weight")  # [n_kv * hd, hidden]
        self.o_proj = w("self_attn.o_proj.weight")  # [hidden, n_heads * hd]
        if cfg.qk_norm:
            self.q_norm = v("self_attn.q_norm.weight")  # [hd]
            self.k_norm = v("self_attn.k_norm.weight")  # [hd]
        self.post_norm = v("post_attention_layernorm.weight")  # [hidden]
        self.gate_proj = w("mlp.gate_proj.weight")  # [intermediate, hidden]
        self.up_proj = w("mlp.up_proj.weight")  # [intermediate, hidden]
        self.down_proj = w("mlp.down_proj.weight")  # [hidden, intermediate]


class Qwen3Model:
    def __init__(self, cfg: ModelConfig, tensors: dict[str, np.ndarray], ops, flash: bool = True):
        """Takes ownership of `tensors` (HF names, float32 numpy): each is handed to the backend
        and dropped, so host copies do not outlive their conversion."""
        self.cfg, self.ops, self.flash = cfg, ops, flash
        tensors = dict(tensors)
        check_weights(cfg, tensors)
        embed = tensors.pop("model.embed_tokens.weight")  # [vocab, hidden]
        lm_head = embed if cfg.tie_word_embeddings else tensors.pop("lm_head.weight")
        self.embed_tokens = ops.from_numpy(embed)
        self.lm_head = ops.weight(lm_head)  # [vocab, hidden]
        self.layers = [Layer(ops, cfg, tensors, i) for i in range(cfg.num_hidden_layers)]
        self.norm = ops.from_numpy(tensors.pop("model.norm.weight"))
        self.inv_freq = cfg.inv_freq()  # [hd / 2]

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(self.ops, self.cfg.num_hidden_layers, capacity, self.cfg.kv_width)

    def forward(self, token_ids, cache: KVCache | None = None, last_only: bool = False):
        """Logits for `token_ids`, [n, vocab] (or [1, vocab] with `last_only`), as a backend tensor.

        Without a cache this is one uncached pass over the whole sequence. With one, the tokens
        continue the cached sequence at position cache.length, and their K/V are appended.
        """
        ops, cfg = self.ops, self.cfg
        ids = np.asarray(token_ids, dtype=np.int64)
        n = ids.shape[0]
        start = cache.length if cache is not None else 0
        if cache is not None and start + n > cache.capacity:
            raise InfernoError(f"KV cache full: {start} + {n} tokens exceed its {cache.capacity} positions")
        cos, sin = ops.rope_tables(np.arange(start, start + n), self.inv_freq)  # [n, hd / 2]
        x = ops.embedding(self.embed_tokens, ids)  # [n, hidden]
        for i, layer in enumerate(self.layers):
            h = ops.rms_norm(x, layer.input_norm, cfg.rms_norm_eps)
            x = ops.add(x, self.attention(layer, i, h, cos, sin, cache, start))
            h = ops.rms_norm(x, layer.post_norm, cfg.rms_norm_eps)
            x = ops.add(x, self.mlp(layer, h))
        if cache is not None:
            cache.length = start + n
        if last_only:
            x = ops.rows(x, n - 1, n)  # [1, hidden]: generation needs only the last position
        x = ops.rms_norm(x, self.norm, cfg.rms_norm_eps)
        return ops.linear(x, self.lm_head)  # [n or 1, vocab]

    def attention(self, layer: Layer, i: int, h, cos, sin, cache: KVCache | None, start: int):
        ops, cfg = self.ops, self.cfg
        hd, nh, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        q = ops.linear(h, layer.q_proj)  # [n, nh * hd]
        k = ops.linear(h, layer.k_proj)  # [n, nkv * hd]
        v = ops.linear(h, layer.v_proj)  # [n, nkv * hd]
        if cfg.qk_norm:
            q = ops.rms_norm(q, layer.q_norm, cfg.rms_norm_eps)  # per head: len(q_norm) == hd
            k = ops.rms_norm(k, layer.k_norm, cfg.rms_norm_eps)
        q = ops.apply_rope(q, cos, sin, hd)
        k = ops.apply_rope(k, cos, sin, hd)
        n = q.shape[0]
        if cache is not None:
            ops.write_rows(cache.k[i], k, start)
            ops.write_rows(cache.v[i], v, start)
            if n == 1:
                # Decode: the new token against everything cached, read in place.
                ctx = ops.fused_attention(q, cache.k[i], cache.v[i], start + n, nh, nkv, hd)
                return ops.linear(ctx, layer.o_proj)
            if start > 0:
                # A chunk after a cache: attend over all cached rows; the causal diagonal is
                # bottom-right aligned, so row j sees keys 0..start + j.
                k = ops.rows(cache.k[i], 0, start + n)  # [start + n, nkv * hd]
                v = ops.rows(cache.v[i], 0, start + n)
        attend = ops.flash_attention_prefill if self.flash else ops.materialized_attention
        ctx = attend(q, k, v, nh, nkv, hd, True)  # [n, nh * hd]
        return ops.linear(ctx, layer.o_proj)

    def mlp(self, layer: Layer, h):
        ops = self.ops
        gate = ops.linear(h, layer.gate_proj)  # [n, intermediate]
        up = ops.linear(h, layer.up_proj)  # [n, intermediate]
        return ops.linear(ops.silu_mul(gate, up), layer.down_proj)  # [n, hidden]


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the forward pass reads, by Hugging Face name, with its shape."""
    hidden, inter, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
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
    if cfg.qk_norm:
        layer.update({"self_attn.q_norm.weight": (hd,), "self_attn.k_norm.weight": (hd,)})
    for i in range(cfg.num_hidden_layers):
        shapes.update({f"model.layers.{i}.{name}": shape for name, shape in layer.items()})
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
            raise InfernoError(f"weights do not match the config: {name} is "
                               f"{list(tensors[name].shape)}, the config implies {list(shape)}")
