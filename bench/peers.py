"""Our backends beside the engines a user would pick instead, in one run, on the same weights.

    python bench/peers.py                                   # SmolLM2-135M: simd, pool, peers
    python bench/peers.py -m ~/.cache/inferno/bench/qwen3-0.6b-shape -b pool

Peers, each when installed, each in its own fresh process like our backends:
- transformers (torch, float32, `--threads` intra-op threads) on the same weights: the GGUF
  dequantised by transformers' own loader, or the same model folder.
- llama.cpp through llama-cpp-python on the same GGUF (its Q4_1 weights, so its GB/s counts
  Q4_1 bytes), `--threads` threads for prefill and decode. Needs a .gguf: not run on a folder.

The tests are inferno bench's (see inferno/bench.py): ppN from an empty cache to the first token,
tgN decoded one token at a time from an empty cache, warm-up then -r runs. Then the ratio of each
of our backends to each peer, test by test.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

from inferno import bench
from inferno.errors import InfernoError
from inferno.loading.resolve import resolve


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class TransformersRunner:
    """transformers' model in float32 behind bench.measure's interface."""

    flash = None

    def __init__(self, path: str, threads: int, label: str):
        import torch
        from transformers import AutoModelForCausalLM
        torch.set_num_threads(threads)
        self.torch, self.threads, self.model_name, self.backend = torch, threads, label, "transformers"
        self.weight_type = "F32"  # loaded as float32, whatever the file holds
        path = Path(path)
        t0 = time.perf_counter()
        if path.suffix == ".gguf":
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.model = model.eval()
        self.load_s = time.perf_counter() - t0
        cfg = model.config
        self.vocab_size = cfg.vocab_size
        self.first_token = cfg.bos_token_id or 0
        # As engine.weight_bytes_per_token: every matrix once (a tied lm_head is the embedding,
        # read whole), plus one embedding row.
        embed = model.get_input_embeddings().weight
        total = sum(p.numel() for p in model.parameters()) * 4
        untied = model.get_output_embeddings().weight.data_ptr() != embed.data_ptr()
        self.weight_bytes_per_token = total - (embed.numel() * 4 if untied else 0) + embed.shape[1] * 4

    def _step(self, ids, past):
        out = self.model(input_ids=self.torch.tensor([ids]), past_key_values=past, use_cache=True)
        return int(out.logits[0, -1].argmax()), out.past_key_values

    def prefill(self, ids) -> float:
        with self.torch.inference_mode():
            t0 = time.perf_counter()
            self._step(ids, None)
            return time.perf_counter() - t0

    def decode(self, first: int, n: int, context: list[int] = ()) -> float:
        with self.torch.inference_mode():
            token, past = first, None
            if context:  # the depth to decode at, prefilled untimed
                _, past = self._step(list(context), None)
            t0 = time.perf_counter()
            for _ in range(n):
                token, past = self._step([token], past)
            return time.perf_counter() - t0

    def peak_memory_bytes(self) -> int:
        return _peak_rss()

    def close(self) -> None:
        del self.model


class LlamaCppRunner:
    """llama.cpp (llama-cpp-python) on a GGUF, behind bench.measure's interface."""

    flash = None

    def __init__(self, gguf: str, threads: int, n_ctx: int, label: str):
        from llama_cpp import Llama

        from inferno.formats.gguf_file import read_gguf
        self.threads, self.model_name, self.backend = threads, label, "llama.cpp"
        t0 = time.perf_counter()
        self.llm = Llama(model_path=str(gguf), n_threads=threads, n_threads_batch=threads,
                         n_ctx=n_ctx, n_batch=n_ctx, verbose=False)
        self.load_s = time.perf_counter() - t0
        self.vocab_size = self.llm.n_vocab()
        self.first_token = self.llm.token_bos()
        # Every tensor's bytes in the file's own types (Q4_1 here); the tied embedding is the
        # output matrix and is read whole.
        gf = read_gguf(gguf)
        self.weight_bytes_per_token = sum(t.nbytes for t in gf.tensors.values())
        self.weight_type = gguf_file_type(gf.metadata)

    def _step(self, ids) -> int:
        self.llm.eval(ids)
        # NOTE: llama-cpp-python 0.3 keeps only the last position's logits in the context.
        logits = np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.vocab_size,))
        return int(np.argmax(logits))

    def prefill(self, ids) -> float:
        self.llm.reset()
        t0 = time.perf_counter()
        self._step(ids)
        return time.perf_counter() - t0

    def decode(self, first: int, n: int, context: list[int] = ()) -> float:
        self.llm.reset()
        if context:  # the depth to decode at, prefilled untimed
            self._step(list(context))
        token = first
        t0 = time.perf_counter()
        for _ in range(n):
            token = self._step([token])
        return time.perf_counter() - t0

    def peak_memory_bytes(self) -> int:
        return _peak_rss()

    def close(self) -> None:
        self.llm.close()


def gguf_file_type(meta: dict) -> str:
    from gguf import LlamaFileType
    ft = meta.get("general.file_type")
    return LlamaFileType(int(ft)).name.removeprefix("MOSTLY_") if ft is not None else "?"


def ratio_table(rows: list[bench.Row], ours: list[str], peers: list[str]) -> str:
    tests = list(dict.fromkeys(r.test for r in rows))
    lines = ["| ours / peer (tokens/s) | " + " | ".join(f"{t} vs {p}" for t in tests for p in peers) + " |",
             "| --- | " + " | ".join("---:" for _ in tests for _ in peers) + " |"]
    for b in ours:
        cells = []
        for t in tests:
            for p in peers:
                r = bench.ratio(rows, b, p, t)
                cells.append("n/a" if r is None else f"{r:.2f}x")
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", "-m", default="smollm2-135m", help="alias, folder or .gguf (inferno's resolution)")
    p.add_argument("--gguf", default=None, help="GGUF for llama.cpp and transformers (default: the model, if a .gguf)")
    p.add_argument("--backend", "-b", default="simd,pool", help="our backends, comma list")
    p.add_argument("--peers", default="transformers,llama.cpp", help="peers to run, comma list")
    p.add_argument("--threads", "-t", type=int, default=os.cpu_count(), help="threads for pool and the peers")
    p.add_argument("--n-prompt", "-p", default="512")
    p.add_argument("--n-gen", "-n", default="128")
    p.add_argument("--repetitions", "-r", type=int, default=3)
    p.add_argument("--depth", "-d", type=int, default=0,
                   help="decode (the tg tests) after a context of this many tokens, as llama-bench's -d")
    p.add_argument("--cache-type", default=None, help="our KV cache type (default: the backend's; llama.cpp keeps f16)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    model = resolve(args.model)
    gguf = Path(args.gguf).expanduser() if args.gguf else (model if model.suffix == ".gguf" else None)
    label = bench.model_label(model)
    sizes = dict(n_prompts=bench.parse_sizes(args.n_prompt, "-p"),
                 n_gens=bench.parse_sizes(args.n_gen, "-n"), reps=args.repetitions, depth=args.depth)
    ours, rows = [], []
    for backend in bench.parse_names([args.backend]):
        try:
            rows += bench.run(str(model), [backend], backend_options={"threads": args.threads},
                              load_options={"cache_type": args.cache_type}, **sizes)
        except InfernoError as e:  # a model inferno cannot run yet: the peers still run
            print(f"peers: inferno's {backend} cannot run {label} ({e}): skipped", file=sys.stderr)
            continue
        ours.append(backend)
    peers = []
    for peer in bench.parse_names([args.peers]):
        try:
            if peer == "transformers":
                rows += bench.measure_isolated(TransformersRunner, str(gguf or model), args.threads, label, **sizes)
            elif peer == "llama.cpp":
                if gguf is None:
                    print("peers: llama.cpp needs a .gguf (--gguf): skipped", file=sys.stderr)
                    continue
                n_ctx = max(sizes["n_prompts"] + sizes["n_gens"]) + args.depth + 8
                rows += bench.measure_isolated(LlamaCppRunner, str(gguf), args.threads, n_ctx, label, **sizes)
            else:
                raise SystemExit(f"unknown peer {peer!r}: transformers or llama.cpp")
        except ImportError as e:
            print(f"peers: {peer} is not installed ({e}): skipped", file=sys.stderr)
            continue
        peers.append(peer)
    if args.json:
        print(bench.to_json(rows))
    else:
        print(bench.format_table(rows))
        print()
        print(ratio_table(rows, ours, peers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
