"""`inferno serve --ray`: the same app as two Ray Serve replicas on a local Ray cluster, each
with its own engine, behind Ray's router (or the prefix router's gateway), driven by the
`openai` client."""

from __future__ import annotations

import socket
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import ray
from ray import serve

from inferno.serve.app import ServerConfig
from inferno.serve.ray_app import deployment, routed_deployment


@pytest.fixture(scope="module")
def ray_port():
    """A local Ray cluster of 2 CPUs with Serve's HTTP proxy on a free port, for the module's
    tests (a cluster's start and stop are most of a test's time)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield port
    finally:
        serve.shutdown()
        ray.shutdown()


@contextmanager
def two_replicas(port: int, build, config: ServerConfig):
    """`build(config, replicas=2, cpus=1)` served on the cluster, both replicas running: the
    `openai` client of its URL. The application is deleted after, its replicas with it."""
    serve.run(build(config, replicas=2, cpus=1), name="inferno", route_prefix="/")
    try:
        assert serve.status().applications["inferno"].deployments["inferno"].replica_states == {"RUNNING": 2}
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    finally:
        serve.delete("inferno")


def test_two_replicas_behind_ray_serve(ray_port, qwen3_dir):
    config = ServerConfig(model=str(qwen3_dir), model_id="tiny", parallel=2, ctx_size=128)
    with two_replicas(ray_port, deployment, config) as client:
        ask = dict(model="tiny", messages=[{"role": "user", "content": "Hello"}], max_tokens=8, temperature=0)

        def chat(stream: bool) -> str:
            if stream:
                return "".join(c.choices[0].delta.content or "" for c in
                               client.chat.completions.create(stream=True, **ask) if c.choices)
            return client.chat.completions.create(**ask).choices[0].message.content

        with ThreadPoolExecutor(6) as pool:
            texts = list(pool.map(chat, [False, True] * 3))
        assert len(set(texts)) == 1 and texts[0]  # the same greedy answer from either replica
        assert [m.id for m in client.models.list()] == ["tiny"]


def test_the_prefix_router_sends_each_turn_where_its_prefix_is(ray_port, qwen3_dir):
    """Two replicas behind the gateway: four conversations of three turns, each turn resending
    its history. Every later turn lands on the replica that served the earlier ones, so its
    history comes from that replica's slots (cached_tokens at least the last turn's prompt);
    Ray's default router would put about half of them on the other replica, where nothing is
    cached. Streaming passes through the gateway as a stream."""
    # four slots a replica: all four conversations fit on either, so no prefix is evicted
    config = ServerConfig(model=str(qwen3_dir), model_id="tiny", parallel=4, ctx_size=512)
    with two_replicas(ray_port, routed_deployment, config) as client:
        def conversation(k: int) -> list[tuple[int, int]]:
            history, seen = [{"role": "system", "content": f"You are assistant number {k}. " * 4}], []
            for turn in range(3):
                history.append({"role": "user", "content": f"Question {turn} of conversation {k}?"})
                reply = client.chat.completions.create(model="tiny", messages=history, max_tokens=6, temperature=0)
                usage = reply.usage
                seen.append((usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens))
                history.append({"role": "assistant", "content": reply.choices[0].message.content})
            return seen

        # one at a time: the replicas' queues stay level, so every turn is routed on its prefix
        # (past IMBALANCE requests of difference, load decides: not what this test is about)
        turns = [conversation(k) for k in range(4)]
        for seen in turns:
            for (before, _), (_, cached) in zip(seen, seen[1:]):
                assert cached >= before - 8, turns  # the last turn's prompt (bar its last tokens) was cached
        stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=6, temperature=0, stream=True)
        pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
        assert len(pieces) > 1
        assert [m.id for m in client.models.list()] == ["tiny"]  # no prompt: routed on load
