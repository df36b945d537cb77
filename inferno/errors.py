"""The one exception type a user sees.

Anything raised as `InfernoError` is a problem with the user's input or machine (a missing file,
a bad flag, an unreachable hub), not a bug: the CLI prints its message on one line and exits
non-zero, without a traceback. The message says what is wrong and how to fix it.

An error about a parameter names it as the Python API spells it (`max_tokens`); `params` lists
those names so that the CLI can speak in its own flags instead (`--max-tokens`).
"""

from __future__ import annotations

import re


class InfernoError(Exception):
    """A user-facing error whose message is one line with the fix in it."""

    def __init__(self, message: str, *, params: tuple[str, ...] = ()):
        super().__init__(message)
        self.params = tuple(params)

    def for_cli(self) -> str:
        """The message with each parameter name written as its command-line flag."""
        return as_flags(str(self), self.params)


def as_flags(text: str, params) -> str:
    """`text` with each name in `params` written as the flag that sets it (top_p: --top-p)."""
    for name in params:
        text = re.sub(rf"(?<![\w-]){re.escape(name)}(?!\w)", "--" + name.replace("_", "-"), text)
    return text


def one_line(e: BaseException, limit: int = 300) -> str:
    """An exception's message on one printable line, for wrapping a library's error (which may
    quote a file's bytes) in an InfernoError."""
    text = " ".join(str(e).split())[:limit] or type(e).__name__
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
