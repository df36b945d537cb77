"""Write a Qwen3-shaped model with random weights, since the hub is out of reach here.

    python bench/make_qwen3_shape.py                                # 0.6B, bf16 folder
    python bench/make_qwen3_shape.py --size 1.7b --type q4_k_m      # a GGUF, as llama.cpp users have
    python bench/make_qwen3_shape.py --size 8b --type q4_k_m        # 4.7 GB, from a 2-layer template
    python bench/make_qwen3_shape.py --moe 30b-a3b --type q4_k_m    # 17 GiB, from a 2-layer template
    python bench/make_qwen3_shape.py --moe 30b-a3b --layers 8 --type q4_k_m   # the same, 8 layers

Qwen3-0.6B, 1.7B and 8B geometries (layers, heads, hidden, intermediate, vocab 151936, tying,
q/k norms); `--moe 30b-a3b` is Qwen3-30B-A3B's mixture of experts (48 layers of 128 experts of
768, 8 a token), and `--layers N` keeps N layers of any shape for quicker runs. `--type bf16` writes a safetensors folder as the releases are; f16, q8_0 and q4_k_m
write a GGUF: f16 streamed tensor by tensor, then requantised by llama.cpp's own quantizer
(bench/quantize.py), so the file has the same per-tensor type mix a user's Q4_K_M has. Past two
layers the quantizer runs on a 2-layer file only, and the layers are copied from it with the types
llama-quantize gives each (`--via-f16` quantizes the whole f16 file instead). Weights are
N(0, 0.02), norms 1: the speed of every op is the real model's; the text it writes is noise. The
tokenizer is a stand-in (benchmarks feed synthetic token ids).
"""

from __future__ import annotations

import argparse
import json
import struct
import time
from pathlib import Path

import numpy as np

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000, "max_position_embeddings": 40960, "tie_word_embeddings": True,
    "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
    "initializer_range": 0.02, "use_cache": True, "bos_token_id": 151643, "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}
# What each size changes (Qwen3's released config.json files).
SIZES = {
    "0.6b": {},
    "1.7b": dict(hidden_size=2048, intermediate_size=6144),
    "8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
               num_attention_heads=32, tie_word_embeddings=False),
}
# Mixtures of experts (Qwen3-30B-A3B's config.json): experts stacked per layer as GGUF keeps them.
MOE = {
    "30b-a3b": dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=2048,
                    intermediate_size=6144, num_hidden_layers=48, num_attention_heads=32,
                    num_key_value_heads=4, tie_word_embeddings=False, num_experts=128,
                    num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
                    decoder_sparse_step=1, mlp_only_layers=[]),
}
TYPES = ("bf16", "f16", "q8_0", "q4_k_m")
BENCH_DIR = Path("~/.cache/inferno/bench").expanduser()


DEFAULT_OUT = BENCH_DIR / "qwen3-0.6b-shape"  # the 0.6B bf16 folder, as bench/attention.py reads


def default_out(size: str, qtype: str, layers: int | None = None) -> Path:
    name = f"qwen3-{size}-shape" + (f"-{layers}l" if layers else "")
    return BENCH_DIR / (name if qtype == "bf16" else f"{name}.{qtype.upper()}.gguf")


def tensor_shapes(c: dict) -> dict[str, tuple[int, ...]]:
    h, i, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    shapes = {"model.embed_tokens.weight": (c["vocab_size"], h), "model.norm.weight": (h,)}
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (c["vocab_size"], h)
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
        })
        if c.get("num_experts"):  # stacked [n_expert, out, in], and the router
            n, e = c["num_experts"], c["moe_intermediate_size"]
            shapes.update({p + "mlp.gate.weight": (n, h), p + "mlp.experts.gate_proj.weight": (n, e, h),
                           p + "mlp.experts.up_proj.weight": (n, e, h),
                           p + "mlp.experts.down_proj.weight": (n, h, e)})
        else:
            shapes.update({p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                           p + "mlp.down_proj.weight": (h, i)})
    return shapes


# Stacked experts' GGUF names (gguf's name map has one per expert, not the stacks).
EXPERT_GGUF = {"mlp.gate.weight": "ffn_gate_inp.weight", "mlp.experts.gate_proj.weight": "ffn_gate_exps.weight",
               "mlp.experts.up_proj.weight": "ffn_up_exps.weight",
               "mlp.experts.down_proj.weight": "ffn_down_exps.weight"}


def gguf_name(names, name: str) -> str:
    for hf, gg in EXPERT_GGUF.items():
        if name.endswith(hf):
            return f"blk.{name.split('.')[2]}.{gg}"
    return names.get_name(name, try_suffixes=(".weight",))


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, rounding to nearest even."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path: Path, shapes: dict, seed: int) -> None:
    """Stream one tensor at a time: the header first (offsets known from the shapes)."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes.items():
        size = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for name, values in random_tensors(shapes, seed):
            f.write(to_bf16(values).tobytes())


def random_tensors(shapes: dict, seed: int):
    """(name, float32 values) one at a time: N(0, 0.02) weights, norms of 1."""
    rng = np.random.default_rng(seed)
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            yield name, np.ones(shape, np.float32)
        else:
            yield name, rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)


def gguf_writer(path: Path, config: dict, file_type: int):
    """A GGUFWriter with a qwen3 (or qwen3moe) model's metadata as llama.cpp's converter writes it.
    The vocabulary is GPT-2's 256 byte tokens plus fillers, enough for llama.cpp and for us."""
    import gguf

    c = config
    moe = bool(c.get("num_experts"))
    w = gguf.GGUFWriter(str(path), "qwen3moe" if moe else "qwen3")
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    if moe:
        w.add_expert_count(c["num_experts"])
        w.add_expert_used_count(c["num_experts_per_tok"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_file_type(file_type)
    if file_type != gguf.LlamaFileType.MOSTLY_F16:
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_stand_in_vocab(w, c["vocab_size"], "qwen2", bos="<|endoftext|>", eos="<|im_end|>")
    return w


def add_stand_in_vocab(w, size: int, pre: str, bos: str, eos: str) -> None:
    """A vocabulary of `size` for a GGUFWriter: GPT-2's 256 byte tokens, a few merges (llama.cpp
    wants some; any will do), fillers, and the `bos` and `eos` control tokens last."""
    import gguf

    merges = ["Ġ t", "Ġ a", "i n", "h e"]
    byte_tokens = [chr(b) for b in gguf_byte_alphabet()] + [m.replace(" ", "") for m in merges]
    tokens = byte_tokens + [f"<t{i}>" for i in range(size - len(byte_tokens) - 2)] + [bos, eos]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * (len(tokens) - 2) + [gguf.TokenType.CONTROL] * 2)
    w.add_token_merges(merges)
    w.add_eos_token_id(len(tokens) - 1)
    w.add_bos_token_id(len(tokens) - 2)


def write_gguf_f16(path: Path, config: dict, shapes: dict, seed: int) -> None:
    """A qwen3 GGUF as llama.cpp's converter writes one (norms F32, matrices F16), streamed: the
    tensor table first (sizes follow from the shapes), then each tensor as it is drawn."""
    import gguf

    c = config
    w = gguf_writer(path, c, gguf.LlamaFileType.MOSTLY_F16)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, c["num_hidden_layers"])
    gguf_names = {n: gguf_name(names, n) for n in shapes}
    for name, shape in shapes.items():
        # llama.cpp keeps norms and routers in float32 (its quantizer leaves them so)
        dtype = np.float32 if len(shape) == 1 or name.endswith("mlp.gate.weight") else np.float16
        w.add_tensor_info(gguf_names[name], shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, values in random_tensors(shapes, seed):
        w.write_tensor_data(values if values.ndim == 1 or name.endswith("mlp.gate.weight")
                            else values.astype(np.float16))
    w.close()


# Quantized files of more layers than this are assembled from a quantized file of this many.
TEMPLATE_LAYERS = 2


def more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp's use_more_bits: the layers where Q4_K_M gives attn_v and ffn_down Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def write_gguf_from_template(out: Path, config: dict, qtype: str, seed: int) -> None:
    """A quantized GGUF of many layers without its f16 on the way (57 GiB for the 30B-A3B shape):
    llama.cpp's quantizer makes a 2-layer file of the same shape, and each layer of `out` copies
    the template layer whose tensor types llama-quantize gives it (Q4_K_M's `use_more_bits` is
    False on template layer 0 and True on layer 1), its rows shuffled so no two layers are
    alike. The embedding, head and the types of every tensor are what llama-quantize writes for
    the whole file; the weights are its quantization of N(0, 0.02) rows."""
    import gguf
    from quantize import quantize  # bench/quantize.py, beside this script

    n = config["num_hidden_layers"]
    small = {**config, "num_hidden_layers": TEMPLATE_LAYERS}
    f16 = out.with_name(out.name + ".template.f16.tmp")
    small_q = out.with_name(out.name + ".template.tmp")
    try:
        write_gguf_f16(f16, small, tensor_shapes(small), seed)
        quantize(f16, small_q, qtype)
        f16.unlink()
        reader = gguf.GGUFReader(small_q)
        template = {t.name: t for t in reader.tensors}
        file_type = int(reader.fields["general.file_type"].contents())

        def source(name: str):
            if not name.startswith("blk."):
                return template[name]
            _, i, rest = name.split(".", 2)
            return template[f"blk.{int(more_bits(int(i), n))}.{rest}"]

        names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, n)
        order = [gguf_name(names, name) for name in tensor_shapes(config)]
        w = gguf_writer(out, config, file_type)
        for name in order:
            t = source(name)
            w.add_tensor_info(name, t.data.shape, t.data.dtype, t.data.nbytes, raw_dtype=t.tensor_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        rng = np.random.default_rng(seed + 1)
        for name in order:
            data = source(name).data
            if name.startswith("blk.") and data.ndim > 1:
                rows = data.reshape(-1, data.shape[-1])
                data = rows[rng.permutation(len(rows))].reshape(data.shape)
            w.write_tensor_data(data)
        w.close()
    finally:
        f16.unlink(missing_ok=True)
        small_q.unlink(missing_ok=True)


def gguf_byte_alphabet() -> list[int]:
    """GPT-2's printable stand-ins for the 256 bytes (the order byte-level BPE vocabularies use)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra = [b for b in range(256) if b not in keep]
    return keep + [256 + i for i in range(len(extra))]


def write_tokenizer(out: Path) -> None:
    """A word-level stand-in with Qwen3's special tokens at their ids' places in spirit only."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"<unk>": 0, "<|endoftext|>": 1, "<|im_start|>": 2, "<|im_end|>": 3}
    vocab.update({w: i + 4 for i, w in enumerate("the a of to and in is it you that".split())})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "unk_token": "<unk>"}))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--size", default="0.6b", choices=list(SIZES))
    p.add_argument("--moe", choices=list(MOE), default=None,
                   help="a mixture-of-experts shape instead of --size (GGUF types only)")
    p.add_argument("--layers", type=int, default=None, help="keep this many layers (default: the shape's)")
    p.add_argument("--type", default="bf16", choices=TYPES,
                   help="bf16: a safetensors folder; the others a GGUF file")
    p.add_argument("--out", type=Path, default=None,
                   help=f"where to write (default: {BENCH_DIR}/qwen3-SIZE-shape[.TYPE.gguf])")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--via-f16", action="store_true",
                   help="quantize the whole file from f16 (needs its f16 on disk) rather than "
                        f"assemble it from a {TEMPLATE_LAYERS}-layer quantized file")
    args = p.parse_args(argv)
    config = {**CONFIG, **(MOE[args.moe] if args.moe else SIZES[args.size])}
    if args.moe and args.type == "bf16":
        p.error("--moe writes a GGUF: choose --type f16, q8_0 or q4_k_m")
    if args.layers is not None:
        if not 1 <= args.layers <= config["num_hidden_layers"]:
            p.error(f"--layers must be between 1 and {config['num_hidden_layers']}")
        config["num_hidden_layers"] = args.layers
    out = (args.out or default_out(args.moe or args.size, args.type, args.layers)).expanduser()
    t0 = time.perf_counter()
    shapes = tensor_shapes(config)
    params = sum(int(np.prod(s)) for s in shapes.values())
    if args.moe and args.via_f16:
        print(f"{params / 1e9:.1f} B parameters: about {params * 2 / 2**30:.0f} GiB of f16 on the way")
    if args.type == "bf16":
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(config, indent=2))
        write_tokenizer(out)
        write_safetensors(out / "model.safetensors", shapes, args.seed)
    elif args.type != "f16" and config["num_hidden_layers"] > TEMPLATE_LAYERS and not args.via_f16:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_gguf_from_template(out, config, args.type, args.seed)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        f16 = out if args.type == "f16" else out.with_name(out.name + ".f16.tmp")
        write_gguf_f16(f16, config, shapes, args.seed)
        if args.type != "f16":
            from quantize import quantize  # bench/quantize.py, beside this script
            try:
                quantize(f16, out, args.type)
            finally:
                f16.unlink(missing_ok=True)
    print(f"wrote {out}: {params / 1e6:.0f} M parameters, {args.type}, "
          f"{_size(out) / 2**30:.2f} GiB, in {time.perf_counter() - t0:.0f} s")
    return 0


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.iterdir())


if __name__ == "__main__":
    raise SystemExit(main())
