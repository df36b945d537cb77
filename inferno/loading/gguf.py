"""GGUF files (llama.cpp's format) as a Checkpoint: config, weights under Hugging Face names,
and a tokenizer, all from the one file.

    checkpoint = load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")

Weights stay as stored: a matrix in a type the backends multiply in place (F16, BF16, Q8_0,
Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) is a QuantTensor over the memory-mapped file, an F32
one a read-only float32 view; nothing is copied or dequantised. Vectors (norms) become float32
copies; matrices of any other type are dequantised at load by the `gguf` package, with a notice.
Two layout facts from llama.cpp's converter are undone here: GGUF lists a tensor's dimensions
innermost first (numpy's order reversed), and `llama` files have their q/k rows permuted for
llama.cpp's RoPE (undone by reordering whole rows, so blocks move unchanged).
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from itertools import chain
from pathlib import Path

import numpy as np

from inferno.formats.cache_types import widen_bf16
from inferno.formats.quant import QTYPES, QuantTensor
from inferno.errors import InfernoError, one_line
from inferno.model.config import Experts, ModelConfig, RopeScaling, both_ways_window, yarn_mscale
from inferno.formats.gguf_file import GGUFFile, TensorInfo, read_gguf
from inferno.tokenizers.gguf_tokenizer import tokenizer_from_gguf
from inferno.loading.checkpoint import Checkpoint
from inferno.loading.pooling import EmbeddingSpec, spec_from_gguf
from inferno.sampling import gguf_sampling

ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "gemma-embedding", "gpt-oss")
# GGUF architecture -> the family whose forward pass it runs (config.FAMILIES); experts come
# from the metadata (expert_count), in llama files too (Mixtral). gemma-embedding is
# EmbeddingGemma: Gemma 3 attending both ways.
FAMILY_OF = {"qwen3moe": "qwen3", "gpt-oss": "gpt_oss", "gemma-embedding": "gemma3"}

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
    # Mixtures of experts: the router, and each expert matrix stacked, [n_expert, out, in]
    # (kept as [n_expert * out, in]: expert e is rows e * out .. (e + 1) * out, contiguous).
    "blk.{i}.ffn_gate_inp.weight": "model.layers.{i}.mlp.gate.weight",
    "blk.{i}.ffn_gate_exps.weight": "model.layers.{i}.mlp.experts.gate_proj.weight",
    "blk.{i}.ffn_up_exps.weight": "model.layers.{i}.mlp.experts.up_proj.weight",
    "blk.{i}.ffn_down_exps.weight": "model.layers.{i}.mlp.experts.down_proj.weight",
}
STACKED = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
# Gemma's four norms a block: llama.cpp's ffn_norm is its pre-feedforward norm, and Hugging Face's
# post_attention_layernorm is the norm of the attention output.
GEMMA3_NAMES = {
    **TENSOR_NAMES,
    "blk.{i}.post_attention_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.pre_feedforward_layernorm.weight",
    "blk.{i}.post_ffw_norm.weight": "model.layers.{i}.post_feedforward_layernorm.weight",
}
# gpt-oss: llama.cpp's post_attention_norm is the norm before the MLP (Hugging Face's
# post_attention_layernorm, as in Llama); biases on the output projection, the router and every
# expert matrix ([n_expert, out] each); a sink logit per head.
GPT_OSS_NAMES = {
    **TENSOR_NAMES,
    "blk.{i}.post_attention_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_output.bias": "model.layers.{i}.self_attn.o_proj.bias",
    "blk.{i}.attn_sinks.weight": "model.layers.{i}.self_attn.sinks",
    "blk.{i}.ffn_gate_inp.bias": "model.layers.{i}.mlp.gate.bias",
    "blk.{i}.ffn_gate_exps.bias": "model.layers.{i}.mlp.experts.gate_proj.bias",
    "blk.{i}.ffn_up_exps.bias": "model.layers.{i}.mlp.experts.up_proj.bias",
    "blk.{i}.ffn_down_exps.bias": "model.layers.{i}.mlp.experts.down_proj.bias",
}
GPT_OSS_SWA_PATTERN = 2  # llama.cpp's: even layers windowed, odd ones global (not in the file)
GPT_OSS_CLAMP = (1.702, 7.0)  # llama.cpp's swiglu_oai: alpha and limit (not in the file)
NAMES_OF = {"gemma3": GEMMA3_NAMES, "gemma-embedding": GEMMA3_NAMES, "gpt-oss": GPT_OSS_NAMES}
# Tensors that configure rather than compute: read into the config.
CONFIG_TENSORS = ("rope_freqs.weight",)
# EmbeddingGemma's sentence-transformers Dense layers (2_Dense, 3_Dense: no bias, no activation),
# as llama.cpp's converter writes them with --sentence-transformers-dense-modules: read into the
# embedding spec, applied after the pooling.
DENSE_TENSORS = ("dense_2.weight", "dense_3.weight")
SIDE_TENSORS = (*CONFIG_TENSORS, *DENSE_TENSORS)  # in the file, not among the model's tensors
GEMMA3_SWA_PATTERN = 6  # llama.cpp's: every sixth Gemma 3 layer is global (where the file does not say)
GEMMA3_LOCAL_ROPE_BASE = 10000.0  # llama.cpp's rope_freq_base_train_swa for Gemma 3 (where not in the file)
_BLOCK = re.compile(r"blk\.(\d+)\.")


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """The Hugging Face name of a GGUF tensor, or None when the table has no entry."""
    m = _BLOCK.match(gguf_name)
    key = _BLOCK.sub("blk.{i}.", gguf_name, count=1) if m else gguf_name
    name = NAMES_OF.get(arch, TENSOR_NAMES).get(key)
    return name.format(i=m.group(1)) if name and m else name


def load_gguf(path: str | Path, progress=None) -> Checkpoint:
    """Read a .gguf file into a Checkpoint. `progress` wraps the loop over tensors that must be
    dequantised (a tqdm factory); the others are views and take no time."""
    path = Path(path)
    gf = read_gguf(path)
    meta = gf.metadata
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise InfernoError(f"{path.name}: unsupported GGUF architecture {arch!r:.80}; inferno runs "
                           f"{', '.join(ARCHITECTURES[:-1])} and {ARCHITECTURES[-1]} GGUF files "
                           f"(e.g. SmolLM2, Llama 3, Mixtral, Qwen2.5, Qwen3, Qwen3-MoE, Gemma 3, EmbeddingGemma, gpt-oss)")
    infos = gf.tensors
    _check_tensors(path, arch, infos)
    tokenizer = tokenizer_from_gguf(meta, path.name)
    freqs = infos.get("rope_freqs.weight")
    rope_freqs = tensor(gf, freqs) if freqs is not None else None
    try:
        config = config_from_gguf(meta, arch, infos, tokenizer, path.name, rope_freqs)
    except (TypeError, ValueError, ArithmeticError) as e:  # a string or list for a number, 0 heads
        raise InfernoError(f"{path.name}: GGUF metadata of the wrong type ({one_line(e)}); the "
                           f"file is corrupt") from None
    _check_layers(path, config, infos)

    # Matrices in other types are dequantised: the one slow part, under the progress bar.
    model_tensors = [i for i in infos.values() if i.name not in SIDE_TENSORS]
    dense = tuple(tensor(gf, infos[n]) for n in DENSE_TENSORS if n in infos)
    slow = [i for i in model_tensors if len(i.shape) >= 2 and not _kept_as_stored(i)]
    fast = [i for i in model_tensors if len(i.shape) < 2 or _kept_as_stored(i)]
    tensors = {}
    todo = chain(fast, progress(slow, desc="dequantising", unit="tensor") if progress and slow else slow)
    for info in todo:
        w = tensor(gf, info)
        if arch == "llama" and info.name.endswith((".attn_q.weight", ".attn_k.weight")):
            heads = config.num_attention_heads if ".attn_q." in info.name else config.num_key_value_heads
            w = unpermute_qk(w, heads, f"{path.name}: tensor {info.name}")
        tensors[hf_name(info.name, arch)] = w
    _notice_dequantised(path, slow)
    return Checkpoint(config, tensors, tokenizer, source=str(path), file_format="gguf",
                      sampling=[("the GGUF's general.sampling", gguf_sampling(meta))],
                      embedding=_embedding_spec(meta, arch, path.name, dense),
                      metadata={k: v for k, v in meta.items() if not k.startswith("tokenizer.ggml.")})


def _embedding_spec(meta: dict, arch: str, name: str, dense=()) -> EmbeddingSpec:
    try:
        return spec_from_gguf(meta, arch, dense)
    except InfernoError as e:
        raise InfernoError(f"{name}: {e}") from None


def tensor(gf: GGUFFile, info: TensorInfo) -> QuantTensor | np.ndarray:
    """One tensor in Hugging Face's order (`[out, in]` for a matrix; stacked experts
    `[n_expert * out, in]`), copied only if it must change: see the module's docstring."""
    shape = info.hf_shape
    if len(shape) == 3:  # [n_expert, out, in]: the experts' rows end to end, as stored
        shape = (shape[0] * shape[1], shape[2])
    raw = gf.raw(info)  # [nbytes]
    if len(shape) == 2 and info.type_name in QTYPES:
        return QuantTensor(info.type_name, shape, raw)
    if info.type_name == "F32":
        w = raw.view(np.float32).reshape(shape)
        return w if len(shape) == 2 else w.copy()
    return dequantize(raw, info, gf.path).reshape(shape)


def dequantize(raw: np.ndarray, info: TensorInfo, path: Path) -> np.ndarray:
    """A tensor's bytes as a flat float32 array (a copy)."""
    if info.type_name in _WIDEN:
        return raw.view(_WIDEN[info.type_name]).astype(np.float32)
    if info.type_name == "BF16":
        return widen_bf16(raw.view(np.uint16))
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    try:
        rows = raw.reshape(-1, info.row_bytes)  # [rows, row bytes]
        w = gguf_dequantize(rows, GGMLQuantizationType(info.type_id))
    except NotImplementedError:
        raise InfernoError(f"{path.name}: tensor {info.name} has type {info.type_name}, "
                           f"which the gguf package cannot dequantise; {_types_hint()}") from None
    return np.asarray(w, dtype=np.float32).reshape(-1)


def unpermute_qk(w: QuantTensor | np.ndarray, n_heads: int, what: str = "a q/k weight"):
    """Undo llama.cpp's q/k row permutation. Its converter turns Hugging Face's rotate-half rows
    (per head: all first halves, then all second halves) into interleaved pairs for its RoPE:
    w.reshape(heads, 2, hd/2, in).swapaxes(1, 2). This is the inverse, as a row order, so that a
    QuantTensor's rows of blocks move whole."""
    rows = w.shape[0]  # [n_heads * hd, in]
    if rows % (2 * n_heads):
        raise InfernoError(f"{what} has {rows} rows, not {n_heads} heads of an even size")
    order = np.arange(rows).reshape(n_heads, rows // n_heads // 2, 2).swapaxes(1, 2).reshape(rows)
    return w.take_rows(order) if isinstance(w, QuantTensor) else w[order]


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
    elif scaling_type == "yarn":
        # llama.cpp's YaRN: the ramp's ends always rounded outwards (ggml_rope_yarn_corr_dims:
        # truncate on, whatever the checkpoint said), cos and sin x (1 + 0.1 ln factor) times
        # attn_factor.
        attn = meta.get(f"{arch}.rope.scaling.attn_factor")
        scaling = RopeScaling(rope_type="yarn", factor=_f32(key("rope.scaling.factor")),
                              original_max_position_embeddings=int(key("rope.scaling.original_context_length")),
                              beta_fast=_f32(key("rope.scaling.yarn_beta_fast", 32.0)),
                              beta_slow=_f32(key("rope.scaling.yarn_beta_slow", 1.0)), truncate=True,
                              attention_factor=None if attn is None else _f32(attn) * yarn_mscale(
                                  _f32(key("rope.scaling.factor"))))
    elif scaling_type == "none":
        scaling = RopeScaling()
    else:
        raise InfernoError(f"{source}: RoPE scaling {scaling_type!r} is not supported (supported: none, "
                           f"linear, yarn)")
    # GGUF lists the embedding as [hidden, vocab], innermost first; the rows are the vocabulary.
    vocab = int(infos["token_embd.weight"].shape[1])
    layers = int(key("block_count"))
    family = {}
    if arch in ("gemma3", "gemma-embedding"):
        window = int(key("attention.sliding_window"))
        # llama.cpp: 1/sqrt(head_dim), except the 27B (62 layers): 1/sqrt(hidden / heads), which
        # is what Hugging Face's query_pre_attn_scalar says for each size.
        scalar = hidden / heads if layers == 62 and arch == "gemma3" else head_dim
        # the windowed layers: the file's pattern where it has one (llama.cpp's load_swa_pattern:
        # a flag a layer, or every n-th layer global), else every sixth global
        pattern = meta.get(f"{arch}.attention.sliding_window_pattern") or GEMMA3_SWA_PATTERN
        if isinstance(pattern, (list, tuple)):
            if len(pattern) != layers:
                raise InfernoError(f"{source}: {arch}.attention.sliding_window_pattern has {len(pattern)} "
                                   f"flags for {layers} layers; the file is corrupt")
            windowed = [bool(p) for p in pattern]
        else:
            windowed = [(i + 1) % int(pattern) != 0 for i in range(layers)]
        if arch == "gemma-embedding":
            window = both_ways_window(window)
        family = dict(
            activation="gelu_tanh", attention_scale=float(scalar) ** -0.5,
            layer_windows=tuple(window if w else 0 for w in windowed),
            rope_local_theta=_f32(meta.get(f"{arch}.rope.freq_base_swa", GEMMA3_LOCAL_ROPE_BASE)),
            bidirectional=arch == "gemma-embedding")
    if arch == "gpt-oss":
        window = int(key("attention.sliding_window"))
        family = dict(layer_windows=tuple(window if i % GPT_OSS_SWA_PATTERN == 0 else 0 for i in range(layers)))
    if rope_freqs is not None:
        family["rope_freq_factors"] = tuple(float(f) for f in np.asarray(rope_freqs).reshape(-1))
    if meta.get(f"{arch}.expert_count"):
        family["experts"] = experts_from_gguf(meta, arch, infos, layers, key)
    return ModelConfig(
        architecture=FAMILY_OF.get(arch, arch),
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


def experts_from_gguf(meta: dict, arch: str, infos: dict, layers: int, key) -> Experts:
    """The expert MLP as llama.cpp reads it: `expert_count` experts, `expert_used_count` a
    token, each of `expert_feed_forward_length` (Mixtral's llama files: feed_forward_length);
    the chosen experts' weights renormalised unless `expert_weights_norm` says not (llama.cpp
    always renormalises qwen3moe and llama experts). A layer has experts where its router is."""
    count = int(key("expert_count"))
    inter = int(meta.get(f"{arch}.expert_feed_forward_length") or key("feed_forward_length"))
    sparse = tuple(i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" in infos)
    if arch == "gpt-oss":  # a softmax over the top-k logits, biases, the clamped SwiGLU
        return Experts(count, int(key("expert_used_count")), inter, True, sparse, bias=True, clamp=GPT_OSS_CLAMP)
    return Experts(count, int(key("expert_used_count")), inter,
                   bool(meta.get(f"{arch}.expert_weights_norm", True)), sparse)



def _f32(x) -> float:
    """A float32 metadata value as the decimal it was written from (1e-05, not 9.99999974e-06):
    the shortest text that reads back as the same float32."""
    return float(str(np.float32(x)))


# Widened with numpy (F32 and BF16 too); every other type through the gguf package.
_WIDEN = {"F16": np.float16, "F64": np.float64}


def _kept_as_stored(info: TensorInfo) -> bool:
    return len(info.shape) in (2, 3) and (info.type_name in QTYPES or info.type_name == "F32")


def _check_tensors(path: Path, arch: str, infos: dict[str, TensorInfo]) -> None:
    """Fail fast, before any work, on a tensor we do not know, cannot shape or cannot read."""
    embd = infos.get("token_embd.weight")
    if embd is None or len(embd.shape) != 2:
        raise InfernoError(f"{path.name}: no token_embd.weight matrix; the file is incomplete")
    for info in infos.values():
        if hf_name(info.name, arch) is None and info.name not in SIDE_TENSORS:
            raise InfernoError(f"{path.name}: tensor {info.name} is not part of a {arch} model "
                               f"inferno runs (biases, shared experts and vision towers are not "
                               f"supported)")
        if len(info.shape) > (3 if info.name.endswith(STACKED) else 2):
            raise InfernoError(f"{path.name}: tensor {info.name} has {len(info.shape)} dimensions; "
                               f"inferno's models use vectors, matrices and stacked experts")
    for type_name, info in {i.type_name: i for i in infos.values()}.items():
        if type_name not in (*QTYPES, *_WIDEN, "F32", "BF16") and not _can_dequantize(info):
            raise InfernoError(f"{path.name}: unsupported GGUF tensor type {type_name} "
                               f"(tensor {info.name}); {_types_hint()}")


def _check_layers(path: Path, config: ModelConfig, infos: dict[str, TensorInfo]) -> None:
    """The block count must match the blocks present: a corrupted count would otherwise make
    every later per-layer loop run for billions of layers."""
    blocks = {int(m.group(1)) for m in map(_BLOCK.match, infos) if m}
    n = config.num_hidden_layers
    if len(blocks) != n or max(blocks, default=-1) != n - 1:
        raise InfernoError(f"{path.name}: block_count is {config.num_hidden_layers} but the file "
                           f"has tensors for {len(blocks)} blocks; the file is corrupt")


def _can_dequantize(info: TensorInfo) -> bool:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    try:  # dequantise one zero row
        gguf_dequantize(np.zeros((1, info.row_bytes), dtype=np.uint8), GGMLQuantizationType(info.type_id))
    except (NotImplementedError, ValueError, KeyError):
        return False
    return True


def _notice_dequantised(path: Path, infos: list[TensorInfo]) -> None:
    """One line on stderr naming the matrix types that could not stay as stored."""
    if infos:
        counts = Counter(i.type_name for i in infos)
        what = ", ".join(f"{n} {t}" for t, n in sorted(counts.items()))
        print(f"note: {path.name}: dequantised {what} tensor(s) to float32 at load; inferno keeps "
              f"{', '.join(['F32', *QTYPES])} as stored", file=sys.stderr)


def _types_hint() -> str:
    return (f"inferno reads {', '.join(['F32', *QTYPES])} as stored and dequantises what the "
            f"gguf package can (F64, Q2_K, Q3_K, the IQ types)")
