"""EmbeddingGemma's shape: Gemma 3 with bidirectional attention (every position sees the whole
text, a sliding window on both sides), mean pooling, two Dense layers and Normalize, as
sentence-transformers saves it. A tiny random one against sentence-transformers, on every
backend, whole and cut into the loop's chunks, in process and through the server; and what such
a model refuses (it generates nothing)."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import torch

import inferno
from inferno.errors import InfernoError
from inferno.serve.app import ServerConfig, build_app

from test_embeddings import TEXT_ONLY, cosine_gap
from test_serve import running, wait_healthy
from tiny import make_model
from tiny_gguf import write_gguf

# The second text is longer than the window on either side (sliding_window 8: |p - j| < 5)
# and than the chunk the loop is given below.
TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog " * 3, "a", "lazy dog and fox " * 5]


@pytest.fixture(scope="module")
def gemma_st(tmp_path_factory):
    """(folder, SentenceTransformer): a 2-layer bidirectional Gemma 3 (one windowed layer, one
    global), then Pooling (mean), Dense 64 -> 128 -> 64 without bias or activation, Normalize:
    EmbeddingGemma's modules."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling
    root = tmp_path_factory.mktemp("embeddinggemma")
    body = make_model(root / "body", "gemma3", hidden=64, heads=4, kv_heads=1, head_dim=32, tied=True,
                      use_bidirectional_attention=True, sliding_window=8,
                      layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=32)
    torch.manual_seed(1)
    modules = [Transformer(str(body), **TEXT_ONLY), Pooling(64, "mean"),
               Dense(64, 128, bias=False, activation_function=torch.nn.Identity()),
               Dense(128, 64, bias=False, activation_function=torch.nn.Identity()), Normalize()]
    st = SentenceTransformer(modules=modules, device="cpu")
    st.save(str(root / "st"))
    return root / "st", st


@pytest.fixture(scope="module")
def gemma_gguf(gemma_st):
    """The same model as llama.cpp's converter writes it with --sentence-transformers-dense-modules:
    architecture gemma-embedding, mean pooling (1), the Dense matrices as dense_2 and dense_3."""
    folder, st = gemma_st
    dense = [m.linear.weight.detach().numpy() for m in st if type(m).__name__ == "Dense"]
    return write_gguf(folder.parent / "body", folder.parent / "embeddinggemma.gguf", arch="gemma-embedding",
                      pooling=1, extra={"dense_2.weight": dense[0], "dense_3.weight": dense[1]})


def test_the_window_is_on_both_sides(gemma_st):
    """transformers halves the window of a bidirectional Gemma 3 (|p - j| < 8 // 2 + 1)."""
    from inferno.model.config import ModelConfig
    cfg = ModelConfig.from_hf(json.loads((gemma_st[0] / "config.json").read_text()))
    assert cfg.bidirectional and cfg.layer_windows == (5, 0)


@pytest.mark.parametrize("backend", ["cpu", "simd", "pool", "torch"])
def test_vectors_match_sentence_transformers(gemma_st, backend):
    folder, st = gemma_st
    want = st.encode(TEXTS, convert_to_numpy=True)
    with inferno.load(str(folder), backend=backend, progress=False) as engine:
        got = engine.embed(TEXTS)
    assert got.shape == want.shape
    assert cosine_gap(got, want).max() < 1e-4


@pytest.mark.parametrize("backend", ["cpu", "pool"])
def test_the_gguf_gives_the_same_vectors(gemma_st, gemma_gguf, backend):
    """llama.cpp's gemma-embedding: its window is |p - j| <= sliding_window / 2 (the file holds
    8, as the folder's config.json), the windowed layers as the file's pattern says."""
    folder, st = gemma_st
    want = st.encode(TEXTS, convert_to_numpy=True)
    with inferno.load(str(gemma_gguf), backend=backend, progress=False) as engine:
        assert engine.config.bidirectional and engine.config.layer_windows == (5, 0)
        assert engine.embedding.pooling == "mean" and len(engine.embedding.dense) == 2
        got = engine.embed(TEXTS)
    assert cosine_gap(got, want).max() < 1e-4


def test_a_text_is_never_cut_into_chunks(gemma_st, monkeypatch):
    """The loop cuts prompts into chunks of UBATCH tokens; a text of a bidirectional model goes
    through whole (its early rows see its late ones), here in a loop of 4-token chunks, beside
    the other texts or in a step of its own."""
    import inferno.engine
    folder, st = gemma_st
    want = st.encode(TEXTS, convert_to_numpy=True)
    monkeypatch.setattr(inferno.engine, "UBATCH", 4)
    with inferno.load(str(folder), backend="pool", progress=False) as engine:
        got = engine.embed(TEXTS)
    assert cosine_gap(got, want).max() < 1e-4


def test_it_generates_nothing(gemma_st):
    with inferno.load(str(gemma_st[0]), backend="cpu", progress=False) as engine:
        with pytest.raises(InfernoError, match="attends both ways.*embeds texts"):
            engine.generate("hello", max_tokens=4)


def test_the_server_embeds_and_refuses_a_chat(gemma_st):
    folder, st = gemma_st
    want = st.encode(TEXTS, convert_to_numpy=True)
    app = build_app(ServerConfig(model=str(folder), model_id="emb", parallel=2, ctx_size=128))
    with running(app) as url:
        wait_healthy(url)
        r = httpx.post(url + "/v1/embeddings", json={"model": "emb", "input": TEXTS})
        assert r.status_code == 200, r.text
        got = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
        assert cosine_gap(got, want).max() < 1e-4
        r = httpx.post(url + "/v1/chat/completions",
                       json={"model": "emb", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 400 and "attends both ways" in r.text, r.text
