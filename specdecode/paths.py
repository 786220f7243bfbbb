"""Where specdecode keeps what it makes once and reuses: converted models, packed weights, assembled GGUFs,
built kernels."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    """User cache dir ($SPECDECODE_CACHE, else $XDG_CACHE_HOME/specdecode, else ~/.cache/specdecode)."""
    if os.environ.get("SPECDECODE_CACHE"):
        return Path(os.environ["SPECDECODE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "specdecode"


def write_whole(path: Path, write: Callable[[str], None]) -> bool:
    """Write `path` through `write(staging)`, a file beside it then renamed into place, so that another process
    (two servers starting at once) never reads half a file -> whether it was written: False, with nothing left
    behind, where the cache cannot be written (a full disk or a read-only directory is not an error: the file is
    made again next time)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, staging = tempfile.mkstemp(prefix=path.name + ".tmp-", dir=path.parent)
        os.close(handle)
        try:
            write(staging)
            os.replace(staging, path)
        finally:
            if os.path.exists(staging):
                os.remove(staging)
    except OSError:
        return False
    return True
