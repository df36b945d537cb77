"""Embeddings over HTTP: `inferno serve --embeddings` beside llama.cpp's `llama-server --embeddings`
on the same GGUF, the same pooling, the same slots, the same requests.

    python bench/embed.py                          # SmolLM2 Q4_1, last-token pooling, 4 slots
    python bench/embed.py --pooling mean --clients 1 --rounds 5

Each round sends the same set of texts (--texts of them, 20 to 300 tokens, in requests of
--batch inputs, --clients requests at a time) to each server in turn, the servers alternating
round by round; the figure is prompt tokens (as each server's usage counts them) over the wall
time of the round. Medians over the rounds, and their ratio. Then the vectors, text by text
(cosine): the two servers' (the same model, pooling and tokens should give the same direction
up to the two engines' rounding), and each server's against its own for the text sent alone.

llama-server runs with -b and -ub 2048, so that a text fits one of its physical batches (its
embeddings need that), and -c parallel x --ctx-size (512).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from serve_load import DEFAULT_GGUF, TEXT, free_port, server  # noqa: E402

WORDS = TEXT.split()


def texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        k = rng.randint(15, 220)  # words: about 20 to 300 tokens
        start = rng.randrange(len(WORDS))
        out.append(f"{i}: " + " ".join(WORDS[(start + j) % len(WORDS)] for j in range(k)))
    return out


async def run_round(url: str, items: list[str], batch: int, clients: int, pooling_field: dict):
    import httpx
    requests = [items[i:i + batch] for i in range(0, len(items), batch)]
    vectors, tokens = [None] * len(items), [0]
    sem = asyncio.Semaphore(clients)

    async with httpx.AsyncClient(timeout=600) as client:
        async def one(k: int, inputs: list[str]):
            async with sem:
                r = await client.post(url + "/v1/embeddings", json={"model": "bench", "input": inputs, **pooling_field})
                r.raise_for_status()
                body = r.json()
                tokens[0] += body["usage"]["prompt_tokens"]
                for d in body["data"]:
                    vectors[k * batch + d["index"]] = np.asarray(d["embedding"], np.float64)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(k, inputs) for k, inputs in enumerate(requests)))
        wall = time.perf_counter() - t0
    return tokens[0] / wall, tokens[0], np.stack(vectors)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(DEFAULT_GGUF))
    ap.add_argument("--backend", default="pool")
    ap.add_argument("--pooling", default="last", choices=["last", "mean", "cls"])
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--texts", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="inputs per request")
    ap.add_argument("--clients", type=int, default=2, help="requests in flight")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--ctx-size", type=int, default=512, help="positions a slot, both servers (the longest text's)")
    args = ap.parse_args()
    from serve_load import llama_server_cmd

    items = texts(args.texts)
    p1, p2 = free_port(), free_port()
    icmd = [sys.executable, "-m", "inferno", "serve", "-m", args.model, "-b", args.backend, "--port", str(p1),
            "--parallel", str(args.parallel), "--ctx-size", str(args.ctx_size), "--alias", "bench", "--embeddings",
            "--pooling", args.pooling, "--log-level", "warning"]
    if args.threads:
        icmd += ["--threads", str(args.threads)]
    lcmd = llama_server_cmd(args, p2, args.parallel, args.ctx_size) + ["--embeddings", "--pooling", args.pooling,
                                                              "-b", "2048", "-ub", "2048"]
    figures: dict[str, list[float]] = {"inferno": [], "llama-server": []}
    vecs = {}
    with server(icmd, port=p1) as (iurl, _), server(lcmd, port=p2) as (lurl, _):
        for name, url in (("inferno", iurl), ("llama-server", lurl)):  # a warm-up round each
            asyncio.run(run_round(url, items[:args.batch], args.batch, 1, {}))
        for r in range(args.rounds):
            order = [("inferno", iurl), ("llama-server", lurl)]
            for name, url in (order if r % 2 == 0 else order[::-1]):
                rate, tokens, v = asyncio.run(run_round(url, items, args.batch, args.clients, {}))
                figures[name].append(rate)
                vecs[name] = v
                print(f"round {r + 1} {name:<13} {rate:8.1f} tokens/s ({tokens} prompt tokens)", flush=True)
        # Each server's vectors again, one text a request: does a text's vector depend on its company?
        alone = {name: asyncio.run(run_round(url, items, 1, 1, {}))[2]
                 for name, url in (("inferno", iurl), ("llama-server", lurl))}
    cos = lambda a, b: (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)  # noqa: E731
    mi, ml = np.median(figures["inferno"]), np.median(figures["llama-server"])
    between, single = cos(vecs["inferno"], vecs["llama-server"]), cos(alone["inferno"], alone["llama-server"])
    print(f"median: inferno {mi:.1f}, llama-server {ml:.1f} tokens/s: {mi / ml:.2f}x")
    print(f"cosine between the servers' vectors: min {between.min():.5f}, median {np.median(between):.5f} "
          f"({args.batch} a request), min {single.min():.5f} (one a request)")
    for name in figures:
        c = cos(vecs[name], alone[name])
        print(f"{name}: a text in a request of {args.batch} against alone: cosine min {c.min():.5f}, "
              f"bit-equal {int((vecs[name] == alone[name]).all(1).sum())} of {len(items)}")


if __name__ == "__main__":
    main()
