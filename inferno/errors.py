"""The one exception type a user sees.

Anything raised as `InfernoError` is a problem with the user's input or machine (a missing file,
a bad flag, an unreachable hub), not a bug: the CLI prints its message on one line and exits
non-zero, without a traceback. The message says what is wrong and how to fix it.
"""


class InfernoError(Exception):
    """A user-facing error whose message is one line with the fix in it."""


def one_line(e: BaseException, limit: int = 300) -> str:
    """An exception's message on one printable line, for wrapping a library's error (which may
    quote a file's bytes) in an InfernoError."""
    text = " ".join(str(e).split())[:limit] or type(e).__name__
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
