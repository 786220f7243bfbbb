"""Where specdecode keeps what it makes once and reuses: converted models, packed weights, assembled GGUFs,
built kernels; and the checks that a run's output folder or file can be written, made before the run."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from specdecode.errors import ConfigError


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


def output_dir(path: str, name: str) -> Path:
    """`path` as a folder a run can write its results into, made now (`name`: the option, for the message): checked
    before the work runs, so that a run never ends unable to write what it measured. An empty path is refused
    (Path('') is the current folder)."""
    if not path:
        raise ConfigError(f"{name} is empty; name a folder")
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{name} {path!r} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"cannot create {name} {path!r}: {error.strerror or error}") from None
    if not os.access(out, os.W_OK):
        raise ConfigError(f"{name} {path!r} is not writable")
    return out


def output_file(path: str, name: str) -> Path:
    """`path` as a file a run can write (`name`: the option, for the message), checked before the work runs:
    not a folder, in a folder that exists, with permission to write it. Nothing is created."""
    if not path:
        raise ConfigError(f"{name} is empty; name a file")
    out = Path(path)
    if out.is_dir():
        raise ConfigError(f"{name} {path!r} is a folder; name a file in it")
    if not out.parent.is_dir():
        raise ConfigError(f"{name} {path!r}: its folder does not exist")
    if not os.access(out if out.exists() else out.parent, os.W_OK):
        raise ConfigError(f"{name} {path!r} cannot be written (no permission)")
    return out
