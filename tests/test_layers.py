"""The package's layers, read from its imports (every `import`, at any depth, functions included):
no circle anywhere, and no import that runs against the layers DESIGN.md draws:

    cli, chat, bench                      the commands
    serve/                                HTTP
    engine, scheduler, sequence, ...      the generation loop
    loading/                              a name to a checkpoint: aliases and the hub, GGUF, folders
    model/  tokenizers/  sampling         the forward, config and cache; text to ids; the sampler
    backends/ (base, registry, tracing)   the contract;  backends/numba/, backends/torch/ below it
    formats/                              what weights and cache rows are, and the files holding them
"""

from __future__ import annotations

import ast
from pathlib import Path

import inferno

ROOT = Path(inferno.__file__).parent
KERNELS = ("inferno.backends.numba", "inferno.backends.torch")
LOOP = ("inferno.engine", "inferno.scheduler", "inferno.sequence", "inferno.constrain", "inferno.tools",
        "inferno.calls", "inferno.harmony", "inferno.thinking",
        "inferno.ahead", "inferno.embedding")
COMMANDS = ("inferno.cli", "inferno.chat", "inferno.bench", "inferno.helper")
ABOVE_MODEL = ("inferno.loading", "inferno.serve") + LOOP + COMMANDS
FILE_READERS = ("inferno.formats.gguf_file", "inferno.formats.safetensors", "inferno.loading")

# What a layer may not import, by module prefix: (importer prefix, forbidden prefixes, why).
RULES = [
    ("inferno.formats", ("inferno.backends", "inferno.model", "inferno.tokenizers", "inferno.sampling")
     + ABOVE_MODEL, "formats are data: they import no kernel, model, tokenizer or loader"),
    ("inferno.backends", ("inferno.model", "inferno.tokenizers", "inferno.sampling") + FILE_READERS + ABOVE_MODEL,
     "backends compute; they know nothing of models, files, loops or servers"),
    ("inferno.model", KERNELS + ("inferno.tokenizers", "inferno.sampling") + FILE_READERS + ABOVE_MODEL,
     "the model reaches a backend through `ops` only, and knows no file format or tokenizer"),
    ("inferno.tokenizers", KERNELS + ("inferno.model", "inferno.sampling") + ABOVE_MODEL,
     "a tokenizer turns text into ids, whatever model or loader uses it"),
    ("inferno.sampling", KERNELS + ("inferno.model", "inferno.tokenizers") + ABOVE_MODEL,
     "the sampler takes logits and settings"),
    ("inferno.loading", KERNELS + ("inferno.serve",) + LOOP + COMMANDS,
     "loading reads files into a checkpoint; it runs no kernel and no loop"),
    ("inferno.backends.base", KERNELS, "the contract imports no kernel"),
    ("inferno.backends.tracing", KERNELS, "the tracer wraps any backend, importing none"),
    ("inferno.backends.cpu", KERNELS, "the reference imports no kernel"),
    ("inferno.backends.__init__", KERNELS, "the registry imports a backend only when it is asked for"),
    ("inferno.backends.numba", ("inferno.backends.torch",), "a Numba user never loads torch"),
    ("inferno.backends.torch", ("inferno.backends.numba",), "a torch user never loads Numba"),
    ("inferno.engine", KERNELS + ("inferno.serve", "inferno.formats.gguf_file", "inferno.formats.safetensors",
                                  "inferno.loading.gguf") + COMMANDS,
     "the loop serves the server, not the other way; the engine knows no file format and no "
     "backend's insides"),
    ("inferno.scheduler", ("inferno.serve",) + COMMANDS, "the loop serves the server, not the other way"),
    ("inferno.serve", COMMANDS, "the server does not import the commands"),
]
# Known exceptions, each with its reason: the torch backend dequantises GGML blocks once at load
# with the Numba kernel (gguf's numpy dequantisation is ~100x slower), imported in that function.
ALLOWED = {("inferno.backends.torch.torch_backend", "inferno.backends.numba.qkernels")}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in ROOT.rglob("*.py")}


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The inferno modules `path` imports, anywhere in it (a `from package import x` names the
    module x when there is one)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(path, name, set(mods)) for name, path in mods.items()}


def test_no_import_circle():
    g, state, path, cycles = graph(), {}, [], []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for n in sorted(g[m]):
            if state.get(n) == "open":
                cycles.append(path[path.index(n):] + [n])
            elif n not in state:
                visit(n)
        path.pop()
        state[m] = "done"
    for m in sorted(g):
        if m not in state:
            visit(m)
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_imports_follow_the_layers():
    bad = []
    for name, deps in graph().items():
        for prefix, forbidden, why in RULES:
            exact = prefix.endswith(".__init__")
            if (name == prefix[: -len(".__init__")]) if exact else (name == prefix or name.startswith(prefix + ".")):
                for dep in deps:
                    if (name, dep) not in ALLOWED and any(dep == f or dep.startswith(f + ".") for f in forbidden):
                        bad.append(f"{name} imports {dep}: {why}")
    assert not bad, "\n".join(sorted(set(bad)))


def test_the_checker_sees_imports_inside_functions(tmp_path):
    """The test above would miss a circle hidden in a function body unless the walk finds it."""
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from inferno.backends.numba import qkernels\n    import inferno.errors\n")
    assert imports(src, "inferno.x", {"inferno.backends.numba.qkernels", "inferno.errors", "inferno.x"}) == {
        "inferno.backends.numba.qkernels", "inferno.errors"}
