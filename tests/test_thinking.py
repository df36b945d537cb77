"""A thinking model's think block as its reasoning (thinking.py): the same split whatever pieces
the reply is decoded in, the answer's tool calls read after the block, and which templates and
prompts reason at all."""

from __future__ import annotations

import io
import json
import random

import pytest
from test_serve import THINKING, running, wait_healthy

from inferno.calls import collect
from inferno.thinking import OPENED, TAGS, ThinkSplit, think_mode
from inferno.tools import parse_reply, stream_parser

CASES = [  # (mode, reply, (reasoning, content))
    (TAGS, "<think>\nI think.\n</think>\n\nHello there", ("I think.", "Hello there")),
    (TAGS, "  <think>a</think>b", ("a", "b")),
    (TAGS, "<think>one\n\ntwo</think>three\n", ("one\n\ntwo", "three\n")),
    (TAGS, "Hello <think>x</think>", ("", "Hello <think>x</think>")),  # only a reply's opening reasons
    (TAGS, "<thx", ("", "<thx")),
    (TAGS, "<th", ("", "<th")),  # cut where it could have been the tag: what was written
    (TAGS, "<think>\n\n</think>\n\nAnswer.", ("", "Answer.")),  # Qwen3 with thinking off
    (TAGS, "<think>cut in the middle\n\n", ("cut in the middle", "")),  # max_tokens in the reasoning
    (TAGS, "<think>a</thin>b</think>c", ("a</thin>b", "c")),
    (TAGS, "\n\nNo block, 東京 🙂", ("", "\n\nNo block, 東京 🙂")),
    (TAGS, "", ("", "")),
    (OPENED, "reasoning here\n</think>\n\nthe answer", ("reasoning here", "the answer")),
    (OPENED, "\nall reasoning", ("all reasoning", "")),
]


def split(mode, pieces, fmt=None):
    p = stream_parser(fmt, mode)
    deltas = [d for piece in pieces for d in p.feed(piece)] + p.finish()
    return collect(deltas)


@pytest.mark.parametrize("mode,reply,want", CASES)
def test_the_split_does_not_depend_on_the_pieces(mode, reply, want):
    assert split(mode, [reply])[:2] == want
    assert split(mode, list(reply))[:2] == want  # a character at a time
    rng = random.Random(len(reply))
    for _ in range(100):
        cuts = sorted(rng.sample(range(len(reply) + 1), min(len(reply), rng.randint(1, 6)))) if reply else []
        pieces = [reply[a:b] for a, b in zip([0, *cuts], [*cuts, len(reply)])]
        assert split(mode, pieces)[:2] == want, pieces
    assert parse_reply(None, reply, mode)[:2] == want


def test_a_tool_call_after_the_reasoning():
    reply = '<think>\nThe weather, then.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    for pieces in ([reply], list(reply)):
        reasoning, content, calls = split(TAGS, pieces, "hermes")
        assert (reasoning, content) == ("The weather, then.", "")
        assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Oslo"}')]
    parser = stream_parser("hermes", TAGS)
    parser.feed(reply)
    parser.finish()
    assert parser.count == 1 and len(parser.calls) == 1  # what the server's finish and CallGuard read


def test_which_replies_reason():
    qwen3 = "{%- if enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    assert think_mode(qwen3, "<|im_start|>assistant\n") == TAGS
    assert think_mode(qwen3, "<|im_start|>assistant\n<think>\n\n</think>\n\n") == TAGS  # closed in the prompt: the reply starts outside
    assert think_mode("{{ '<｜Assistant｜><think>\\n' }}...</think>", "<｜Assistant｜><think>\n") == OPENED
    assert think_mode("{{ message.content }}", "<|im_start|>assistant\n") is None
    assert think_mode(None, "") is None
    with pytest.raises(ValueError, match="think mode"):
        ThinkSplit("maybe")
    with pytest.raises(ValueError, match="tool-call format or a think mode"):
        stream_parser(None)


# -- the CLI and the Python API: the tiny Qwen3's template has Qwen3's think block ------------------
# (THINKING: a grammar that makes a reply open one; a random model would not write it.)


class TTY(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture(scope="module")
def engine(qwen3_dir):
    import inferno
    return inferno.load(str(qwen3_dir), progress=False)


def test_the_chat_shows_the_block_dimmed_and_keeps_the_answer(engine):
    from inferno.chat import run_chat

    def chat(stdout, **options):
        run_chat(engine, stdin=io.StringIO("Hello!\nAgain?\n"), stdout=stdout, stderr=io.StringIO(),
                 max_tokens=40, grammar=THINKING, temperature=0, **options)
        return stdout.getvalue()

    replies = chat(io.StringIO()).split("\n")  # a pipe: plain, a blank line between them
    (r1, a1, r2, a2) = replies[0], replies[2], replies[3], replies[5]
    assert r1 in ("yes and so", "no and so") and a1 in ("Paris.", "Rome.") and replies[1] == ""
    assert chat(TTY()).startswith(f"\033[2m{r1}\033[0m\n\n{a1}\n")  # a terminal: dimmed
    assert chat(TTY(), hide_reasoning=True) == f"{a1}\n{a2}\n"
    assert r2 in ("yes and so", "no and so")


def test_a_stream_says_whether_its_reply_may_open_a_block(engine):
    stream = engine.stream("Hello!", max_tokens=30, grammar=THINKING, temperature=0)
    text = "".join(stream)
    assert stream.think == TAGS and text.startswith("<think>\n")  # the text as written
    from inferno.chat import answer
    content, reasoning = answer(stream)
    assert text == f"<think>\n{reasoning}\n</think>\n\n{content}"
    assert engine.stream("Hello!", raw=True, max_tokens=2).think is None  # no chat, no block
    assert engine.stream(prompt_ids=[1, 2, 3], max_tokens=2).think is None


def test_generate_prints_the_answer_without_the_block(qwen3_dir, tmp_path, capsys):
    """A constrained reply to a pipe is its answer alone; --json has the block as `reasoning`."""
    from inferno import cli
    grammar = tmp_path / "think.gbnf"
    grammar.write_text(THINKING)
    argv = ["generate", "-m", str(qwen3_dir), "-p", "Hello!", "-n", "40", "-t", "0", "--grammar-file", str(grammar)]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert out in ("Paris.\n", "Rome.\n") and "<think>" not in out + err
    assert cli.main(argv + ["--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["text"] + "\n" == out and got["reasoning"] in ("yes and so", "no and so")


def test_the_responses_api_gives_the_block_as_a_reasoning_item(qwen3_dir, monkeypatch):
    """/v1/responses on the chat's replies: the think block is a reasoning item of its own (its
    text in reasoning_text parts, streamed as response.reasoning_text deltas), the answer the
    message's output_text, as gpt-oss's analysis is."""
    import httpx

    from inferno.sequence import Sampler
    from inferno.serve.app import ServerConfig, build_app
    app = build_app(ServerConfig(model=str(qwen3_dir), model_id="m", ctx_size=256))
    with running(app) as url:
        wait_healthy(url)
        tok = app.state.inferno.batch.engine.tokenizer
        ids = tok.encode("<think>\nFrance, then.\n</think>\n\nParis.", add_special_tokens=False)
        ids.append(tok.hf.token_to_id("<|im_end|>"))

        def choose(self, logits, mask, history):  # every reply writes the script, then ends
            return next(self.__dict__.setdefault("script", iter(ids)), ids[-1]), None
        monkeypatch.setattr(Sampler, "choose", choose)
        body = {"model": "m", "input": "The capital?", "max_output_tokens": 60}
        out = httpx.post(url + "/v1/responses", json=body, timeout=60).json()["output"]
        assert [item["type"] for item in out] == ["reasoning", "message"]
        assert out[0]["content"] == [{"type": "reasoning_text", "text": "France, then."}]
        assert out[1]["content"][0]["text"] == "Paris."
        events = httpx.post(url + "/v1/responses", json={**body, "stream": True}, timeout=60).text
        deltas = [json.loads(line[6:]) for line in events.splitlines() if line.startswith("data: {")]
        assert "".join(d["delta"] for d in deltas if d["type"] == "response.reasoning_text.delta") == "France, then."
        assert "".join(d["delta"] for d in deltas if d["type"] == "response.output_text.delta") == "Paris."


def test_reasoning_format_takes_auto_or_none(capsys):
    from inferno import cli
    parser = cli.build_parser()
    assert parser.parse_args(["serve"]).reasoning_format == "auto"
    assert parser.parse_args(["serve", "--reasoning-format", "none"]).reasoning_format == "none"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--reasoning-format", "deepseek"])
    err = capsys.readouterr().err  # argparse's one line, naming the flag, the value and the choices
    assert "--reasoning-format" in err and "invalid choice: 'deepseek'" in err and "none" in err
