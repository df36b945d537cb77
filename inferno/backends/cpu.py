"""`cpu`: the numpy reference. Every op is the Backend default; this is what the others are
pinned to."""

from inferno.backends.base import Backend


class CpuBackend(Backend):
    name = "cpu"
    warms_up = False  # (numpy's own code: nothing compiles or loads on first use)
