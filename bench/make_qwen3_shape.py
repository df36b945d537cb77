"""Write a Qwen3-0.6B-shaped model with random weights, since the hub is out of reach here.

    python bench/make_qwen3_shape.py [--out ~/.cache/inferno/bench/qwen3-0.6b-shape]

Qwen3-0.6B's geometry (28 layers, 16 query / 8 KV heads of 128, hidden 1024, intermediate 3072,
vocab 151936, tied embeddings, q/k norms), stored as its release is: bf16 safetensors (1.2 GB,
widened exactly to float32 at load). Weights are N(0, 0.02), norms 1: the speed of every op is
the real model's; the text it writes is noise. The tokenizer is a stand-in (benchmarks feed
synthetic token ids). transformers loads the folder too, so the same weights run on it.
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
DEFAULT_OUT = Path("~/.cache/inferno/bench/qwen3-0.6b-shape").expanduser()


def tensor_shapes(c: dict) -> dict[str, tuple[int, ...]]:
    h, i, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    shapes = {"model.embed_tokens.weight": (c["vocab_size"], h), "model.norm.weight": (h,)}
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        })
    return shapes


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
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for name, shape in shapes.items():
            if name.endswith("norm.weight"):
                values = np.ones(shape, np.float32)
            else:
                values = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
            f.write(to_bf16(values).tobytes())


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
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder to write")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    out = args.out.expanduser()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2))
    write_tokenizer(out)
    shapes = tensor_shapes(CONFIG)
    write_safetensors(out / "model.safetensors", shapes, args.seed)
    params = sum(int(np.prod(s)) for s in shapes.values())
    print(f"wrote {out}: {params / 1e6:.0f} M parameters, bf16, in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
