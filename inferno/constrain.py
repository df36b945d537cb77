"""Constrained output: JSON schemas, grammars and regexes turned into token masks by llguidance.

One `Grammars` per engine holds llguidance's view of the tokenizer (its token trie, built once
from the `tokenizers` JSON, for byte-level BPE and SentencePiece alike). `compile` checks and
compiles a request's constraint once; each sequence gets a `Matcher`, which follows the tokens
sampled. Per decode step the sampler fills one bitmask row per sequence (`fill_masks`, the whole
batch in one call into llguidance's thread pool), and sets disallowed logits to -inf
(`apply_mask`). A mask is int32 words, bit i of the array = token i allowed.

EOS: llguidance knows the model's eos ids, so the mask allows them exactly when the grammar may
end, and only them once it must end (`is_stopped`); consuming an allowed EOS is accepted.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache, cached_property
from typing import TYPE_CHECKING

import numpy as np

from inferno.errors import InfernoError, one_line

if TYPE_CHECKING:  # the library itself loads on first use (_llguidance)
    import llguidance as llg

# JSON whitespace, where JSON allows it: none, one space, or one or two newlines and an indent of
# up to 20 spaces or tabs (llama.cpp's schema converter's rule): compact or pretty-printed JSON.
# Unbounded, a weak model can fill its whole budget with whitespace inside a constrained object.
JSON_OPTIONS = {"whitespace_pattern": r"(?: |\n{1,2}[ \t]{0,20})"}

# Numbers a schema leaves unbounded: at most 16 digits before the point, as llama.cpp's schema
# converter allows, and 10 after it (a multipleOf of 1e-10; llguidance refuses finer steps, whose
# float is not the decimal it reads). Unbounded, greedy decoding writes 1111... to the limit.
NUMBER_BOUNDS = {"minimum": -(10**16 - 1), "maximum": 10**16 - 1}
FRACTION_STEP = 1e-10

# Subschema places of JSON Schema: a map of them, a list of them, one of them.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "additionalItems", "unevaluatedProperties",
               "unevaluatedItems", "contains", "not", "if", "then", "else", "propertyNames")


def json_defaults(schema):
    """A JSON Schema as inferno constrains replies to it (a new one; the given one is not
    changed), so that a reply that may end does:
    - an object that lists its `properties`, all of them the only keys it may have, and says
      nothing of others is closed (`additionalProperties: false`), as llama.cpp's converter
      and vLLM's guided decoding (xgrammar's strict mode) read it, and as OpenAI's strict mode
      requires it to be written. Pydantic, zod and hand-written schemas leave the key out; open,
      a small model invents keys without end. `"additionalProperties": true` (or a schema) keeps
      an object open. An object composed with others stays as written, since each part lists
      only some of the keys: one with a `$ref`, `allOf`, `anyOf`, `oneOf` or `dependentSchemas`
      beside its properties, or `required` keys it does not list, the parts of such a
      composition, and the definitions an `allOf` or such an object refers to.
    - an integer or number without a bound gets one 10^16 - 1 away (NUMBER_BOUNDS, or the
      other bound's value moved by that much), and a number without a `multipleOf`
      FRACTION_STEP where its range is wider than 1e-3; a bound the schema gives is kept.
    """
    if isinstance(schema, dict):
        return _defaults(schema, _composed_refs(schema), False)
    return schema


def _defaults(node, composed: set[str], open_: bool):
    """json_defaults of one subschema; `open_`: a part of a composition, not to be closed."""
    if isinstance(node, list):
        return [_defaults(s, composed, open_) for s in node]
    if not isinstance(node, dict):
        return node
    out = dict(node)
    composes = bool(_COMPOSING & set(out)) and "properties" in out
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: _defaults(v, composed, key in ("$defs", "definitions") and
                                     f"#/{key}/{k}" in composed) for k, v in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_defaults(s, composed, key == "allOf" or composes) for s in out[key]]
    for key in _SCHEMA_ONE:
        if isinstance(out.get(key), (dict, list)):
            out[key] = _defaults(out[key], composed, False)
    types = out.get("type")
    types = set(types) if isinstance(types, list) else {types}
    listed = set(out.get("properties") or ())
    if (("object" in types or "type" not in out) and "properties" in out and not open_ and not composes
            and set(out.get("required") or ()) <= listed
            and not {"additionalProperties", "patternProperties", "unevaluatedProperties"} & set(out)):
        out["additionalProperties"] = False
    if types & {"integer", "number"} and not {"enum", "const"} & set(out):
        _bound(out, "number" in types)
    return out


# Keywords beside `properties` that make an object a composition of parts.
_COMPOSING = {"$ref", "allOf", "anyOf", "oneOf", "dependentSchemas"}


def _composed_refs(schema: dict) -> set[str]:
    """The $refs that point at a part of a composition: a member of an `allOf`, or beside
    `properties` (draft 2019's sibling $ref)."""
    found: set[str] = set()

    def walk(node, in_all_of=False):
        if isinstance(node, list):
            for s in node:
                walk(s, in_all_of)
        elif isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and (in_all_of or "properties" in node):
                found.add(ref)
            for key, value in node.items():
                walk(value, key == "allOf")
    walk(schema)
    return found


def _bound(out: dict, number: bool) -> None:
    """NUMBER_BOUNDS for the bounds an integer or number lacks, FRACTION_STEP for a number."""
    step = NUMBER_BOUNDS["maximum"]
    low = next((out[k] for k in ("minimum", "exclusiveMinimum") if _is_number(out.get(k))), None)
    high = next((out[k] for k in ("maximum", "exclusiveMaximum") if _is_number(out.get(k))), None)
    if number and any(b is not None and abs(b) > step for b in (low, high)):
        return  # beyond what a float range llguidance can write as digits: left as given
    if low is None and "minimum" not in out:  # (a draft-4 boolean exclusiveMinimum needs its minimum)
        low = out["minimum"] = min(-step, high - step) if high is not None else -step
    if high is None and "maximum" not in out:
        high = out["maximum"] = max(step, low + step) if low is not None else step
    if number and "multipleOf" not in out and (low is None or high is None or high - low > 1e-3):
        out["multipleOf"] = FRACTION_STEP


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# response_format json_object: any JSON object, its numbers bounded as json_defaults bounds them.
ANY_OBJECT = {
    "$defs": {"value": {"anyOf": [
        {"type": "string"}, json_defaults({"type": "number"}), {"type": "boolean"}, {"type": "null"},
        {"type": "array", "items": {"$ref": "#/$defs/value"}},
        {"type": "object", "additionalProperties": {"$ref": "#/$defs/value"}}]}},
    "type": "object", "additionalProperties": {"$ref": "#/$defs/value"}}


# A chat reply under a JSON response format may wrap its JSON in a markdown fence, as llama.cpp's
# server allows (common/chat-auto-parser-generator.cpp): chat models write ```json by habit, and
# a small one held to `{` from its first token is off its course and can loop where it would
# have ended. The fence never reaches the reply's content (Unfence).
FENCE_OPEN, FENCE_CLOSE = r"```json[ \t]*\n?", r"\n?```"


def fenced(schema_text: str) -> str:
    """Lark for a JSON Schema's JSON, bare or inside a ```json fence."""
    schema = json.loads(schema_text)
    if schema is True:
        schema = {}
    if isinstance(schema, dict):
        schema = {**schema, "x-guidance": {**JSON_OPTIONS, **schema.get("x-guidance", {})}}
    return (f"start: FENCE_OPEN body FENCE_CLOSE | body\nFENCE_OPEN: /{FENCE_OPEN}/\n"
            f"FENCE_CLOSE: /{FENCE_CLOSE}/\nbody: %json {json.dumps(schema)}\n")


class Unfence:
    """A reply's text streamed without the fence `fenced` allows around its JSON. Text is held
    back only while it may still be fence: the opening until it is whole, a tail of whitespace
    and backticks until more follows. feed() + ... + finish() equals the whole text unfenced."""
    _open = re.compile(FENCE_OPEN)
    _tail = re.compile(r"\s*`{0,3}\Z")

    def __init__(self):
        self.state = "start"  # -> "plain" (no fence) or "body" (inside one)
        self.held = ""
        self.body = ""  # what was sent of the fenced JSON: is it whole, at the end?

    def feed(self, text: str) -> str:
        self.held += text
        if self.state == "start":
            if not self.held:
                return ""
            if not self.held.startswith("`"):
                self.state = "plain"
            else:
                m = self._open.match(self.held)
                if m is None or m.end() == len(self.held):  # not whole yet: more may belong to it
                    return ""
                self.state, self.held = "body", self.held[m.end():]
        if self.state == "plain":
            out, self.held = self.held, ""
            return out
        cut = self._tail.search(self.held).start()
        out, self.held = self.held[:cut], self.held[cut:]
        self.body += out
        return out

    def finish(self) -> str:
        """What is held at the end: nothing of a fence, any other text as it came."""
        held, self.held = self.held, ""
        if self.state == "start":
            m = self._open.match(held)
            return "" if m is not None or "```json".startswith(held) else held
        if self.state == "body" and _whole_json(self.body):
            return ""  # after the JSON, only the closing fence, whole or cut short, can follow
        return held


def _whole_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def unfence(text: str) -> str:
    u = Unfence()
    return u.feed(text) + u.finish()


@dataclass(frozen=True)
class Grammar:
    """A compiled constraint: `template` is a matcher at the start, copied for each sequence."""
    kind: str  # the parameter it came from: json_schema, grammar, regex, lark, json_object
    text: str  # llguidance's grammar (JSON text)
    template: llg.LLMatcher
    eos_ids: tuple[int, ...]
    mask_width: int  # token ids its masks cover
    fenced: bool = False  # JSON that may come inside a ```json fence (Unfence removes it)

    def matcher(self) -> "Matcher":
        """A new sequence's place in this grammar: at its start."""
        return Matcher(self.template.deep_copy(), self.eos_ids, (self.mask_width + 31) // 32)


class Grammars:
    """Compiles constraints for one tokenizer. `vocab_size` is the model's logits width, which
    can exceed the tokenizer's vocabulary (padded embeddings): ids without a token are never
    allowed. `eos_ids` defaults to the tokenizer's."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids=None):
        eos = [int(i) for i in (tokenizer.eos_ids if eos_ids is None else eos_ids)]
        if not eos:
            raise InfernoError("constrained output needs the model's end-of-sequence token, and "
                               "this tokenizer names none")
        self.eos_ids = tuple(eos)
        self.vocab_size = int(vocab_size)
        self.tokenizer = tokenizer
        self.mask_width = max(self.vocab_size, tokenizer.vocab_size)  # ids the masks cover
        self._cache: dict[tuple[str, str], Grammar] = {}

    @cached_property
    def lltok(self) -> llg.LLTokenizer:
        """llguidance's tokenizer, built on first use: ~1 s for a 150k vocabulary, holding the
        GIL, so a server that will constrain should touch it at load."""
        llg = _llguidance()
        try:
            return llg.LLTokenizer(self.tokenizer.hf.to_str(), n_vocab=self.mask_width,
                                   eos_token=list(self.eos_ids))
        except Exception as e:  # a vocabulary llguidance cannot read
            raise InfernoError(f"constrained output is unavailable for this tokenizer: "
                               f"{one_line(e)}") from None

    @cached_property
    def special_tokens(self) -> dict[str, int]:
        """Added tokens like <tool_call> or <think>, text -> id: whole tokens to llguidance,
        never text, so a grammar names them as <tool_call>; a quoted "<tool_call>" would be
        spelled out of plain tokens instead. (Added tokens that are not <...>, such as Gemma's
        runs of spaces, are text to llguidance.)"""
        return {t.content: i for i, t in self.tokenizer.hf.get_added_tokens_decoder().items()
                if i < self.mask_width and self.lltok.is_special_token(i)}

    def compile(self, *, json_schema: dict | str | None = None, grammar: str | None = None,
                regex: str | None = None, lark: str | None = None, json_object: bool = False,
                fence: bool = False) -> Grammar:
        """Exactly one constraint: a JSON Schema, a GBNF grammar (llama.cpp's; Lark text is
        accepted too), a regex, llguidance's Lark, or any JSON object. `fence`: a JSON
        constraint's reply may also come inside a ```json fence (`fenced`), as a chat reply
        under a response format may. Raises InfernoError naming the parameter and what is wrong
        with it."""
        given = {k: v for k, v in dict(json_schema=json_schema, grammar=grammar, regex=regex,
                                       lark=lark).items() if v is not None}
        if json_object:
            given["json_object"] = ANY_OBJECT  # any object, extra properties allowed
        if len(given) != 1:
            raise InfernoError(f"give one constraint, not {len(given)}: {', '.join(given) or 'none'}",
                               params=tuple(given))
        kind, source = next(iter(given.items()))
        if kind in ("json_schema", "json_object"):
            if isinstance(source, str):
                try:
                    source = json.loads(source)
                except json.JSONDecodeError as e:
                    raise InfernoError(f"json_schema is not valid JSON: {e}", params=(kind,)) from None
            if not isinstance(source, (dict, bool)):
                raise InfernoError(f"json_schema must be a JSON object, not {type(source).__name__}",
                                   params=(kind,))
            source = json.dumps(json_defaults(source))
        elif not isinstance(source, str):
            raise InfernoError(f"{kind} must be text, not {type(source).__name__}", params=(kind,))
        fence = fence and kind in ("json_schema", "json_object")
        key = (kind, source, fence)
        if key not in self._cache:
            if len(self._cache) >= 256:  # requests repeat their schemas; a bound keeps it small
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = self._compile(kind, source, fence)
        return self._cache[key]

    def _compile(self, kind: str, source: str, fence: bool = False) -> Grammar:
        what = {"json_schema": "JSON Schema", "json_object": "JSON Schema", "grammar": "GBNF grammar",
                "regex": "regex", "lark": "Lark grammar"}[kind]
        llg = _llguidance()
        try:
            if fence:
                text = llg.LLMatcher.grammar_from_lark(fenced(source))
            elif kind in ("json_schema", "json_object"):
                text = llg.LLMatcher.grammar_from_json_schema(source, defaults=JSON_OPTIONS)
            elif kind == "grammar":
                from llguidance.gbnf_to_lark import any_to_lark
                text = llg.LLMatcher.grammar_from_lark(any_to_lark(source))
            elif kind == "regex":
                text = llg.LLMatcher.grammar_from_regex(source)
            else:
                text = llg.LLMatcher.grammar_from_lark(source)
        except Exception as e:  # the GBNF converter's parse errors, a schema that is not an object
            raise InfernoError(f"{kind}: not a valid {what}: {one_line(e)}", params=(kind,)) from None
        # Building the matcher compiles and checks everything (llguidance reports, never raises).
        template = llg.LLMatcher(self.lltok, text, log_level=0)
        if template.is_error():
            raise InfernoError(f"{kind}: not a valid {what} (or one llguidance does not support): "
                               f"{one_line(template.get_error())}", params=(kind,))
        return Grammar(kind, text, template, self.eos_ids, self.mask_width, fence)

    def matcher(self, grammar: Grammar) -> "Matcher":
        return grammar.matcher()

    def allocate(self, n: int) -> np.ndarray:
        return allocate(n, self.mask_width)


class Matcher:
    """One sequence's place in its grammar."""

    def __init__(self, m: llg.LLMatcher, eos_ids: tuple[int, ...], words: int):
        self._m = m
        self.eos_ids = eos_ids
        self.words = words  # of its mask rows

    def consume(self, token: int) -> None:
        """Advance by a sampled token; an EOS is accepted where the grammar may end."""
        if not self._m.consume_token(int(token)):
            raise InfernoError(f"token {int(token)} is not allowed by the grammar: {self.error}")

    def is_stopped(self) -> bool:
        """Complete, and nothing can follow: only EOS is allowed (also true after an error)."""
        return self._m.is_stopped()

    def is_accepting(self) -> bool:
        """The output so far is complete: EOS is allowed (more may be too)."""
        return self._m.is_accepting()

    @property
    def error(self) -> str | None:
        return one_line(self._m.get_error()) if self._m.is_error() else None

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next (`{"name": "` after `{`): could skip forward passes."""
        return self._m.compute_ff_tokens()

    def rollback(self, n: int) -> None:
        self._m.rollback(n)

    def fill(self, bitmask: np.ndarray, row: int = 0) -> None:
        fill_masks([self], bitmask[row:row + 1])


def allocate(n: int, vocab: int) -> np.ndarray:
    """An all-allowed mask for n rows. # [n, ceil(vocab / 32)] int32"""
    return np.full((n, (vocab + 31) // 32), -1, dtype=np.int32)


@cache
def _executor() -> llg.LLExecutor:
    return _llguidance().LLExecutor()  # llguidance's own thread pool, shared by every engine


def _llguidance():
    """The library, imported on first use: 40 ms that a load without constrained output
    (every `inferno generate`) does not pay."""
    import llguidance
    return llguidance


def fill_masks(matchers: list[Matcher | None], bitmask: np.ndarray) -> None:
    """Row i of `bitmask` [n, words] gets matchers[i]'s allowed tokens; a None row allows all.
    The rows are computed in parallel, without the GIL (a forward pass can run meanwhile). A
    stopped matcher, or one in an error state (a grammar too complex to follow), allows only
    EOS, which ends it."""
    assert bitmask.dtype == np.int32 and bitmask.ndim == 2 and bitmask.flags["C_CONTIGUOUS"]
    rows = [(m._m, i) for i, m in enumerate(matchers) if m is not None]
    for i, m in enumerate(matchers):
        if m is None:
            bitmask[i] = -1
        else:
            assert bitmask.shape[1] == m.words, "allocate masks with Grammars.allocate"
    if rows:
        _executor().unsafe_compute_mask_ptr(rows, bitmask.ctypes.data, bitmask.shape[1] * 4,
                                            bitmask.shape[0])


def apply_mask(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """`logits` with -inf where `mask` disallows. logits [..., vocab], mask [..., words] int32;
    ids past the mask's 32 * words bits are disallowed, mask bits past vocab are ignored."""
    vocab = logits.shape[-1]
    # The words as little-endian bytes: bit i of the array is bit i % 8 of byte i // 8.
    as_bytes = np.ascontiguousarray(mask, dtype="<i4").view(np.uint8)  # [..., words * 4]
    # count= truncates to the logits' width, or pads with zeros (disallowed) up to it.
    allowed = np.unpackbits(as_bytes, axis=-1, count=vocab, bitorder="little")  # [..., vocab] 0/1
    # log(1) = 0, log(0) = -inf: an add, 4x faster than np.where on a mixed mask.
    with np.errstate(divide="ignore"):
        return logits + np.log(allowed, dtype=np.float32)
