"""GGUF files (llama.cpp's format) as a Checkpoint: config, float32 tensors under Hugging Face
names, and a tokenizer, all from the one file.

    checkpoint = load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")

Quantised tensors (Q8_0, Q4_0, Q4_1, the K-quants, ...) are dequantised to float32 at load by
the `gguf` package, so the backends see the same thing a folder gives them. Two layout facts
from llama.cpp's converter are undone here: GGUF lists a tensor's dimensions innermost first
(numpy's order reversed), and `llama` files have their q/k rows permuted for llama.cpp's RoPE.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from inferno.errors import InfernoError
from inferno.model.config import ModelConfig, RopeScaling
from inferno.model.gguf_tokenizer import tokenizer_from_gguf
from inferno.model.loader import Checkpoint
from inferno.model.sampling import gguf_sampling

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
MAGIC = b"GGUF"

# GGUF tensor name -> Hugging Face name, the one rename table; `{i}` is the layer index.
TENSOR_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.attn_q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
    "blk.{i}.attn_k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
    "blk.{i}.attn_q.bias": "model.layers.{i}.self_attn.q_proj.bias",
    "blk.{i}.attn_k.bias": "model.layers.{i}.self_attn.k_proj.bias",
    "blk.{i}.attn_v.bias": "model.layers.{i}.self_attn.v_proj.bias",
}
# Gemma's four norms a block: llama.cpp's ffn_norm is its pre-feedforward norm, and Hugging Face's
# post_attention_layernorm is the norm of the attention output.
GEMMA3_NAMES = {
    **TENSOR_NAMES,
    "blk.{i}.post_attention_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.pre_feedforward_layernorm.weight",
    "blk.{i}.post_ffw_norm.weight": "model.layers.{i}.post_feedforward_layernorm.weight",
}
# Tensors that configure rather than compute: read into the config.
CONFIG_TENSORS = ("rope_freqs.weight",)
GEMMA3_SWA_PATTERN = 6  # llama.cpp's: every sixth Gemma 3 layer is global (not in the file)
GEMMA3_LOCAL_ROPE_BASE = 10000.0  # llama.cpp's rope_freq_base_train_swa for Gemma 3
_BLOCK = re.compile(r"blk\.(\d+)\.")


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """The Hugging Face name of a GGUF tensor, or None when the table has no entry."""
    m = _BLOCK.match(gguf_name)
    key = _BLOCK.sub("blk.{i}.", gguf_name, count=1) if m else gguf_name
    name = (GEMMA3_NAMES if arch == "gemma3" else TENSOR_NAMES).get(key)
    return name.format(i=m.group(1)) if name and m else name


def load_gguf(path: str | Path, progress=None) -> Checkpoint:
    """Read a .gguf file into a Checkpoint. `progress` wraps the tensor loop (a tqdm factory)."""
    path = Path(path)
    reader = open_reader(path)
    meta = metadata(reader, path)
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise InfernoError(f"{path.name}: unsupported GGUF architecture {arch!r}; inferno runs "
                           f"{', '.join(ARCHITECTURES[:-1])} and {ARCHITECTURES[-1]} GGUF files "
                           f"(e.g. SmolLM2, Llama 3, Qwen2.5, Qwen3, Gemma 3)")
    infos = {t.name: t for t in reader.tensors}
    _check_tensors(path, arch, infos)
    tokenizer = tokenizer_from_gguf(meta, path.name)
    rope_freqs = dequantize(infos["rope_freqs.weight"], path) if "rope_freqs.weight" in infos else None
    config = config_from_gguf(meta, arch, infos, tokenizer, path.name, rope_freqs)
    tensors = {}
    items = [(n, i) for n, i in infos.items() if n not in CONFIG_TENSORS]
    for name, info in progress(items, desc="dequantising", unit="tensor") if progress else items:
        w = dequantize(info, path)
        if arch == "llama" and name.endswith((".attn_q.weight", ".attn_k.weight")):
            heads = config.num_attention_heads if ".attn_q." in name else config.num_key_value_heads
            w = unpermute_qk(w, heads)
        if config.family.norm_plus_one and name.endswith("norm.weight"):
            # llama.cpp's converter stores Gemma's norms as 1 + w; the model folds the 1 in
            # itself, as it does for a Hugging Face folder.
            w = w - np.float32(1.0)
        tensors[hf_name(name, arch)] = w
    return Checkpoint(config, tensors, tokenizer, source=str(path), file_format="gguf",
                      sampling=[("the GGUF's general.sampling", gguf_sampling(meta))],
                      metadata={k: v for k, v in meta.items() if not k.startswith("tokenizer.ggml.")})


def open_reader(path: Path):
    """A GGUFReader over `path`, with a truncated or foreign file turned into a one-line error."""
    from gguf import GGUFReader

    if not path.is_file():
        raise InfernoError(f"GGUF file {path} not found")
    with open(path, "rb") as f:
        if f.read(4) != MAGIC:
            raise InfernoError(f"{path}: not a GGUF file (it does not start with 'GGUF')")
    try:
        return GGUFReader(path)
    except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError) as e:
        raise InfernoError(f"{path}: truncated or corrupt GGUF file ({_one_line(e)}); download it again") from None


def metadata(reader, path: Path) -> dict:
    """Every key-value field as a plain Python value (strings, numbers, lists)."""
    try:
        return {name: field.contents() for name, field in reader.fields.items()}
    except (ValueError, IndexError, UnicodeDecodeError) as e:
        raise InfernoError(f"{path}: corrupt GGUF metadata ({_one_line(e)}); download it again") from None


def dequantize(info, path: Path) -> np.ndarray:
    """One tensor as a float32 numpy array in Hugging Face's `[out, in]` order."""
    from gguf.quants import dequantize as gguf_dequantize

    # GGUF lists dimensions innermost first: ne = [in, out] for a linear weight.
    shape = tuple(int(d) for d in reversed(info.shape))
    try:
        w = gguf_dequantize(info.data, info.tensor_type)
    except NotImplementedError:
        raise InfernoError(f"{path.name}: tensor {info.name} has type {info.tensor_type.name}, "
                           f"which the gguf package cannot dequantise; {_types_hint()}") from None
    # np.array copies: F32 data would otherwise stay a view into the memory-mapped file.
    return np.array(w, dtype=np.float32).reshape(shape)


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation. Its converter turns Hugging Face's rotate-half rows
    (per head: all first halves, then all second halves) into interleaved pairs for its RoPE:
    w.reshape(heads, 2, hd/2, in).swapaxes(1, 2). This is the inverse."""
    rows, cols = w.shape  # [n_heads * hd, in]
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def config_from_gguf(meta: dict, arch: str, infos: dict, tokenizer, source: str,
                     rope_freqs: np.ndarray | None = None) -> ModelConfig:
    """The model config from `ARCH.*` metadata, with llama.cpp's own fallbacks (some of Gemma 3's
    are not in the file at all: llama.cpp hard-codes them, and so do we). `rope_freqs` is the
    rope_freqs.weight tensor of Llama 3.1-style files: a divisor per RoPE frequency."""
    def key(name, fallback=None):
        value = meta.get(f"{arch}.{name}", fallback)
        if value is None:
            raise InfernoError(f"{source}: GGUF metadata has no {arch}.{name}; the file is incomplete")
        return value

    hidden = int(key("embedding_length"))
    heads = int(key("attention.head_count"))
    head_dim = int(key("attention.key_length", hidden // heads))
    rot = int(key("rope.dimension_count", head_dim))
    if rot != head_dim:
        raise InfernoError(f"{source}: partial RoPE ({rot} of {head_dim} dims) is not supported")
    scaling_type = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling_type == "linear":
        scaling = RopeScaling(rope_type="linear", factor=_f32(key("rope.scaling.factor")))
    elif scaling_type == "none":
        scaling = RopeScaling()
    else:
        raise InfernoError(f"{source}: RoPE scaling {scaling_type!r} is not supported (supported: none, linear)")
    # GGUF lists the embedding as [hidden, vocab], innermost first; the rows are the vocabulary.
    vocab = int(infos["token_embd.weight"].shape[1])
    layers = int(key("block_count"))
    family = {}
    if arch == "gemma3":
        window = int(key("attention.sliding_window"))
        # llama.cpp: 1/sqrt(head_dim), except the 27B (62 layers): 1/sqrt(hidden / heads), which
        # is what Hugging Face's query_pre_attn_scalar says for each size.
        scalar = hidden / heads if layers == 62 else head_dim
        family = dict(
            activation="gelu_tanh", attention_scale=float(scalar) ** -0.5,
            layer_windows=tuple(0 if (i + 1) % GEMMA3_SWA_PATTERN == 0 else window
                                for i in range(layers)),
            rope_local_theta=GEMMA3_LOCAL_ROPE_BASE)
    if rope_freqs is not None:
        family["rope_freq_factors"] = tuple(float(f) for f in np.asarray(rope_freqs).reshape(-1))
    return ModelConfig(
        architecture=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=int(key("attention.head_count_kv", heads)),
        head_dim=head_dim,
        rms_norm_eps=_f32(key("attention.layer_norm_rms_epsilon")),
        rope_theta=_f32(key("rope.freq_base", 10000.0)),  # llama.cpp's default when absent
        max_position_embeddings=int(key("context_length")),
        tie_word_embeddings="output.weight" not in infos,
        rope_scaling=scaling,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=tuple(tokenizer.eos_ids),
        **family,
    )


def _f32(x) -> float:
    """A float32 metadata value as the decimal it was written from (1e-05, not 9.99999974e-06):
    the shortest text that reads back as the same float32."""
    return float(str(np.float32(x)))


def _check_tensors(path: Path, arch: str, infos: dict) -> None:
    """Fail fast, before any dequantising, on a tensor we do not know or cannot dequantise."""
    if "token_embd.weight" not in infos:
        raise InfernoError(f"{path.name}: no token_embd.weight tensor; the file is incomplete")
    for name in infos:
        if hf_name(name, arch) is None and name not in CONFIG_TENSORS:
            raise InfernoError(f"{path.name}: tensor {name} is not part of a {arch} model inferno "
                               f"runs (biases, experts and vision towers are not supported)")
    for qtype in {info.tensor_type for info in infos.values()}:
        if not _can_dequantize(qtype):
            bad = next(n for n, i in infos.items() if i.tensor_type == qtype)
            raise InfernoError(f"{path.name}: unsupported GGUF tensor type {qtype.name} "
                               f"(tensor {bad}); {_types_hint()}")


def _can_dequantize(qtype) -> bool:
    from gguf import GGML_QUANT_SIZES
    from gguf.quants import dequantize as gguf_dequantize

    _, type_size = GGML_QUANT_SIZES[qtype]  # bytes per block: dequantise one zero block
    try:
        gguf_dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _types_hint() -> str:
    return ("inferno reads what the gguf package dequantises: F32, F16, BF16, Q8_0, Q4_0, Q4_1, "
            "Q5_0, Q5_1, the K-quants and the IQ types")
