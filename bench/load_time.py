"""How long a model takes to open, phase by phase, median of several rounds in one process:
parse the GGUF file, build its tokenizer, and the whole checkpoint (parse + tokenizer + config +
weights as views of the map). The engine's warm-up, the rest of the `load:` line, is not here.

    python bench/load_time.py                   # SmolLM2-135M Q4_1, the default model
    python bench/load_time.py -m model.gguf -r 9
    python bench/load_time.py --vocab 151643    # also a metadata-only GGUF of that vocabulary size

`--vocab N` writes a GGUF holding only a byte-level BPE vocabulary of N tokens and N - 256 merges
(each token beyond the 256 byte tokens is a merge of two earlier ones): the parser and the
tokenizer on a vocabulary of Qwen3's size (151643), without the hub.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from inferno.loading.gguf import load_gguf
from inferno.formats.gguf_file import read_gguf
from inferno.tokenizers.gguf_tokenizer import tokenizer_from_gguf
from inferno.loading.resolve import resolve


def median_ms(fn, rounds: int) -> str:
    """Wall and CPU time, medians: on a shared machine the CPU time is the steadier figure."""
    wall, cpu = [], []
    for _ in range(rounds):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return f"{1e3 * statistics.median(wall):7.1f} ms wall {1e3 * statistics.median(cpu):7.1f} ms CPU"


def byte_level_vocab(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """GPT-2's 256 byte tokens, then n - 256 tokens each merged from two earlier ones, about
    6 symbols long on average, as in real byte-level vocabularies."""
    from tokenizers import pre_tokenizers

    rng = np.random.default_rng(seed)
    tokens = sorted(pre_tokenizers.ByteLevel.alphabet())
    by_length = {1: list(tokens)}
    seen, merges = set(tokens), []
    while len(tokens) < n:
        length = min(1 + int(rng.geometric(0.2)), 24)  # 2 or more
        left = int(rng.integers(1, length))
        a, b = by_length.get(left), by_length.get(length - left)
        if not a or not b:
            continue
        token = (a := a[rng.integers(len(a))]) + (b := b[rng.integers(len(b))])
        if token not in seen:
            seen.add(token)
            tokens.append(token)
            by_length.setdefault(length, []).append(token)
            merges.append(f"{a} {b}")
    return tokens, merges


def write_vocab_gguf(path: Path, n: int) -> Path:
    import gguf

    tokens, merges = byte_level_vocab(n)
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_token_merges(merges)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def phases(path: Path, rounds: int, whole: bool) -> None:
    meta = read_gguf(path).metadata
    n_tokens = len(meta.get("tokenizer.ggml.tokens", []))
    print(f"{path.name}: {path.stat().st_size / 2**20:.1f} MiB, {n_tokens} tokens, "
          f"{len(meta.get('tokenizer.ggml.merges', []))} merges, median of {rounds}")
    print(f"  parse (read_gguf)      {median_ms(lambda: read_gguf(path), rounds)}")
    print(f"  tokenizer_from_gguf    {median_ms(lambda: tokenizer_from_gguf(meta, path.name), rounds)}")
    if whole:
        print(f"  load_gguf (all of it)  {median_ms(lambda: load_gguf(path), rounds)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None, help="a .gguf file, hub id or alias (default: smollm2-135m)")
    ap.add_argument("-r", "--rounds", type=int, default=7, help="rounds per phase (default: 7)")
    ap.add_argument("--vocab", type=int, default=0, help="also time a vocabulary of this many tokens "
                                                         "(e.g. 151643, Qwen3's; default: 0, none)")
    args = ap.parse_args()
    phases(resolve(args.model), args.rounds, whole=True)
    if args.vocab:
        with tempfile.TemporaryDirectory() as tmp:
            phases(write_vocab_gguf(Path(tmp) / f"vocab-{args.vocab}.gguf", args.vocab), args.rounds, whole=False)


if __name__ == "__main__":
    main()
