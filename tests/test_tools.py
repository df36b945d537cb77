"""Tool calls (inferno/tools.py): the format from the template, the parsers (whole and streamed
in random pieces, which must agree exactly), and the grammars: decoding by RANDOM allowed tokens
under them must give calls that parse and whose arguments validate against the tool's schema.
Tags are tried both ways a vocabulary can hold them: as plain text (split into ordinary tokens)
and as one added token each (<tool_call> in Qwen's vocabulary).
"""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
import tiny
from test_constrain import allowed_ids, make_vocabs, random_decode
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from inferno import constrain as C
from inferno import tools as T
from inferno.errors import InfernoError
from inferno.tokenizers.tokenizer import Tokenizer
from inferno.tools import CLOSE, OPEN

def tool(name: str, properties: dict, required: list[str], **extra) -> dict:
    return {"type": "function", "function": {"name": name, **extra, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


TOOLS = [
    tool("get_weather", {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
         ["city", "unit"], description="The weather in a city"),
    tool("add", {"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a", "b"]),
    tool("search", {"query": {"type": "string", "maxLength": 20},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 10},
                    # a format llguidance lacks: ignored in tools, not an error
                    "site": {"type": "string", "format": "uri-reference", "maxLength": 16}},
         ["query"]),
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def with_added(tok: Tokenizer, texts, special: bool) -> Tokenizer:
    hf = HFTokenizer.from_str(tok.hf.to_str())
    hf.add_tokens([AddedToken(t, special=special, normalized=False) for t in texts])
    return Tokenizer(hf, eos_ids=tok.eos_ids)


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory) -> dict[str, Tokenizer]:
    base = make_vocabs(tmp_path_factory)
    return {"bpe": base["bpe_folder"], "spm": base["spm_gguf"],
            # Qwen's vocabulary: the tags and think markers are added (non-special) tokens.
            "qwen": with_added(base["bpe_folder"], [OPEN, CLOSE, "<think>", "</think>"], False),
            "llama3": with_added(base["bpe_folder"], ["<|python_tag|>"], True)}


@pytest.fixture(scope="module")
def grammars(vocabs) -> dict[str, C.Grammars]:
    return {k: C.Grammars(tok, tok.vocab_size) for k, tok in vocabs.items()}


def decode_text(tok, ids) -> str:
    return tok.decode(ids, skip_special_tokens=False)


def check_calls(calls, names=SCHEMAS):
    for c in calls:
        assert c.name in names and c.id.startswith("call_")
        jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])


# -- format and prompt -----------------------------------------------------------------------------
QWEN_SNIPPET = ('{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and '
                'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": '
                '<function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}')
LLAMA31_SNIPPET = ("{%- if builtin_tools is defined or tool_calls %}{{- '<|python_tag|>' }}{%- endif %}"
                   "{%- if message.role == 'ipython' %}")
LLAMA32_SNIPPET = ("{{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of "
                   "argument name and its value}.' }}{%- elif message.role == \"ipython\" %}")


def test_detect_format():
    assert T.detect_format(QWEN_SNIPPET) == "hermes"
    assert T.detect_format(LLAMA31_SNIPPET) == "llama3"
    assert T.detect_format(LLAMA32_SNIPPET) == "llama3"
    assert T.detect_format(tiny.CHAT_TEMPLATE) == "generic"
    assert T.detect_format(None) == "generic"


def test_generic_system_prompt_lists_the_tools_and_both_replies():
    text = T.generic_system_prompt(TOOLS)
    for name in SCHEMAS:
        assert f'"name": "{name}"' in text
    assert '"uri-reference"' in text  # the schemas, whole
    assert '{"tool_calls": [{"name": ' in text and '{"response": ' in text


def test_functions_checks_and_fills_in():
    assert T.functions([{"name": "now"}]) == [{"name": "now", "description": "",
                                               "parameters": {"type": "object"}}]
    for bad in ([{"type": "function", "function": {}}], ["add"], [{"name": "f", "parameters": [1]}]):
        with pytest.raises(InfernoError) as e:
            T.functions(bad)
        assert e.value.params == ("tools",)


# -- parsing ---------------------------------------------------------------------------------------
def calls_of(text, fmt):
    content, calls = T.parse(fmt, text)
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


def test_parse_hermes():
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit":"c"}}\n</tool_call>'
    assert calls_of(one, "hermes") == ("", [("get_weather", {"city": "Paris", "unit": "c"})])
    assert T.parse("hermes", one)[1][0].arguments == '{"city": "Paris", "unit":"c"}'  # the model's text
    two = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "東京"}}\n'
           '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')
    assert calls_of(two, "hermes") == ("Let me look.", [("get_weather", {"city": "東京"}),
                                                        ("add", {"a": 1, "b": 2})])
    bad = 'x <tool_call>{"name": "add", "arguments": {"a": 1</tool_call> y'  # cut: still a call
    content, calls = T.parse("hermes", bad)
    assert content == "x  y" and [(c.name, c.arguments) for c in calls] == [("add", '{"a": 1')]
    not_a_call = 'x <tool_call>{"a": 1}</tool_call> y'
    assert calls_of(not_a_call, "hermes") == (not_a_call, [])
    unclosed = 'ok <tool_call>\n{"name": "add", "arguments": {"a": 1}}'
    assert calls_of(unclosed, "hermes") == ("ok", [("add", {"a": 1})])
    as_string = '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>'
    assert T.parse("hermes", as_string)[1][0].arguments == '{"a": 1}'
    parameters = '<tool_call>{"name": "f", "parameters": {"q": [1]}}</tool_call>'
    assert calls_of(parameters, "hermes") == ("", [("f", {"q": [1]})])
    assert calls_of("a < b, <tool and </tool_call>", "hermes") == ("a < b, <tool and </tool_call>", [])


def test_parse_llama3():
    one = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    assert calls_of(one, "llama3") == ("", [("get_weather", {"city": "Paris"})])
    two = '<|python_tag|>{"name": "add", "parameters": {"a": 1}}; {"name": "add", "parameters": {"a": 3}}'
    assert calls_of(two, "llama3") == ("", [("add", {"a": 1}), ("add", {"a": 3})])
    for text in ["The answer is 42.", '{"not": "a call"}', "<|python"]:
        assert calls_of(text, "llama3") == (text, [])
    cut = T.parse("llama3", '{"name": "add", "parameters": {"a": 1')  # cut by max_tokens: a call
    assert cut[0] == "" and [(c.name, c.arguments) for c in cut[1]] == [("add", '{"a": 1')]
    assert calls_of(one + " and more", "llama3") == ("and more", [("get_weather", {"city": "Paris"})])


def test_parse_generic():
    calls = ('{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}},'
             ' {"name": "search", "arguments": {"query": "x"}}]}')
    assert calls_of(calls, "generic") == ("", [("add", {"a": 1, "b": 2}), ("search", {"query": "x"})])
    assert calls_of(' {"response": "Hello there"} ', "generic") == ("Hello there", [])
    assert calls_of('{"response": "line\\nnext \\u00e9"}', "generic") == ("line\nnext é", [])
    for text in ["plain text", '{"tool_calls": [{"name": 3}]}', '{"tool_calls": []}', '{"a": 1}',
                 '{"tool_calls": "nope"}', '{"response": 5}']:
        assert calls_of(text, "generic") == (text, [])
    assert calls_of('{"response": "cut sh', "generic") == ("cut sh", [])  # cut: what was written


TEXTS = {
    "hermes": [
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1,\n "b": 2}}\n</tool_call>\n',
        '  Météo 東京 🙂 <tool_call>{"name": "get_weather", "arguments": {"city": "東京"}}</tool_call> fin  ',
        'x <tool_call>{not json}</tool_call> y <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>',
        "a <tool_ca and << <<tool_call and nothing else <",
        '<tool_call>{"name": "add", "arguments": {"a": 1}}',
    ],
    "llama3": [
        '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}};'
        ' {"name": "get_weather", "parameters": {"city": "Paris"}}',
        '\n {"name": "search", "parameters": {"query": "a \\"quoted\\" {brace}"}} then text',
        "Just a reply, with { braces } inside.",
        '{"name": "add", "parameters": {"a": 1',
    ],
    "generic": [
        '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}},'
        ' {"name": "search", "arguments": {"query": "x"}}]}',
        '{"response": "Hello, world."}',
        "A plain reply.",
        '{"tool_calls": "nope"}',
    ],
}


def stream(fmt, pieces):
    p = T.StreamParser(fmt)
    deltas = [d for piece in pieces for d in p.feed(piece)] + p.finish()
    content = "".join(d.content for d in deltas if d.content is not None)
    calls = {}
    for d in deltas:
        if d.index is None:
            continue
        if d.index not in calls:  # the first delta of a call names it
            assert d.id.startswith("call_") and d.name and d.index == len(calls)
            calls[d.index] = [d.name, ""]
        else:
            assert d.id is None and d.name is None
        calls[d.index][1] += d.arguments
    return content, [tuple(c) for c in calls.values()]


@pytest.mark.parametrize("fmt", T.FORMATS)
def test_streaming_in_random_pieces_equals_the_whole(fmt):
    rng = random.Random(0)
    for text in TEXTS[fmt]:
        content, calls = T.parse(fmt, text)
        whole = (content, [(c.name, c.arguments) for c in calls])
        assert stream(fmt, [text]) == whole
        assert stream(fmt, list(text)) == whole  # one character at a time
        for _ in range(20):
            cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
            assert stream(fmt, [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]) == whole


def test_content_streams_as_it_comes_and_holds_back_only_a_possible_tag():
    p = T.StreamParser("hermes")
    seen = []
    text = 'Hello world <tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    for i, ch in enumerate(text):
        seen += p.feed(ch)
        if text[:i + 1] == "Hello world <tool_c":
            assert "".join(d.content for d in seen) == "Hello world"
            assert all(d.index is None for d in seen)
    assert [d.name for d in seen if d.name] == ["add"]  # complete at </tool_call>, before finish()
    p = T.StreamParser("llama3")
    assert [d.content for d in p.feed("The answer ")] == ["The answer"]
    assert [d.content for d in p.feed("{")] == [" {"]  # the held space, once text follows it


# -- grammars --------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["bpe", "qwen", "spm", "llama3"])
@pytest.mark.parametrize("fmt", T.FORMATS)
def test_required_grammar_random_decoding_gives_valid_calls(vocabs, grammars, fmt, kind):
    g, tok = grammars[kind], vocabs[kind]
    for parallel in (False, True):
        grammar = g.compile(lark=T.required_grammar(fmt, TOOLS, parallel, grammars=g))
        for seed in range(2):
            ids, ended = random_decode(g, grammar, seed)
            assert ended
            content, calls = T.parse(fmt, decode_text(tok, ids))
            # Nothing but calls; where <think> is a token (Qwen3), perhaps a thought first.
            assert re.fullmatch(r"(<think>.*</think>)?", content, re.S if kind == "qwen" else 0)
            assert calls and (parallel or len(calls) == 1)
            check_calls(calls)


@pytest.mark.parametrize("kind", ["bpe", "qwen", "spm"])
@pytest.mark.parametrize("fmt", T.FORMATS)
def test_named_grammar_calls_that_tool(vocabs, grammars, fmt, kind):
    g, tok = grammars[kind], vocabs[kind]
    choice = {"type": "function", "function": {"name": "search"}}
    grammar = g.compile(lark=T.tool_choice_grammar(fmt, TOOLS, choice, grammars=g))
    for seed in range(3):
        ids, ended = random_decode(g, grammar, seed)
        content, calls = T.parse(fmt, decode_text(tok, ids))
        assert ended and [c.name for c in calls] == ["search"]
        assert re.fullmatch(r"(<think>.*</think>)?", content, re.S if kind == "qwen" else 0)
        check_calls(calls)


def test_a_tag_that_is_one_token_is_written_as_that_token(vocabs, grammars):
    g, tok = grammars["qwen"], vocabs["qwen"]
    assert "<tool_call>" in T.required_grammar("hermes", TOOLS, grammars=g).replace('"<tool_call>"', "")
    assert '"<tool_call>"' in T.required_grammar("hermes", TOOLS, grammars=grammars["bpe"])
    mask = g.allocate(1)
    g.matcher(g.compile(lark=T.required_grammar("hermes", TOOLS, grammars=g))).fill(mask)
    opening = set(allowed_ids(mask[0], g.vocab_size))
    assert opening == {tok.hf.token_to_id("<tool_call>"), tok.hf.token_to_id("<think>")}


def test_required_lets_a_thinking_model_think_first(vocabs, grammars):
    g, tok = grammars["qwen"], vocabs["qwen"]
    prefix = ([tok.hf.token_to_id("<think>")] + tok.encode("\nI should add.\n", add_special_tokens=False)
              + [tok.hf.token_to_id("</think>")] + tok.encode("\n\n", add_special_tokens=False))
    grammar = g.compile(lark=T.required_grammar("hermes", TOOLS, False, grammars=g))
    ids, ended = random_decode(g, grammar, 0, prefix)
    content, calls = T.parse("hermes", decode_text(tok, ids))
    assert ended and content == "<think>\nI should add.\n</think>" and len(calls) == 1
    check_calls(calls)


def allowed(g, m) -> set[int]:
    mask = g.allocate(1)
    m.fill(mask)
    return set(allowed_ids(mask[0], g.vocab_size))


def is_free(g, m) -> bool:
    """Everything plain text allows is allowed next (byte tokens that cannot start a UTF-8
    character never are)."""
    return allowed(g, g.matcher(g.compile(regex=r"(.|\n)*"))) <= allowed(g, m)


@pytest.mark.parametrize("kind", ["bpe", "qwen", "spm"])
def test_hermes_auto_is_free_until_the_tag_then_constrained(vocabs, grammars, kind):
    g, tok = grammars[kind], vocabs[kind]
    grammar = g.compile(lark=T.auto_grammar("hermes", TOOLS, grammars=g))
    words = tok.encode("Sure, I can help with {that}.\n", add_special_tokens=False)
    tag = [tok.hf.token_to_id(OPEN)] if kind == "qwen" else tok.encode(" " + OPEN, add_special_tokens=False)
    m = g.matcher(grammar)
    assert is_free(g, m) and m.is_accepting()  # anything, or nothing, at first
    for t in words + tag[:-1]:
        m.consume(t)
        assert is_free(g, m)
    m.consume(tag[-1])
    assert len(allowed(g, m)) == 1  # inside the call: the newline before its JSON
    for seed in range(3):
        ids, ended = random_decode(g, grammar, seed, prefix=words + tag)
        content, calls = T.parse("hermes", decode_text(tok, ids))
        assert ended and content == "Sure, I can help with {that}." and calls
        check_calls(calls)
    if kind == "qwen":  # thinking markers are tokens, and free text allows them
        m = g.matcher(grammar)
        m.consume(tok.hf.token_to_id("<think>"))
        assert is_free(g, m)


def test_hermes_auto_random_decoding_is_content_or_valid_calls(vocabs, grammars):
    g, tok = grammars["qwen"], vocabs["qwen"]
    grammar = g.compile(lark=T.auto_grammar("hermes", TOOLS, grammars=g))
    for seed in range(4):
        ids, ended = random_decode(g, grammar, seed)
        assert ended
        check_calls(T.parse("hermes", decode_text(tok, ids))[1])


@pytest.mark.parametrize("kind", ["bpe", "llama3"])
def test_llama3_auto_a_reply_starting_with_a_brace_is_a_call(vocabs, grammars, kind):
    g, tok = grammars[kind], vocabs[kind]
    grammar = g.compile(lark=T.auto_grammar("llama3", TOOLS, grammars=g))
    m = g.matcher(grammar)
    for t in tok.encode("Hi {", add_special_tokens=False):
        m.consume(t)
    assert is_free(g, m)  # text, braces and all
    starts = [tok.encode("{", add_special_tokens=False)]
    if kind == "llama3":
        starts.append([tok.hf.token_to_id("<|python_tag|>")])
    for prefix in starts:
        for seed in range(2):
            ids, ended = random_decode(g, grammar, seed, prefix=prefix)
            content, calls = T.parse("llama3", decode_text(tok, ids))
            assert ended and content == "" and calls
            check_calls(calls)


def test_generic_auto_is_a_response_or_calls(vocabs, grammars):
    g, tok = grammars["spm"], vocabs["spm"]
    grammar = g.compile(lark=T.auto_grammar("generic", TOOLS, parallel=False, grammars=g))
    kinds = set()
    for seed in range(8):
        ids, ended = random_decode(g, grammar, seed)
        text = decode_text(tok, ids)
        content, calls = T.parse("generic", text)
        assert ended and (calls or json.loads(text)["response"].strip() == content)
        assert len(calls) <= 1
        check_calls(calls)
        kinds.add(bool(calls))
    assert kinds == {True, False}


def test_tool_choice():
    assert T.tool_choice_grammar("hermes", TOOLS, "none") is None
    assert T.tool_choice_grammar("hermes", [], "auto") is None
    assert T.tool_choice_grammar("hermes", TOOLS, "auto") == T.auto_grammar("hermes", TOOLS)
    required = T.tool_choice_grammar("llama3", TOOLS, "required", parallel=False)
    assert required == T.required_grammar("llama3", TOOLS, False)
    with pytest.raises(InfernoError) as e:
        T.tool_choice_grammar("hermes", TOOLS, {"type": "function", "function": {"name": "nope"}})
    assert e.value.params == ("tool_choice",) and "nope" in str(e.value)


def test_grammars_are_valid_for_every_format_and_choice(grammars):
    g = grammars["bpe"]
    for fmt in T.FORMATS:
        for parallel in (False, True):
            for lark in (T.auto_grammar(fmt, TOOLS, parallel), T.required_grammar(fmt, TOOLS, parallel),
                         T.named_grammar(fmt, TOOLS[0])):
                g.compile(lark=lark)  # raises if llguidance refuses it


# -- streaming fragment by fragment, cut calls, repeated calls -----------------------------------
ONE_CALL = {
    "hermes": ('Sure. <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": [2, 3], "s": "x}y"}}\n</tool_call>',
               "add", '{"a": 1, "b": [2, 3], "s": "x}y"}'),
    "llama3": ('<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": [2, 3], "s": "x}y"}}',
               "add", '{"a": 1, "b": [2, 3], "s": "x}y"}'),
    "generic": ('{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": [2, 3], "s": "x}y"}}]}',
                "add", '{"a": 1, "b": [2, 3], "s": "x}y"}'),
}


@pytest.mark.parametrize("fmt", T.FORMATS)
def test_arguments_stream_as_they_are_generated(fmt):
    """Fed a character at a time, the call's name goes out once it is whole and its arguments
    in fragments that arrive before the call is complete (instructor's partial objects are
    built from these)."""
    text, name, args = ONE_CALL[fmt]
    p = T.StreamParser(fmt)
    fragments, complete_at = [], None
    for i, ch in enumerate(text):
        for d in p.feed(ch):
            if d.name is not None:
                assert d.name == name and d.arguments == "" and text[:i + 1].endswith('"add"')
            elif d.index is not None:
                fragments.append((i, d.arguments))
        if p.calls and complete_at is None:
            complete_at = i
    fragments += [(len(text), d.arguments) for d in p.finish() if d.index is not None]
    assert "".join(f for _, f in fragments) == args
    assert len(fragments) > 10 and fragments[0][0] < complete_at  # streamed, not sent whole
    assert [(c.name, c.arguments) for c in p.calls] == [(name, args)]


@pytest.mark.parametrize("fmt", T.FORMATS)
def test_a_call_cut_by_max_tokens_is_still_a_call(fmt):
    text, name, args = ONE_CALL[fmt]
    cut = text[:text.index('"b"')]  # inside the arguments
    content, calls = T.parse(fmt, cut)
    assert [(c.name, c.arguments) for c in calls] == [(name, '{"a": 1, ')]
    assert "tool_call" not in content and "name" not in content
    before_name = text[:text.index('"add"') + 3]  # the name not yet whole: no call, no wrapper
    content, calls = T.parse(fmt, before_name)
    assert calls == [] and content in ("", "Sure.")


REPEATS = {
    "hermes": '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n'
              '<tool_call>\n{"name": "f", "arguments": {"x": 2}}\n</tool_call>\n'
              '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>\n{"name"',
    "llama3": '{"name": "f", "parameters": {"x": 1}}; {"name": "f", "parameters": {"x": 2}}; '
              '{"name": "f", "parameters": {"x": 1}}; {"name"',
    "generic": '{"tool_calls": [{"name": "f", "arguments": {"x": 1}}, {"name": "f", "arguments": {"x": 2}}, '
               '{"name": "f", "arguments": {"x": 1}}, {"name"',
}


@pytest.mark.parametrize("fmt", T.FORMATS)
def test_a_repeated_call_ends_the_reply_where_it_starts(fmt):
    """Fed the reply a character at a time, as the loop does: the guard says where to cut at
    the third call (the first's twin), and never held back less than that: nothing of the
    repeat was ever sent. What is left parses to the two distinct calls."""
    text = REPEATS[fmt]
    guard, cut_at = T.CallGuard(fmt), None
    sendable = 0
    for i, ch in enumerate(text):
        guard.feed(ch)
        cut_at = guard.cut()
        if cut_at is not None:
            break
        sendable = max(sendable, guard.hold())
    assert cut_at is not None and sendable <= cut_at
    content, calls = T.parse(fmt, text[:cut_at])
    assert content == "" and [c.arguments for c in calls] == ['{"x": 1}', '{"x": 2}']


def test_distinct_calls_stream_while_a_possible_repeat_is_held():
    """A call written exactly as an earlier one is held only while it could still be its twin:
    once it differs, all of it may go out."""
    guard = T.CallGuard("hermes")
    first = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n'
    for ch in first + '<tool_call>\n{"name": "f", "arguments": {"x": ':
        guard.feed(ch)
    assert guard.hold() == len(first)  # so far the twin of the first: held from its tag
    guard.feed("2")
    assert guard.hold() == len(guard.parser.text)  # differs: nothing held


def test_at_most_max_calls(monkeypatch):
    monkeypatch.setattr(T, "MAX_CALLS", 3)
    text = "".join(f'<tool_call>{{"name": "f", "arguments": {{"x": {i}}}}}</tool_call>' for i in range(5))
    guard = T.CallGuard("hermes")
    for ch in text:
        guard.feed(ch)
        if guard.cut() is not None:
            break
    assert len(T.parse("hermes", text[:guard.cut()])[1]) == 3


def test_a_repeat_in_other_whitespace_is_a_repeat():
    first = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n'
    again = '<tool_call>\n{\n  "name":"f",\n "arguments" : {"x":1} }\n</tool_call>'
    guard = T.CallGuard("hermes")
    for ch in first + again:
        guard.feed(ch)
        assert guard.hold() <= len(first) or guard.cut() is not None
    assert guard.cut() == len(first)


def test_surrogate_pairs_and_lone_surrogates_in_a_generic_response():
    """An emoji written as a \\u surrogate pair is one character, also when the pair arrives
    in pieces; a lone surrogate (not text: no server could encode it) is U+FFFD."""
    text = '{"response": "hi \\ud83d\\ude00 and \\ud83d alone"}'
    assert T.parse("generic", text)[0] == "hi 😀 and \ufffd alone"
    assert stream("generic", list(text))[0] == "hi 😀 and \ufffd alone"


@pytest.mark.parametrize("fmt,text", [
    ("llama3", '{"name":"add","parameters":-1}'),
    ("llama3", '{"parameters":true,"name":"f"}'),
    ("llama3", '{"name":"add","id":null}'),
    ("hermes", '<tool_call>{"name":"f","arguments":{"q":"</tool_call>"}}</tool_call>'),
    ("hermes", '<tool_call>{"name":"f","arguments":{"a":1}} </tool_call> and text'),
])
def test_partial_literals_and_tags_in_strings_stream_as_the_whole(fmt, text):
    content, calls = T.parse(fmt, text)
    assert stream(fmt, list(text)) == (content, [(c.name, c.arguments) for c in calls])
    assert calls and "tool_call" not in content


def test_text_between_calls_cannot_let_a_repeat_out():
    """Text between two hermes calls: what could begin the next tag is held back, so a repeat
    after it is cut before anything of it was sent."""
    call = '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
    text = call + "note " + call
    guard, sent = T.CallGuard("hermes"), 0
    for ch in text:
        guard.feed(ch)
        if guard.cut() is not None:
            break
        sent = max(sent, guard.hold())
    assert guard.cut() == len(call) + len("note ") and sent <= guard.cut()
