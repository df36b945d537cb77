"""Constrained output (inferno/constrain.py) with inferno's own tokenizers, both kinds, as a
folder and as a GGUF gives them: decoding by picking RANDOM allowed tokens must still give text
that parses and validates, and must end with EOS where the grammar ends. Masks are checked
against a brute-force reference, the batch fill against single fills.

The tokenizer fixtures here are shared with test_tools.py.
"""

from __future__ import annotations

import json
import re

import gguf
import jsonschema
import numpy as np
import pytest
import tiny
import tiny_gguf
import tiny_spm

from inferno import constrain as C
from inferno.errors import InfernoError
from inferno.formats.gguf_file import read_gguf
from inferno.tokenizers.gguf_tokenizer import tokenizer_from_gguf
from inferno.tokenizers.tokenizer import Tokenizer

KINDS = ["bpe_folder", "bpe_gguf", "spm_gguf", "spm_folder"]


def make_vocabs(tmp_path_factory) -> dict[str, Tokenizer]:
    """The tokenizer kinds inferno builds: byte-level BPE (SmolLM2, Qwen) from a folder and from
    a GGUF (padded with unused tokens as converters pad it), SentencePiece (Llama 2) from a GGUF
    and as transformers' tokenizer.json has it (a folder's)."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("bpe")
    fast = tiny.make_tokenizer(folder)
    out = {"bpe_folder": Tokenizer.from_folder(folder)}
    w = gguf.GGUFWriter(str(folder / "vocab.gguf"), "llama")
    tiny_gguf._add_tokenizer(w, folder, len(fast) + 8, "gpt-2")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out["bpe_gguf"] = tokenizer_from_gguf(read_gguf(folder / "vocab.gguf").metadata, "bpe")

    spm = tmp_path_factory.mktemp("spm")
    path = tiny_spm.write_vocab_gguf(tiny_spm.train(), spm / "spm.gguf")
    out["spm_gguf"] = tokenizer_from_gguf(read_gguf(path).metadata, "spm")
    theirs = AutoTokenizer.from_pretrained(str(spm), gguf_file=path.name)
    out["spm_folder"] = Tokenizer(theirs.backend_tokenizer, eos_ids=(theirs.eos_token_id,))
    return out


@pytest.fixture(scope="session")
def vocabs(tmp_path_factory) -> dict[str, Tokenizer]:
    return make_vocabs(tmp_path_factory)


@pytest.fixture(scope="session")
def grammars(vocabs) -> dict[str, C.Grammars]:
    # Logits wider than the vocabulary, as padded embeddings make them.
    return {k: C.Grammars(tok, tok.vocab_size + 8) for k, tok in vocabs.items()}


def allowed_ids(mask_row: np.ndarray, vocab: int) -> np.ndarray:
    logits = C.apply_mask(np.zeros(vocab, np.float32), mask_row)
    return np.flatnonzero(np.isfinite(logits))


def random_decode(g: C.Grammars, grammar: C.Grammar, seed: int, prefix=(), limit: int = 4000):
    """Pick uniformly among the allowed tokens until an EOS is picked: (ids, ended with EOS)."""
    rng = np.random.default_rng(seed)
    m, mask, ids = g.matcher(grammar), g.allocate(1), list(prefix)
    for t in prefix:
        m.consume(t)
    while len(ids) < limit:
        C.fill_masks([m], mask)
        allowed = allowed_ids(mask[0], g.vocab_size)
        assert allowed.size, "the grammar allowed nothing"
        t = int(rng.choice(allowed))
        if t in g.eos_ids:
            assert m.is_accepting()
            m.consume(t)  # the matcher takes the EOS it allowed
            return ids, True
        m.consume(t)
        ids.append(t)
    return ids, False


# A pydantic-like schema: nested object, bounded array, enum, Optional, a union, a pattern.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "a b"]},
                 "minItems": 1, "maxItems": 3},
        "nickname": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]},
        "pet": {"anyOf": [
            {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
             "required": ["kind", "lives"], "additionalProperties": False},
            {"type": "object", "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"}},
             "required": ["kind", "good"], "additionalProperties": False}]},
        "address": {"type": "object", "additionalProperties": False, "required": ["city", "zip"],
                    "properties": {"city": {"type": "string", "maxLength": 10},
                                   "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}},
        "score": {"type": "number"},
    },
    "required": ["name", "age", "tags", "nickname", "pet", "address"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("kind", KINDS)
def test_random_decoding_follows_a_json_schema(vocabs, grammars, kind):
    g, tok = grammars[kind], vocabs[kind]
    grammar = g.compile(json_schema=SCHEMA)
    pets = set()
    for seed in range(16):
        ids, ended = random_decode(g, grammar, seed)
        assert ended
        obj = json.loads(tok.decode(ids))
        jsonschema.validate(obj, SCHEMA)
        pets.add(obj["pet"]["kind"])
        if seed >= 5 and len(pets) == 2:
            break
    assert pets == {"cat", "dog"}  # both branches of the union were taken


@pytest.mark.parametrize("kind", KINDS)
def test_gbnf_regex_lark_and_json_object(vocabs, grammars, kind):
    g, tok = grammars[kind], vocabs[kind]
    text = lambda grammar, seed: tok.decode(random_decode(g, grammar, seed)[0])  # noqa: E731
    yes_no = g.compile(grammar='root ::= "yes" | "no"')
    assert {text(yes_no, s) for s in range(12)} == {"yes", "no"}
    gbnf = g.compile(grammar='root ::= item ("," item){0,3}\nitem ::= [0-9]{1,3} | "x"')
    for s in range(4):
        assert re.fullmatch(r"([0-9]{1,3}|x)(,([0-9]{1,3}|x)){0,3}", text(gbnf, s))
    regex = g.compile(regex=r"(ab|cd){2,4}!")
    for s in range(4):
        assert re.fullmatch(r"(ab|cd){2,4}!", text(regex, s))
    lark = g.compile(lark='start: "ok " NUM\nNUM: /[1-9][0-9]?/')
    assert re.fullmatch(r"ok [1-9][0-9]?", text(lark, 0))
    any_object = g.compile(json_object=True)
    for s in range(4):
        assert isinstance(json.loads(text(any_object, s)), dict)


@pytest.mark.parametrize("kind", KINDS)
def test_a_fenced_json_schema_reply_validates_once_unfenced(vocabs, grammars, kind):
    """fence=True: random replies come bare or inside a ```json fence (both are taken), and
    without the fence every one parses and validates; a ```python fence is refused."""
    g, tok = grammars[kind], vocabs[kind]
    grammar = g.compile(json_schema=SCHEMA, fence=True)
    assert grammar.fenced and grammar is not g.compile(json_schema=SCHEMA)
    shapes = set()
    for seed in range(40):
        ids, ended = random_decode(g, grammar, seed)
        assert ended
        text = tok.decode(ids)
        shapes.add(text.startswith("```json"))
        jsonschema.validate(json.loads(C.unfence(text)), SCHEMA)
        if len(shapes) == 2 and seed >= 5:
            break
    assert shapes == {True, False}
    m = g.matcher(grammar)
    with pytest.raises(InfernoError):
        for t in tok.encode("```python", add_special_tokens=False):
            m.consume(t)
    assert not g.compile(regex="a+", fence=True).fenced  # only JSON is fenced


FENCED = [
    ('```json\n{"a": "x ``` y", "b": [1, 2]}\n```', '{"a": "x ``` y", "b": [1, 2]}'),
    ('```json {\n  "a": 1\n}```', '{\n  "a": 1\n}'),
    ('{"a": "`"}', '{"a": "`"}'),
    ('{"a": 1}', '{"a": 1}'),
    ('```json\n{"a": "cut here  `', '{"a": "cut here  `'),  # cut by max_tokens: the text as it came
    ('```json\n{"a": "cut ```', '{"a": "cut ```'),  # backticks in a string, not a fence
    ('```json\n{"a": 1}\n``', '{"a": 1}'),  # cut inside the closing fence
    ('```js', ''),  # cut inside the opening: nothing of it
    ('', ''),
]


@pytest.mark.parametrize("text,want", FENCED)
def test_unfence_streams_what_it_gives_whole(text, want):
    """Any cutting of the stream gives the whole text's unfencing, and never sends fence."""
    assert C.unfence(text) == want
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            u = C.Unfence()
            sent = [u.feed(text[:i]), u.feed(text[i:j]), u.feed(text[j:]), u.finish()]
            assert "".join(sent) == want, (i, j, sent)
            assert not "".join(sent[:3]).startswith("`")


def test_eos_is_the_only_way_out_once_complete(vocabs):
    tok = vocabs["bpe_folder"]
    eos = (tok.hf.token_to_id("<|im_end|>"), tok.hf.token_to_id("<|endoftext|>"))  # two, as Qwen has
    g = C.Grammars(tok, tok.vocab_size, eos_ids=eos)
    mask = g.allocate(1)

    m = g.matcher(g.compile(regex="yes|no"))
    for t in tok.encode("yes", add_special_tokens=False):
        m.consume(t)
    m.fill(mask)
    assert m.is_stopped() and m.is_accepting()
    assert set(allowed_ids(mask[0], g.vocab_size)) == set(eos)
    m.consume(eos[1])  # either EOS is taken

    m = g.matcher(g.compile(regex="a+"))  # complete, but more may follow
    m.consume(tok.encode("a", add_special_tokens=False)[0])
    m.fill(mask)
    allowed = set(allowed_ids(mask[0], g.vocab_size))
    assert m.is_accepting() and not m.is_stopped()
    assert set(eos) < allowed and tok.encode("a", add_special_tokens=False)[0] in allowed
    m.consume(eos[0])
    assert m.is_stopped()

    m = g.matcher(g.compile(regex="a+"))
    m.fill(mask)
    assert not set(eos) & set(allowed_ids(mask[0], g.vocab_size))  # nothing yet: no EOS
    with pytest.raises(InfernoError, match="not allowed by the grammar"):
        m.consume(eos[0])


def test_a_disallowed_token_raises_and_its_row_then_allows_only_eos(vocabs, grammars):
    g, tok = grammars["bpe_folder"], vocabs["bpe_folder"]
    m = g.matcher(g.compile(json_schema={"type": "integer"}))
    with pytest.raises(InfernoError, match="not allowed by the grammar"):
        m.consume(tok.encode("x", add_special_tokens=False)[0])
    assert m.error and m.is_stopped()
    mask = g.allocate(2)
    C.fill_masks([None, m], mask)
    assert (mask[0] == -1).all()
    assert set(allowed_ids(mask[1], g.vocab_size)) == set(g.eos_ids)


@pytest.mark.parametrize("kwargs, words", [
    (dict(json_schema={"type": "nonsense"}), ["json_schema", "nonsense"]),
    (dict(json_schema='{"type": "object",'), ["json_schema", "not valid JSON"]),
    (dict(json_schema=[1, 2]), ["json_schema", "JSON object"]),
    (dict(json_schema={"type": "string", "pattern": "(?<=a)b"}), ["json_schema", "look-around"]),
    (dict(json_schema={"$ref": "#/$defs/missing"}), ["json_schema", "missing"]),
    (dict(json_schema={"type": "string", "format": "bogus"}), ["json_schema", "bogus"]),
    (dict(grammar="root ::= item\n"), ["grammar", "item"]),  # an undefined rule
    (dict(grammar='root ::= ("a" | "b"'), ["grammar"]),  # unbalanced
    (dict(regex="a(b"), ["regex", "unclosed group"]),
    (dict(lark="start: foo"), ["lark", "foo"]),
    (dict(regex="a", grammar='root ::= "a"'), ["one constraint"]),
    (dict(), ["one constraint", "none"]),
])
def test_bad_constraints_are_clear_errors(grammars, kwargs, words):
    with pytest.raises(InfernoError) as e:
        grammars["bpe_folder"].compile(**kwargs)
    for w in words:
        assert w in str(e.value)
    assert "\n" not in str(e.value)
    assert set(e.value.params) <= {"json_schema", "grammar", "regex", "lark", "json_object"}


def test_compiled_grammars_are_cached(grammars):
    g = grammars["bpe_folder"]
    assert g.compile(json_schema=SCHEMA) is g.compile(json_schema=json.dumps(SCHEMA))


def reference_mask(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    out = logits.copy()
    for i in range(logits.shape[-1]):
        word = i // 32
        bit = word < mask.shape[-1] and (int(mask[..., word]) >> (i % 32)) & 1
        if not bit:
            out[..., i] = -np.inf
    return out


@pytest.mark.parametrize("vocab, words", [(100, 4), (100, 2), (50, 3), (64, 2), (33, 1), (1, 1)])
def test_apply_mask_equals_the_bit_by_bit_reference(vocab, words):
    rng = np.random.default_rng(vocab + words)
    for _ in range(5):
        logits = rng.standard_normal(vocab).astype(np.float32)  # [vocab]
        mask = rng.integers(-2**31, 2**31, size=words, dtype=np.int64).astype(np.int32)  # [words]
        mask[0] |= np.int32(-2**31)  # bit 31, the sign bit, set in some word
        got = C.apply_mask(logits, mask)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, reference_mask(logits, mask))
    batch = rng.standard_normal((3, vocab)).astype(np.float32)  # [3, vocab]
    masks = rng.integers(-2**31, 2**31, size=(3, words), dtype=np.int64).astype(np.int32)  # [3, words]
    np.testing.assert_array_equal(C.apply_mask(batch, masks),
                                  np.stack([reference_mask(b, m) for b, m in zip(batch, masks)]))


def test_fill_masks_for_a_batch_equals_one_fill_each(vocabs, grammars):
    g, tok = grammars["spm_gguf"], vocabs["spm_gguf"]
    rng = np.random.default_rng(0)
    matchers = []
    for grammar, steps in [(g.compile(json_schema=SCHEMA), 0), (g.compile(json_schema=SCHEMA), 7),
                           (g.compile(json_object=True), 3), (g.compile(regex="[a-z]+ [0-9]+"), 2),
                           (g.compile(grammar='root ::= "yes" | "no"'), 1)]:
        m, mask = g.matcher(grammar), g.allocate(1)
        for _ in range(steps):  # each to its own place in its grammar
            m.fill(mask)
            allowed = [t for t in allowed_ids(mask[0], g.vocab_size) if t not in g.eos_ids]
            m.consume(int(rng.choice(allowed)))
        matchers.append(m)
    batch = g.allocate(len(matchers) + 1)
    batch[-1] = 0
    C.fill_masks(matchers + [None], batch)
    for i, m in enumerate(matchers):
        one = g.allocate(1)
        m.fill(one)
        np.testing.assert_array_equal(batch[i], one[0])
    assert (batch[-1] == -1).all()
    assert batch.shape == (len(matchers) + 1, (tok.vocab_size + 8 + 31) // 32)


@pytest.mark.parametrize("kind", ["bpe_folder", "spm_gguf"])
def test_ids_past_the_vocabulary_are_never_allowed(vocabs, kind):
    tok = vocabs[kind]
    g = C.Grammars(tok, tok.vocab_size + 40)
    m, mask = g.matcher(g.compile(json_object=True)), g.allocate(1)
    rng = np.random.default_rng(1)
    for _ in range(30):
        m.fill(mask)
        allowed = allowed_ids(mask[0], g.vocab_size)
        assert allowed.max() < tok.vocab_size
        t = int(rng.choice(allowed))
        if t in g.eos_ids:
            break
        m.consume(t)
    # Logits narrower than the mask (a tokenizer with more ids than the model): cut to the width.
    assert C.apply_mask(np.zeros(10, np.float32), mask[0]).shape == (10,)


def test_special_tokens_are_the_added_ones_llguidance_treats_whole(vocabs, grammars):
    assert {"<|im_end|>", "<|im_start|>"} <= set(grammars["bpe_folder"].special_tokens)
    assert {"<s>", "</s>"} <= set(grammars["spm_gguf"].special_tokens)
    im_end = vocabs["bpe_folder"].hf.token_to_id("<|im_end|>")
    assert grammars["bpe_folder"].special_tokens["<|im_end|>"] == im_end


# -- the defaults: closed objects, bounded numbers, bounded whitespace ------------------------------
def test_json_defaults_close_objects_and_bound_numbers():
    pydantic_like = {  # as City.model_json_schema() writes it: no additionalProperties
        "type": "object", "title": "City",
        "properties": {"name": {"type": "string"}, "population": {"type": "integer"},
                       "area": {"type": "number"}, "mayor": {"$ref": "#/$defs/Person"},
                       "tags": {"type": "array", "items": {"type": "object", "properties": {"t": {"type": "string"}}}},
                       "rank": {"type": "integer", "minimum": 1},
                       "share": {"anyOf": [{"type": "number", "multipleOf": 0.5}, {"type": "null"}]},
                       "open": {"type": "object", "properties": {"x": {"type": "boolean"}},
                                "additionalProperties": True},
                       "level": {"type": "integer", "enum": [1, 2]}},
        "required": ["name"],
        "$defs": {"Person": {"properties": {"first": {"type": "string"}},
                             "allOf": [{"properties": {"last": {"type": "string"}}}]}},
    }
    got = C.json_defaults(pydantic_like)
    assert pydantic_like["properties"]["population"] == {"type": "integer"}  # not changed in place
    assert got["additionalProperties"] is False
    # properties beside an allOf: a composition, each part listing some keys: left open
    assert "additionalProperties" not in got["$defs"]["Person"]
    assert "additionalProperties" not in got["$defs"]["Person"]["allOf"][0]
    assert got["properties"]["tags"]["items"]["additionalProperties"] is False
    assert got["properties"]["open"]["additionalProperties"] is True  # said open: stays open
    b = 10**16 - 1
    assert got["properties"]["population"] == {"type": "integer", "minimum": -b, "maximum": b}
    assert got["properties"]["area"] == {"type": "number", "minimum": -b, "maximum": b, "multipleOf": 1e-10}
    assert got["properties"]["rank"] == {"type": "integer", "minimum": 1, "maximum": 1 + b}  # its bound kept
    assert got["properties"]["share"]["anyOf"][0]["multipleOf"] == 0.5
    assert got["properties"]["level"] == {"type": "integer", "enum": [1, 2]}  # an enum is bounded


@pytest.mark.parametrize("kind", KINDS[:2])
def test_an_object_that_omits_additional_properties_ends(vocabs, grammars, kind):
    """Uniform random decoding under the pydantic form of a schema (no additionalProperties):
    every reply ends, with only the listed keys and numbers of at most 16 digits, and the
    whitespace between tokens is compact or an indent."""
    g, tok = grammars[kind], vocabs[kind]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "number"},
                                               "c": {"type": "object", "properties": {"d": {"type": "integer"}}}},
              "required": ["a", "b", "c"]}
    grammar = g.compile(json_schema=schema)
    for seed in range(8):
        ids, ended = random_decode(g, grammar, seed)
        text = tok.decode(ids)
        obj = json.loads(text)
        assert ended and set(obj) == {"a", "b", "c"} and set(obj["c"]) <= {"d"}
        assert abs(obj["a"]) < 1e16 and abs(obj["b"]) < 1e16
        for gap in re.findall(r'[{}\[\],:]([ \t\n\r]+)["{\[0-9tfn-]', text):
            assert gap == " " or re.fullmatch(r"\n{1,2}[ \t]{0,20}", gap), repr(gap)


def test_json_object_bounds_its_numbers(vocabs, grammars):
    g, tok = grammars["bpe_folder"], vocabs["bpe_folder"]
    m = g.compile(json_object=True).matcher()
    for t in tok.encode('{"a": [1, 2.5, {"b": ' + "9" * 16, add_special_tokens=False):
        m.consume(t)
    with pytest.raises(InfernoError, match="not allowed"):  # a 17th digit
        for t in tok.encode("9", add_special_tokens=False):
            m.consume(t)


@pytest.mark.parametrize("schema,instance", [
    # compositions: each part lists only some keys, so none is closed
    ({"$defs": {"A": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                "B": {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}},
      "allOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}]}, '{"a": 1, "b": 2}'),
    ({"$defs": {"Base": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}},
      "allOf": [{"$ref": "#/$defs/Base"}, {"properties": {"name": {"type": "string"}}, "required": ["name"]}]},
     '{"id": 1, "name": "x"}'),
    ({"type": "object", "properties": {"kind": {"type": "string"}}, "required": ["kind"],
      "anyOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]}, '{"kind": "x", "a": 1}'),
    ({"$defs": {"A": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}},
      "$ref": "#/$defs/A", "properties": {"b": {"type": "integer"}}}, '{"a": 1, "b": 2}'),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]}, '{"a": 1, "b": 2}'),
    # bounds the schema gives are kept, the missing one placed beside them
    ({"type": "integer", "minimum": 10**17}, str(10**17 + 5)),
    ({"type": "integer", "exclusiveMinimum": 10**16 - 1}, str(10**16 + 3)),
    ({"type": "number", "minimum": 0, "exclusiveMinimum": True}, "1.5"),  # draft 4
], ids=["allOf-refs", "allOf-ref-and-part", "properties-and-anyOf", "sibling-ref", "required-unlisted",
        "minimum-past-the-default", "exclusive-minimum", "draft4-exclusive"])
def test_json_defaults_keep_valid_schemas_satisfiable(vocabs, grammars, schema, instance):
    """What the schema allows as written stays allowed: the defaults only close objects and bound
    numbers where the schema leaves them open."""
    g, tok = grammars["bpe_folder"], vocabs["bpe_folder"]
    m = g.compile(json_schema=schema).matcher()
    for t in tok.encode(instance, add_special_tokens=False):
        m.consume(t)
    assert m.is_accepting()
