"""GGUF files: a tiny random Qwen3 and Llama written both with save_pretrained and as GGUF (the
way llama.cpp's converter writes them) must load into the same model, tokenizer and logits."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from tiny import CORPUS, make_model
from tiny_gguf import T, mixed_types, write_gguf

import inferno
from inferno.model.gguf import dequantize, open_reader

TEXTS = CORPUS + ["  leading spaces,\n\nblank lines\tand tabs  ", "<|im_start|>user\nhi<|im_end|>"]


@pytest.fixture(scope="module")
def qwen3_hd128_dir(tmp_path_factory):
    """A Qwen3 with head_dim 128: transformers' GGUF loader ignores qwen3.attention.key_length
    and assumes Qwen3Config's default of 128, so this is the Qwen3 it can read back."""
    return make_model(tmp_path_factory.mktemp("qwen3_hd128"), "qwen3", hidden=64, heads=2,
                      kv_heads=1, head_dim=128, tied=True)


@pytest.fixture(params=["qwen3", "llama"])
def folder(request):
    return request.getfixturevalue(f"{request.param}_dir")


def test_f32_gguf_is_the_same_model_as_its_folder(folder, tmp_path):
    gguf_file = write_gguf(folder, tmp_path / "model.gguf")
    ref, got = inferno.load(str(folder)), inferno.load(str(gguf_file))
    assert got.file_format == "gguf"

    cfg, want = got.config, ref.config
    for name in ("architecture", "vocab_size", "hidden_size", "intermediate_size",
                 "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "rms_norm_eps", "rope_theta", "max_position_embeddings", "tie_word_embeddings",
                 "qk_norm", "rope_scaling", "bos_token_id"):
        assert getattr(cfg, name) == getattr(want, name), name
    assert set(want.eos_token_ids) <= set(cfg.eos_token_ids)

    for text in TEXTS:
        for special in (True, False):  # with and without the BOS the Llama tokenizer adds
            assert got.tokenizer.encode(text, special) == ref.tokenizer.encode(text, special), text
        ids = ref.tokenizer.encode(text, add_special_tokens=False)
        assert got.tokenizer.decode(ids) == ref.tokenizer.decode(ids)
    prompt = ref.encode_prompt("What is the capital of France?", system="Be brief.")
    assert got.encode_prompt("What is the capital of France?", system="Be brief.") == prompt

    # Same float32 weights, same forward pass: the logits agree to float rounding.
    np.testing.assert_allclose(got.logits(prompt), ref.logits(prompt), rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["llama_dir", "qwen3_hd128_dir"])
def test_quantised_gguf_matches_transformers_and_its_folder(name, request, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    folder = request.getfixturevalue(name)
    gguf_file = write_gguf(folder, tmp_path / "mixed.gguf", types=mixed_types)
    types = Counter(t.tensor_type for t in open_reader(gguf_file).tensors)
    assert {T.F32, T.F16, T.Q8_0} <= set(types), types

    ours = inferno.load(str(gguf_file))
    ids = ours.encode_prompt("The capital of France is Paris. Café, 東京 🙂")
    logits = ours.logits(ids)

    # transformers dequantises the same file with its own code and un-permutes llama's q/k
    # itself: the same weights exactly, so only float rounding separates us.
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=gguf_file.name, dtype=torch.float32)
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(logits, want, rtol=0, atol=1e-4)

    # Against the float32 original the difference is the quantisation's: F16 and Q8_0 keep
    # logits within a few percent of their spread (a wrong or missing q/k permutation does not).
    exact = inferno.load(str(folder)).logits(ids)
    assert np.abs(logits - exact).max() < 0.2 * exact.std()


@pytest.mark.parametrize("qtype, tolerance", [
    (T.F32, 0.0), (T.F16, 1e-3), (T.BF16, 5e-3), (T.Q8_0, 1.5e-2), (T.Q5_0, 0.08),
    (T.Q5_1, 0.08), (T.Q4_0, 0.15), (T.Q4_1, 0.15)])
def test_dequantise_each_tensor_type_in_hf_layout(qtype, tolerance, tmp_path):
    import gguf

    w = np.random.default_rng(0).standard_normal((48, 64)).astype(np.float32)  # [out, in]
    path = tmp_path / "one.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    if qtype == T.F32:
        writer.add_tensor("w", w)
    elif qtype == T.F16:
        writer.add_tensor("w", w.astype(np.float16))
    else:
        writer.add_tensor("w", gguf.quants.quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    (info,) = open_reader(path).tensors
    assert info.tensor_type == qtype
    got = dequantize(info, path)
    assert got.dtype == np.float32 and got.shape == (48, 64)
    rel_rms = np.sqrt(np.mean((got - w) ** 2) / np.mean(w ** 2))
    assert rel_rms <= tolerance, rel_rms
