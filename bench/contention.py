"""pool on a busy machine: `inferno generate` with another process keeping a core busy, against
`--threads 1` and `-b simd`, and the same on a quiet machine (issue: steady on a busy machine).

    python bench/contention.py                     # SmolLM2, 3 runs of each, busy and quiet
    python bench/contention.py --busy 2 -r 5       # two spinning processes

The busy load is this script's own: `--busy` Python processes spinning (`while True: pass`),
started before the runs and stopped after them. Each run is a fresh `inferno generate --json -t 0
-n 64` process, alternating the settings; reported are the medians of decode tok/s and TTFT, and
each setting's ratio to `--threads 1` in the same condition. Then the server: one client, 20
tokens a reply, five replies in a row, the median time per reply.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

PROMPT = "Write a long story about a dragon who loves bread."
SETTINGS = {"pool (default)": [], "--threads 1": ["--threads", "1"], "-b simd": ["-b", "simd"]}


@contextmanager
def busy(n: int):
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    time.sleep(0.5)
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def generate(model: str | None, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "inferno", "generate", "--json", "-t", "0", "-n", "64", "-p", PROMPT, *extra]
    if model:
        cmd += ["-m", model]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout)


def table(model, reps: int, label: str) -> None:
    runs = {name: [] for name in SETTINGS}
    for _ in range(reps):
        for name, extra in SETTINGS.items():
            runs[name].append(generate(model, extra))
    base = runs["--threads 1"]
    base_dec = np.median([r["decode_tokens_per_s"] for r in base])
    base_ttft = np.median([r["ttft_s"] for r in base])
    print(f"\n{label}")
    print("| setting | decode tok/s | TTFT ms | decode / --threads 1 | TTFT / --threads 1 |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, rs in runs.items():
        dec, ttft = np.median([r["decode_tokens_per_s"] for r in rs]), np.median([r["ttft_s"] for r in rs])
        print(f"| {name} | {dec:.1f} | {ttft * 1e3:.1f} | {dec / base_dec:.2f}x | {ttft / base_ttft:.2f}x |")


def server(model, threads: list[str], replies: int = 5) -> float:
    sys.path.insert(0, str(Path(__file__).parent))
    import openai
    from serve_load import free_port
    from serve_load import server as run_server
    port = free_port()
    cmd = [sys.executable, "-m", "inferno", "serve", "--port", str(port), "--alias", "bench", *threads]
    if model:
        cmd += ["-m", model]
    with run_server(cmd, port=port) as (url, _):
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        times = []
        for i in range(replies + 1):
            t0 = time.perf_counter()
            c.chat.completions.create(model="bench", max_tokens=20, temperature=0,
                                      messages=[{"role": "user", "content": f"{i}. {PROMPT}"}])
            times.append(time.perf_counter() - t0)
    return float(np.median(times[1:]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", "-m", default=None)
    p.add_argument("--busy", type=int, default=1, help="spinning processes for the busy runs")
    p.add_argument("--repetitions", "-r", type=int, default=3)
    args = p.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)
    print(f"# {os.cpu_count()} cores; {args.model or 'the default model'}; medians of {args.repetitions}")
    table(args.model, args.repetitions, "quiet")
    with busy(args.busy):
        table(args.model, args.repetitions, f"busy: {args.busy} spinning process(es)")
        serve_default = server(args.model, [])
        serve_one = server(args.model, ["--threads", "1"])
    print(f"\nserver under the same load, one client, 20 tokens a reply: default {serve_default:.2f} s, "
          f"--threads 1 {serve_one:.2f} s a reply ({serve_one / serve_default:.2f}x default's rate)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
