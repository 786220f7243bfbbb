"""Which free cache row a new prompt takes, where finished sequences left their KV in their rows (the engine's
parked rows, a draft model's held rows): a pure choice over the rows' token lists (choose_row), and the rows
themselves (KeptRows), shared by both caches.

A prompt that continues a row's tokens (shares at least half of them: a conversation's next turn) takes that row
whole. One that shares less (the chat template's system prompt: another conversation's row) gets a copy of the
shared prefix in another row, so the row stays with its own conversation for its next turn. A row not taken whole
is an empty free row where there is one, else the one whose tokens were left longest ago (they are then freed).
A row still in use (the first choice of a request that asks for several of one prompt) may be a source to copy
from, never a row to take.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specdecode.core.drafting import common_prefix
from specdecode.core.kv_cache import RollbackCache


@dataclass(frozen=True)
class RowChoice:
    row: int  # the row the prompt takes
    shared: int  # prompt tokens whose KV the row holds (once `source`'s are copied in)
    source: int | None = None  # a row to copy the shared prefix from (None: `row` holds it already)
    evict: bool = False  # `row` held other tokens, of no use now: free them


def choose_row(free: Sequence[int], held: Mapping[int, tuple[str | None, Sequence[int]]], prompt: Sequence[int],
               salt: str | None = None, sources: Mapping[int, Sequence[int]] | None = None) -> RowChoice:
    """free: the free rows (at least one); held: free rows -> (the cache salt of the sequence that left them, the
    tokens whose KV they hold), left longest ago first; prompt: the tokens whose KV the new sequence needs, under
    `salt` (a row left under another salt holds nothing it may use: GenerationConfig.cache_salt); sources: rows in
    use -> the tokens whose KV they hold for good (under the same salt), to copy from where they share the most.

    Example: free [0, 1, 2], held {0: (None, [5, 6, 7, 8]), 1: (None, [5, 9])}, prompt [5, 6, 7, 1] -> row 0
    whole (3 of its 4 tokens); prompt [5, 3] -> row 2 (empty) with a copy of row 0's first token (row 0 came
    first of equals); prompt [5, 6, 7, 1] with sources {3: [5, 6, 7, 1]} -> row 2 with a copy of row 3's four."""
    usable = {row: tokens if row_salt == salt else () for row, (row_salt, tokens) in held.items()}
    best, shared = None, 0
    for row in free:
        length = common_prefix(usable.get(row, ()), prompt)
        if length > shared:
            best, shared = row, length
    for row, tokens in (sources or {}).items():
        length = common_prefix(tokens, prompt)
        if length > shared:
            best, shared = row, length
    if best in usable and best in free and (2 * shared >= len(usable[best]) or len(free) == 1):
        return RowChoice(best, shared)
    empty = [row for row in free if row not in held]
    if empty:
        return RowChoice(empty[0], shared, best)
    oldest = next(row for row in held if row != best and row in free)
    return RowChoice(oldest, shared, best, evict=True)


class KeptRows:
    """The free rows of one cache that still hold a finished sequence's KV, left longest ago first: where a new
    prompt looks for its prefix (choose_row), what a server's KV budget counts (nbytes) and frees, oldest first
    (release_oldest). The engine keeps the target's parked rows in one, a draft model its own rows in another."""

    def __init__(self, cache: RollbackCache):
        self.cache = cache
        # free row -> (the cache salt of the sequence that left it, the tokens whose KV it holds, in order)
        self.held: dict[int, tuple[str | None, list[int]]] = {}

    def __len__(self) -> int:
        return len(self.held)

    def keep(self, row: int, salt: str | None, tokens: list[int]) -> None:
        """A finished sequence leaves `tokens`' KV in `row` (kept last: released last)."""
        self.held.pop(row, None)
        self.held[row] = (salt, tokens)

    def choose(self, free: Sequence[int], prompt: Sequence[int], salt: str | None = None,
               sources: Mapping[int, Sequence[int]] | None = None) -> RowChoice:
        return choose_row(free, self.held, prompt, salt, sources)

    def take(self, row: int) -> list[int]:
        """The row is in use again; -> the tokens whose KV it holds (none if it held nothing)."""
        return self.held.pop(row, (None, []))[1]

    def tokens(self, row: int) -> list[int]:
        return self.held[row][1]

    def nbytes(self) -> int:
        return sum(self.cache.row_nbytes(row) for row in self.held)

    def release_oldest(self) -> bool:
        """Free the KV of the row left longest ago (it stays a free row, holding nothing); False if none is held."""
        if not self.held:
            return False
        row = next(iter(self.held))
        del self.held[row]
        self.cache.release(row)
        return True

    def release_all(self) -> None:
        while self.release_oldest():
            pass
