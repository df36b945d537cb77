"""How often a small model's `response_format: json_object` replies end, on any OpenAI-style
server: sixteen everyday prompts, greedy, 300 tokens, through the official openai client.

    inferno serve --port 8391 &
    llama-server -m ~/.cache/inferno/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf --port 8392 &
    python bench/json_object.py http://127.0.0.1:8391/v1 http://127.0.0.1:8392/v1

Per server: each prompt's finish_reason, whether the content parses as a JSON object, its
completion tokens; then how many of the sixteen parsed.
"""

from __future__ import annotations

import argparse
import json

from openai import OpenAI

PROMPTS = [
    "List three fruits as JSON.", "Give a JSON object with your name and age.", "Weather today, as JSON.",
    "Describe a cat as JSON.", "Return a JSON object with the capital of Italy.", "Make a shopping list in JSON.",
    "Give me a recipe for pancakes as JSON.", "Describe the planet Mars in JSON.",
    "A JSON object for a book: title, author, year.", "Convert this to JSON: Alice is 30 and lives in Paris.",
    "Output the days of the week as a JSON object.", "Summarize World War II as JSON.",
    "Return JSON with fields ok and message.", "Tell me about Python as JSON.",
    "Give three colors and their hex codes as JSON.", "What is 2+2? Reply in JSON.",
]


def parses(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("urls", nargs="+", help="base URLs, each ending in /v1")
    p.add_argument("--max-tokens", "-n", type=int, default=300)
    args = p.parse_args(argv)
    totals = {}
    for url in args.urls:
        client = OpenAI(base_url=url, api_key="x", max_retries=0)
        model = client.models.list().data[0].id
        ok = 0
        for prompt in PROMPTS:
            r = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": prompt}], temperature=0,
                max_tokens=args.max_tokens, response_format={"type": "json_object"})
            choice = r.choices[0]
            good = parses(choice.message.content or "")
            ok += good
            print(f"{url}  {prompt[:44]:44s}  {choice.finish_reason:6s}  {'parses' if good else 'BROKEN':6s}  "
                  f"{r.usage.completion_tokens} tokens", flush=True)
        totals[url] = ok
    for url, ok in totals.items():
        print(f"{url}: {ok} of {len(PROMPTS)} parse")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
