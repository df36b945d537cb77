"""Model configuration: one frozen dataclass, built from config.json or GGUF metadata.

Nothing here relies on a default for a number that changes the math (head_dim, rope_theta, eps,
tied embeddings): each comes from the file or the file's own documented fallback.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from inferno.errors import InfernoError

# Hugging Face class name (or model_type) -> our architecture name. One forward pass serves them
# all; what differs between them is a Family, below.
ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",  # its text model; the vision tower is not read
    # Mixtures of experts: the same attention, an expert MLP (config.Experts) in sparse layers.
    "Qwen3MoeForCausalLM": "qwen3",
    "MixtralForCausalLM": "llama",
    # The same models without their head, as sentence-transformers saves an embedding model
    # (Qwen3-Embedding): its weights lack the "model." prefix and lm_head (the head is tied).
    "Qwen3Model": "qwen3", "LlamaModel": "llama", "Qwen2Model": "qwen2", "Gemma3TextModel": "gemma3",
    "Qwen3MoeModel": "qwen3", "MixtralModel": "llama",
    "GptOssForCausalLM": "gpt_oss", "GptOssModel": "gpt_oss",
}
MODEL_TYPES = {"qwen3": "qwen3", "llama": "llama", "qwen2": "qwen2", "gemma3_text": "gemma3",
               "gemma3": "gemma3", "qwen3_moe": "qwen3", "mixtral": "llama", "gpt_oss": "gpt_oss"}
ROPE_TYPES = ("default", "linear", "llama3", "yarn")
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


@dataclass(frozen=True)
class Family:
    """The nameable ways a family's decoder block differs from Llama's."""

    qk_norm: bool = False  # RMSNorm over each head of q and k before RoPE (Qwen3, Gemma 3)
    qkv_bias: bool = False  # biases on the q/k/v projections (Qwen2, gpt-oss)
    o_bias: bool = False  # a bias on the attention's output projection (gpt-oss)
    sinks: bool = False  # a learned logit per head in every softmax row (gpt-oss: base.py's sinks)
    sandwich_norms: bool = False  # also norm the attention and MLP outputs (Gemma 3)
    norm_plus_one: bool = False  # RMSNorm scales by (1 + w) (Gemma): a folder's w gets the 1 at
    # load; a GGUF stores it folded already
    scaled_embedding: bool = False  # embeddings times sqrt(hidden_size) (Gemma)


FAMILIES = {
    "llama": Family(),
    "qwen2": Family(qkv_bias=True),
    "qwen3": Family(qk_norm=True),
    "gemma3": Family(qk_norm=True, sandwich_norms=True, norm_plus_one=True, scaled_embedding=True),
    "gpt_oss": Family(qkv_bias=True, o_bias=True, sinks=True),
}
# Gemma3TextConfig's defaults, for a multimodal gemma3 config.json whose text_config leaves
# them out (transformers fills them in the same way).
GEMMA3_TEXT_DEFAULTS = dict(vocab_size=262208, head_dim=256, rms_norm_eps=1e-6, rope_theta=1e6,
                            rope_local_base_freq=1e4, query_pre_attn_scalar=256,
                            sliding_window=4096, sliding_window_pattern=6,
                            hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131072)


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling as transformers' `rope_parameters` describes it."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # YaRN's: the ramp between interpolated and kept frequencies spans the dimensions that turn
    # between beta_fast and beta_slow times over the original context (`truncate` rounds those
    # dimensions outwards); attention_factor multiplies cos and sin (None: 0.1 ln(factor) + 1).
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float | None = None


@dataclass(frozen=True)
class Experts:
    """A mixture-of-experts MLP: a router scores `count` experts per token, the `top_k` best
    run (each a SwiGLU of `intermediate_size`), and their outputs add up weighted by the
    router's softmax, taken over all experts (renormalised over the chosen when `norm_topk`:
    Mixtral's softmax over the top-k logits is the same thing). `layers` are the layers with
    experts; the others keep the dense MLP (Qwen3-MoE's mlp_only_layers)."""

    count: int
    top_k: int
    intermediate_size: int
    norm_topk: bool
    layers: tuple[int, ...]
    # gpt-oss: biases on the router and on each expert's three matrices, and its clamped SwiGLU,
    # (up + 1) * g * sigmoid(alpha * g) with g = min(gate, limit) and up within +-limit
    # (base.Backend.moe's `clamp`). None: SiLU(gate) * up.
    bias: bool = False
    clamp: tuple[float, float] | None = None  # (alpha, limit)

    def check(self, n_layers: int) -> None:
        if self.count < 1 or self.intermediate_size < 1:
            raise InfernoError(f"model config: {self.count} experts of {self.intermediate_size} "
                               f"features; an expert MLP needs at least one of at least one")
        if not 1 <= self.top_k <= self.count:
            raise InfernoError(f"model config: {self.top_k} experts per token (top-k) with "
                               f"{self.count} experts; top-k must be between 1 and the expert count")
        if any(not 0 <= i < n_layers for i in self.layers):
            raise InfernoError(f"model config: expert layers {list(self.layers)} outside the "
                               f"model's {n_layers} layers")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # a key of FAMILIES
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float  # the RoPE base of global layers
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    activation: str = "silu"  # the gated MLP's: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    attention_scale: float | None = None  # scores x this; None: 1/sqrt(head_dim)
    # Sliding-window attention: layer_windows[i] is layer i's window in keys, 0 for a global
    # layer; () when every layer is global. Windowed layers take their RoPE base from
    # rope_local_theta, unscaled, where it is given (Gemma 3's local layers); otherwise the
    # global layers' frequencies, scaling included (gpt-oss's YaRN on every layer).
    layer_windows: tuple[int, ...] = ()
    rope_local_theta: float | None = None
    # Llama 3.1 GGUFs store their RoPE scaling as a factor per frequency (rope_freqs.weight).
    rope_freq_factors: tuple[float, ...] | None = None
    experts: Experts | None = None  # a mixture of experts; None: every MLP dense
    # Every position sees the whole input, later ones too (EmbeddingGemma: Gemma 3 trained for
    # embeddings with `use_bidirectional_attention`); a window is then |p - j| < window. Such a
    # model embeds a text in one pass and generates nothing.
    bidirectional: bool = False

    def __post_init__(self):
        positive = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads", "head_dim",
                    "max_position_embeddings")
        for name in positive:
            if getattr(self, name) <= 0:
                raise InfernoError(f"model config: {name} must be positive, got {getattr(self, name)}")
        if self.architecture not in FAMILIES:
            raise InfernoError(f"model config: unknown architecture {self.architecture!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise InfernoError(
                f"model config: num_attention_heads ({self.num_attention_heads}) must be a multiple "
                f"of num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise InfernoError(f"model config: head_dim must be even for RoPE, got {self.head_dim}")
        if self.rope_scaling.rope_type not in ROPE_TYPES:
            raise InfernoError(f"model config: rope type {self.rope_scaling.rope_type!r} is not "
                               f"supported (supported: {', '.join(ROPE_TYPES)})")
        if self.activation not in ACTIVATIONS.values():
            raise InfernoError(f"model config: activation {self.activation!r} is not supported "
                               f"(supported: silu, gelu_pytorch_tanh)")
        if self.layer_windows and (len(self.layer_windows) != self.num_hidden_layers
                                   or min(self.layer_windows) < 0):
            raise InfernoError(f"model config: layer windows {self.layer_windows} do not give "
                               f"each of {self.num_hidden_layers} layers a window of 0 or more")
        if self.rope_freq_factors is not None and len(self.rope_freq_factors) != self.head_dim // 2:
            raise InfernoError(f"model config: {len(self.rope_freq_factors)} RoPE frequency factors "
                               f"for head_dim {self.head_dim} (expected {self.head_dim // 2})")
        if self.experts is not None:
            self.experts.check(self.num_hidden_layers)

    @property
    def rope_attention_factor(self) -> float:
        """What YaRN multiplies cos and sin by (1 for every other RoPE): the scores then grow by
        its square, which is how the decoder applies it (Attention's scale)."""
        rs = self.rope_scaling
        if rs.rope_type != "yarn":
            return 1.0
        return float(rs.attention_factor) if rs.attention_factor is not None else yarn_mscale(rs.factor)

    @property
    def family(self) -> Family:
        return FAMILIES[self.architecture]

    @property
    def qk_norm(self) -> bool:
        return self.family.qk_norm

    @property
    def q_width(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def sparse(self, layer: int) -> bool:
        """Whether layer `layer`'s MLP is a mixture of experts."""
        return self.experts is not None and layer in self.experts.layers

    def window(self, layer: int) -> int:
        """Layer `layer`'s sliding window in keys; 0 for global attention."""
        return self.layer_windows[layer] if self.layer_windows else 0

    def inv_freq(self, local: bool = False) -> np.ndarray:
        """RoPE inverse frequencies, [head_dim // 2] float64: the global layers' with any scaling
        applied, or (`local`) the sliding-window layers' plain ones where they have their own
        base (the global ones where not)."""
        if local and self.rope_local_theta is None:
            local = False
        half = self.head_dim // 2
        theta = self.rope_local_theta if local else self.rope_theta
        inv = 1.0 / (theta ** (np.arange(half, dtype=np.float64) * 2.0 / self.head_dim))
        if local:
            return inv
        if self.rope_freq_factors is not None:
            return inv / np.asarray(self.rope_freq_factors, dtype=np.float64)
        rs = self.rope_scaling
        if rs.rope_type == "yarn":
            return yarn_inv_freq(inv, rs, self.head_dim, self.rope_theta)
        if rs.rope_type == "linear":
            inv = inv / rs.factor
        elif rs.rope_type == "llama3":
            # Llama 3.1's scheme: long wavelengths slowed by `factor`, short ones kept,
            # a smooth blend between the two thresholds.
            low_wavelen = rs.original_max_position_embeddings / rs.low_freq_factor
            high_wavelen = rs.original_max_position_embeddings / rs.high_freq_factor
            wavelen = 2 * math.pi / inv
            smooth = ((rs.original_max_position_embeddings / wavelen - rs.low_freq_factor)
                      / (rs.high_freq_factor - rs.low_freq_factor))
            blended = (1 - smooth) * inv / rs.factor + smooth * inv
            inv = np.where(wavelen > low_wavelen, inv / rs.factor,
                           np.where(wavelen < high_wavelen, inv, blended))
        return inv

    @classmethod
    def from_hf(cls, cfg: dict, extra_eos: int | list[int] | tuple[int, ...] | None = (),
                has_lm_head: bool | None = None) -> "ModelConfig":
        """Build from a Hugging Face config.json dict (transformers 4.x and 5.x spellings).
        `extra_eos` is another eos_token_id field (generation_config.json's: an id, a list or
        None). `has_lm_head` (whether the weights hold lm_head.weight) decides tying when
        config.json does not say."""
        arch = _architecture(cfg)
        top = cfg
        if "text_config" in cfg:  # a multimodal config: the text model's fields
            cfg = {**GEMMA3_TEXT_DEFAULTS, **cfg["text_config"]}
        for flag in ("attention_bias", "mlp_bias", "final_logit_softcapping", "attn_logit_softcapping"):
            if cfg.get(flag) and not (flag == "attention_bias" and FAMILIES[arch].o_bias):
                raise InfernoError(f"model config: {flag}={cfg[flag]} is not supported by inferno's "
                                   f"{arch} forward pass")
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            head_dim = cfg.get("head_dim") or hidden // heads
            layers = int(cfg["num_hidden_layers"])
            # transformers 5 keeps RoPE parameters per layer type when they differ.
            rope_params = cfg.get("rope_parameters") or {}
            global_rope = rope_params.get("full_attention", rope_params)
            local_rope = rope_params.get("sliding_attention", {})
            rope_theta = cfg.get("rope_theta", global_rope.get("rope_theta"))
            if rope_theta is None:
                raise KeyError("rope_theta")
            act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
            if act not in ACTIVATIONS:
                raise InfernoError(f"model config: activation {act!r} is not supported "
                                   f"(supported: {', '.join(ACTIVATIONS)})")
            scale = cfg.get("query_pre_attn_scalar")
            return cls(
                architecture=arch,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_hidden_layers=layers,
                num_attention_heads=heads,
                num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(head_dim),
                rms_norm_eps=float(cfg["rms_norm_eps"]),
                rope_theta=float(rope_theta),
                max_position_embeddings=int(cfg["max_position_embeddings"]),
                # Absent from config.json: LlamaConfig and Qwen3Config default to untied, and
                # the weights settle it (no lm_head.weight means the embedding is the head).
                # A base model without a head (embeddings) reads the embedding as its head.
                tie_word_embeddings=_headless(top, has_lm_head) or bool(top.get(
                    "tie_word_embeddings", cfg.get("tie_word_embeddings", has_lm_head is False))),
                rope_scaling=_rope_scaling(cfg.get("rope_scaling") or global_rope),
                bos_token_id=cfg.get("bos_token_id", top.get("bos_token_id")),
                eos_token_ids=_unique(_ids(top.get("eos_token_id")) + _ids(cfg.get("eos_token_id"))
                                      + _ids(extra_eos)),
                activation=ACTIVATIONS[act],
                attention_scale=float(scale) ** -0.5 if scale else None,
                layer_windows=_layer_windows(cfg, arch, layers),
                bidirectional=bool(cfg.get("use_bidirectional_attention")),
                rope_local_theta=_float_or_none(cfg.get("rope_local_base_freq",
                                                        local_rope.get("rope_theta"))),
                experts=_experts(cfg, layers),
            )
        except KeyError as e:
            raise InfernoError(f"model config: config.json has no {e.args[0]!r} field") from None


def yarn_mscale(factor: float) -> float:
    """YaRN's default factor on cos and sin for a context stretched `factor` times: 0.1 ln(factor)
    + 1 (transformers' yarn_get_mscale, llama.cpp's rope_yarn)."""
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


def yarn_inv_freq(inv: np.ndarray, rs: RopeScaling, head_dim: int, theta: float) -> np.ndarray:
    """YaRN's frequencies (transformers' _compute_yarn_parameters): the fast-turning dimensions
    kept, the slow ones divided by `factor`, a linear ramp between the dimensions that turn
    beta_fast and beta_slow times over the original context."""
    def dim_of(turns):  # the dimension that turns `turns` times over the original context
        return (head_dim * math.log(rs.original_max_position_embeddings / (turns * 2 * math.pi))
                / (2 * math.log(theta)))
    low, high = dim_of(rs.beta_fast), dim_of(rs.beta_slow)
    if rs.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    kept = 1 - ramp  # 1: the dimension's frequency extrapolated (kept), 0: interpolated
    return inv / rs.factor * (1 - kept) + inv * kept


def _layer_windows(cfg: dict, arch: str, layers: int) -> tuple[int, ...]:
    """Each layer's sliding window (0: global) from `layer_types`, or from Gemma 3's older
    `sliding_window_pattern` (every n-th layer global)."""
    types = cfg.get("layer_types")
    if types is None and arch == "gemma3":
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                 for i in range(layers)]
    if not types or "sliding_attention" not in types:
        return ()
    window = cfg.get("sliding_window")
    if not window:
        raise InfernoError("model config: sliding_attention layers but no sliding_window size")
    unknown = set(types) - {"sliding_attention", "full_attention"}
    if unknown:
        raise InfernoError(f"model config: layer type {sorted(unknown)[0]!r} is not supported")
    if cfg.get("use_bidirectional_attention"):  # (config.json holds the window as trained)
        window = both_ways_window(int(window))
    return tuple(int(window) if t == "sliding_attention" else 0 for t in types)


def both_ways_window(trained: int) -> int:
    """The window of a model that attends both ways, as inferno counts it (|p - j| < window),
    from the one it was trained with: |p - j| <= trained // 2, as transformers' bidirectional
    Gemma 3 (its config's __post_init__) and llama.cpp's LLAMA_SWA_TYPE_SYMMETRIC keep it."""
    return trained // 2 + 1


def _experts(cfg: dict, layers: int) -> Experts | None:
    """The expert MLP of a Qwen3-MoE, Mixtral or gpt-oss config.json; None for a dense model.
    Qwen3-MoE: `num_experts` (transformers 5 writes `num_local_experts`), experts of
    `moe_intermediate_size`, `norm_topk_prob`, and dense layers where `mlp_only_layers` or
    `decoder_sparse_step` say. Mixtral: `num_local_experts` of `intermediate_size`, every layer,
    always renormalised (a softmax over the top-k logits)."""
    count = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
    if not count:
        return None
    if cfg.get("model_type") == "gpt_oss" or "GptOssForCausalLM" in (cfg.get("architectures") or ()):
        # A softmax over the top-k router logits (renormalised, as Mixtral's), biases, and the
        # clamped SwiGLU; experts in every layer.
        return Experts(int(count), int(cfg["num_experts_per_tok"]), int(cfg["intermediate_size"]),
                       True, tuple(range(layers)), bias=True,
                       clamp=(float(cfg.get("swiglu_alpha", 1.702)), float(cfg.get("swiglu_limit", 7.0))))
    mixtral = cfg.get("model_type") == "mixtral" or "MixtralForCausalLM" in (cfg.get("architectures") or ())
    if mixtral:
        return Experts(int(count), int(cfg["num_experts_per_tok"]), int(cfg["intermediate_size"]),
                       True, tuple(range(layers)))
    step = int(cfg.get("decoder_sparse_step") or 1)
    dense = set(cfg.get("mlp_only_layers") or ())
    return Experts(int(count), int(cfg["num_experts_per_tok"]), int(cfg["moe_intermediate_size"]),
                   bool(cfg.get("norm_topk_prob", False)),
                   tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0))


def _headless(cfg: dict, has_lm_head: bool | None) -> bool:
    return has_lm_head is False and any(not n.endswith(("ForCausalLM", "ForConditionalGeneration"))
                                        for n in cfg.get("architectures") or ())


def _float_or_none(x) -> float | None:
    return None if x is None else float(x)


def _architecture(cfg: dict) -> str:
    names = cfg.get("architectures") or []
    for name in names:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    if not names and cfg.get("model_type") in MODEL_TYPES:
        return MODEL_TYPES[cfg["model_type"]]
    got = ", ".join(names) or cfg.get("model_type") or "none given"
    raise InfernoError(f"unsupported architecture {got}: inferno runs "
                       f"{', '.join(ARCHITECTURES)} (Qwen3, Qwen3-MoE, Qwen2, Gemma 3, Mixtral, gpt-oss "
                       f"and Llama-family models such as SmolLM2)")


def _rope_scaling(params: dict) -> RopeScaling:
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type == "default":
        return RopeScaling()
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings",
            "beta_fast", "beta_slow", "truncate", "attention_factor")
    if rope_type == "yarn" and (params.get("mscale") or params.get("mscale_all_dim")):
        raise InfernoError("model config: YaRN with mscale/mscale_all_dim (DeepSeek's) is not supported")
    return RopeScaling(rope_type=rope_type, **{k: params[k] for k in keys if params.get(k) is not None})


def _ids(value) -> tuple:
    """An eos_token_id field as a tuple: JSON spells it as one id, a list of ids or null."""
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def _unique(ids: tuple) -> tuple[int, ...]:
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))
