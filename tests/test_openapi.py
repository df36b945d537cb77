"""/openapi.json describes the API (inferno/serve/openapi.py): request bodies from the models
the server validates against, responses the server really sends (checked here with
jsonschema), every error status; then Schemathesis fuzzes the whole document."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import jsonschema
import pytest

from inferno.serve.app import ServerConfig, build_app

from test_serve import running, wait_healthy

MODEL = "tiny"
POSTS = {"/v1/chat/completions": ("ChatRequest", "ChatCompletion"),
         "/v1/completions": ("CompletionRequest", "Completion"),
         "/v1/embeddings": ("EmbeddingRequest", "EmbeddingList"),
         "/v1/responses": ("ResponsesRequest", "ResponseObject")}


@pytest.fixture(scope="module")
def server(qwen3_dir):
    app = build_app(ServerConfig(model=str(qwen3_dir), model_id=MODEL, parallel=2, ctx_size=256, embeddings=True))
    with running(app) as url:
        wait_healthy(url)
        yield url


@pytest.fixture(scope="module")
def doc(server):
    return httpx.get(server + "/openapi.json").json()


def check(doc: dict, path: str, method: str, response: httpx.Response) -> None:
    """`response` against what the document says `method path` answers with its status."""
    documented = doc["paths"][path][method]["responses"]
    assert str(response.status_code) in documented, (path, response.status_code)
    schema = documented[str(response.status_code)]["content"]["application/json"]["schema"]
    jsonschema.validate(response.json(), {**schema, "components": doc["components"]})


def test_every_body_and_status_is_described(doc):
    for path, (request, answer) in POSTS.items():
        op = doc["paths"][path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/" + request)
        assert {"200", "400", "401", "404", "413", "429", "500", "503"} <= set(op["responses"])
        assert op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/" + answer)
        assert MODEL in doc["components"]["schemas"][request]["properties"]["model"]["enum"]
    assert "422" not in doc["paths"]["/v1/models/{model}"]["get"]["responses"]  # never sent
    messages = doc["components"]["schemas"]["ChatRequest"]["properties"]["messages"]
    assert messages["minItems"] == 1 and "items" in messages  # the validated model's own rules


BODIES = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "logprobs": True,
                              "top_logprobs": 2}, 200),
    ("/v1/completions", {"prompt": ["Hi", "there"], "max_tokens": 3, "logprobs": 2}, 200),
    ("/v1/embeddings", {"input": ["Hi", "there"]}, 200),
    ("/v1/embeddings", {"input": [[1, 2, 3], [4, 5]]}, 200),
    ("/v1/embeddings", {"input": "Hi", "encoding_format": "base64"}, 200),
    ("/v1/responses", {"input": "Hi", "max_output_tokens": 4}, 200),
    ("/v1/responses", {"input": "Hi", "previous_response_id": "resp_x"}, 404),
    ("/v1/chat/completions", {"messages": []}, 400),
    ("/v1/completions", {"prompt": "Hi", "temperature": "hot"}, 400),  # strict: a string is no number
    ("/v1/embeddings", {"input": [[True]]}, 400),  # nor true a token id
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 10**6}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "repetition_penalty": 5e-324}, 400),
]


@pytest.mark.parametrize("path,body,status", BODIES)
def test_responses_match_the_document(server, doc, path, body, status):
    r = httpx.post(server + path, json={"model": MODEL, **body}, timeout=60)
    assert r.status_code == status, r.text
    check(doc, path, "post", r)


def test_other_answers_match_the_document(server, doc):
    check(doc, "/v1/models", "get", httpx.get(server + "/v1/models"))
    check(doc, "/v1/models/{model}", "get", httpx.get(server + "/v1/models/" + MODEL))
    check(doc, "/v1/models/{model}", "get", httpx.get(server + "/v1/models/nope"))
    check(doc, "/health", "get", httpx.get(server + "/health"))
    check(doc, "/v1/chat/completions", "post",
          httpx.post(server + "/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]}))
    check(doc, "/v1/completions", "post", httpx.post(server + "/v1/completions", content=b"x" * (2 << 20)))  # 413


def test_schemathesis_finds_nothing(server, tmp_path):
    """Every check but positive_data_acceptance, over the coverage, fuzzing and stateful
    phases: no 5xx, no status the document does not list, no body or streamed event that
    breaks its schema, no schema-violating body accepted. positive_data_acceptance wants
    every schema-valid body accepted, which no LLM API can promise: a prompt's tokens against
    the context, a tool message with no content, a size the model was not trained for and a
    draft model the server has not loaded are 400s a JSON Schema cannot foresee."""
    st = Path(sys.executable).parent / "st"
    run = subprocess.run([str(st), "run", server + "/openapi.json", "--checks", "all",
                          "--exclude-checks", "positive_data_acceptance", "--max-examples", "40",
                          "--request-timeout", "60", "--seed", "1", "--no-color"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "Server error" not in run.stdout
