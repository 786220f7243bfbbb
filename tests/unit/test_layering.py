"""The command line sits on top: no module imports `specdecode.cli` (subcommands share `cli_args`), so cli.py
and the subcommands' modules never import each other."""
import ast
from pathlib import Path

import specdecode

PACKAGE = Path(specdecode.__file__).parent


def _imported_modules(path: Path) -> set[str]:
    """Absolute names of the specdecode modules a file imports."""
    module = ".".join(("specdecode", *path.relative_to(PACKAGE).with_suffix("").parts))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
            stem = ".".join([*base, *(node.module.split(".") if node.module else [])])
            names.add(stem)
            names.update(f"{stem}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_nothing_imports_the_command_line_module():
    importers = [str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                 if "specdecode.cli" in _imported_modules(path)]
    assert importers == ["__main__.py"]
