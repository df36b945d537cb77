"""Write a tiny Hugging Face folder (tests/tiny.py) as a GGUF file, the way llama.cpp's
convert_hf_to_gguf.py does: the gguf package's own HF -> GGUF tensor-name map (not inferno's
table), llama q/k rows permuted for llama.cpp's RoPE, tokens padded to the vocabulary with
[PAD{i}] tokens, special tokens marked CONTROL, and the chat template in the metadata."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import gguf
import numpy as np

ARCHS = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen3": gguf.MODEL_ARCH.QWEN3,
         "qwen2": gguf.MODEL_ARCH.QWEN2, "gemma3": gguf.MODEL_ARCH.GEMMA3,
         "qwen3moe": gguf.MODEL_ARCH.QWEN3MOE, "gpt-oss": gguf.MODEL_ARCH.GPT_OSS}


def hf_arch_of(cfg: dict) -> str:
    first = cfg["architectures"][0]
    return next(a for p, a in (("Llama", "llama"), ("Mixtral", "llama"), ("Qwen2", "qwen2"),
                               ("Gemma3", "gemma3"), ("Qwen3Moe", "qwen3moe"), ("Qwen3", "qwen3"),
                               ("GptOss", "gpt-oss"))
                if first.startswith(p))


def gpt_oss_tensors(tensors: dict) -> dict:
    """A gpt-oss folder's experts and sinks as llama.cpp's converter writes them
    (conversion/gpt_oss.py): gate_up ([n_expert, hidden, 2 * inter], gate and up interleaved)
    transposed and split into gate and up, down transposed, the biases split alike; sinks and
    the router under their GGUF names. Everything else as it was."""
    out = {}
    for name, t in tensors.items():
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name)
        i, rest = (m.group(1), m.group(2)) if m else (None, None)
        blk = f"blk.{i}."
        if rest == "mlp.experts.gate_up_proj":
            t = t.swapaxes(-1, -2)  # [n_expert, 2 * inter, hidden]
            out[blk + "ffn_gate_exps.weight"], out[blk + "ffn_up_exps.weight"] = t[:, 0::2], t[:, 1::2]
        elif rest == "mlp.experts.gate_up_proj_bias":
            out[blk + "ffn_gate_exps.bias"], out[blk + "ffn_up_exps.bias"] = t[:, 0::2], t[:, 1::2]
        elif rest == "mlp.experts.down_proj":
            out[blk + "ffn_down_exps.weight"] = t.swapaxes(-1, -2)
        elif rest == "mlp.experts.down_proj_bias":
            out[blk + "ffn_down_exps.bias"] = t
        elif rest in ("mlp.router.weight", "mlp.router.bias"):
            out[blk + "ffn_gate_inp." + rest.rsplit(".", 1)[1]] = t
        elif rest == "self_attn.sinks":
            out[blk + "attn_sinks.weight"] = t
        elif rest == "post_attention_layernorm.weight":
            out[blk + "post_attention_norm.weight"] = t
        else:
            out[name] = t
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


# A folder's expert tensors, as the converter stacks them: (pattern, GGUF name of the stack).
EXPERT_NAMES = [
    (re.compile(r"model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.gate\.weight"), "blk.{i}.ffn_gate_inp.weight"),
    (re.compile(r"model\.layers\.(\d+)\.(?:mlp\.experts\.(\d+)\.gate_proj|block_sparse_moe\.experts\.(\d+)\.w1)\.weight"),
     "blk.{i}.ffn_gate_exps.weight"),
    (re.compile(r"model\.layers\.(\d+)\.(?:mlp\.experts\.(\d+)\.up_proj|block_sparse_moe\.experts\.(\d+)\.w3)\.weight"),
     "blk.{i}.ffn_up_exps.weight"),
    (re.compile(r"model\.layers\.(\d+)\.(?:mlp\.experts\.(\d+)\.down_proj|block_sparse_moe\.experts\.(\d+)\.w2)\.weight"),
     "blk.{i}.ffn_down_exps.weight"),
]


def stack_experts(tensors: dict) -> dict:
    """The folder's tensors with each layer's experts stacked, [n_expert, out, in], under their
    GGUF names (the router too); everything else as it was."""
    out, stacks = {}, {}
    for name, t in tensors.items():
        for pattern, gguf_name in EXPERT_NAMES:
            m = pattern.fullmatch(name)
            if m:
                expert = next((int(g) for g in m.groups()[1:] if g is not None), None)
                key = gguf_name.format(i=m.group(1))
                if expert is None:
                    out[key] = t
                else:
                    stacks.setdefault(key, {})[expert] = t
                break
        else:
            out[name] = t
    for key, by_expert in stacks.items():
        out[key] = np.stack([by_expert[e] for e in sorted(by_expert)])
    return out


def llama3_rope_factors(cfg: dict, head_dim: int) -> np.ndarray:
    """convert_hf_to_gguf.py's rope_freqs.weight for Llama 3.1 RoPE scaling: the divisor of each
    frequency (1 for short wavelengths, `factor` for long ones, a blend between)."""
    rs = cfg.get("rope_scaling") or cfg["rope_parameters"]
    theta = cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    old = rs["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / rs["low_freq_factor"], old / rs["high_freq_factor"]
    factors = []
    for freq in freqs:
        wavelen = 2 * np.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(rs["factor"])
        else:
            smooth = (old / wavelen - rs["low_freq_factor"]) / (rs["high_freq_factor"] - rs["low_freq_factor"])
            factors.append(1 / ((1 - smooth) / rs["factor"] + smooth))
    return np.array(factors, dtype=np.float32)
T = gguf.GGMLQuantizationType


def permute(w: np.ndarray, n_head: int, n_head_kv: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def mixed_types(name: str, w: np.ndarray, index: int):
    """F32 for norms, then F16 and Q8_0 taking turns (Q8_0 only where rows split into 32-blocks)."""
    if w.ndim == 1:
        return T.F32
    if index % 2 == 0 and w.shape[-1] % 32 == 0:
        return T.Q8_0
    return T.F16


def write_gguf(folder: Path, out: Path, *, types=lambda name, w, i: T.F32, arch: str | None = None,
               pre: str = "gpt-2", pooling: int | None = None, extra: dict | None = None) -> Path:
    """`types(gguf_name, array, index)` picks each tensor's GGML type. `arch` overrides the
    architecture written (for error tests; gemma-embedding for a Gemma 3 folder); `pooling` is
    llama.cpp's pooling_type to write; `extra` more float32 tensors by GGUF name (EmbeddingGemma's
    dense_2.weight and dense_3.weight)."""
    from safetensors.numpy import load_file

    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    hf_arch = hf_arch_of(cfg)
    arch_name = arch or hf_arch
    n_layers, n_head, n_kv = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head

    w = gguf.GGUFWriter(str(out), arch_name)
    w.add_block_count(n_layers)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    rope = cfg.get("rope_parameters") or {}
    w.add_rope_freq_base(cfg.get("rope_theta") or rope.get("full_attention", rope)["rope_theta"])
    if hf_arch in ("gemma3", "gpt-oss"):
        w.add_sliding_window(cfg["sliding_window"])
    if arch_name == "gemma-embedding" and cfg.get("layer_types"):
        # a flag a layer, which llama.cpp reads (load_swa_pattern); its converter leaves
        # EmbeddingGemma to the default, every sixth layer global, which the real one has
        w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg["layer_types"]])
    if rope.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(rope.get("beta_fast", 32.0))
        w.add_rope_scaling_yarn_beta_slow(rope.get("beta_slow", 1.0))
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        if cfg.get("moe_intermediate_size"):
            w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        elif hf_arch == "gpt-oss":
            w.add_expert_feed_forward_length(cfg["intermediate_size"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if pooling is not None:
        w.add_pooling_type(gguf.PoolingType(pooling))
    _add_tokenizer(w, folder, cfg["vocab_size"], pre)

    names = gguf.get_tensor_name_map(ARCHS[hf_arch], n_layers)
    # gguf's qwen3moe table has no dense MLP (llama.cpp's qwen3moe has experts in every layer);
    # a dense layer between sparse ones takes qwen3's names, which inferno reads in either.
    dense = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, n_layers)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors = gpt_oss_tensors(tensors) if hf_arch == "gpt-oss" else stack_experts(tensors)
    for i, (hf_name, t) in enumerate(sorted(tensors.items())):
        t = t.astype(np.float32)
        name = hf_name if hf_name.startswith("blk.") else (
            names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
            or dense.get_name(hf_name, try_suffixes=(".weight", ".bias")))
        if hf_arch == "gemma3" and name.endswith("norm.weight"):
            t = t + np.float32(1.0)  # the converter stores Gemma's norms as 1 + w
        if hf_arch == "llama" and name.endswith("attn_q.weight"):
            t = permute(t, n_head, n_head)
        elif hf_arch == "llama" and name.endswith("attn_k.weight"):
            t = permute(t, n_head, n_kv)
        qtype = types(name, t, i)
        if qtype == T.F32:
            w.add_tensor(name, t)
        elif qtype == T.F16:
            w.add_tensor(name, t.astype(np.float16))
        elif qtype in (T.Q8_1, T.Q8_K, T.I32, T.IQ4_NL):  # types gguf cannot quantise: zero bytes
            w.add_tensor(name, np.zeros(gguf.quant_shape_to_byte_shape(t.shape, qtype), np.uint8),
                         raw_dtype=qtype)
        elif qtype in (T.Q4_K, T.Q5_K, T.Q6_K):  # nor these: random blocks (qblocks.py), not t
            from qblocks import random_blocks

            rows = int(np.prod(t.shape[:-1]))
            blocks = random_blocks(qtype.name, rows, t.shape[-1], seed=i, extremes=False).data
            w.add_tensor(name, blocks.reshape(gguf.quant_shape_to_byte_shape(t.shape, qtype)), raw_dtype=qtype)
        else:
            w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)

    rope_type = (cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}).get("rope_type")
    if rope_type == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg, head_dim))

    for name, t in (extra or {}).items():
        w.add_tensor(name, np.asarray(t, np.float32))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def dequantised_engine(path):
    """The reference path for a quantised file: every QuantTensor dequantised by the reference
    (QuantTensor.dequantize), then the float32 model on the cpu backend."""
    from inferno.backends import create_backend
    from inferno.engine import Engine
    from inferno.formats.quant import QuantTensor
    from inferno.loading.loader import open_checkpoint

    checkpoint = open_checkpoint(path)
    checkpoint.tensors = {k: w.dequantize() if isinstance(w, QuantTensor) else w
                          for k, w in checkpoint.tensors.items()}
    return Engine(checkpoint, create_backend("cpu"))


def _add_tokenizer(w, folder: Path, vocab_size: int, pre: str) -> None:
    tok = json.loads((folder / "tokenizer.json").read_text())
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    special = set()
    for added in tok["added_tokens"]:
        by_id[added["id"]] = added["content"]
        if added["special"]:
            special.add(added["id"])
    tokens, types = [], []
    for i in range(vocab_size):
        if i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    ids = {t: i for i, t in enumerate(tokens)}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(ids[tok_cfg["eos_token"]])
    w.add_pad_token_id(ids[tok_cfg["pad_token"]])
    if tok_cfg.get("bos_token"):
        w.add_bos_token_id(ids[tok_cfg["bos_token"]])
        w.add_add_bos_token(True)
    else:
        w.add_add_bos_token(False)
    w.add_chat_template(tok_cfg.get("chat_template") or (folder / "chat_template.jinja").read_text())


# -- GGUF files byte by byte, for files no writer would produce (error and fuzz tests) ----------
V = gguf.GGUFValueType
_FORMATS = {V.UINT8: "B", V.INT8: "b", V.UINT16: "H", V.INT16: "h", V.UINT32: "I", V.INT32: "i",
            V.FLOAT32: "f", V.BOOL: "?", V.UINT64: "Q", V.INT64: "q", V.FLOAT64: "d"}


def gguf_string(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def gguf_value(vtype: V, value, elem: V | None = None) -> bytes:
    """A value's bytes after its type id; an array is (elem type, count, elements), and the
    elements of an array of arrays are (elem type, values) pairs."""
    if vtype == V.STRING:
        return gguf_string(value)
    if vtype == V.ARRAY:
        items = [gguf_value(V.ARRAY, v[1], v[0]) if elem == V.ARRAY else gguf_value(elem, v) for v in value]
        return struct.pack("<IQ", elem, len(value)) + b"".join(items)
    return struct.pack("<" + _FORMATS[vtype], value)


def gguf_kv(key: str | bytes, vtype: V, value, elem: V | None = None) -> bytes:
    return gguf_string(key) + struct.pack("<I", vtype) + gguf_value(vtype, value, elem)


def gguf_tensor(name: str, dims: tuple[int, ...], type_id: int, offset: int) -> bytes:
    """One tensor-table entry; dims innermost first, offset from the data section."""
    return (gguf_string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
            + struct.pack("<IQ", type_id, offset))


def gguf_bytes(kvs: list[bytes], tensors: list[bytes], data: bytes = b"", *, version: int = 3,
               n_tensors: int | None = None, n_kv: int | None = None, alignment: int = 32) -> bytes:
    """A whole file: header, the given key-value and tensor entries, padding, data. The counts
    default to the entries given."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tensors)
    return body + b"\0" * (-len(body) % alignment) + data
