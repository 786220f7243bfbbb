"""The package's import graph, read from the code (AST): its folders are layers and imports flow one way.

A module imports only modules of its own layer or of layers below it, the modules of one layer import each other
without a circle, and no function imports a module of ours or a library inside its body, except the few on
ALLOWED_LOCAL, each with its reason. `specdecode/__init__.py` (the package's face) and `__main__.py` sit on top."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import specdecode

PACKAGE = Path(specdecode.__file__).parent

# lowest first; a module belongs to the longest prefix listed
LAYERS = (
    ("specdecode.errors", "specdecode.paths"),
    ("specdecode.config",),
    ("specdecode.backends",),
    ("specdecode.core",),
    ("specdecode.loading",),
    ("specdecode.drafters.common",),
    ("specdecode.drafters",),
    ("specdecode.api",),
    ("specdecode.server.scheduling",),  # the server's folders, lowest first (server/__init__.py)
    ("specdecode.server.protocol",),
    ("specdecode.server.stores",),
    ("specdecode.server.routes",),
    ("specdecode.server", "specdecode.train"),
    ("specdecode.bench",),
    ("specdecode.cli",),
    ("specdecode", "specdecode.__main__"),
)

# (module, what it imports inside a function): why it may
ALLOWED_LOCAL = {
    ("specdecode.cli.serve", "ray"): "Ray Serve is an optional extra, imported only with --replicas",
    ("specdecode.cli.serve", "specdecode.server.replicas"): "imports Ray at its top: only with --replicas",
    ("specdecode.bench.llamacpp", "llama_cpp"): "llama-cpp-python is an optional extra (the bench's llamacpp peer)",
    ("specdecode.bench.report", "matplotlib"): "~1.4 s of import that only `bench`, drawing its plot, needs",
    ("specdecode.bench.report", "matplotlib.pyplot"): "~1.4 s of import that only `bench`, drawing its plot, needs",
    ("specdecode.cli.main", "transformers"): "quietened once a command runs: `specdecode --help` imports no model code",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function or class) for every import statement of module `name`; `from
    package import module` names the module."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno, nested) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - (child.level - 1)] if child.level else []
                stem = ".".join([*base, *(child.module.split(".") if child.module else [])])
                for alias in child.names:
                    full = f"{stem}.{alias.name}"
                    found.append((full if full in MODULES else stem, child.lineno, nested))
            visit(child, nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))

    visit(ast.parse(path.read_text()), False)
    return found


def _layer(name: str) -> int:
    best, rank = -1, None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), index
    assert rank is not None, f"{name} is in no layer: add its package to LAYERS"
    return rank


def _own_edges() -> dict[str, set[str]]:
    return {name: {target for target, _, _ in _imports(name) if target in MODULES and target != name}
            for name in MODULES}


def test_every_module_is_in_a_layer():
    for name in MODULES:
        _layer(name)


def test_nothing_imports_a_higher_layer():
    upward = [f"{name} (layer {_layer(name)}) imports {target} (layer {_layer(target)})"
              for name, targets in _own_edges().items() for target in targets if _layer(target) > _layer(name)]
    assert not upward, "\n".join(upward)


def test_no_import_circles():
    edges = _own_edges()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(edges[name]):
            if state.get(target) == 1:
                circles.append(" -> ".join(path[path.index(target):] + [name, target]))
            elif target not in state:
                visit(target, path + [name])
        state[name] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [])
    assert not circles, "\n".join(circles)


def test_function_local_imports_are_only_the_allowed_ones():
    local = {(name, target): line for name in MODULES for target, line, nested in _imports(name) if nested}
    unexpected = [f"{MODULES[name].relative_to(PACKAGE.parent)}:{line} imports {target} inside a function"
                  for (name, target), line in local.items() if (name, target) not in ALLOWED_LOCAL]
    assert not unexpected, "\n".join(unexpected)
    stale = [key for key in ALLOWED_LOCAL if key not in local]
    assert not stale, f"allowed but no longer imported locally: {stale}"


def test_nothing_imports_the_command_line():
    importers = [name for name, targets in _own_edges().items()
                 if any(t == "specdecode.cli" or t.startswith("specdecode.cli.") for t in targets)
                 and not name.startswith("specdecode.cli")]
    assert importers == ["specdecode.__main__"]


@pytest.mark.parametrize("broken", ["upward", "circle", "local"])
def test_the_checks_fail_on_a_broken_graph(broken, monkeypatch):
    """Each check above catches what it is for: a graph with one bad edge fails it."""
    real = _imports
    extra = {"upward": ("specdecode.core.engine", ("specdecode.api", 1, False)),
             "circle": ("specdecode.core.trees", ("specdecode.core.engine", 1, False)),
             "local": ("specdecode.core.engine", ("specdecode.loading.load", 1, True))}[broken]
    monkeypatch.setitem(globals(), "_imports",
                        lambda name: real(name) + ([extra[1]] if name == extra[0] else []))
    check = {"upward": test_nothing_imports_a_higher_layer, "circle": test_no_import_circles,
             "local": test_function_local_imports_are_only_the_allowed_ones}[broken]
    with pytest.raises(AssertionError):
        check()
