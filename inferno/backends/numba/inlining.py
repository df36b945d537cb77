"""Numba's inliner, made to copy a callee's IR once per call site instead of many times.

The quantized kernels build their loops from small helpers that Numba inlines into its IR
(`inline="always"`: the kind, the row count and the remainder flag then fold away before
typing). Numba pays for each inlined call site in `InlineWorker.inline_ir`, which copies the
callee's IR twice, and copies it block by block with a fresh memo per block: the function's one
Scope, with every variable in it, and every source location are copied again for each block.
A K-quant's row kernels, with their helpers inlined at a hundred sites, spent half of their
compile there (`cProfile`: 79 of 190 s in `copy.deepcopy`; bench/RESULTS.md, "Compiling the
kernels"). Numba's issues #8989 and #9204 and numba-cuda's #688 describe the same costs.

`apply()` swaps in a copy of that method which copies the callee's IR once, with one memo for
all its blocks (so the blocks share one copied Scope, as the original's blocks share theirs),
and returns the IR it was given as the "unmutated" one (the method never mutates it; the
inliner's callers discard it or only read it). The copy is made from Numba's own source: where
that source is not the one this was written against, nothing is replaced and Numba runs as it
is. The result is the same IR; only the time to make it changes. jitcache.py applies it when a
kernel misses the cache, just before Numba compiles it: a warm load never imports Numba's
compiler, and this would.
"""

from __future__ import annotations

import inspect
import textwrap

_COPIES = '''        # Always copy the callee IR, it gets mutated
        def copy_ir(the_ir):
            kernel_copy = the_ir.copy()
            kernel_copy.blocks = {}
            for block_label, block in the_ir.blocks.items():
                new_block = copy.deepcopy(the_ir.blocks[block_label])
                kernel_copy.blocks[block_label] = new_block
            return kernel_copy

        callee_ir = copy_ir(callee_ir)
'''
_ONE_COPY = '''        # Always copy the callee IR, it gets mutated (inferno: once, one memo for every block)
        def copy_ir(the_ir):
            kernel_copy = the_ir.copy()
            kernel_copy.blocks = {}
            memo = {}
            for block_label, block in the_ir.blocks.items():
                kernel_copy.blocks[block_label] = copy.deepcopy(block, memo)
            return kernel_copy

        callee_ir_original = callee_ir
        callee_ir = copy_ir(callee_ir)
'''
_SECOND = '''        # save an unmutated copy of the callee_ir to return
        callee_ir_original = copy_ir(callee_ir)
'''

_applied = None


def apply() -> bool:
    """Replace InlineWorker.inline_ir as the module docstring says, once; whether it is."""
    global _applied
    if _applied is not None:
        return _applied
    from numba.core import inline_closurecall

    worker = inline_closurecall.InlineWorker
    try:
        source = textwrap.dedent(inspect.getsource(worker.inline_ir))
    except (OSError, TypeError):
        _applied = False
        return False
    body = textwrap.indent(source, "    ")
    if body.count(_COPIES) != 1 or body.count(_SECOND) != 1:
        _applied = False  # another Numba: leave its inliner alone
        return False
    body = body.replace(_COPIES, _ONE_COPY).replace(_SECOND, "")
    scope = dict(vars(inline_closurecall))
    where = f"<numba's InlineWorker.inline_ir as {__name__} patched it>"
    exec(compile(textwrap.dedent(body), where, "exec"), scope)
    patched = scope["inline_ir"]
    patched.__qualname__ = worker.inline_ir.__qualname__
    patched.__doc__ = worker.inline_ir.__doc__
    patched.patched_by = __name__
    patched.original = worker.inline_ir
    worker.inline_ir = patched
    _applied = True
    return True
