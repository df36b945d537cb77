"""SentencePiece GGUF vocabularies (tokenizer.ggml.model = llama) against their oracles.

- Gemma 3 270M, the real file, fetched the way a user gets it (`gemma3-270m`, kept in inferno's
  cache): token ids and decoded text equal transformers' tokenizer built from the same GGUF,
  except on runs of more than 31 spaces, where they equal llama.cpp's.
- A tiny Llama-2-style vocabulary trained here with sentencepiece and written as llama.cpp's
  converter writes it: ids equal sentencepiece's own, and transformers' except on a leading space.
Where transformers 5 departs from llama.cpp, inferno follows llama.cpp: see _sentencepiece in
inferno/tokenizers/gguf_tokenizer.py.
Streaming never prints half a character, also where byte fallback spreads one over several tokens.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hf_gguf import one_parse
import tiny_spm
from transformers import AutoTokenizer

import inferno.tokenizers.gguf_tokenizer as G
from inferno.errors import InfernoError
from inferno.formats.gguf_file import read_gguf
from inferno.tokenizers.gguf_tokenizer import tokenizer_from_gguf
from inferno.loading.resolve import resolve

# Not in Gemma's vocabulary: each is its UTF-8 bytes as <0xNN> tokens (3 or 4 of them).
BYTE_FALLBACK = "𠀀𪚥 ꙮ 𓀀 🜁"
FALLBACK_CHARS = BYTE_FALLBACK.replace(" ", "")
HARD = [
    "", " ", "  ", "    four", " leading space", "   three leading", "trailing   ", "a" + " " * 31 + "b",
    "\n", "\n\n\n", "x\n\n\n\n\n\ny", "line one\nline two\r\nthree", "\t\ttabs\tand\t", " \n \n\t ",
    "🙂😀🔥👩‍👩‍👧 emoji", "東京と大阪、北京", "e\u0301 n\u0303 a\u0308 (combining marks)", "Ærø naïve café",
    "12345678901234567890", "3.14159 2,718 1e-10 -42", f"{BYTE_FALLBACK} (byte fallback)",
    "def f(x):\n    return x**2  # comment\n", "Water boils at a temperature of",
]
# Control-token look-alikes: Gemma's own control tokens match whole, the rest is plain text.
LOOKALIKES = ["<start_of_turn>user\nhi<end_of_turn>\n", "<s>", "</s>", "<unk>", "<0x0A>", "<bos>text<eos>",
              "<pad><mask>", "<start_of_turn", "start_of_turn>", "x <s> y", "[multimodal]"]
LONG_SPACES = "a" + " " * 40 + "b"  # longer than Gemma's longest run-of-spaces token (31)
ALPHABET = list("abcXYZ  \n\n\t0123456789.,;!?'\"()<>/") + ["東京", "🙂", "👩‍👩‍👧", "e\u0301", "ß", "€", "  ", *BYTE_FALLBACK]


def mixed_text(n_chars: int, seed: int) -> str:
    """Prose, code and the hard cases, shuffled with random characters: a few thousand chars."""
    rng = random.Random(seed)
    parts = []
    while sum(map(len, parts)) < n_chars:
        parts.append(rng.choice(HARD + tiny_spm.EXTRA) if rng.random() < 0.3
                     else "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 30))))
    return "".join(parts)


def stream(tok, ids) -> list[str]:
    decoder = tok.stream()
    return [decoder.step(i) for i in ids]


# -- Gemma 3 270M ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gemma():
    path = resolve("gemma3-270m")
    ours = tokenizer_from_gguf(read_gguf(path).metadata, path.name)
    with one_parse():
        theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return ours, theirs


@pytest.mark.parametrize("text", HARD + LOOKALIKES)
def test_gemma_ids_match_transformers(gemma, text):
    ours, theirs = gemma
    for special in (True, False):
        assert ours.encode(text, special) == theirs(text, add_special_tokens=special)["input_ids"]
    ids = ours.encode(text)
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    assert ours.decode(ids, skip_special_tokens=False) == "<bos>" + text  # no prefix space, nothing lost


def test_gemma_long_run_of_spaces_splits_as_llama_cpp(gemma):
    """31 + 9 spaces (ids 167, 145), as llama.cpp (llama-cpp-python 0.3.36 on this file) and
    SentencePiece match user-defined tokens; transformers 5 gives 16 + 24."""
    ours, _ = gemma
    assert ours.encode(LONG_SPACES, False) == [ours.hf.token_to_id("a"), 167, 145, ours.hf.token_to_id("b")]
    assert ours.decode(ours.encode(LONG_SPACES)) == LONG_SPACES


def test_gemma_long_mixed_text(gemma):
    ours, theirs = gemma
    text = mixed_text(6000, seed=0)
    ids = ours.encode(text)
    assert ids == theirs(text)["input_ids"]
    assert ours.decode(ids) == text


def test_gemma_specials(gemma):
    ours, _ = gemma
    assert ours.encode("<start_of_turn>user", False) == [105, ours.hf.token_to_id("user")]
    assert ours.encode("x", True)[0] == 2 and ours.special_tokens["bos_token"] == "<bos>"
    assert set(ours.eos_ids) == {1, 106}  # <eos>, and <end_of_turn> as llama.cpp adds it
    assert ours.chat_template is None  # the base model: prompts go in raw


def test_gemma_stream_holds_back_byte_fallback_characters(gemma):
    ours, _ = gemma
    text = f"Runes {BYTE_FALLBACK} and 東京🙂 end"
    ids = ours.encode(text)
    byte_ids = [i for i in ids if ours.hf.id_to_token(i).startswith("<0x")]
    assert len(byte_ids) == len(FALLBACK_CHARS.encode("utf-8"))
    pieces = stream(ours, ids)
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    # Held back until whole: no output for all but the last byte of each such character.
    assert pieces.count("") >= len(FALLBACK_CHARS.encode("utf-8")) - len(FALLBACK_CHARS)


# -- a tiny Llama-2-style vocabulary ---------------------------------------------------------------
@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(ours, transformers', sentencepiece's) for one trained vocabulary, and the GGUF folder."""
    folder = tmp_path_factory.mktemp("spm")
    sp = tiny_spm.train(user_defined=("<|user|>",))
    path = tiny_spm.write_vocab_gguf(sp, folder / "tiny-spm.gguf", user_defined=("<|user|>",))
    ours = tokenizer_from_gguf(read_gguf(path).metadata, path.name)
    theirs = AutoTokenizer.from_pretrained(str(folder), gguf_file=path.name)
    return ours, theirs, sp


PLAIN = HARD + [LONG_SPACES, mixed_text(3000, seed=1)]


@pytest.mark.parametrize("text", PLAIN)
def test_llama_style_ids_match_sentencepiece(llama, text):
    ours, _, sp = llama
    ids = ours.encode(text, False)
    assert ids == sp.encode(text)
    assert ours.encode(text) == [sp.bos_id()] + ids
    assert ours.decode(ids) == text


@pytest.mark.parametrize("text", [t for t in PLAIN if not t.startswith(" ")])
def test_llama_style_ids_match_transformers(llama, text):
    ours, theirs, _ = llama
    for special in (True, False):
        assert ours.encode(text, special) == theirs(text, add_special_tokens=special)["input_ids"]
    ids = ours.encode(text)
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True) == text


def test_llama_style_leading_space_is_kept(llama):
    """SentencePiece's dummy prefix goes before the text's own space: " hi" is "▁▁hi"."""
    ours, _, sp = llama
    assert ours.hf.encode(" Hello", add_special_tokens=False).tokens[0] == "▁▁"
    assert ours.encode(" Hello", False) == sp.encode(" Hello") != ours.encode("Hello", False)


@pytest.mark.parametrize("text", LOOKALIKES + ["x<s> y", "<|user|>hi there", "a</s>b<unk>c"])
def test_llama_style_text_after_a_special_token_starts_afresh(llama, text):
    """llama.cpp's rule: control and user-defined tokens match whole; each stretch of text
    between them is tokenized as a whole input would be, space prefix included."""
    import re
    ours, _, sp = llama
    want = []
    for piece in re.split(r"(<s>|</s>|<unk>|<\|user\|>)", text):
        if piece in ("<s>", "</s>", "<unk>", "<|user|>"):
            want.append(sp.piece_to_id(piece))
        elif piece:
            want += sp.encode(piece)
    assert ours.encode(text, False) == want


def test_llama_style_stream_holds_back_byte_fallback_characters(llama):
    ours, _, _ = llama
    fallback = "ß€ꙮ𓀀"  # 2, 3, 3 and 4 bytes; none of them is in the tiny vocabulary
    text = f"  Two spaces, {fallback[:2]} and {fallback[2:]}."
    ids = ours.encode(text)
    assert sum(ours.hf.id_to_token(i).startswith("<0x") for i in ids) == len(fallback.encode("utf-8"))
    pieces = stream(ours, ids)
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def test_llama_style_flags_are_read(tmp_path):
    """add_bos/add_eos as the file says (transformers agrees); add_space_prefix = false as
    sentencepiece without its dummy prefix."""
    sp = tiny_spm.train()
    path = tiny_spm.write_vocab_gguf(sp, tmp_path / "eos.gguf", add_bos=False, add_eos=True)
    ours = tokenizer_from_gguf(read_gguf(path).metadata, path.name)
    theirs = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    assert ours.encode("Hello world") == theirs("Hello world")["input_ids"] == sp.encode("Hello world") + [sp.eos_id()]

    bare = tiny_spm.train(dummy_prefix=False)
    path = tiny_spm.write_vocab_gguf(bare, tmp_path / "bare.gguf", add_space_prefix=False)
    ours = tokenizer_from_gguf(read_gguf(path).metadata, path.name)
    for text in HARD:
        assert ours.encode(text, False) == bare.encode(text), text
        assert ours.decode(ours.encode(text)) == text


def test_a_vocabulary_without_scores_is_refused():
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "a"]}
    with pytest.raises(InfernoError, match="no score per token"):
        tokenizer_from_gguf(meta, "x.gguf")


# -- the merges kept in inferno's cache -----------------------------------------------------------
def test_merges_are_kept_in_the_cache_and_read_back(tmp_path, monkeypatch):
    """A big vocabulary's merges are computed once and read back from inferno's cache; a cache
    file that is damaged or names tokens out of range is computed around and rewritten."""
    monkeypatch.setenv("INFERNO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(G, "CACHE_MERGES_FROM", 0)  # the tiny vocabulary counts as big
    sp = tiny_spm.train()
    path = tiny_spm.write_vocab_gguf(sp, tmp_path / "v.gguf")
    meta = read_gguf(path).metadata
    tokens, scores = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"]
    vocab = dict(zip(tokens, range(len(tokens))))
    expected = G._merges(tokens, scores, vocab)
    assert len(expected) > 50

    assert G.cached_merges(tokens, scores, vocab) == expected  # computed, then written
    [kept] = (tmp_path / "cache" / "tokenizers").iterdir()
    calls = []
    monkeypatch.setattr(G, "_merges", lambda *a: calls.append(1) or expected)
    assert G.cached_merges(tokens, scores, vocab) == expected and not calls  # read back
    assert tokenizer_from_gguf(meta, path.name).encode("Hello world", False) == sp.encode("Hello world")

    other = list(scores)
    other[5] += 1.0
    G.cached_merges(tokens, other, vocab)  # another vocabulary: another file
    assert len(calls) == 1 and len(list(kept.parent.iterdir())) == 2

    for damage in (b"not an array", np.full((3, 2), len(tokens), np.int32)):
        if isinstance(damage, bytes):
            kept.write_bytes(damage)
        else:
            np.save(kept, damage)
        assert G.cached_merges(tokens, scores, vocab) == expected
    assert len(calls) == 3 and np.load(kept).shape == (len(expected), 2)  # rewritten whole

    monkeypatch.setenv("INFERNO_CACHE", str(path))  # a file, not a folder: nothing can be written
    assert G.cached_merges(tokens, scores, vocab) == expected


def test_gemma_merges_from_the_cache_equal_computed_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERNO_CACHE", str(tmp_path))
    path = resolve("gemma3-270m")
    meta = read_gguf(path).metadata
    tokens, scores = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"]
    assert len(tokens) >= G.CACHE_MERGES_FROM
    vocab = dict(zip(tokens, range(len(tokens))))
    written = G.cached_merges(tokens, scores, vocab)
    assert G.cached_merges(tokens, scores, vocab) == written == G._merges(tokens, scores, vocab)
