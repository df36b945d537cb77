"""Numba's compiler made to do less for the same machine code, where our kernels make it work
for nothing: its inliner, its SSA reconstruction and its branch pruning. `apply()` patches them,
once per process;
jitcache.py calls it when a kernel misses the cache, just before Numba compiles it (a warm load
never imports Numba's compiler, and this would). Each part checks that Numba's own code is the
one it was written against; where it is not, that part is left as Numba has it.

The quantized kernels build their loops from small helpers that Numba inlines into its IR
(`inline="always"`: the kind, the row count and the remainder flag then fold away before
typing). Three costs came with that, each paid per inlined call site or per variable:

- Copies. `InlineWorker.inline_ir` copied the callee's IR twice, and block by block with a
  fresh memo per block: the function's one Scope, with every variable in it, and every source
  location were copied again for each block (a K-quant's row kernels, with their helpers
  inlined at a hundred sites, spent 79 of 190 s in `copy.deepcopy`; bench/RESULTS.md,
  "Compiling the kernels"; Numba's issues #8989 and #9204, numba-cuda's #688). The patched
  method, made from Numba's own source, copies once, with one memo for all the blocks (so they
  share one copied Scope, as the original's share theirs), and returns the IR it was given as
  the "unmutated" one (it never mutates it; its callers discard it or only read it).
- The callee's IR itself. `inline_function` ran the callee's whole untyped pipeline at every
  site (bytecode to IR, its own helpers inlined in turn, branch pruning, literal propagation):
  the same IR from the same function each time, since nothing of the site enters it (a
  K-quant's entry: 608 sites of some forty helpers). It is kept the first time, keyed on the
  function and the one flag that pipeline reads (`no_rewrites`), and every later site gets a
  copy under a fresh identity (the inlined variables' names are made from it); the run's one
  side effect, the caller's `enable_ssa` turned off, is kept too.
- SSA. `ssa._run_ssa` renames each variable assigned more than once (every loop-carried
  accumulator of the inlined helpers: some 1,500 in a K-quant's entry) with two passes over
  every statement of the function, though the variable lives in a few of its thousands of
  blocks: 15 of a K-quant entry's 63 s. Here the blocks that mention each variable are listed
  once, and each variable's two passes visit those blocks only; every other block is carried
  over as it is (a new Block of the same statements, as Numba's passes make it). The handlers
  are Numba's own and see the same statements in the same order, so the IR is the same, down
  to the names of the fresh variables.

And one cost paid per kind. The drivers are made per weight or cache kind, the kind a literal
(qkernels.py, "the drivers compiled per kind"), and the kernels branch on it (`if kind ==
Q4_K:`). Numba's `dead_branch_prune` folds a branch on a constant but not one on an argument
typed as a literal integer (it reads such an argument's type, not its value, and prunes only
comparisons with None), so every kind's branches were typed and lowered, their callees compiled,
and LLVM folded them away afterwards: an embedding's rows compiled the dequantisation of two
kinds and the Q4_K panels' unpacking for a Q8_0 table, decode attention every cache type's
loads. The patched function takes such an argument's value as a constant's; a branch the kind
does not take is gone before typing. The rest of the function is Numba's own.

Tests pin that the IR comes out the same (tests/test_compiler.py); the kernels' bits are
pinned throughout the suite.
"""

from __future__ import annotations

import hashlib
import inspect
import textwrap
from collections import defaultdict

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

_UNTYPED = "        callee_ir = self.run_untyped_passes(function)\n"
_applied = None
_untyped = {}  # (function, no_rewrites) -> its untyped IR, as run_untyped_passes made it


def inline_function(self, caller_ir, block, i, function, arg_typs=None):
    """InlineWorker.inline_function, the callee's untyped IR made once (module docstring)."""
    key = (function, bool(self.flags.no_rewrites))
    made = _untyped.get(key)
    if made is None:
        made = _untyped[key] = self.run_untyped_passes(function)
    else:
        self.flags.enable_ssa = False  # as run_untyped_passes leaves it
    callee_ir = made.copy()  # (inline_ir copies the blocks deeply before it changes anything)
    callee_ir.func_id = made.func_id.derive()
    return self.inline_ir(caller_ir, block, i, callee_ir, function.__code__.co_freevars,
                          arg_typs=arg_typs)


_ARG_BRANCH = """                arg_def = guard(get_definition, func_ir, arg)
                if isinstance(arg_def, ir.Arg):
                    # it's an e.g. literal argument to the function
                    resolved_const = resolve_input_arg_const(arg_def.index)
                    prune = prune_by_type
"""
_LITERAL_BRANCH = """                arg_def = guard(get_definition, func_ir, arg)
                if (isinstance(arg_def, ir.Arg)
                        and isinstance(called_args[arg_def.index], types.IntegerLiteral)):
                    # (inferno) an integer known at compile time: its value, as a constant's
                    resolved_const = called_args[arg_def.index].literal_value
                elif isinstance(arg_def, ir.Arg):
                    # it's an e.g. literal argument to the function
                    resolved_const = resolve_input_arg_const(arg_def.index)
                    prune = prune_by_type
"""


def apply() -> bool:
    """Patch the inliner, the SSA reconstruction and the branch pruning as the module docstring
    says, once; whether the inliner is patched (each part is left alone where Numba's code is not
    the one it knows)."""
    global _applied
    if _applied is None:
        _applied = _patch_inliner()
        _patch_ssa()
        _patch_pruning()
    return _applied


def _patch_inliner() -> bool:
    from numba.core import inline_closurecall

    worker = inline_closurecall.InlineWorker
    try:
        body = inspect.getsource(worker.inline_ir)  # (indented as in its class, as _COPIES is)
        calls = inspect.getsource(worker.inline_function)
    except (OSError, TypeError):
        return False
    if body.count(_COPIES) != 1 or body.count(_SECOND) != 1 or calls.count(_UNTYPED) != 1:
        return False  # another Numba: leave its inliner alone
    body = body.replace(_COPIES, _ONE_COPY).replace(_SECOND, "")
    scope = dict(vars(inline_closurecall))
    where = f"<numba's InlineWorker.inline_ir as {__name__} patched it>"
    exec(compile(textwrap.dedent(body), where, "exec"), scope)
    patched = scope["inline_ir"]
    patched.__doc__ = worker.inline_ir.__doc__
    for new, old in ((patched, worker.inline_ir), (inline_function, worker.inline_function)):
        new.__qualname__ = old.__qualname__
        new.patched_by = __name__
        new.original = old
    worker.inline_ir = patched
    worker.inline_function = inline_function
    return True


def _patch_pruning() -> bool:
    """dead_branch_prune, a branch on an integer argument typed as a literal (the kind) pruned
    as one on a constant (module docstring)."""
    from numba.core import analysis, untyped_passes
    if getattr(analysis.dead_branch_prune, "patched_by", None) == __name__:
        return True
    try:
        body = inspect.getsource(analysis.dead_branch_prune)
    except (OSError, TypeError):
        return False
    if body.count(_ARG_BRANCH) != 1 or untyped_passes.dead_branch_prune is not analysis.dead_branch_prune:
        return False  # another Numba: leave its pruning alone
    scope = dict(vars(analysis))
    where = f"<numba's dead_branch_prune as {__name__} patched it>"
    exec(compile(body.replace(_ARG_BRANCH, _LITERAL_BRANCH), where, "exec"), scope)
    patched = scope["dead_branch_prune"]
    patched.__doc__ = analysis.dead_branch_prune.__doc__
    patched.patched_by = __name__
    patched.original = analysis.dead_branch_prune
    analysis.dead_branch_prune = untyped_passes.dead_branch_prune = patched
    return True


# -- SSA ---------------------------------------------------------------------------------------------
# The digest of the Numba functions `run_ssa` stands in for (their source as Numba 0.68 has it):
# the loop over the violators and the block passes it repeats. Another source: Numba's own.
_SSA_SOURCES = "45ba7f998f2cd800"


def _ssa_digest(ssa) -> str | None:
    try:
        source = "".join(inspect.getsource(f) for f in (
            ssa._run_ssa, ssa._fresh_vars, ssa._fix_ssa_vars,
            ssa._run_block_rewrite, ssa._run_ssa_block_pass))
    except (AttributeError, OSError, TypeError):
        return None
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def _patch_ssa() -> bool:
    from numba.core import ssa
    if getattr(ssa._run_ssa, "patched_by", None) == __name__:
        return True
    if _ssa_digest(ssa) != _SSA_SOURCES:
        return False
    run_ssa.original = ssa._run_ssa
    ssa._run_ssa = run_ssa  # (reconstruct_ssa looks it up at each call)
    return True


def _mentions(blocks) -> dict:
    """Each variable's name -> the labels of the blocks whose statements define or use it."""
    where = defaultdict(set)
    for label, block in blocks.items():
        for stmt in block.body:
            for var in stmt.list_vars():
                where[var.name].add(label)
    return where


def _rewrite(blocks, states, handler, labels):
    """ssa._run_block_rewrite, the handler run over the statements of the blocks in `labels`
    only (the others hold nothing it changes)."""
    from numba.core import ir
    rewritten = {}
    for label, block in blocks.items():
        new = ir.Block(scope=block.scope, loc=block.loc)
        if label in labels:
            states["label"], states["block"] = label, block
            new.body = [handler.on_assign(states, stmt) if isinstance(stmt, ir.Assign)
                        else handler.on_other(states, stmt) for stmt in block.body]
        else:
            new.body = block.body[:]
        rewritten[label] = new
    return rewritten


def run_ssa(blocks):
    """ssa._run_ssa with each violator's passes over the blocks that mention it (module
    docstring); the same steps, handlers and order otherwise."""
    from numba.core import errors, ssa
    from numba.core.analysis import compute_cfg_from_blocks
    if not blocks:
        return {}
    cfg = compute_cfg_from_blocks(blocks)
    df_plus = ssa._iterated_domfronts(cfg)
    violators = ssa._find_defs_violators(blocks, cfg)
    cache_list_vars = ssa._CacheListVars()
    mentions = _mentions(blocks)  # (renaming one variable moves no other's statements)
    for varname in violators:
        labels = mentions[varname]
        # the left-hand sides: a fresh variable for every assignment but the first
        states = dict(scope=ssa._get_scope(blocks), varname=varname, defmap=defaultdict(list))
        blocks = _rewrite(blocks, states, ssa._FreshVarHandler(), labels)
        defmap = states["defmap"]
        # the uses: each takes its reaching definition, through phi nodes where paths meet
        states = dict(scope=ssa._get_scope(blocks), varname=varname, defmap=defmap,
                      phimap=defaultdict(list), cfg=cfg,
                      phi_locations=ssa._compute_phi_locations(df_plus, defmap))
        blocks = _rewrite(blocks, states, ssa._FixSSAVars(cache_list_vars), labels)
        for label, phis in states["phimap"].items():
            blocks[label].body = phis + blocks[label].body
    if compute_cfg_from_blocks(blocks) != cfg:
        raise errors.CompilerError("CFG mutated in SSA pass")
    return blocks


run_ssa.patched_by = __name__
