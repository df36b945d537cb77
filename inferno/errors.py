"""The one exception type a user sees.

Anything raised as `InfernoError` is a problem with the user's input or machine (a missing file,
a bad flag, an unreachable hub), not a bug: the CLI prints its message on one line and exits
non-zero, without a traceback. The message says what is wrong and how to fix it.
"""


class InfernoError(Exception):
    """A user-facing error whose message is one line with the fix in it."""
