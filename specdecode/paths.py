"""Where specdecode keeps what it makes once and reuses: converted models, packed weights, assembled GGUFs,
built kernels."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """User cache dir ($SPECDECODE_CACHE, else $XDG_CACHE_HOME/specdecode, else ~/.cache/specdecode)."""
    if os.environ.get("SPECDECODE_CACHE"):
        return Path(os.environ["SPECDECODE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "specdecode"
