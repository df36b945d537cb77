"""`inferno chat`: a multi-turn conversation on the model's chat template.

Every turn renders the whole history through the template, as `apply_chat_template` would, and
an engine Session keeps the KV cache between turns, so a turn prefills only what is new (the
last reply's closing tokens and the new message). Replies stream to stdout; the banner, stats
and errors go to stderr. When stdin is not a terminal (a pipe, a file) each line is one message
and no prompt is printed, so a conversation can be scripted.
"""

from __future__ import annotations

import sys

from inferno.engine import Engine, Session
from inferno.errors import InfernoError

HELP = "/clear forgets the conversation, /bye (or Ctrl-D) quits"
QUIT = ("/bye", "/exit", "/quit")


def run_chat(engine: Engine, *, system: str | None = None, think: bool = True,
             verbose: bool = False, format_stats=None, stdin=None, stdout=None, stderr=None,
             **options) -> int:
    """The REPL. `options` are Engine.stream's (max_tokens, temperature, seed, ctx_size, ...);
    `format_stats(result)` gives the text printed after each reply with `verbose`."""
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
        try:
            stream = engine.stream(messages, system=system, think=think, session=session, **options)
            for piece in stream:
                out.write(piece)
                out.flush()
        except InfernoError as e:
            messages.pop()  # the message never got an answer: forget it
            print(f"inferno: error: {e.for_cli()}; /clear starts a new conversation", file=err, flush=True)
            continue
        except KeyboardInterrupt:  # Ctrl-C stops the reply, not the chat
            messages.pop()
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
        messages.append({"role": "assistant", "content": result.text})
        if verbose:
            stats = format_stats(result) if format_stats else ""
            print(f"{stats}\ncache: {result.cached_tokens} of {result.prompt_tokens} prompt tokens "
                  f"reused from earlier turns", file=err, flush=True)
    return 0


def _dim(text: str, stream) -> str:
    """Faint text on a terminal; plain in a pipe or a file."""
    return f"\033[2m{text}\033[0m" if stream.isatty() else text


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
