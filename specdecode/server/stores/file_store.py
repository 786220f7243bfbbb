"""The Files API's files, held in memory: the batch files clients upload (`POST /v1/files`, purpose "batch") and the
output and error files batches write (purpose "batch_output"), read back with `GET /v1/files/{id}/content`.

Bounded by bytes: an upload that would take the store past its capacity is refused (413, naming what is held), so
a client cannot fill the server's memory. An upload being read holds its declared size aside until it is kept or
refused; one that declares none (chunked) holds what has arrived, growing as it is read, and is refused once it
would pass the room (it had held the whole room, so one slow chunked upload refused every other). Before, uploads
read side by side each had the whole room, and all
were read and parsed before all but one were refused: eight clients uploading 60 MB at once to a 64 MiB store
raised the server's RSS by 1,004 MiB at its peak (194 MiB with the room held aside; `specdecode serve`, the
default model). A running batch holds room for its results as they arrive, and stops where they would pass it
(batches.py); its files then take that room (its error lines, never refused, beside it: a finished batch must not
lose what it answered), and later uploads wait for room, which deleting files makes. Nothing is dropped to make
room, and nothing outlives the process.
"""
from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

FILES_BYTES = 256 << 20  # the server's default capacity (serve --files-store)
PURPOSES = ("batch",)  # what a client may upload: files for the Batches API
OUTPUT_PURPOSE = "batch_output"


@dataclass(frozen=True)
class StoredFile:
    id: str
    filename: str
    purpose: str
    created_at: int
    data: bytes

    def card(self) -> dict:
        """OpenAI's file object."""
        return {"id": self.id, "object": "file", "bytes": len(self.data), "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed", "expires_at": None,
                "status_details": None}


class FileStore:
    """Files by id, oldest first. Used from the server's event loop only (no lock)."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"a file store holds at least one byte, got {capacity}")
        self.capacity = capacity
        self.reserved = 0  # bytes held for uploads being read (reserve)
        self._files: dict[str, StoredFile] = {}

    @property
    def used(self) -> int:
        return sum(len(held.data) for held in self._files.values())

    def room(self) -> int:
        """Bytes an upload may have now (what is held and what uploads being read have reserved aside)."""
        return max(0, self.capacity - self.used - self.reserved)

    @contextlib.contextmanager
    def reserve(self, size: int, slack: int = 0) -> Iterator[Callable[[int], bool]]:
        """Hold `size` bytes of room aside while an upload is read and parsed (room() no longer counts them).
        Yields grow(total): hold `total` bytes in all, as an upload that declared no size arrives; False, holding
        no more, when that is over the room beside what others hold (plus `slack`: a form's bytes beyond its
        file's)."""
        held = size
        self.reserved += size

        def grow(total: int) -> bool:
            nonlocal held
            if total <= held:
                return True
            if total > self.capacity - self.used - (self.reserved - held) + slack:
                return False
            self.reserved += total - held
            held = total
            return True
        try:
            yield grow
        finally:
            self.reserved -= held

    def add(self, filename: str, purpose: str, data: bytes) -> StoredFile:
        """Keep a file (the caller has checked an upload against room())."""
        held = StoredFile("file-" + uuid.uuid4().hex, filename, purpose, int(time.time()), data)
        self._files[held.id] = held
        return held

    def get(self, file_id: str) -> StoredFile | None:
        return self._files.get(file_id)

    def delete(self, file_id: str) -> bool:
        return self._files.pop(file_id, None) is not None

    def held(self) -> list[StoredFile]:
        """Every file, oldest first."""
        return list(self._files.values())
