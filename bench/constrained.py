"""Decode under a JSON schema against free decode, same prompt, same run (issue: structured
output at >= 0.8x unconstrained decode).

    python bench/constrained.py                      # SmolLM2 on pool
    python bench/constrained.py -m gemma3-270m -r 5

Each run generates --max-tokens tokens greedily with EOS banned: the free run as is, the
constrained one under a schema that lets the reply run that long (an object holding an array of
strings). The schema is compiled once, before the timed runs, as a server compiles it once per
schema. Reported: decode tok/s of each (medians of -r runs, alternating), their ratio, and the
grammar's own cost per token (llguidance's mask for one sequence, plus applying it to the logits).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import inferno
from inferno.constrain import apply_mask, fill_masks

SCHEMA = {"type": "object", "properties": {"notes": {"type": "array", "items": {"type": "string"}}},
          "required": ["notes"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", "-m", default=None)
    p.add_argument("--backend", "-b", default="pool")
    p.add_argument("--max-tokens", "-n", type=int, default=128)
    p.add_argument("--repetitions", "-r", type=int, default=5)
    args = p.parse_args(argv)
    engine = inferno.load(args.model, backend=args.backend, progress=False)
    prompt = "Write notes about bread, as JSON."
    ban = {t: -100.0 for t in engine.eos}
    common = dict(max_tokens=args.max_tokens, temperature=0, logit_bias=ban)
    grammar = engine.constraint(json_schema=SCHEMA)  # compiled once, as a server does per schema
    engine.generate(prompt, max_tokens=4, temperature=0)  # warm
    free, constrained, lengths = [], [], []
    for _ in range(args.repetitions):
        free.append(engine.generate(prompt, **common).decode_tokens_per_s)
        stream = engine.stream(prompt, **common, json_schema=SCHEMA)
        text = "".join(stream)
        constrained.append(stream.result.decode_tokens_per_s)
        lengths.append(stream.result.generated_tokens)
    # The grammar's own cost: one matcher's mask per step, and applying it.
    m = grammar.matcher()
    mask = np.empty((1, m.words), np.int32)
    logits = np.zeros(engine.config.vocab_size, np.float32)
    ids = engine.tokenizer.encode(text, add_special_tokens=False)
    t0 = time.perf_counter()
    for t in ids:
        fill_masks([m], mask)
        apply_mask(logits, mask[0])
        m.consume(t)
    per_token = (time.perf_counter() - t0) / len(ids)
    f, c = np.median(free), np.median(constrained)
    print(f"# {engine.source}, {engine.backend}, {args.max_tokens} tokens, medians of {args.repetitions}")
    print(f"free decode        {f:7.1f} tok/s")
    print(f"under the schema   {c:7.1f} tok/s  ({min(lengths)}-{max(lengths)} tokens)")
    print(f"ratio              {c / f:7.2f}x")
    print(f"grammar cost       {per_token * 1e3:7.3f} ms a token (mask + apply, one sequence)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
