"""The Responses API (inferno/serve/responses.py) through the official `openai` client, on a tiny
random model: the same greedy text as the chat completion it becomes, streamed events that add
up to the whole, a stored conversation continued by previous_response_id, and errors in
OpenAI's shape. tests/test_frameworks.py runs openai-agents' default (Responses) model, tool
calls included, on SmolLM2."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from inferno.serve.app import ServerConfig, build_app

from test_serve import running, wait_healthy

MODEL = "tiny"
GREEDY = dict(temperature=0, max_output_tokens=10)


@pytest.fixture(scope="module")
def server(qwen3_dir):
    app = build_app(ServerConfig(model=str(qwen3_dir), model_id=MODEL, parallel=2, ctx_size=512))
    with running(app) as url:
        wait_healthy(url)
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


def test_text_is_the_chat_completions(client):
    r = client.responses.create(model=MODEL, input="Hello there", instructions="Be brief.", **GREEDY)
    chat = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=10, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}])
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL
    assert r.output_text == chat.choices[0].message.content and r.output[0].type == "message"
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"
    assert (r.usage.input_tokens, r.usage.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)


def test_streamed_events_add_up_to_the_whole(client):
    whole = client.responses.create(model=MODEL, input="Hello there", **GREEDY)
    events = list(client.responses.create(model=MODEL, input="Hello there", stream=True, **GREEDY))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-1] == f"response.{whole.status}" and [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    assert text == done.text == whole.output_text == events[-1].response.output_text


@pytest.mark.parametrize("instructions", [None, "Be brief."])
def test_previous_response_id_continues_the_conversation(client, instructions):
    """The stored conversation, without its instructions (OpenAI carries none over)."""
    first = client.responses.create(model=MODEL, input="My name is Ada.", instructions=instructions, **GREEDY)
    second = client.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id, **GREEDY)
    chat = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=10, messages=[
        {"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"}])
    assert second.output_text == chat.choices[0].message.content
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    if instructions is None:
        assert second.usage.input_tokens_details.cached_tokens > first.usage.input_tokens // 2  # the slot held it


def test_items_as_input_and_json_output(client):
    items = [{"role": "developer", "content": "Answer in JSON."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "A number?"}]}]
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
    r = client.responses.create(model=MODEL, input=items, temperature=0, max_output_tokens=60,
                                text={"format": {"type": "json_schema", "name": "n", "schema": schema, "strict": True}})
    if r.status == "completed":
        assert isinstance(json.loads(r.output_text)["n"], int)
    else:  # a random model's number may run past 60 tokens; what came is a prefix of the JSON
        assert r.output_text.lstrip().startswith("{")


@pytest.mark.parametrize("body,status,param", [
    ({"input": "hi", "previous_response_id": "resp_nope"}, 404, "previous_response_id"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, 400, "input"),
    ({"input": "hi", "text": {"format": {"type": "grammar"}}}, 400, "text.format"),
    ({"input": "hi", "max_output_tokens": 10**6}, 400, "max_output_tokens"),
    ({"input": 5}, 400, "input"),
])
def test_bad_requests_get_openai_errors(server, body, status, param):
    r = httpx.post(server + "/v1/responses", json={"model": MODEL, **body})
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_store_false_is_not_kept(client):
    r = client.responses.create(model=MODEL, input="hi", store=False, **GREEDY)
    with pytest.raises(openai.NotFoundError, match="not found"):
        client.responses.create(model=MODEL, input="again", previous_response_id=r.id, **GREEDY)
