"""Structured output and tool calls end to end: JSON schemas, GBNF and `tools` through the server
(the official `openai` client), the CLI and the Python API, on a tiny random model with a
Qwen-style tool template and on the real default model."""

from __future__ import annotations

import json
import subprocess
import sys
from enum import Enum
from typing import Literal, Optional, Union

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from test_serve import running, wait_healthy
from tiny import make_model

import inferno
from inferno.constrain import unfence
from inferno.loading.resolve import resolve
from inferno.sampling import SamplingParams
from inferno.serve import BatchEngine, Options
from inferno.serve.app import ServerConfig, build_app

# Qwen2.5's tool template, cut down: tools in the system turn, calls as <tool_call> blocks,
# tool results as <tool_response> in a user turn.
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions.\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n\n"
    "For each call, return a JSON object within <tool_call></tool_call> tags:\n"
    "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n{{ message.content }}"
    "{%- for tc in message.tool_calls %}\n<tool_call>\n{\"name\": \"{{ tc.function.name }}\", "
    "\"arguments\": {{ tc.function.arguments | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"enum": ["Paris", "Rome", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["city", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                                       "required": ["zone"], "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tool_model_dir(tmp_path_factory):
    """A tiny Qwen3 with a Qwen-style tool template (its vocabulary has no <tool_call> token:
    the tag is text, which the lazy grammar of tool_choice auto must catch), and room for the
    tool list in its small vocabulary's many tokens."""
    folder = make_model(tmp_path_factory.mktemp("tools") / "model", "qwen3", hidden=64, heads=4, kv_heads=2,
                        head_dim=24, max_positions=2048)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = TOOL_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def serve(model, ctx_size: int):
    app = build_app(ServerConfig(model=str(model), model_id="m", parallel=2, ctx_size=ctx_size))
    return app, running(app)


@pytest.fixture(scope="module")
def tiny(tool_model_dir):
    app, ctx = serve(tool_model_dir, 2048)
    with ctx as url:
        wait_healthy(url)
        yield openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0), app.state.inferno.batch.engine


@pytest.fixture(scope="module")
def real():
    app, ctx = serve(resolve("smollm2-135m"), 2048)
    with ctx as url:
        wait_healthy(url)
        yield openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0), app.state.inferno.batch.engine


def check_calls(message, names):
    assert message.tool_calls, message
    for call in message.tool_calls:
        assert call.id.startswith("call_") and call.type == "function" and call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def streamed(client, **request):
    """A streamed chat request folded back into (content, calls, finish_reason)."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            d = choice.delta
            content += d.content or ""
            for tc in d.tool_calls or ():
                if tc.id:  # the first delta of a call: its id and name, once
                    assert tc.index not in calls and tc.function.name
                    calls[tc.index] = [tc.id, tc.function.name, ""]
                calls[tc.index][2] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


# -- structured output ---------------------------------------------------------------------------
class Colour(str, Enum):
    red = "red"
    green = "green"


class Address(BaseModel):
    city: str = Field(max_length=20)
    country: Literal["France", "Italy", "Spain"]


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int
    address: Address
    favourite: Colour
    nicknames: list[str] = Field(min_length=1, max_length=2)
    height: Optional[float]
    id: Union[int, str]


def test_parse_with_a_pydantic_model_on_the_default_model(real):
    client, _ = real
    r = client.chat.completions.parse(
        model="m", temperature=0, max_tokens=300, response_format=Person,
        messages=[{"role": "user", "content": "Describe a person who lives in Paris as JSON."}])
    person = r.choices[0].message.parsed
    assert isinstance(person, Person) and isinstance(person.address, Address)
    assert 1 <= len(person.nicknames) <= 2 and r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("which", ["tiny", "real"])
def test_json_object(which, request):
    client, _ = request.getfixturevalue(which)
    ask = [{"role": "user", "content": 'Give the capital of France as a JSON object with the key "capital".'}]
    r = client.chat.completions.create(model="m", messages=ask, temperature=0, max_tokens=400,
                                       response_format={"type": "json_object"})
    # A complete reply parses, always; a random model may also run out of tokens in a string.
    assert r.choices[0].finish_reason == "stop" or which == "tiny" and r.choices[0].finish_reason == "length"
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)


@pytest.mark.parametrize("stream", [False, True])
def test_a_fenced_reply_reaches_content_without_its_fence(real, stream):
    """SmolLM2 writes ```json first (llama.cpp's server allows it too): the JSON inside ends,
    and the content holds only the JSON, streamed or whole."""
    client, _ = real
    ask = dict(model="m", messages=[{"role": "user", "content": "List three fruits as JSON."}], temperature=0,
               max_tokens=300, response_format={"type": "json_object"})
    whole = client.chat.completions.create(logprobs=True, **ask)
    assert whole.choices[0].logprobs.content[0].token == "```"  # the model did fence it
    content, finish = whole.choices[0].message.content, whole.choices[0].finish_reason
    if stream:
        content, _, finish = streamed(client, **ask)
    assert finish == "stop" and content == whole.choices[0].message.content
    assert isinstance(json.loads(content), dict) and "`" not in content


def test_max_tokens_cut_is_length(tiny):
    client, _ = tiny
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    r = client.chat.completions.create(model="m", messages=ASK, temperature=0, max_tokens=24, logprobs=True,
                                       response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}})
    written = "".join(t.token for t in r.choices[0].logprobs.content)
    # What was written, less a ```json fence the grammar allows (this model takes it).
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.content == unfence(written)
    assert r.choices[0].message.content.startswith("{")


def test_gbnf_and_json_schema_fields_on_chat_and_completions(tiny):
    client, _ = tiny
    gbnf = 'root ::= answer "." \nanswer ::= "yes" | "no"'
    chat = client.chat.completions.create(model="m", messages=ASK, temperature=0, max_tokens=20,
                                          extra_body={"grammar": gbnf})
    assert chat.choices[0].message.content in ("yes.", "no.") and chat.choices[0].finish_reason == "stop"
    text = client.completions.create(model="m", prompt="Is it?", temperature=0.9, seed=3, max_tokens=20,
                                     extra_body={"grammar": gbnf})
    assert text.choices[0].text in ("yes.", "no.")
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 2,
              "maxItems": 3}
    text = client.completions.create(model="m", prompt="Numbers:", temperature=0, max_tokens=60,
                                     extra_body={"json_schema": schema})
    jsonschema.validate(json.loads(text.choices[0].text), schema)


def test_a_constrained_sequence_beside_a_free_one(tool_model_dir):
    """In one batch, a constrained sequence and a free one each give what they give alone."""
    engine = inferno.load(tool_model_dir, progress=False)
    greedy = SamplingParams(temperature=0, top_k=0, top_p=1, min_p=0)
    grammar = engine.constraint(json_schema={"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4})
    a = engine.encode_prompt("Letters please")
    b = engine.encode_prompt("Once upon a time")
    constrained = Options(max_tokens=40, sampling=greedy, grammar=grammar)
    free = Options(max_tokens=40, sampling=greedy)
    with BatchEngine(engine, parallel=2, ctx_size=256) as batch:
        alone = ["".join(e.text for e in batch.submit(ids, o)) for ids, o in ((a, constrained), (b, free))]
        batch.slots.clear()
        handles = [batch.submit(a, constrained), batch.submit(b, free)]
        together = ["".join(e.text for e in h) for h in handles]
    assert together == alone
    assert set(json.loads(alone[0])) <= {"a", "b", "c"}
    assert alone[1] == engine.generate("Once upon a time", max_tokens=40, temperature=0, top_k=0, top_p=1,
                                       min_p=0).text


def test_python_api_and_cli(tool_model_dir, tmp_path):
    engine = inferno.load(tool_model_dir, progress=False)
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    r = engine.generate("A number", json_schema=schema, max_tokens=50, temperature=0)
    jsonschema.validate(json.loads(r.text), schema)
    assert engine.generate("Is it?", grammar='root ::= "yes" | "no"', temperature=0).text in ("yes", "no")
    (tmp_path / "g.gbnf").write_text('root ::= "yes" | "no"')
    (tmp_path / "s.json").write_text(json.dumps(schema))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "inferno", "generate", "-m", str(tool_model_dir), "-t", "0",
                               *args], capture_output=True, text=True, timeout=300)
    p = cli("-p", "Is it?", "--grammar-file", tmp_path / "g.gbnf")
    assert p.returncode == 0 and p.stdout.strip() in ("yes", "no"), p.stderr
    for spec in (str(tmp_path / "s.json"), json.dumps(schema)):
        p = cli("-p", "A number", "-n", "50", "--json-schema", spec)
        assert p.returncode == 0, p.stderr
        jsonschema.validate(json.loads(p.stdout), schema)
    cut = cli("-p", "A number", "-n", "2", "--json-schema", json.dumps(schema))
    assert cut.returncode == 1 and cut.stdout == "" and "the JSON is incomplete" in cut.stderr, cut
    bad = cli("-p", "x", "--grammar-file", tmp_path / "missing.gbnf")
    assert bad.returncode == 1 and "--grammar-file: cannot read" in bad.stderr and "Traceback" not in bad.stderr
    bad = cli("-p", "x", "--json-schema", '{"type": 5')
    assert bad.returncode == 1 and "--json-schema is not valid JSON" in bad.stderr
    (tmp_path / "bad.gbnf").write_text("root ::= ((")
    bad = cli("-p", "x", "--grammar-file", tmp_path / "bad.gbnf")
    assert bad.returncode == 1 and "not a valid GBNF grammar" in bad.stderr and "Traceback" not in bad.stderr


def test_schemas_as_pydantic_writes_them_end(tool_model_dir):
    """Objects that list their properties and leave additionalProperties out (pydantic's,
    zod's, most hand-written schemas), numbers without bounds: a tiny random model invents keys
    and writes digits to the limit under the schema as written, and ends under inferno's reading
    of it (closed objects, bounded numbers)."""
    engine = inferno.load(tool_model_dir, progress=False)
    schemas = [{"type": "object", "properties": {"a": {"type": "integer"}}},
               {"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"]},
               {"type": "object", "properties": {"city": {"type": "object", "properties": {
                   "name": {"type": "string", "maxLength": 10}, "people": {"type": "integer"}}}}}]
    def listed_keys_only(obj, schema):
        assert set(obj) <= set(schema["properties"]), obj
        for key, value in obj.items():
            if isinstance(value, dict):
                listed_keys_only(value, schema["properties"][key])

    for schema in schemas:
        for prompt in ("hello", "story", "x y z", "Describe a city."):
            r = engine.generate(prompt, json_schema=schema, max_tokens=120, temperature=0)
            assert r.cut_by is None, (schema, prompt, r.text)
            obj = json.loads(r.text)
            jsonschema.validate(obj, schema)
            listed_keys_only(obj, schema)


# -- tool calls ----------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["tiny", "real"])
@pytest.mark.parametrize("parallel", [False, True])
def test_tool_choice_required_and_named(which, parallel, request):
    """With parallel calls allowed (OpenAI's default, what agent frameworks send), these models
    repeat their last call until max_tokens (SmolLM2 does): the repeat ends the reply."""
    client, engine = request.getfixturevalue(which)
    assert engine.tool_format == ("hermes" if which == "tiny" else "generic")
    r = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required",
                                       temperature=0, max_tokens=400, parallel_tool_calls=parallel)
    assert r.choices[0].finish_reason == "tool_calls"
    check_calls(r.choices[0].message, {"get_weather", "get_time"})
    calls = [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls]
    assert len(calls) == len(set(calls)) and (parallel or len(calls) == 1)
    r = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, temperature=0, max_tokens=400,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    check_calls(r.choices[0].message, {"get_time"})
    assert len(r.choices[0].message.tool_calls) == 1


@pytest.mark.parametrize("which", ["tiny", "real"])
@pytest.mark.parametrize("choice,parallel", [("required", False), ("auto", False), ("required", True),
                                             ("auto", True)])
def test_streamed_calls_concatenate_to_the_whole_reply(which, choice, parallel, request):
    client, _ = request.getfixturevalue(which)
    body = dict(model="m", messages=ASK, tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=400,
                parallel_tool_calls=parallel)
    whole = client.chat.completions.create(**body).choices[0]
    content, calls, finish = streamed(client, **body)
    assert finish == whole.finish_reason
    assert [(n, a) for _, n, a in calls] == [(c.function.name, c.function.arguments)
                                            for c in whole.message.tool_calls or ()]
    assert content == (whole.message.content or "")
    if calls:
        for _, name, arguments in calls:
            jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_by_max_tokens_is_a_call(tiny, stream):
    """Forced calls cut by max_tokens come back as calls with what was generated, finish_reason
    length, and nothing of the call's wrapper in the content."""
    client, engine = tiny
    body = dict(model="m", messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}},
                temperature=0, max_tokens=75)  # this model: inside the arguments' object
    if stream:
        content, calls, finish = streamed(client, **body)
        calls = [(n, a) for _, n, a in calls]
    else:
        r = client.chat.completions.create(**body).choices[0]
        content, finish = r.message.content or "", r.finish_reason
        calls = [(c.function.name, c.function.arguments) for c in r.message.tool_calls or ()]
    assert finish == "length" and "tool_call" not in content and '"name"' not in content
    assert [n for n, _ in calls] == ["get_weather"]
    assert calls[0][1].startswith("{") and not calls[0][1].rstrip().endswith("}")


def test_arguments_stream_in_fragments(tiny):
    client, _ = tiny
    fragments = []
    for chunk in client.chat.completions.create(
            stream=True, model="m", messages=ASK, tools=TOOLS, temperature=0, max_tokens=400,
            tool_choice={"type": "function", "function": {"name": "get_weather"}}):
        for tc in chunk.choices[0].delta.tool_calls or () if chunk.choices else ():
            if tc.function.arguments:
                fragments.append(tc.function.arguments)
    assert len(fragments) > 3 and json.loads("".join(fragments))["city"] in ("Paris", "Rome", "Oslo")


def test_auto_calls_once_the_model_opens_a_call(tiny, monkeypatch):
    """tool_choice auto on the tiny model: free text, until the model writes <tool_call> (here
    the sampler is made to write it first); from there the call is held to the tools' schemas,
    so a random model's call still parses and validates."""
    import inferno.sequence
    client, engine = tiny
    opening = iter(engine.tokenizer.encode("Sure.<tool_call>", add_special_tokens=False))
    sample = inferno.sequence.sample
    monkeypatch.setattr(inferno.sequence, "sample",
                        lambda *a, **k: t if (t := next(opening, None)) is not None else sample(*a, **k))
    r = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="auto", temperature=0,
                                       max_tokens=400, parallel_tool_calls=False)
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content == "Sure."
    check_calls(r.choices[0].message, {"get_weather", "get_time"})


def test_a_tool_result_round_trips(tiny):
    client, engine = tiny
    first = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required",
                                           temperature=0, max_tokens=400, parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 C"}]
    r = client.chat.completions.create(model="m", messages=history, tools=TOOLS, temperature=0, max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    rendered = engine.tokenizer.decode(engine.encode_prompt(history, tools=TOOLS))
    assert "<tool_response>\nSunny, 24 C\n</tool_response>" in rendered
    assert f'"name": "{call.function.name}", "arguments": {{' in rendered
    assert r.usage.prompt_tokens_details.cached_tokens > 0  # the history's prefix was reused


def test_tools_without_a_tool_template_get_the_generic_format(real):
    client, engine = real
    rendered = engine.tokenizer.decode(engine.encode_prompt(ASK, tools=TOOLS))
    assert '"tool_calls": [{"name": "<tool name>"' in rendered and "get_weather" in rendered
    r = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="none", temperature=0,
                                       max_tokens=8)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length")


def test_a_failing_grammar_fails_its_sequence_only(tool_model_dir, monkeypatch):
    import inferno.scheduler
    engine = inferno.load(tool_model_dir, progress=False)
    greedy = SamplingParams(temperature=0, top_k=0, top_p=1, min_p=0)
    grammar = engine.constraint(json_schema={"type": "array", "items": {"enum": ["a", "b"]}})

    def broken(seqs):
        if any(s.matcher is not None for s in seqs):
            raise RuntimeError("the grammar library failed")
        return [None] * len(seqs)
    monkeypatch.setattr(inferno.scheduler, "masks_for", broken)
    with BatchEngine(engine, parallel=2, ctx_size=256) as batch:
        bad = batch.submit(engine.encode_prompt("Letters"), Options(max_tokens=8, sampling=greedy, grammar=grammar))
        good = batch.submit(engine.encode_prompt("Once upon"), Options(max_tokens=8, sampling=greedy))
        bad_events, good_events = list(bad), list(good)
    assert bad_events[-1].finish_reason == "error" and "grammar library" in bad_events[-1].error
    assert good_events[-1].finish_reason == "length" and not good_events[-1].error
