"""`inferno chat`: a multi-turn conversation on the model's chat template.

Every turn renders the whole history through the template, as `apply_chat_template` would, and
an engine Session keeps the KV cache between turns, so a turn prefills only what is new (the
last reply's closing tokens and the new message). Replies stream to stdout; the banner, stats
and errors go to stderr. When stdin is not a terminal (a pipe, a file) each line is one message
and no prompt is printed, so a conversation can be scripted.

A reasoning model that speaks harmony (gpt-oss) reasons before it answers: its reasoning is
shown dimmed (on a terminal; plain, then a blank line, in a pipe) before the answer, or not at
all with `hide_reasoning` (--hide-reasoning); the history keeps the answer, and the reasoning
only as harmony keeps it (dropped once answered).
"""

from __future__ import annotations

import sys

from inferno import harmony
from inferno.engine import Engine, Session
from inferno.errors import InfernoError
from inferno.tools import parse_reply, stream_parser

HELP = "/clear forgets the conversation, /bye (or Ctrl-D) quits"
QUIT = ("/bye", "/exit", "/quit")


def run_chat(engine: Engine, *, system: str | None = None, think: bool = True,
             verbose: bool = False, format_stats=None, stdin=None, stdout=None, stderr=None,
             hide_reasoning: bool = False, **options) -> int:
    """The REPL. `options` are Engine.stream's (max_tokens, temperature, seed, ctx_size,
    reasoning_effort, ...); `format_stats(result)` gives the text printed after each reply with
    `verbose`; `hide_reasoning`: a reasoning model's reasoning is not shown."""
    stdin, out, err = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    if not engine.tokenizer.chat_template:
        raise InfernoError("this model has no chat template, so it cannot chat: use "
                           "`inferno generate --raw` to complete text instead")
    interactive = stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401  input() gains line editing and history
        except ImportError:  # not on every platform
            pass
    messages: list[dict] = []
    session = Session()
    print(f"chat with {engine.source} ({engine.backend} backend); {HELP}", file=err, flush=True)
    while True:
        line = _read(stdin, interactive)
        if line is None or line.strip() in QUIT:
            break
        text = line.strip()
        if not text:
            continue
        if text == "/clear":
            messages.clear()
            session.clear()
            print("(conversation cleared)", file=err, flush=True)
            continue
        if text.startswith("/"):
            print(f"unknown command {text.split()[0]}: {HELP}", file=err, flush=True)
            continue

        messages.append({"role": "user", "content": text})
        shown = None
        try:
            stream = engine.stream(messages, system=system, think=think, session=session, **options)
            shown = Shown(out, stream.harmony, think=stream.think, hide_reasoning=hide_reasoning)
            for piece in stream:
                shown.feed(piece)
            shown.finish()
        except InfernoError as e:
            messages.pop()  # the message never got an answer: forget it
            if shown is not None:
                shown.stop()
            print(f"inferno: error: {e.for_cli()}; /clear starts a new conversation", file=err, flush=True)
            continue
        except KeyboardInterrupt:  # Ctrl-C stops the reply, not the chat
            messages.pop()
            if shown is not None:
                shown.stop()
            out.write("\n")
            print("(reply interrupted)", file=err, flush=True)
            continue
        out.write("\n")
        out.flush()
        result = stream.result
        if result.cut_by == "max_tokens":  # cut mid-reply: say so, as llama.cpp and ollama do
            print(_dim(f"[max tokens: the reply was cut at {result.generated_tokens} tokens; "
                       f"raise --max-tokens for longer replies]", err), file=err, flush=True)
        elif result.cut_by == "context":
            print(_dim(f"[context full: the reply was cut at {result.generated_tokens} tokens; "
                       f"raise --ctx-size, or /clear]", err), file=err, flush=True)
        content, reasoning = answer(stream)  # the reasoning for harmony.render to keep or drop
        messages.append({"role": "assistant", "content": content,
                         **({"reasoning_content": reasoning} if reasoning is not None else {})})
        if verbose:
            stats = format_stats(result) if format_stats else ""
            print(f"{stats}\ncache: {result.cached_tokens} of {result.prompt_tokens} prompt tokens "
                  f"reused from earlier turns", file=err, flush=True)
    return 0


DIM, RESET = "\033[2m", "\033[0m"  # faint text on a terminal, and back


class Shown:
    """A reply printed as it streams: its text to `out`; a harmony reply's (`harmony`) or one
    that may open a think block (`think`: Stream.think) parsed, its answer to `out` and its
    reasoning to `thoughts` (default: `out`), dimmed where that is a terminal, then a blank line
    (a line break on a stream of its own) before the answer; none of it with `hide_reasoning`.
    The pieces are whole characters (the engine's detokenizer), and the parser cuts them only
    at its tags."""

    def __init__(self, out, harmony_reply: bool, *, think: str | None = None, thoughts=None,
                 hide_reasoning: bool = False):
        self.out, self.thoughts = out, thoughts if thoughts is not None else out
        self.parser = (harmony.StreamParser() if harmony_reply
                       else stream_parser(None, think) if think is not None else None)
        self.hide = hide_reasoning
        self.dim = _isatty(self.thoughts)
        self.reasoning = False  # reasoning is being shown
        self.answered = False  # the answer has begun

    def feed(self, piece: str) -> None:
        if self.parser is None:
            self._write(self.out, piece)
        else:
            self._show(self.parser.feed(piece))

    def finish(self) -> None:
        if self.parser is not None:
            self._show(self.parser.finish())
        self.stop()

    def stop(self) -> None:
        """The reasoning ends here (the reply ended, or was stopped): the terminal's dim off."""
        if self.reasoning:
            self.reasoning = False
            self._write(self.thoughts, RESET if self.dim else "")
            if self.thoughts is not self.out:
                self._write(self.thoughts, "\n")

    def _show(self, deltas) -> None:
        for d in deltas:
            if d.reasoning is not None:
                self._think(d.reasoning)
            elif d.content is not None:
                if self.reasoning:
                    self.stop()
                    if self.thoughts is self.out:
                        self._write(self.out, "\n\n")
                self.answered = True
                self._write(self.out, d.content)
            elif d.name is not None:  # a call (to a function no chat here runs): shown as reasoning
                self._think(f"\n[call {d.name}] ")
            elif d.arguments:
                self._think(d.arguments)

    def _think(self, text: str) -> None:
        if self.hide or not text:
            return
        if not self.reasoning:
            self.reasoning = True
            if self.answered and self.thoughts is self.out:
                text = "\n\n" + text.lstrip("\n")
            if self.dim:
                text = DIM + text
        self._write(self.thoughts, text)

    @staticmethod
    def _write(stream, text: str) -> None:
        if text:
            stream.write(text)
            stream.flush()


def answer(stream) -> tuple[str, str | None]:
    """A finished stream's answer, and its reasoning: a harmony reply's (gpt-oss's) parsed apart
    (harmony.parse) or a think block's (tools.parse_reply), None where the reply is all
    answer."""
    if stream.think is not None:
        reasoning, content, _ = parse_reply(None, stream.result.text, stream.think)
        return content, reasoning or None
    if not stream.harmony:
        return stream.result.text, None
    reply = harmony.parse(stream.result.text)
    return reply.content, reply.reasoning


def _isatty(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _dim(text: str, stream) -> str:
    """Faint text on a terminal; plain in a pipe or a file."""
    return f"{DIM}{text}{RESET}" if stream.isatty() else text


def _read(stdin, interactive: bool) -> str | None:
    """One message, or None at end of input."""
    if interactive:
        try:
            return input(">>> ")  # readline editing and history when stdin is a terminal
        except EOFError:
            print()
            return None
    line = stdin.readline()
    return line if line else None
