"""`inferno chat` and the engine Session under it: a turn that reuses the KV cache of earlier
turns must give exactly what a fresh generation over the whole history gives, and the REPL
stops at end of input and survives a bad turn. (The REPL with the real model, keeping history
and forgetting it on /clear, is in test_real_model.py, which loads that model once.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

import inferno
from inferno.engine import Session


def chat(*args, stdin: str):
    return subprocess.run([sys.executable, "-m", "inferno", "chat", *map(str, args)], input=stdin,
                          capture_output=True, text=True, timeout=300)


def replay(engine, user_turns, **options) -> list[str]:
    """Each reply generated afresh (no cache reuse) over the whole history so far."""
    messages, replies = [], []
    for text in user_turns:
        messages.append({"role": "user", "content": text})
        reply = engine.generate(messages, **options).text
        messages.append({"role": "assistant", "content": reply})
        replies.append(reply)
    return replies


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_session_reuse_equals_fresh_generation(arch, request):
    engine = inferno.load(str(request.getfixturevalue(f"{arch}_dir")), progress=False)
    opts = dict(temperature=0, system="You are terse.")
    session, messages = Session(), []
    turns = [("Hello there", 6), ("The capital of France is", 40), ("Once upon a time", 12)]
    for text, n in turns:  # the second turn outgrows the first turn's cache
        messages.append({"role": "user", "content": text})
        got = engine.generate(messages, session=session, max_tokens=n, **opts)
        want = engine.generate(messages, max_tokens=n, **opts)
        assert got.token_ids == want.token_ids
        # Turn one has nothing cached; later turns reuse the history and prefill the rest.
        assert (got.cached_tokens > 0) == (len(messages) > 1) and got.cached_tokens < got.prompt_tokens
        assert session.cache.length == len(session.ids) == got.prompt_tokens + len(got.token_ids) - (
            got.finish_reason == "length")
        messages.append({"role": "assistant", "content": got.text})

    # An edited history shares only a prefix: the cache is cut back to it, not trusted whole.
    messages[0]["content"] = "Goodbye there"
    got = engine.generate(messages, session=session, max_tokens=8, **opts)
    assert got.token_ids == engine.generate(messages, max_tokens=8, **opts).token_ids
    assert 0 < got.cached_tokens < len(engine.encode_prompt(messages[:1], system=opts["system"]))

    session.clear()
    got = engine.generate(messages[:1], session=session, max_tokens=8, **opts)
    assert got.cached_tokens == 0


def test_repl_on_a_tiny_model(qwen3_dir):
    # An unknown command, a message too long for --ctx-size (an error, then the chat goes on),
    # a real turn, and end of input without /bye.
    p = chat("-m", qwen3_dir, "-t", 0, "-n", 8, "-c", 64, "-v",
             stdin="/foo\n" + "word " * 80 + "\nHello there\n")
    assert p.returncode == 0, p.stderr
    assert "unknown command /foo" in p.stderr
    assert "exceeds the context of 64 set by --ctx-size" in p.stderr and "/clear starts a new conversation" in p.stderr
    assert "Traceback" not in p.stderr
    engine = inferno.load(str(qwen3_dir), progress=False)
    assert p.stdout == replay(engine, ["Hello there"], temperature=0, max_tokens=8)[0] + "\n"
    assert p.stderr.count("prefill: ") == 1  # stats for the one answered turn


def test_chat_needs_a_chat_template(base_model_dir):
    p = chat("-m", base_model_dir, stdin="hi\n")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("inferno: error: this model has no chat template")
