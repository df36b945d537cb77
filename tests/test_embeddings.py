"""Embeddings (inferno/embedding.py): engine.embed, `inferno embed` and /v1/embeddings, against
sentence-transformers and transformers on tiny random Qwen3 models saved as embedding models
(one per pooling kind), and the pooling read from a sentence-transformers folder or a GGUF."""

from __future__ import annotations

import base64
import json

import numpy as np
import openai
import pytest
import torch

import inferno
from inferno.errors import InfernoError
from inferno.serve.app import ServerConfig, build_app

from test_serve import running, wait_healthy
from tiny_gguf import write_gguf

TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog " * 3, "a"]
TEXT_ONLY = {"modality_config": {"text": {"method": "forward", "method_output_name": "last_hidden_state"}},
             "module_output_name": "token_embeddings"}
ST_MODES = {"last": "lasttoken", "mean": "mean", "cls": "cls"}


def save_st(qwen3_dir, out, mode: str, *, message: bool = False, dense: bool = False, matryoshka=None):
    """The tiny Qwen3 saved by sentence-transformers as an embedding model: its base model,
    then Pooling (`mode`), a Dense layer (Tanh, 64 -> 32) if asked, Normalize. sentence-
    transformers 6 renders texts through the chat template unless the text modality is pinned,
    as it is for folders saved before it (`message` False)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling
    torch.manual_seed(0)
    body = Transformer(str(qwen3_dir), **({} if message else TEXT_ONLY))
    modules = [body, Pooling(64, mode)]
    if dense:
        modules.append(Dense(64, 32, activation_function=torch.nn.Tanh()))
    st = SentenceTransformer(modules=modules + [Normalize()], device="cpu")
    st.save(str(out))
    if matryoshka is not None:
        config = json.loads((out / "config.json").read_text())
        config["matryoshka_dimensions"] = matryoshka
        (out / "config.json").write_text(json.dumps(config))
    return st


@pytest.fixture(scope="module")
def st_models(qwen3_dir, tmp_path_factory):
    """name -> (folder, its SentenceTransformer)."""
    root = tmp_path_factory.mktemp("st")
    out = {p: (root / p, save_st(qwen3_dir, root / p, m)) for p, m in ST_MODES.items()}
    out["message"] = (root / "message", save_st(qwen3_dir, root / "message", "lasttoken", message=True))
    out["dense"] = (root / "dense", save_st(qwen3_dir, root / "dense", "mean", dense=True, matryoshka=[8, 16, 32]))
    return out


@pytest.fixture(scope="module")
def engines(st_models):
    cache = {}

    def get(name, backend="pool"):
        if (name, backend) not in cache:
            cache[name, backend] = inferno.load(str(st_models[name][0]), backend=backend, progress=False)
        return cache[name, backend]
    yield get
    for e in cache.values():
        e.close()


def cosine_gap(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return 1 - (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


# -- fidelity -------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["cpu", "simd", "pool", "torch"])
@pytest.mark.parametrize("name", ["last", "mean", "cls", "message", "dense"])
def test_vectors_match_sentence_transformers(st_models, engines, name, backend):
    folder, st = st_models[name]
    want = st.encode(TEXTS, convert_to_numpy=True)
    got = engines(name, backend).embed(TEXTS)
    assert got.shape == want.shape and got.dtype == np.float32
    assert cosine_gap(got, want).max() < 1e-4
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-6)


@pytest.mark.parametrize("pooling", ["last", "mean", "cls", "none"])
def test_pooling_matches_transformers_hidden_states(st_models, engines, pooling):
    """Each pooling over transformers' own last hidden states, unnormalised; the flag
    overrides what the folder says (its Pooling module is last-token)."""
    from transformers import AutoModel
    engine = engines("last")
    model = AutoModel.from_pretrained(str(st_models["last"][0]), dtype=torch.float32).eval()
    for text in TEXTS:
        ids = engine.embed_ids(text)[0]
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0].numpy()
        want = {"last": hidden[-1], "mean": hidden.mean(0), "cls": hidden[0], "none": hidden}[pooling]
        got = engine.embed(text, pooling=pooling, normalize=False)
        got = got[0] if pooling == "none" else got
        assert got.shape == (len(ids), 64) if pooling == "none" else got.shape == (1, 64)
        assert cosine_gap(got.reshape(-1, 64), want.reshape(-1, 64)).max() < 1e-4
        assert np.allclose(got.reshape(want.shape), want, atol=2e-3 * np.abs(want).max())


def test_pooling_and_sizes_are_read_from_the_files(st_models, engines, qwen3_dir, tmp_path):
    assert engines("mean").embedding.pooling == "mean" and engines("cls").embedding.pooling == "cls"
    assert engines("message").embedding.as_message and not engines("last").embedding.as_message
    dense = engines("dense").embedding
    assert dense.dimensions == (8, 16, 32) and [d.weight.shape for d in dense.dense] == [(32, 64)]
    for value, name in [(1, "mean"), (2, "cls"), (3, "last"), (0, "none")]:
        path = write_gguf(qwen3_dir, tmp_path / f"p{value}.gguf", pooling=value)
        engine = inferno.load(str(path), backend="cpu", progress=False)
        assert engine.embedding.pooling == name and engine.embedding_note is None
        engine.close()
    with pytest.raises(InfernoError, match="pooling_type 4"):
        inferno.load(str(write_gguf(qwen3_dir, tmp_path / "rank.gguf", pooling=4)), backend="cpu", progress=False)


def test_a_chat_model_embeds_with_a_note(qwen3_dir):
    engine = inferno.load(str(qwen3_dir), backend="pool", progress=False)
    try:
        assert engine.embedding.pooling is None and "not an embedding model" in engine.embedding_note
        v = engine.embed(TEXTS)
        assert v.shape == (3, 64) and engine.embedder().pooling == "last"
    finally:
        engine.close()


# -- the loop: chunks, batches and cached prefixes do not change a vector's bits ------------------
@pytest.mark.parametrize("name", ["last", "mean", "cls"])
def test_the_same_bits_whatever_the_chunks_company_and_cache(engines, name):
    from inferno.serve.batch import BatchEngine
    engine = engines(name)
    long_text = " ".join(f"w{i}" for i in range(40))
    alone = engine.embed([long_text, TEXTS[0]])
    with BatchEngine(engine, parallel=3, ctx_size=512, chunk=7) as batch:
        embedder = engine.embedder()
        ids = engine.embed_ids([TEXTS[1], long_text, TEXTS[0]])
        chat = batch.submit(engine.encode_prompt("Hi"), inferno.sequence.Options(max_tokens=8))
        first = sorted(batch.embed(ids, embedder), key=lambda ev: ev.index)
        again = sorted(batch.embed(ids[1:], embedder), key=lambda ev: ev.index)  # its slots hold these texts now
        list(chat)
    assert np.array_equal(first[1].embedding, alone[0]) and np.array_equal(first[2].embedding, alone[1])
    assert np.array_equal(again[0].embedding, alone[0]) and np.array_equal(again[1].embedding, alone[1])
    cached = sum(ev.cached_tokens for ev in again)
    assert cached > 0 if name == "last" else cached == 0  # only the last row's pooling reuses a prefix


# -- options and errors ---------------------------------------------------------------------------
def test_dimensions_truncate_then_normalise(st_models, engines):
    engine = engines("dense")
    full = engine.embed(TEXTS, normalize=False)
    short = engine.embed(TEXTS, dimensions=16)
    want = full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True)
    assert short.shape == (3, 16) and np.allclose(short, want, atol=1e-6)
    with pytest.raises(InfernoError, match="one of the model's sizes"):
        engine.embed(TEXTS, dimensions=12)
    with pytest.raises(InfernoError, match="not trained to be truncated"):
        engines("mean").embed(TEXTS, dimensions=16)


@pytest.mark.parametrize("inputs,match", [([], "give 1 to 2048"), (["ok", ""], "input 1 is empty"),
                                          ([[1, 2, 10**6]], "out of range")])
def test_bad_inputs_are_refused(engines, inputs, match):
    with pytest.raises(InfernoError, match=match):
        engines("mean").embed(inputs)


def test_a_text_over_the_context_and_an_unknown_pooling(engines):
    engine = engines("mean")
    with pytest.raises(InfernoError, match="input 0 has .* more than the context of 16"):
        engine.embed(" ".join(["word"] * 40), ctx_size=16)
    with pytest.raises(InfernoError, match="unknown pooling 'max'"):
        engine.embed("x", pooling="max")


# -- the server and the CLI -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(st_models):
    app = build_app(ServerConfig(model=str(st_models["dense"][0]), model_id="emb", parallel=2, ctx_size=256))
    with running(app) as url:
        wait_healthy(url)
        yield url, app.state.inferno.batch.engine


def test_the_openai_client_gets_floats_and_base64(server):
    url, engine = server
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    res = client.embeddings.create(model="emb", input=TEXTS)
    got = np.array([d.embedding for d in res.data], np.float32)
    assert [d.index for d in res.data] == [0, 1, 2] and np.array_equal(got, engine.embed(TEXTS))
    assert res.usage.prompt_tokens == res.usage.total_tokens == sum(map(len, engine.embed_ids(TEXTS)))
    raw = client.embeddings.with_raw_response.create(model="emb", input="hello world", encoding_format="base64",
                                                     dimensions=8).http_response.json()
    vec = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), "<f4")
    assert np.array_equal(vec, engine.embed("hello world", dimensions=8)[0])
    ids = engine.embed_ids("hello world")[0]
    assert client.embeddings.create(model="emb", input=ids).data[0].embedding == got[0].tolist()


@pytest.mark.parametrize("body,param", [({"input": []}, "input"), ({"input": ""}, "input"),
                                        ({"input": "x", "dimensions": 5}, "dimensions"),
                                        ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
                                        ({"input": "x " * 300}, "input")])
def test_bad_embedding_requests_are_400s(server, body, param):
    import httpx
    r = httpx.post(server[0] + "/v1/embeddings", json={"model": "emb", **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_a_chat_models_server_embeds_only_when_asked(qwen3_dir):
    import httpx
    for embeddings, status in [(False, 400), (True, 200)]:
        app = build_app(ServerConfig(model=str(qwen3_dir), model_id="chat", embeddings=embeddings,
                                     pooling="mean", parallel=1, ctx_size=128))
        with running(app) as url:
            wait_healthy(url)
            r = httpx.post(url + "/v1/embeddings", json={"model": "chat", "input": "hello"})
            assert r.status_code == status, r.text
            if status == 400:
                assert r.json()["error"]["code"] == "embeddings_disabled" and "--embeddings" in r.text
            else:
                engine = app.state.inferno.batch.engine
                assert np.array_equal(np.float32(r.json()["data"][0]["embedding"]), engine.embed("hello", pooling="mean")[0])


def test_inferno_embed_prints_a_vector_per_line(st_models, engines, capsys, monkeypatch):
    from inferno.cli import main
    import io
    monkeypatch.setattr("sys.stdin", io.StringIO("hello world\na\n"))
    assert main(["embed", "-m", str(st_models["mean"][0]), "-b", "pool", "-"]) == 0
    out, err = capsys.readouterr()
    rows = [json.loads(line) for line in out.splitlines()]
    assert np.array_equal(np.float32(rows), engines("mean").embed(["hello world", "a"]))
    assert "2 texts" in err and "mean pooling" in err


def test_serve_refuses_pooling_none_before_it_loads(capsys):
    from inferno.cli import main
    assert main(["serve", "--pooling", "none", "--embeddings"]) != 0
    assert "--pooling none gives a vector per token" in capsys.readouterr().err


def test_a_text_of_exactly_the_slot_and_too_many_texts(engines):
    """An embedding needs its prompt's positions only (it samples nothing): a text as long as
    a slot fits. A request of more texts than the server runs and queues is refused whole."""
    from inferno.serve.batch import BatchEngine
    engine = engines("mean")
    ids = engine.embed_ids(" ".join(["word"] * 20))[0][:16]
    with BatchEngine(engine, parallel=2, ctx_size=16, queue_limit=3) as batch:
        (event,) = list(batch.embed([ids], engine.embedder()))
        assert np.array_equal(event.embedding, engine.embed([ids])[0])
        with pytest.raises(InfernoError, match="6 texts in one request is more than"):
            batch.embed([ids[:4]] * 6, engine.embedder())
        assert [e.finish_reason for e in batch.embed([ids[:4]] * 5, engine.embedder())] == ["stop"] * 5
