"""Every op of the Backend contract has its file here, test_<op>.py, with tests that take the
`backend` fixture (so every variant runs them), and its `GPU` flag says whether GpuBackend
overrides that op itself (then the gpu variant runs them too, and only then)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from inferno.backends import OPS

HERE = Path(__file__).parent


def gpu_overrides(op: str) -> bool:
    from inferno.backends.torch.gpu import GpuBackend
    return op in GpuBackend.__dict__


@pytest.mark.parametrize("op", OPS)
def test_every_op_has_its_tests(op):
    path = HERE / f"test_{op}.py"
    assert path.exists(), f"no tests/ops/{path.name} for the op {op}"
    tree = ast.parse(path.read_text())
    takers = [f.name for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")
              and "backend" in [a.arg for a in f.args.args]]
    assert takers, f"{path.name} has no test that takes the backend fixture"
    flags = [n.value.value for n in tree.body if isinstance(n, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "GPU" for t in n.targets)]
    assert flags in ([], [False], [True]), f"{path.name}: GPU must be one True or False"
    assert bool(flags and flags[0]) == gpu_overrides(op), (
        f"{path.name} says GPU = {bool(flags and flags[0])}, but GpuBackend "
        f"{'overrides' if gpu_overrides(op) else 'inherits'} {op}")


def test_no_file_for_an_op_that_is_not_one():
    """test_<op>.py, or test_<op>_<aspect>.py for one form of an op's inputs that has grown
    tests of its own (test_linear_panels.py: linear on weights repacked into panels)."""
    stems = {p.stem.removeprefix("test_") for p in HERE.glob("test_*.py")} - {"every_op"}
    strays = sorted(s for s in stems if not any(s == op or s.startswith(op + "_") for op in OPS))
    assert not strays, f"tests/ops files for no op of the contract: {strays}"
