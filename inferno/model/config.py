"""Model configuration: one frozen dataclass, built from config.json or GGUF metadata.

Nothing here relies on a default for a number that changes the math (head_dim, rope_theta, eps,
tied embeddings): each comes from the file or the file's own documented fallback.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from inferno.errors import InfernoError

# Hugging Face class name -> our architecture name. Qwen3 and Llama share one forward pass;
# Qwen3 adds per-head RMSNorm on q and k (q_norm/k_norm).
ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "LlamaForCausalLM": "llama",
}
MODEL_TYPES = {"qwen3": "qwen3", "llama": "llama"}
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling as transformers' `rope_parameters` describes it."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # "qwen3" or "llama"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qk_norm: bool  # Qwen3: RMSNorm over each head of q and k before RoPE
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        positive = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads", "head_dim",
                    "max_position_embeddings")
        for name in positive:
            if getattr(self, name) <= 0:
                raise InfernoError(f"model config: {name} must be positive, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise InfernoError(
                f"model config: num_attention_heads ({self.num_attention_heads}) must be a multiple "
                f"of num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise InfernoError(f"model config: head_dim must be even for RoPE, got {self.head_dim}")
        if self.rope_scaling.rope_type not in ROPE_TYPES:
            raise InfernoError(f"model config: rope type {self.rope_scaling.rope_type!r} is not "
                               f"supported (supported: {', '.join(ROPE_TYPES)})")

    @property
    def q_width(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def inv_freq(self) -> np.ndarray:
        """RoPE inverse frequencies, [head_dim // 2] float64, with any scaling applied."""
        half = self.head_dim // 2
        inv = 1.0 / (self.rope_theta ** (np.arange(half, dtype=np.float64) * 2.0 / self.head_dim))
        rs = self.rope_scaling
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
        for flag in ("attention_bias", "mlp_bias"):
            if cfg.get(flag):
                raise InfernoError(f"model config: {flag}=true is not supported by inferno's {arch} forward pass")
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            head_dim = cfg.get("head_dim") or hidden // heads
            rope_params = cfg.get("rope_parameters") or {}
            rope_theta = cfg.get("rope_theta", rope_params.get("rope_theta"))
            if rope_theta is None:
                raise KeyError("rope_theta")
            scaling = _rope_scaling(cfg.get("rope_scaling") or rope_params)
            return cls(
                architecture=arch,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_hidden_layers=int(cfg["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(head_dim),
                rms_norm_eps=float(cfg["rms_norm_eps"]),
                rope_theta=float(rope_theta),
                max_position_embeddings=int(cfg["max_position_embeddings"]),
                # Absent from config.json: LlamaConfig and Qwen3Config default to untied, and
                # the weights settle it (no lm_head.weight means the embedding is the head).
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings",
                                                 has_lm_head is False)),
                qk_norm=(arch == "qwen3"),
                rope_scaling=scaling,
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=_unique(_ids(cfg.get("eos_token_id")) + _ids(extra_eos)),
            )
        except KeyError as e:
            raise InfernoError(f"model config: config.json has no {e.args[0]!r} field") from None


def _architecture(cfg: dict) -> str:
    names = cfg.get("architectures") or []
    for name in names:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    if not names and cfg.get("model_type") in MODEL_TYPES:
        return MODEL_TYPES[cfg["model_type"]]
    got = ", ".join(names) or cfg.get("model_type") or "none given"
    raise InfernoError(f"unsupported architecture {got}: inferno runs "
                       f"{', '.join(ARCHITECTURES)} (Qwen3 and Llama-family models such as SmolLM2)")


def _rope_scaling(params: dict) -> RopeScaling:
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type == "default":
        return RopeScaling()
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    return RopeScaling(rope_type=rope_type, **{k: params[k] for k in keys if k in params})


def _ids(value) -> tuple:
    """An eos_token_id field as a tuple: JSON spells it as one id, a list of ids or null."""
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def _unique(ids: tuple) -> tuple[int, ...]:
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))
