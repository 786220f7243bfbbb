"""The K policy's verify-pass costs kept between starts. Timing them is most of a server's start for a model without
built-in costs (the Qwen pair with `hybrid` on the 2-core Zen 4 VM: 11.6 of 20.2 s, 2026-11-29), and the same
machine gives the same table within a timing's own spread (three fresh processes: cells within 18 %). So the
table is stored under the cache root, keyed by what decides it (the model and its weights, the kernels, the
threads, the CPU, the grid), and a later start uses it only after two of its cells, timed again now, agree with it
within TOLERANCE (a check of ~2 s for the Qwen 1.5B); otherwise every cell is timed again and stored.
`--k-policy calibrate` always times the whole grid."""
from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdecode.paths import write_whole
from specdecode.server.scheduling.policy import CostTable

TOLERANCE = 0.25  # a checked cell may differ from the stored one by this share (measured spread: up to 18 %)
VERSION = 1  # bumped when what a table means changes (the timing, its grid), so older files are not read

Shape = tuple[int, int]  # (rows, tokens per row)


@dataclass(frozen=True)
class Stored:
    """How the table was had: `source` is "stored" (a file's, checked now), "timed" (no usable file) or
    "retimed" (a file's cells no longer agreed); `reason` says why it was timed; `kept`: a timed table was
    written for the next start."""

    table: CostTable
    source: str
    reason: str = ""
    kept: bool = False


def path_for(root: Path, key: Mapping[str, Any]) -> Path:
    """Where the table of `key` (JSON-serialisable) lives: one file per key under root/pass-costs."""
    digest = hashlib.sha256(json.dumps({"version": VERSION, **key}, sort_keys=True, default=str).encode())
    return root / "pass-costs" / f"{digest.hexdigest()[:32]}.json"


def checked_table(path: Path, grid: tuple[Sequence[int], Sequence[int]], measure: Callable[[], CostTable],
                  spot: Callable[[Sequence[Shape]], Mapping[Shape, float]], worth_s: float = 0.0) -> Stored:
    """The stored table at `path` when two of its cells (the corners (most rows, 1 token) and (1 row, most tokens):
    cheap, and each end of the grid) timed now by `spot` (seconds) agree with it within TOLERANCE; else
    `measure()`, stored at `path` for the next start when it took at least `worth_s` (a tiny model's quick timing
    is not worth a file; a cache that cannot be written is left as it is)."""
    batches, qs = tuple(grid[0]), tuple(grid[1])
    stored = _read(path, batches, qs)
    if stored is None:
        table, kept = _measured(path, measure, worth_s)
        return Stored(table, "timed", "no stored table", kept)
    corners = [(batches[-1], qs[0]), (batches[0], qs[-1])]
    now = spot(corners)
    for b, q in corners:
        then = stored.ms[batches.index(b)][qs.index(q)]
        if then <= 0 or abs(1000 * now[b, q] / then - 1) > TOLERANCE:
            reason = f"a pass of {b} x {q} tokens took {1000 * now[b, q]:.1f} ms against {then:.1f} stored"
            table, kept = _measured(path, measure, worth_s)
            return Stored(table, "retimed", reason, kept)
    return Stored(stored, "stored")


def _measured(path: Path, measure: Callable[[], CostTable], worth_s: float) -> tuple[CostTable, bool]:
    """measure()'s table, and whether it was written at `path` (only when it took at least worth_s)."""
    began = time.perf_counter()
    table = measure()
    return table, time.perf_counter() - began >= worth_s and _write(path, table)


def _read(path: Path, batches: tuple[int, ...], qs: tuple[int, ...]) -> CostTable | None:
    """The file's table when it is one of this grid; None when it is missing, unreadable or of another shape."""
    try:
        data = json.loads(path.read_text())
        ms = tuple(tuple(float(v) for v in row) for row in data["ms"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if tuple(data.get("batches", ())) != batches or tuple(data.get("qs", ())) != qs:
        return None
    if len(ms) != len(batches) or any(len(row) != len(qs) for row in ms):
        return None
    return CostTable(batches, qs, ms)


def _write(path: Path, table: CostTable) -> bool:
    """Store `table` at `path` whole or not at all (a file of its own, then renamed: two servers starting at once
    never read half a file); False where the cache cannot be written (the table serves this start and is timed
    again at the next)."""
    text = json.dumps({"batches": table.batches, "qs": table.qs, "ms": table.ms})
    return write_whole(path, lambda staging: Path(staging).write_text(text))

