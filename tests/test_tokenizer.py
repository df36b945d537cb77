"""Tokenizer, chat template and streaming decode against transformers' tokenizer."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from inferno.tokenizers.tokenizer import Tokenizer

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 東京 🙂"}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "and 3+3?\n  spaced  "}],
]
VARIED = "Café naïve — 東京と大阪 🙂🔥\n\n  def f(x):\n\treturn x**2  # done\n\n\n"


@pytest.fixture(scope="module")
def pair(qwen3_dir):
    return Tokenizer.from_folder(qwen3_dir), AutoTokenizer.from_pretrained(qwen3_dir)


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}, {"enable_thinking": True},
                                    {"add_generation_prompt": False}])
def test_chat_template_matches_transformers(pair, messages, kwargs):
    ours, theirs = pair
    want = theirs.apply_chat_template(messages, tokenize=False, **{"add_generation_prompt": True, **kwargs})
    assert ours.apply_chat_template(messages, **{"add_generation_prompt": True, **kwargs}) == want


def test_chat_prompt_ids_match_transformers(qwen3_dir, pair):
    import inferno
    _, theirs = pair
    engine = inferno.load(qwen3_dir, progress=False)
    messages = CONVERSATIONS[1]
    want = theirs.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                      enable_thinking=False, return_dict=False)
    got = engine.encode_prompt(messages[1]["content"], system=messages[0]["content"], think=False)
    assert got == list(want)


def test_encode_decode_match_transformers(pair):
    ours, theirs = pair
    ids = ours.encode(VARIED)
    assert ids == theirs(VARIED)["input_ids"]
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True) == VARIED


def test_raw_prompt_gets_bos_when_the_tokenizer_adds_it(llama_dir):
    tok = Tokenizer.from_folder(llama_dir)
    ids = tok.encode("hello")
    assert ids[0] == tok.hf.token_to_id("<s>")
    assert ids == AutoTokenizer.from_pretrained(llama_dir)("hello")["input_ids"]


def test_stream_never_splits_a_character(pair):
    """Byte-level tokens split multi-byte characters; the stream holds them back until whole."""
    ours, _ = pair
    ids = ours.encode(VARIED)
    assert len(ids) > len(VARIED.encode("utf-8")) / 4  # the tiny BPE really does split bytes
    stream = ours.stream()
    pieces = [stream.step(i) for i in ids]
    assert "".join(pieces) == VARIED
    assert not any("\ufffd" in p for p in pieces)


def test_eos_ids_include_the_chat_end_token(pair):
    ours, theirs = pair
    assert theirs.convert_tokens_to_ids("<|im_end|>") in ours.eos_ids


def test_a_template_that_refuses_the_messages_is_a_clear_error(pair):
    from inferno.errors import InfernoError
    ours, _ = pair
    strict = Tokenizer(ours.hf, chat_template="{{ raise_exception('System role not supported') }}")
    with pytest.raises(InfernoError, match="System role not supported"):
        strict.apply_chat_template([{"role": "system", "content": "x"}])
