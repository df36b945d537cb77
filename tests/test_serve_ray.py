"""`inferno serve --ray`: the same app as two Ray Serve replicas on a local Ray cluster, each
with its own engine, behind Ray's router, driven by the `openai` client."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

import openai
import ray
from ray import serve

from inferno.serve.app import ServerConfig
from inferno.serve.ray_app import deployment


def test_two_replicas_behind_ray_serve(qwen3_dir):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        config = ServerConfig(model=str(qwen3_dir), model_id="tiny", parallel=2, ctx_size=128)
        serve.run(deployment(config, replicas=2, cpus=1), name="inferno", route_prefix="/")
        replicas = serve.status().applications["inferno"].deployments["inferno"].replica_states
        assert replicas == {"RUNNING": 2}

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
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
    finally:
        serve.shutdown()
        ray.shutdown()
