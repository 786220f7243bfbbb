"""Plain text the project may use for extra target hidden states: docstrings of installed Python packages whose
declared licence is permissive (MIT, BSD, Apache, PSF, ISC), or user text files. Every source is recorded."""
from __future__ import annotations

import ast
import importlib.metadata as metadata
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from specdecode.errors import ConfigError

PERMISSIVE = re.compile(r"\b(MIT|BSD|Apache|PSF|Python Software Foundation|ISC)\b", re.I)
COPYLEFT = re.compile(r"GPL|Copyleft|CC-BY-SA|MPL", re.I)


@dataclass(frozen=True)
class TextSource:
    texts: tuple[str, ...]
    description: str  # what it is and under which licence, for the head's training record


def package_license(distribution: str) -> str:
    meta = metadata.metadata(distribution)
    parts = [meta.get("License-Expression") or "", meta.get("License") or ""]
    parts += [c for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    return " ".join(p.splitlines()[0] if p else "" for p in parts).strip()


def _distribution_of(package: str) -> str:
    names = metadata.packages_distributions().get(package)
    return names[0] if names else package


def docstrings(package: str, max_chars: int = 2_000_000, min_chars: int = 200) -> TextSource:
    """Module, class and function docstrings of an installed package with a permissive licence."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"package {package!r} is not installed (or is not a package)")
    distribution = _distribution_of(package)
    try:
        version, licence = metadata.version(distribution), package_license(distribution)
    except metadata.PackageNotFoundError as error:
        raise ConfigError(f"no metadata for package {package!r}: cannot check its licence") from error
    if not PERMISSIVE.search(licence) or COPYLEFT.search(licence):
        raise ConfigError(f"package {package!r} is not under a permissive licence ({licence or 'none declared'})")
    texts: list[str] = []
    total = 0
    for root in spec.submodule_search_locations:
        for path in sorted(Path(root).rglob("*.py")):
            if "tests" in path.parts or total >= max_chars:
                continue
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if doc and len(doc) >= min_chars and total < max_chars:
                        texts.append(doc)
                        total += len(doc)
    return TextSource(tuple(dict.fromkeys(texts)), f"docstrings of {distribution} {version} ({licence})")


def text_files(paths: list[str]) -> TextSource:
    """User text files, split on blank lines into passages."""
    texts: list[str] = []
    for path in paths:
        try:
            content = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(f"cannot read text file {path!r}: {error}") from error
        texts.extend(block.strip() for block in re.split(r"\n\s*\n", content) if block.strip())
    return TextSource(tuple(texts), "user text files: " + ", ".join(paths))
