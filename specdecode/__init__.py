"""specdecode: lossless speculative decoding for Hugging Face causal LMs.

Layers, each importing only those below it: config and errors; backends (cpu, cuda); the decoding core; model
loading; drafters; the library API (api.py); server, training, benchmark; the command line (cli/).

The names below load on first use (PEP 562): importing the package, or one module of it (the native kernels,
the config), does not import torch and transformers' model code behind the API (`import specdecode` took ~6 s
on the 2-core VM when it did, of which torch ~2 s; docs/design-notes.md, "Native kernels")."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specdecode.api import SpecDecoder
    from specdecode.config import DrafterConfig, GenerationConfig, ModelConfig, SamplingConfig, SpecConfig, Structure
    from specdecode.core.engine import Engine
    from specdecode.core.sequence import Result
    from specdecode.errors import ConfigError, ModelError

_HOMES = {"SpecDecoder": "specdecode.api", "DrafterConfig": "specdecode.config",
          "GenerationConfig": "specdecode.config", "ModelConfig": "specdecode.config",
          "SamplingConfig": "specdecode.config", "SpecConfig": "specdecode.config", "Structure": "specdecode.config",
          "Engine": "specdecode.core.engine", "Result": "specdecode.core.sequence",
          "ConfigError": "specdecode.errors", "ModelError": "specdecode.errors"}

__all__ = ["ConfigError", "DrafterConfig", "Engine", "GenerationConfig", "ModelConfig", "ModelError", "Result",
           "SamplingConfig", "SpecConfig", "SpecDecoder", "Structure"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """A public name, imported from its module the first time it is read."""
    if name not in _HOMES:
        raise AttributeError(f"module 'specdecode' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
