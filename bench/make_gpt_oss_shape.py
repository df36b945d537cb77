"""Write a gpt-oss-20b-shaped GGUF with random weights, since the hub is out of reach here.

    python bench/make_gpt_oss_shape.py                 # 24 layers, about 12 GiB
    python bench/make_gpt_oss_shape.py --layers 4      # the same layers, fewer of them

gpt-oss-20b's geometry (its config.json): 24 layers, hidden 2880, 64 query heads and 8 KV heads
of 64, 32 experts of 2880 a layer, 4 a token, a vocabulary of 201,088, an untied head; sliding
windows of 128 on even layers, YaRN (factor 32 over 4,096 positions). The types are the
official GGUF's mix: the experts in MXFP4 (as OpenAI trained them), the other matrices in Q8_0,
norms, biases, sinks and routers in F32. Weights are random blocks with a sane scale (MXFP4: an
E8M0 exponent around 2^-8, Q8_0: d near 0.02 / 127), so every op runs at the real model's speed;
the text is noise. Written streamed: the tensor table first, then each tensor as it is drawn.
The tokenizer is a stand-in of byte tokens and fillers (benchmarks feed synthetic ids).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from make_qwen3_shape import BENCH_DIR, add_stand_in_vocab  # noqa: E402

CONFIG = dict(layers=24, hidden=2880, heads=64, kv_heads=8, head_dim=64, experts=32, top_k=4, inter=2880,
              vocab=201088, window=128, context=131072, rope_theta=150000.0, yarn_factor=32.0,
              yarn_context=4096, eps=1e-5)


def tensors(c: dict):
    """(GGUF name, numpy shape [outer .. inner], type) of every tensor, in file order."""
    import gguf

    T = gguf.GGMLQuantizationType
    h, q, kv, e, f = c["hidden"], c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"], c["experts"], c["inter"]
    yield "token_embd.weight", (c["vocab"], h), T.Q8_0
    for i in range(c["layers"]):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (h,), T.F32
        yield b + "post_attention_norm.weight", (h,), T.F32
        for name, rows in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
            yield b + name + ".weight", (rows, h), T.Q8_0
            yield b + name + ".bias", (rows,), T.F32
        yield b + "attn_output.weight", (h, q), T.Q8_0
        yield b + "attn_output.bias", (h,), T.F32
        yield b + "attn_sinks.weight", (c["heads"],), T.F32
        yield b + "ffn_gate_inp.weight", (e, h), T.F32
        yield b + "ffn_gate_inp.bias", (e,), T.F32
        for name, (rows, cols) in (("ffn_gate_exps", (f, h)), ("ffn_up_exps", (f, h)), ("ffn_down_exps", (h, f))):
            yield b + name + ".weight", (e, rows, cols), T.MXFP4
            yield b + name + ".bias", (e, rows), T.F32
    yield "output_norm.weight", (h,), T.F32
    yield "output.weight", (c["vocab"], h), T.Q8_0


def byte_shape(shape: tuple, qtype) -> tuple:
    import gguf

    return tuple(gguf.quant_shape_to_byte_shape(shape, qtype))


def draw(name: str, shape: tuple, qtype, rng: np.random.Generator) -> np.ndarray:
    """A tensor's bytes (or float32 values) with the real model's kind of magnitudes."""
    import gguf

    T = gguf.GGMLQuantizationType
    if qtype == T.F32:
        if name.endswith("norm.weight"):
            return np.ones(shape, np.float32)
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)
    raw = rng.integers(0, 256, size=byte_shape(shape, qtype), dtype=np.uint8)
    blocks = raw.reshape(-1, 34 if qtype == T.Q8_0 else 17)
    if qtype == T.Q8_0:
        blocks[:, :2] = np.frombuffer(np.float16(0.02 / 127).tobytes(), np.uint8)
    else:  # MXFP4: an exponent byte of 118-121 (2^-10 .. 2^-7, times the E2M1 value 0-12)
        blocks[:, 0] = rng.integers(118, 122, size=blocks.shape[0], dtype=np.uint8)
    return raw


def write(out: Path, c: dict, seed: int) -> None:
    import gguf

    w = gguf.GGUFWriter(str(out), "gpt-oss")
    w.add_block_count(c["layers"])
    w.add_context_length(c["context"])
    w.add_embedding_length(c["hidden"])
    w.add_feed_forward_length(c["inter"])
    w.add_head_count(c["heads"])
    w.add_head_count_kv(c["kv_heads"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_rope_freq_base(c["rope_theta"])
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(c["yarn_factor"])
    w.add_rope_scaling_orig_ctx_len(c["yarn_context"])
    w.add_layer_norm_rms_eps(c["eps"])
    w.add_expert_count(c["experts"])
    w.add_expert_used_count(c["top_k"])
    w.add_expert_feed_forward_length(c["inter"])
    w.add_sliding_window(c["window"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_stand_in_vocab(w, c["vocab"], "gpt-4o", bos="<|startoftext|>", eos="<|return|>")
    table = list(tensors(c))
    for name, shape, qtype in table:
        nbytes = int(np.prod(byte_shape(shape, qtype))) if qtype != gguf.GGMLQuantizationType.F32 \
            else int(np.prod(shape)) * 4
        w.add_tensor_info(name, byte_shape(shape, qtype) if qtype != gguf.GGMLQuantizationType.F32 else shape,
                          np.dtype(np.uint8 if qtype != gguf.GGMLQuantizationType.F32 else np.float32),
                          nbytes, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, shape, qtype in table:
        w.write_tensor_data(draw(name, shape, qtype, rng))
    w.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--layers", type=int, default=CONFIG["layers"], help="layers to keep")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--out", type=Path, help=f"where to write (default: {BENCH_DIR}/gpt-oss-20b-shape[-LAYERSl].gguf)")
    args = p.parse_args(argv)
    c = {**CONFIG, "layers": args.layers}
    out = args.out or BENCH_DIR / ("gpt-oss-20b-shape.gguf" if args.layers == CONFIG["layers"]
                                   else f"gpt-oss-20b-shape-{args.layers}l.gguf")
    out.parent.mkdir(parents=True, exist_ok=True)
    write(out, c, args.seed)
    print(f"{out}: {out.stat().st_size / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
