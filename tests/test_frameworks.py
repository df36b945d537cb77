"""Agent frameworks pointed at `inferno serve` with the default model, as their users point them:
instructor (tool calls, JSON schema, partial streaming) and the OpenAI Agents SDK (a typed
output, a function tool's round trip, over chat completions and over its default, the
Responses API, streamed too). A 135M model's facts are not the point; what is: every
request ends, parses and validates, and tool calls come back as calls."""

from __future__ import annotations

import asyncio

import openai
import pytest
from pydantic import BaseModel
from test_serve import running, wait_healthy

from inferno.loading.resolve import resolve
from inferno.serve.app import ServerConfig, build_app

ASK = [{"role": "user", "content": "Tell me about Paris."}]


class City(BaseModel):
    name: str
    country: str
    population: int


@pytest.fixture(scope="module")
def url():
    app = build_app(ServerConfig(model=str(resolve("smollm2-135m")), model_id="m", parallel=2, ctx_size=2048))
    with running(app) as base:
        wait_healthy(base)
        yield base + "/v1"


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_response_models(url, mode):
    import instructor
    client = instructor.from_openai(openai.OpenAI(base_url=url, api_key="x"), mode=getattr(instructor.Mode, mode))
    city = client.chat.completions.create(model="m", response_model=City, messages=ASK, temperature=0,
                                          max_tokens=200, max_retries=0)
    assert isinstance(city, City) and city.name and abs(city.population) < 10**16


def test_instructor_partial_streaming(url):
    """Partial objects are built from the streamed argument fragments: several, growing."""
    import instructor
    client = instructor.from_openai(openai.OpenAI(base_url=url, api_key="x"), mode=instructor.Mode.TOOLS)
    partials = list(client.chat.completions.create_partial(model="m", response_model=City, messages=ASK,
                                                           temperature=0, max_tokens=200, max_retries=0))
    assert len(partials) > 3
    assert partials[0].population is None and isinstance(partials[-1].population, int)


def agents_model(url, api: str = "chat"):
    """openai-agents' model over the chat completions API, or its default: the Responses API."""
    from agents import OpenAIChatCompletionsModel, OpenAIResponsesModel, set_tracing_disabled
    set_tracing_disabled(True)  # its exporter would call OpenAI
    kind = OpenAIChatCompletionsModel if api == "chat" else OpenAIResponsesModel
    return kind(model="m", openai_client=openai.AsyncOpenAI(base_url=url, api_key="x"))


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_openai_agents_output_type(url, api):
    from agents import Agent, ModelSettings, Runner
    agent = Agent(name="cities", instructions="Describe the city.", model=agents_model(url, api), output_type=City,
                  model_settings=ModelSettings(temperature=0, max_tokens=200))
    result = asyncio.run(Runner.run(agent, "Tell me about Paris."))
    assert isinstance(result.final_output, City)


@pytest.mark.parametrize("api,streamed", [("chat", False), ("responses", False), ("responses", True)])
def test_openai_agents_tool_round_trip(url, api, streamed):
    from agents import Agent, ModelSettings, Runner, function_tool
    seen = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        seen.append(city)
        return f"Sunny in {city}"

    agent = Agent(name="weather", instructions="Use the tools.", model=agents_model(url, api), tools=[get_weather],
                  model_settings=ModelSettings(temperature=0, max_tokens=200, tool_choice="required"),
                  tool_use_behavior="stop_on_first_tool")
    if streamed:
        async def run():
            result = Runner.run_streamed(agent, "What is the weather in Paris?", max_turns=3)
            async for _ in result.stream_events():
                pass
            return result
        result = asyncio.run(run())
    else:
        result = asyncio.run(Runner.run(agent, "What is the weather in Paris?", max_turns=3))
    kinds = [type(item).__name__ for item in result.new_items]
    assert seen and "ToolCallItem" in kinds and "ToolCallOutputItem" in kinds
    assert result.final_output == f"Sunny in {seen[0]}"
