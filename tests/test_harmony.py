"""harmony, gpt-oss's chat format (inferno/harmony.py): the prompt, byte for byte as openai-harmony
renders it (recorded here, and compared live where openai-harmony and its o200k vocabulary are
installed); recorded replies parsed whole and streamed in pieces of every size, which must
agree, and as openai-harmony's own parser reads them; the tool-call grammars, compiled by
llguidance, decoded by RANDOM allowed tokens and fed sample replies to accept or reject.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import random
from datetime import date
from pathlib import Path

import jsonschema
import pytest
import tiny
from test_constrain import random_decode
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from inferno import constrain as C
from inferno import harmony as H
from inferno.errors import InfernoError
from inferno.tokenizers.tokenizer import Tokenizer

DATE = "2025-06-28"
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "description": "The city", "maxLength": 12},
    "unit": {"type": "string", "enum": ["c", "f"], "default": "c"}}, "required": ["city"]}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
       "required": ["a", "b"]}
# What the TypeScript rendering has rules for: titles, examples, nullable, enums, oneOf (with the
# property's and the variants' descriptions and defaults), type lists, nested objects, arrays.
KITCHEN = {"type": "object", "description": "Everything", "properties": {
    "s": {"type": "string", "title": "S", "description": "A string", "examples": ["x", "y"]},
    "sn": {"type": "string", "nullable": True, "default": "none"},
    "pick": {"description": "A pick", "default": 3,
             "oneOf": [{"type": "string", "default": "z"}, {"type": "number", "description": "or a number"}]},
    "ids": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"}},
                                       "required": ["id"]}},
    "either": {"type": ["string", "integer", "null"]},
    "opts": {"type": "object", "properties": {"deep": {"type": "boolean", "default": False}}},
    "any": {"anyOf": [{"type": "string"}, {"type": "null"}]},
}, "required": ["s", "pick"]}


def tool(name, parameters, description=None):
    fn = {"name": name, **({"description": description} if description is not None else {})}
    return {"type": "function", "function": {**fn, **({"parameters": parameters} if parameters else {})}}


TOOLS = [tool("get_weather", WEATHER, "The weather in a city."), tool("add", ADD, "Adds two integers.\nExactly.")]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}


def call(id_, name, arguments):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


# -- rendering ---------------------------------------------------------------------------------------
# name -> (OpenAI messages, tools, reasoning effort)
CASES = {
    "plain": ([{"role": "user", "content": "What is 2 + 2?"}], None, None),
    "system_high": ([{"role": "system", "content": "Answer in French."},
                     {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}],
                    None, "high"),
    "tools_low": ([{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}],
                  TOOLS + [tool("kitchen", KITCHEN, "Takes everything."), tool("now", None, "The time."),
                           tool("nothing", {"type": "object", "properties": {}})], "low"),
    # the turn goes on after a call: its reasoning stays
    "tool_result": ([{"role": "user", "content": "Weather in Paris?"},
                     {"role": "assistant", "content": None, "reasoning_content": "Need the weather tool.",
                      "tool_calls": [call("c1", "get_weather", '{"city":"Paris"}')]},
                     {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21, "sky": "clear"}'}], TOOLS, None),
    # answered turns lose their reasoning, the tool calls' included
    "answered": ([{"role": "system", "content": "Sys."},
                  {"role": "user", "content": "q1"},
                  {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
                  {"role": "user", "content": "q2"},
                  {"role": "assistant", "reasoning_content": "r2", "tool_calls": [call("x", "add", {"a": 1, "b": 2})]},
                  {"role": "tool", "tool_call_id": "x", "content": "3"},
                  {"role": "assistant", "content": "a2", "reasoning_content": "r3"},
                  {"role": "user", "content": "q3"}], TOOLS, None),
    # a preamble and two calls in one turn, answered by id in the other order; then another call
    # in the same turn, answered without an id
    "preamble": ([{"role": "user", "content": "Rome, and 1 + 1?"},
                  {"role": "assistant", "content": "Checking both.", "reasoning_content": "Two calls.",
                   "tool_calls": [call("a", "get_weather", '{"city":"Rome"}'), call("b", "add", '{"a":1,"b":1}')]},
                  {"role": "tool", "tool_call_id": "b", "content": "2"},
                  {"role": "tool", "tool_call_id": "a", "content": "sun"},
                  {"role": "assistant", "reasoning_content": "And Oslo.",
                   "tool_calls": [call("d", "get_weather", '{"city":"Oslo"}')]},
                  {"role": "tool", "content": "snow"}], TOOLS, "medium"),
}


def reference(h, name):
    """The case as openai-harmony's messages, written out by hand (what harmony.render must
    reproduce, reasoning already dropped where it is dropped)."""
    R = h.Role

    def fns(*tools):
        return h.DeveloperContent.new().with_function_tools(
            [h.ToolDescription.new(t["function"]["name"], t["function"].get("description", ""),
                                   parameters=t["function"].get("parameters")) for t in tools])

    def system(effort=h.ReasoningEffort.MEDIUM):
        content = h.SystemContent.new().with_reasoning_effort(effort).with_conversation_start_date(DATE)
        return h.Message.from_role_and_content(R.SYSTEM, content)

    def dev(content):
        return h.Message.from_role_and_content(R.DEVELOPER, content)

    def user(text):
        return h.Message.from_role_and_content(R.USER, text)

    def says(text, channel):
        return h.Message.from_role_and_content(R.ASSISTANT, text).with_channel(channel)

    def calls(name, args):
        return says(args, "commentary").with_recipient(f"functions.{name}").with_content_type("<|constrain|>json")

    def result(name, text):
        author = h.Author.new(R.TOOL, f"functions.{name}")
        return h.Message.from_author_and_content(author, text).with_channel("commentary").with_recipient("assistant")

    if name == "plain":
        return [system(), user("What is 2 + 2?")]
    if name == "system_high":
        return [system(h.ReasoningEffort.HIGH), dev(h.DeveloperContent.new().with_instructions("Answer in French.")),
                user("Hi there")]
    if name == "tools_low":
        # (harmony writes `(_: {\n})` for an object without properties; the format's docs, and
        # harmony.py, `() => any`: the reference gets no parameters for it)
        listed = TOOLS + [tool("kitchen", KITCHEN, "Takes everything."), tool("now", None, "The time."),
                          tool("nothing", None)]
        return [system(h.ReasoningEffort.LOW), dev(fns(*listed).with_instructions("Be brief.")), user("Weather in Paris?")]
    if name == "tool_result":
        return [system(), dev(fns(*TOOLS)), user("Weather in Paris?"), says("Need the weather tool.", "analysis"),
                calls("get_weather", '{"city":"Paris"}'), result("get_weather", '{"temp": 21, "sky": "clear"}')]
    if name == "answered":
        return [system(), dev(fns(*TOOLS).with_instructions("Sys.")), user("q1"), says("a1", "final"), user("q2"),
                calls("add", '{"a":1,"b":2}'), result("add", "3"), says("a2", "final"), user("q3")]
    if name == "preamble":
        return [system(), dev(fns(*TOOLS)), user("Rome, and 1 + 1?"), says("Two calls.", "analysis"),
                says("Checking both.", "commentary"), calls("get_weather", '{"city":"Rome"}'),
                calls("add", '{"a":1,"b":1}'), result("add", "2"), result("get_weather", "sun"),
                says("And Oslo.", "analysis"), calls("get_weather", '{"city":"Oslo"}'), result("get_weather", "snow")]
    raise KeyError(name)


SYSTEM = ("<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
          "Knowledge cutoff: 2024-06\n"
          "Current date: 2025-06-28\n\n"
          "Reasoning: {effort}\n\n"
          "# Valid channels: analysis, commentary, final. Channel must be included for every message.")
FUNCTIONS = "\nCalls to these tools must go to the commentary channel: 'functions'."
TOOLS_SECTION = ("# Tools\n\n"
                 "## functions\n\n"
                 "namespace functions {\n\n"
                 "// The weather in a city.\n"
                 "type get_weather = (_: {\n"
                 "// The city\n"
                 "city: string,\n"
                 'unit?: "c" | "f", // default: c\n'
                 "}) => any;\n\n"
                 "// Adds two integers.\n"
                 "// Exactly.\n"
                 "type add = (_: {\n"
                 "a: number,\n"
                 "b: number,\n"
                 "}) => any;\n\n")
END_TOOLS = "} // namespace functions<|end|>"
# Recorded from openai-harmony 0.0.8 (render_conversation_for_completion of reference(), decoded).
GOLDEN = {
    "plain": SYSTEM.format(effort="medium") + "<|end|>"
             "<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant",
    "system_high": SYSTEM.format(effort="high") + "<|end|>"
                   "<|start|>developer<|message|># Instructions\n\nAnswer in French.<|end|>"
                   "<|start|>user<|message|>Hi there<|end|><|start|>assistant",
    "tools_low": SYSTEM.format(effort="low") + FUNCTIONS + "<|end|>"
                 "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n" + TOOLS_SECTION +
                 "// Takes everything.\n"
                 "type kitchen = (_: // Everything\n"
                 "{\n"
                 "// S\n"
                 "//\n"
                 "// A string\n"
                 "// Examples:\n"
                 '// - "x"\n'
                 '// - "y"\n'
                 "s: string,\n"
                 'sn?: string | null, // default: "none"\n'
                 "// A pick\n"
                 "// default: 3\n"
                 "pick:\n"
                 ' | string // default: "z"\n'
                 " | number // or a number\n"
                 ",\n"
                 "ids?: {\n"
                 "    id: number,\n"
                 "    }[],\n"
                 "either?: string | number | null,\n"
                 "opts?: {\n"
                 "    deep?: boolean, // default: false\n"
                 "    },\n"
                 "any?: any,\n"
                 "}) => any;\n\n"
                 "// The time.\n"
                 "type now = () => any;\n\n"
                 "type nothing = () => any;\n\n" + END_TOOLS +
                 "<|start|>user<|message|>Weather in Paris?<|end|><|start|>assistant",
    "tool_result": SYSTEM.format(effort="medium") + FUNCTIONS + "<|end|>"
                   "<|start|>developer<|message|>" + TOOLS_SECTION + END_TOOLS +
                   "<|start|>user<|message|>Weather in Paris?<|end|>"
                   "<|start|>assistant<|channel|>analysis<|message|>Need the weather tool.<|end|>"
                   '<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city":"Paris"}<|call|>'
                   '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{"temp": 21, "sky": "clear"}<|end|>'
                   "<|start|>assistant",
    "answered": SYSTEM.format(effort="medium") + FUNCTIONS + "<|end|>"
                "<|start|>developer<|message|># Instructions\n\nSys.\n\n" + TOOLS_SECTION + END_TOOLS +
                "<|start|>user<|message|>q1<|end|>"
                "<|start|>assistant<|channel|>final<|message|>a1<|end|>"
                "<|start|>user<|message|>q2<|end|>"
                '<|start|>assistant to=functions.add<|channel|>commentary <|constrain|>json<|message|>{"a":1,"b":2}<|call|>'
                "<|start|>functions.add to=assistant<|channel|>commentary<|message|>3<|end|>"
                "<|start|>assistant<|channel|>final<|message|>a2<|end|>"
                "<|start|>user<|message|>q3<|end|><|start|>assistant",
    "preamble": SYSTEM.format(effort="medium") + FUNCTIONS + "<|end|>"
                "<|start|>developer<|message|>" + TOOLS_SECTION + END_TOOLS +
                "<|start|>user<|message|>Rome, and 1 + 1?<|end|>"
                "<|start|>assistant<|channel|>analysis<|message|>Two calls.<|end|>"
                "<|start|>assistant<|channel|>commentary<|message|>Checking both.<|end|>"
                '<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city":"Rome"}<|call|>'
                '<|start|>assistant to=functions.add<|channel|>commentary <|constrain|>json<|message|>{"a":1,"b":1}<|call|>'
                "<|start|>functions.add to=assistant<|channel|>commentary<|message|>2<|end|>"
                "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sun<|end|>"
                "<|start|>assistant<|channel|>analysis<|message|>And Oslo.<|end|>"
                '<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city":"Oslo"}<|call|>'
                "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>snow<|end|>"
                "<|start|>assistant",
}


def render(name):
    messages, tools, effort = CASES[name]
    return H.render(messages, tools, reasoning_effort=effort, date=DATE)


@pytest.mark.parametrize("name", CASES)
def test_render_is_the_recorded_reference(name):
    assert render(name) == GOLDEN[name]


@pytest.fixture(scope="module")
def harmony(tmp_path_factory):
    """openai-harmony and its encoding, where installed. It needs OpenAI's o200k_base.tiktoken,
    which it would download: TIKTOKEN_ENCODINGS_BASE names a folder holding it, or bpe-openai's
    packaged copy is used (openai-harmony checks the file's SHA-256 either way)."""
    h = pytest.importorskip("openai_harmony")
    before = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    if not before:
        spec = importlib.util.find_spec("bpe_openai")
        packaged = spec and Path(spec.submodule_search_locations[0]) / "data" / "o200k_base.tiktoken.gz"
        if not packaged or not packaged.is_file():
            pytest.skip("openai-harmony needs o200k_base.tiktoken: install bpe-openai, which ships it, "
                        "or set TIKTOKEN_ENCODINGS_BASE to a folder holding it")
        folder = tmp_path_factory.mktemp("tiktoken")
        (folder / "o200k_base.tiktoken").write_bytes(gzip.decompress(packaged.read_bytes()))
        os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(folder)
    try:
        return h, h.load_harmony_encoding(h.HarmonyEncodingName.HARMONY_GPT_OSS)
    except Exception as e:  # (a copy whose SHA-256 is not the one openai-harmony expects)
        pytest.skip(f"openai-harmony cannot load its vocabulary: {e}")
    finally:
        if not before:
            del os.environ["TIKTOKEN_ENCODINGS_BASE"]


@pytest.mark.parametrize("name", CASES)
def test_render_is_openai_harmonys_byte_for_byte(harmony, name):
    h, enc = harmony
    config = h.RenderConversationConfig(auto_drop_analysis=False)  # (reference() drops what is dropped)
    tokens = enc.render_conversation_for_completion(h.Conversation.from_messages(reference(h, name)),
                                                    h.Role.ASSISTANT, config)
    text = render(name)
    assert enc.decode(tokens) == text
    assert enc.encode(text, allowed_special="all") == tokens  # the same tokens, encoded whole


def test_reasoning_is_dropped_once_answered_and_kept_across_calls():
    text = render("answered")
    assert not any(r in text for r in ("r1", "r2", "r3"))
    assert "Need the weather tool." in render("tool_result")
    assert "Two calls." in render("preamble") and "And Oslo." in render("preamble")
    # "reasoning" and "thinking" (other servers' names for it) are read as well
    for key in ("reasoning", "thinking"):
        messages = [{"role": "user", "content": "q"},
                    {"role": "assistant", key: "hmm", "tool_calls": [call("c", "add", "{}")]}]
        assert "<|channel|>analysis<|message|>hmm<|end|>" in H.render(messages, TOOLS, date=DATE)


def test_render_options_and_errors():
    messages = [{"role": "user", "content": "x"}]
    assert f"Current date: {date.today():%Y-%m-%d}\n" in H.render(messages)
    assert "Current date: 2024-01-02\n" in H.render(messages, date=date(2024, 1, 2))
    assert "Reasoning: low\n" in H.render(messages, reasoning_effort="minimal")
    assert H.render(messages, model_identity="You are Bob.").startswith("<|start|>system<|message|>You are Bob.\n")
    with pytest.raises(InfernoError, match="reasoning_effort"):
        H.render(messages, reasoning_effort="max")
    with pytest.raises(InfernoError, match="tool call"):
        H.render([{"role": "tool", "content": "3"}])
    with pytest.raises(InfernoError, match="role"):
        H.render([{"role": "robot", "content": "3"}])
    with pytest.raises(InfernoError, match="name"):
        H.render([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}])


def test_is_harmony():
    assert H.is_harmony("{{- '<|start|>' + role + '<|channel|>' + c + '<|message|>' }}")
    assert not H.is_harmony(tiny.CHAT_TEMPLATE) and not H.is_harmony(None)


# -- parsing -----------------------------------------------------------------------------------------
# Replies as gpt-oss writes them after the prompt's <|start|>assistant; name -> (text, reasoning,
# content, [(name, arguments)]).
OUTPUTS = {
    "final": ('<|channel|>analysis<|message|>User asks: "What is 2 + 2?" Simple.<|end|>'
              "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>",
              'User asks: "What is 2 + 2?" Simple.', "2 + 2 = 4.", []),
    "call": ("<|channel|>analysis<|message|>Need the weather tool.<|end|>"
             '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>',
             "Need the weather tool.", "", [("get_weather", '{"city":"Paris"}')]),
    "call_recipient_first": ("<|channel|>analysis<|message|>Need the weather tool.<|end|>"
                             '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
                             "Need the weather tool.", "", [("get_weather", '{"city": "Paris"}')]),
    "call_at_once": (' to=functions.add<|channel|>commentary<|constrain|>json<|message|>{"a":1,"b":2}<|call|>',
                     "", "", [("add", '{"a":1,"b":2}')]),
    "preamble": ("<|channel|>analysis<|message|>Two lookups.<|end|>"
                 "<|start|>assistant<|channel|>commentary<|message|>**Plan**: look up Rome.<|end|>"
                 '<|start|>assistant<|channel|>commentary to=functions.get_weather<|constrain|>json<|message|>{"city":"Rome"}<|call|>',
                 "Two lookups.", "**Plan**: look up Rome.", [("get_weather", '{"city":"Rome"}')]),
    # after the prompt of CASES["tool_result"]: the answer
    "after_tool": ("<|channel|>analysis<|message|>Tool says 21, clear.<|end|>"
                   "<|start|>assistant<|channel|>final<|message|>It is 21 °C and clear in Paris.<|return|>",
                   "Tool says 21, clear.", "It is 21 °C and clear in Paris.", []),
    "no_stop_token": ("<|channel|>final<|message|>Hi!", "", "Hi!", []),
    "two_thoughts": ("<|channel|>analysis<|message|>One.<|end|><|start|>assistant<|channel|>analysis<|message|>Two.<|end|>"
                     "<|start|>assistant<|channel|>final<|message|>Done.<|return|>", "One.\n\nTwo.", "Done.", []),
    "builtin_tool": ('<|channel|>analysis<|message|>Search.<|end|><|start|>assistant to=browser.search<|channel|>analysis'
                     ' code<|message|>{"query": "x"}<|call|>', 'Search.\n\n{"query": "x"}', "", []),
    "tag_like_text": ("<|channel|>final<|message|>a <| b, x<y, <|en d|> and 🙂<|return|>", "",
                      "a <| b, x<y, <|en d|> and 🙂", []),
    "not_harmony": ("Just text, no tags.", "", "Just text, no tags.", []),
    "cut_in_call": ('<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 1, "b',
                    "", "", [("add", '{"a": 1, "b')]),
    "cut_in_header": ("<|channel|>analysis<|message|>Call.<|end|><|start|>assistant<|channel|>commentary to=functions.ad",
                      "Call.", "", []),
    "empty_arguments": ("<|channel|>commentary to=functions.now <|constrain|>json<|message|><|call|>", "", "", [("now", "{}")]),
}


def collect(deltas):
    """(reasoning, content, [(name, arguments)]) of deltas, checking their shapes."""
    reasoning, content, calls = "", "", []
    for d in deltas:
        kinds = [d.reasoning is not None, d.content is not None, d.index is not None]
        assert sum(kinds) == 1, d
        if d.reasoning is not None:
            reasoning += d.reasoning
        elif d.content is not None:
            content += d.content
        elif d.name is not None:
            assert d.index == len(calls) and d.id.startswith("call_") and d.arguments == ""
            calls.append([d.name, ""])
        else:
            assert d.id is None and d.name is None
            calls[d.index][1] += d.arguments
    return reasoning, content, [tuple(c) for c in calls]


def stream(pieces):
    p = H.StreamParser()
    deltas = [d for piece in pieces for d in p.feed(piece)] + p.finish()
    return collect(deltas)


@pytest.mark.parametrize("name", OUTPUTS)
def test_parse_recorded_replies(name):
    text, reasoning, content, calls = OUTPUTS[name]
    reply = H.parse(text)
    assert (reply.reasoning, reply.content, [(c.name, c.arguments) for c in reply.calls]) == (reasoning, content, calls)
    assert all(c.id.startswith("call_") for c in reply.calls)


@pytest.mark.parametrize("name", OUTPUTS)
def test_streamed_in_pieces_of_every_size_equals_the_whole(name):
    text, *whole = OUTPUTS[name]
    whole = tuple(whole)
    for size in range(1, len(text) + 1):
        assert stream([text[i:i + size] for i in range(0, len(text), size)]) == whole, size
    rng = random.Random(0)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 20))))
        assert stream([text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]) == whole


def test_a_tag_split_across_pieces_is_held_back_and_nothing_else():
    p = H.StreamParser()
    assert p.feed("<|chan") == [] and p.feed("nel|>analysis<|mess") == []
    assert collect(p.feed("age|>Let me think<")) == ("Let me think", "", [])  # "<" may begin a tag
    assert collect(p.feed("|")) == ("", "", [])
    assert collect(p.feed("x|> a")) == ("<|x|> a", "", [])  # no tag after all: text
    assert collect(p.feed("<|e")) == ("", "", []) and collect(p.feed("nd|><|sta")) == ("", "", [])
    assert collect(p.feed("rt|>assistant<|channel|>final<|message|>4<|ret")) == ("", "4", [])
    assert collect(p.feed("urn|>") + p.finish()) == ("", "", [])
    assert [(m.channel, m.text) for m in p.messages] == [("analysis", "Let me think<|x|> a"), ("final", "4")]


def test_a_call_streams_its_name_then_its_arguments_as_written():
    p = H.StreamParser()
    assert collect(p.feed("<|channel|>commentary to=functions.get_weather <|constrain|>json")) == ("", "", [])
    first = p.feed("<|message|>")
    assert [(d.index, d.name, d.arguments) for d in first] == [(0, "get_weather", "")] and p.count == 1
    assert [d.arguments for d in p.feed('{"city": "Pa')] == ['{"city": "Pa']
    assert [d.arguments for d in p.feed('ris"}<|ca')] == ['ris"}']  # the tag held back
    assert p.feed("ll|>") == [] and p.finish() == []
    assert [(c.name, c.arguments, c.id) for c in p.calls] == [("get_weather", '{"city": "Paris"}', first[0].id)]
    assert [(m.channel, m.recipient, m.content_type) for m in p.messages] == [
        ("commentary", "functions.get_weather", "<|constrain|>json")]


def test_headers():
    assert H.parse_header("<|channel|>commentary to=functions.f <|constrain|>json", "assistant") == (
        "assistant", "commentary", "functions.f", "<|constrain|>json")
    assert H.parse_header("assistant to=functions.f<|channel|>commentary json") == (
        "assistant", "commentary", "functions.f", "json")
    assert H.parse_header("functions.f to=assistant<|channel|>commentary") == (
        "functions.f", "commentary", "assistant", None)
    assert H.parse_header("<|channel|>final", "assistant") == ("assistant", "final", None, None)


def test_a_message_not_from_the_assistant_is_ignored():
    text = ("<|channel|>commentary to=functions.add<|message|>{}<|call|>"
            "<|start|>functions.add to=assistant<|channel|>commentary<|message|>3<|end|>"
            "<|start|>assistant<|channel|>final<|message|>3.<|return|>")
    reply = H.parse(text)
    assert (reply.content, [c.name for c in reply.calls]) == ("3.", ["add"])


@pytest.mark.parametrize("name", [n for n in OUTPUTS if n not in ("not_harmony", "cut_in_header")])
def test_messages_are_openai_harmonys(harmony, name):
    """Each message's channel, recipient, content type and text, as openai-harmony's parser
    reads the reply's tokens (not for the two replies it refuses: no harmony at all, and one
    cut inside a header)."""
    h, enc = harmony
    text = OUTPUTS[name][0]
    tokens = enc.encode(text, allowed_special="all")
    if tokens[-1] in enc.stop_tokens_for_assistant_actions():
        tokens = tokens[:-1]
    theirs = [(m.channel, m.recipient, m.content_type, m.content[0].text)
              for m in enc.parse_messages_from_completion_tokens(tokens, h.Role.ASSISTANT)]
    p = H.StreamParser()
    p.feed(text)
    p.finish()
    assert [(m.channel, m.recipient, m.content_type, m.text) for m in p.messages] == theirs


# -- grammars ----------------------------------------------------------------------------------------
def harmony_vocab(eos_tags=H.STOPS) -> Tokenizer:
    """A small byte-level BPE with gpt-oss's tags as special tokens, as its vocabulary has them."""
    folder = harmony_vocab.folder
    base = Tokenizer.from_folder(folder)
    hf = HFTokenizer.from_str(base.hf.to_str())
    hf.add_tokens([AddedToken(t, special=True, normalized=False) for t in H.TAGS])
    return Tokenizer(hf, eos_ids=[hf.token_to_id(t) for t in eos_tags])


@pytest.fixture(scope="module")
def grammars(tmp_path_factory) -> dict[str, C.Grammars]:
    harmony_vocab.folder = tmp_path_factory.mktemp("bpe")
    tiny.make_tokenizer(harmony_vocab.folder)
    both, only_return = harmony_vocab(), harmony_vocab((H.RETURN,))
    return {"gpt-oss": C.Grammars(both, both.vocab_size), "return-only": C.Grammars(only_return, only_return.vocab_size)}


def text_of(g: C.Grammars, ids) -> str:
    return g.tokenizer.decode(ids, skip_special_tokens=False)


def check_calls(calls, names=tuple(SCHEMAS)):
    for c in calls:
        assert c.name in names
        jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])


NAMED = {"type": "function", "function": {"name": "add"}}


@pytest.mark.parametrize("kind", ["gpt-oss", "return-only"])
@pytest.mark.parametrize("choice", ["auto", "required", "named"])
def test_random_decoding_gives_reasoning_then_an_answer_or_a_valid_call(grammars, choice, kind):
    g = grammars[kind]
    grammar = g.compile(lark=H.tool_choice_grammar(TOOLS, NAMED if choice == "named" else choice, grammars=g))
    kinds = set()
    for seed in range(8):
        ids, ended = random_decode(g, grammar, seed)
        assert ended
        text = text_of(g, ids)
        reply = H.parse(text)
        if choice == "auto" and not reply.calls:
            assert "<|channel|>final<|message|>" in text
            kinds.add("final")
            continue
        assert len(reply.calls) == 1 and (choice != "named" or reply.calls[0].name == "add")
        assert reply.content == "" or "<|channel|>commentary<|message|>" in text  # a preamble
        check_calls(reply.calls)
        kinds.add("call")
        if kind == "return-only":  # <|call|> is no end token there: the grammar writes it
            assert text.endswith("<|call|>")
    assert choice != "auto" or kinds == {"final", "call"}


def accepts(g: C.Grammars, grammar: C.Grammar, text: str) -> bool:
    m = g.matcher(grammar)
    try:
        for t in g.tokenizer.encode(text, add_special_tokens=False):
            m.consume(t)
    except InfernoError:
        return False
    return m.is_accepting()


THOUGHT = "<|channel|>analysis<|message|>I should check.<|end|><|start|>assistant"
CALL_ADD = '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 1, "b": 2}'


def test_grammars_accept_and_reject_sample_replies(grammars):
    g = grammars["gpt-oss"]
    auto, required, named = (g.compile(lark=H.tool_choice_grammar(TOOLS, c, grammars=g))
                             for c in ("auto", "required", NAMED))
    final = "<|channel|>final<|message|>It is sunny."
    weather = ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
    preamble = "<|channel|>commentary<|message|>Adding.<|end|><|start|>assistant"
    for text in (final, THOUGHT + final, THOUGHT + CALL_ADD, THOUGHT + weather, CALL_ADD, preamble + CALL_ADD,
                 THOUGHT + THOUGHT + '<|channel|>commentary to=functions.add<|message|>{"a":1,"b":2}'):
        assert accepts(g, auto, text), text
    assert not accepts(g, required, THOUGHT + final) and accepts(g, required, THOUGHT + weather)
    assert accepts(g, named, THOUGHT + CALL_ADD) and not accepts(g, named, THOUGHT + weather)
    # "none": the tools are in the prompt, but the reply may only reason, then answer
    none = g.compile(lark=H.tool_choice_grammar(TOOLS, "none", grammars=g))
    assert accepts(g, none, THOUGHT + final) and accepts(g, none, preamble + final)
    assert not accepts(g, none, THOUGHT + CALL_ADD) and not accepts(g, none, THOUGHT + weather)
    for text in ("It is sunny.",  # no channel
                 '<|channel|>commentary to=functions.add<|message|>{"a": "1", "b": 2}',  # a string for a number
                 '<|channel|>commentary to=functions.add<|message|>{"a": 1}',  # b missing
                 '<|channel|>commentary to=functions.mul<|message|>{"a": 1, "b": 2}',  # no such tool
                 '<|channel|>commentary to=functions.get_weather<|message|>{"a": 1, "b": 2}',  # another's arguments
                 THOUGHT + "<|channel|>final<|message|>x<|end|>"):  # an answer ends the reply
        assert not accepts(g, auto, text), text


def test_a_response_format_holds_the_answer_after_the_reasoning(grammars):
    """response_format on gpt-oss: analysis first, as the model was trained, then a final
    message that is JSON valid against the schema; with tools, a call may come instead."""
    g = grammars["gpt-oss"]
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
              "required": ["city", "days"]}
    answer = g.compile(lark=H.answer_grammar(schema, grammars=g))
    final = '<|channel|>final<|message|>{"city": "Oslo", "days": 3}'
    assert accepts(g, answer, final) and accepts(g, answer, THOUGHT + final)
    for text in ('{"city": "Oslo", "days": 3}',  # no channel: the whole reply as JSON
                 THOUGHT + "<|channel|>final<|message|>It is sunny.",  # not JSON
                 THOUGHT + '<|channel|>final<|message|>{"city": "Oslo"}',  # days missing
                 THOUGHT + CALL_ADD):  # no tools: no call
        assert not accepts(g, answer, text), text
    with_tools = g.compile(lark=H.answer_grammar(schema, TOOLS, "auto", grammars=g))
    assert accepts(g, with_tools, THOUGHT + final) and accepts(g, with_tools, THOUGHT + CALL_ADD)
    with pytest.raises(InfernoError, match="Unknown format"):  # held to what it says (a tool's is lenient)
        g.compile(lark=H.answer_grammar({"type": "object", "properties": {"a": {"format": "zork"}}}, grammars=g))


def test_grammar_tags_and_tool_choice(grammars):
    g = grammars["gpt-oss"]
    assert H.tool_choice_grammar([], "auto") is None and H.tool_choice_grammar([], "none") is None
    assert H.tool_choice_grammar(TOOLS, "auto", parallel=False) == H.tool_choice_grammar(TOOLS, "auto")
    # where the stop tags are end tokens, the matcher's end ends the reply; elsewhere they are written
    assert "<|call|>" not in H.tool_choice_grammar(TOOLS, "required", grammars=g)
    assert "<|call|>" in H.tool_choice_grammar(TOOLS, "required", grammars=grammars["return-only"])
    with pytest.raises(InfernoError, match="not in tools"):
        H.tool_choice_grammar(TOOLS, {"type": "function", "function": {"name": "mul"}})
    with pytest.raises(InfernoError, match="tool_choice"):
        H.tool_choice_grammar(TOOLS, "sometimes")
    plain = Tokenizer.from_folder(harmony_vocab.folder)
    with pytest.raises(InfernoError, match="does not speak harmony"):
        H.tool_choice_grammar(TOOLS, "auto", grammars=C.Grammars(plain, plain.vocab_size))
