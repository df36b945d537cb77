"""GGUF files: a tiny random Qwen3 and Llama written both with save_pretrained and as GGUF (the
way llama.cpp's converter writes them) must load into the same model, tokenizer and logits, with
the weights kept as stored; a hostile vocabulary is one InfernoError line."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from tiny import CORPUS, make_model
from tiny_gguf import T, dequantised_engine, mixed_types, permute, write_gguf

import inferno
from inferno.formats.quant import QTYPES, QuantTensor
from inferno.errors import InfernoError
from inferno.loading.gguf import tensor, unpermute_qk
from inferno.formats.gguf_file import read_gguf
from inferno.tokenizers.gguf_tokenizer import tokenizer_from_gguf
from inferno.loading.loader import open_checkpoint

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
    types = Counter(t.type_name for t in read_gguf(gguf_file).tensors.values())
    assert {"F32", "F16", "Q8_0"} <= set(types), types

    checkpoint = open_checkpoint(gguf_file)
    kinds = Counter(w.qtype.name if isinstance(w, QuantTensor) else f"{w.ndim}-D {w.dtype}"
                    for w in checkpoint.tensors.values())
    assert set(kinds) == {"F16", "Q8_0", "1-D float32"}, kinds  # no matrix was dequantised

    ours = dequantised_engine(gguf_file)
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


def _one_tensor_gguf(path, w: np.ndarray, qtype, raw: np.ndarray | None = None):
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    if qtype == T.F32:
        writer.add_tensor("w", w)
    elif qtype == T.F16:
        writer.add_tensor("w", w.astype(np.float16))
    else:
        writer.add_tensor("w", gguf.quants.quantize(w, qtype) if raw is None else raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    gf = read_gguf(path)
    return gf, gf.tensors["w"]


@pytest.mark.parametrize("qtype, tolerance", [
    (T.F32, 0.0), (T.F16, 1e-3), (T.BF16, 5e-3), (T.Q8_0, 1.5e-2), (T.Q5_0, 0.08),
    (T.Q5_1, 0.08), (T.Q4_0, 0.15), (T.Q4_1, 0.15), (T.MXFP4, 0.2)])
def test_each_tensor_type_loads_in_hf_layout(qtype, tolerance, tmp_path):
    """Matrices stay as stored (QuantTensor, or a read-only F32 view into the file), MXFP4 too;
    a type the backends cannot multiply in place is dequantised to float32 at load (below)."""
    w = np.random.default_rng(0).standard_normal((48, 64)).astype(np.float32)  # [out, in]
    gf, info = _one_tensor_gguf(tmp_path / "one.gguf", w, qtype)
    assert info.type_id == qtype and info.hf_shape == (48, 64)
    got = tensor(gf, info)
    if qtype.name in QTYPES:
        assert isinstance(got, QuantTensor) and got.qtype.name == qtype.name and got.shape == (48, 64)
        assert got.data.base is not None  # a view of the file, not a copy
        got = got.dequantize()
    elif qtype == T.F32:
        assert not got.flags.writeable and not got.flags.owndata
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == (48, 64)
    rel_rms = np.sqrt(np.mean((got - w) ** 2) / np.mean(w ** 2))
    assert rel_rms <= tolerance, rel_rms


@pytest.mark.parametrize("qtype, tolerance", [(T.F32, 0.0), (T.F16, 1e-3), (T.BF16, 5e-3), (T.Q8_0, 1.5e-2)])
def test_vectors_become_float32_copies(qtype, tolerance, tmp_path):
    w = np.random.default_rng(3).standard_normal(64).astype(np.float32)  # a norm's weight
    gf, info = _one_tensor_gguf(tmp_path / "v.gguf", w, qtype)
    got = tensor(gf, info)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == (64,)
    assert got.flags.writeable  # a copy, not the read-only map
    assert np.sqrt(np.mean((got - w) ** 2) / np.mean(w ** 2)) <= tolerance


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q5_K, T.Q6_K])
def test_k_quant_blocks_are_the_files_bytes(qtype, tmp_path):
    """The gguf package cannot quantise K-quants: random blocks, finite f16 scales, pin that the
    QuantTensor holds exactly the file's rows of blocks."""
    import gguf

    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(1).integers(0, 256, size=(6, 2 * block_bytes), dtype=np.uint8)
    scales = np.full(2, 0.01, np.float16).view(np.uint8)
    for b in range(2):  # d and dmin lead Q4_K/Q5_K blocks; Q6_K's d ends them
        at = b * block_bytes + (block_bytes - 2 if qtype == T.Q6_K else 0)
        raw[:, at:at + (2 if qtype == T.Q6_K else 4)] = np.tile(scales, 2)[:2 if qtype == T.Q6_K else 4]
    gf, info = _one_tensor_gguf(tmp_path / "k.gguf", None, qtype, raw)
    got = tensor(gf, info)
    assert isinstance(got, QuantTensor) and got.shape == (6, 2 * block)
    np.testing.assert_array_equal(got.data, raw)
    np.testing.assert_array_equal(got.dequantize(), gguf.quants.dequantize(raw, qtype))


def test_qk_unpermutation_moves_whole_rows_of_blocks():
    import gguf

    w = np.random.default_rng(2).standard_normal((9 * 8, 64)).astype(np.float32)  # 9 heads of 8
    q = QuantTensor("Q8_0", w.shape, gguf.quants.quantize(permute(w, 9, 9), T.Q8_0))
    got = unpermute_qk(q, 9)
    assert isinstance(got, QuantTensor)
    np.testing.assert_array_equal(got.dequantize(), unpermute_qk(q.dequantize(), 9))
    np.testing.assert_array_equal(unpermute_qk(permute(w, 9, 9), 9), w)
    with pytest.raises(InfernoError, match="has 72 rows, not 5 heads of an even size"):
        unpermute_qk(q, 5)


def test_other_types_are_dequantised_with_one_notice(llama_dir, tmp_path, capsys):
    def types(name, w, i):
        if name.endswith("ffn_down.weight"):
            return T.IQ4_NL
        return T.Q8_0 if w.ndim == 2 and w.shape[1] % 32 == 0 else T.F32
    path = write_gguf(llama_dir, tmp_path / "iq4_nl.gguf", types=types)
    checkpoint = open_checkpoint(path)
    notice = capsys.readouterr().err.strip()
    assert notice == (f"note: iq4_nl.gguf: dequantised 2 IQ4_NL tensor(s) to float32 at load; inferno "
                      f"keeps F32, {', '.join(QTYPES)} as stored")
    down = checkpoint.tensors["model.layers.1.mlp.down_proj.weight"]
    assert isinstance(down, np.ndarray) and down.dtype == np.float32 and down.shape == (72, 96)


def test_block_count_must_match_the_blocks_present(llama_dir, tmp_path):
    path = write_gguf(llama_dir, tmp_path / "blocks.gguf")
    data = bytearray(path.read_bytes())
    at = data.index(b"llama.block_count") + len("llama.block_count") + 4  # after the type: the u32
    data[at:at + 4] = (10**9).to_bytes(4, "little")
    path.write_bytes(data)
    with pytest.raises(InfernoError, match="block_count is 1000000000 but the file has tensors for 2 blocks"):
        open_checkpoint(path)


@pytest.fixture(scope="module")
def vocab_meta(llama_dir, tmp_path_factory):
    return read_gguf(write_gguf(llama_dir, tmp_path_factory.mktemp("vocab") / "v.gguf")).metadata


@pytest.mark.parametrize("key, value, message", [
    ("merges", lambda merges: merges + ["zzq qqz"], "the tokenizers library refuses its vocabulary: "),
    ("merges", lambda merges: merges + ["Ġt"], "a merge is not two tokens separated by a space"),
    ("merges", lambda merges: [[1, 2]], "tokenizer.ggml.merges is not a list of str"),
    ("tokens", lambda tokens: [1, 2, 3], "tokenizer.ggml.tokens is not a list of str"),
    ("tokens", lambda tokens: "abc", "tokenizer.ggml.tokens is not a list of str"),
    ("token_type", lambda types: types[:1], "1 token types for 408 tokens"),
    ("chat_template", lambda template: 7, "tokenizer.chat_template is not text"),
    ("pre", lambda pre: [pre], "GGUF pre-tokenizer ['gpt-2'] is not supported"),
])
def test_a_hostile_vocabulary_is_one_inferno_error(vocab_meta, key, value, message):
    """Mutated files once made the tokenizers library raise its own errors (a merge out of the
    vocabulary) and a TypeError (a malformed merge)."""
    meta = dict(vocab_meta)
    key = "tokenizer.chat_template" if key == "chat_template" else f"tokenizer.ggml.{key}"
    meta[key] = value(meta[key])
    with pytest.raises(InfernoError) as e:
        tokenizer_from_gguf(meta, "v.gguf")
    assert message in str(e.value) and str(e.value).startswith("v.gguf: ")
    assert len(str(e.value).splitlines()) == 1


def test_special_token_ids_of_the_wrong_type_are_ignored(vocab_meta):
    meta = {**vocab_meta, "tokenizer.ggml.bos_token_id": "1", "tokenizer.ggml.eos_token_id": 10**12}
    tok = tokenizer_from_gguf(meta, "v.gguf")
    assert "bos_token" not in tok.special_tokens and "eos_token" not in tok.special_tokens
