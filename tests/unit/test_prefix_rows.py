"""Which free row a prompt takes (prefix_rows.choose_row), by table; the kept rows themselves (KeptRows)."""
from __future__ import annotations

import pytest

from specdecode.core.prefix_rows import KeptRows, RowChoice, choose_row

HELD = {0: (None, [5, 6, 7, 8]), 1: (None, [5, 9])}  # row 0 left first


@pytest.mark.parametrize("free,prompt,expected", [
    ([0, 1, 2], [5, 6, 7, 1], RowChoice(0, 3)),  # continues row 0: taken whole
    ([0, 1, 2], [5, 9, 4], RowChoice(1, 2)),  # continues row 1
    ([0, 1, 2], [5, 3], RowChoice(2, 1, source=0)),  # shares a little: a copy in the empty row
    ([0, 1], [5, 3], RowChoice(1, 1, source=0, evict=True)),  # no empty row: the oldest other than the source
    ([1, 0], [5, 6, 3], RowChoice(0, 2)),  # half of row 0 is enough
    ([0], [5, 3], RowChoice(0, 1)),  # the only free row: taken whole
    ([0, 1, 2], [4], RowChoice(2, 0)),  # nothing shared: an empty row
    ([0, 1], [4], RowChoice(0, 0, evict=True)),  # nothing shared, no empty row: the oldest
])
def test_choose_row(free, prompt, expected):
    assert choose_row(free, {r: t for r, t in HELD.items() if r in free}, prompt) == expected


def test_a_row_left_under_another_salt_holds_nothing_usable():
    held = {0: ("a", [5, 6, 7, 8]), 1: ("b", [5, 9])}
    assert choose_row([0, 1, 2], held, [5, 6, 7, 1], salt="a") == RowChoice(0, 3)
    assert choose_row([0, 1, 2], held, [5, 6, 7, 1], salt="b") == RowChoice(1, 1)  # b's own row, not a's
    assert choose_row([0, 1, 2], held, [5, 6, 7, 1], salt="c") == RowChoice(2, 0)  # an empty row, both kept
    assert choose_row([0, 1], held, [5, 6, 7, 1], salt="c") == RowChoice(0, 0, evict=True)  # the oldest


@pytest.mark.parametrize("free,prompt,expected", [
    ([1, 2], [5, 6, 7, 1], RowChoice(2, 4, source=3)),  # a row in use shares more than any kept row: copied
    ([0, 1], [5, 6, 7, 1], RowChoice(0, 4, source=3, evict=True)),  # no empty row: the oldest kept one, freed
    ([0], [5, 6, 7, 1], RowChoice(0, 4, source=3, evict=True)),  # the only free row is never taken whole here
    ([0, 1, 2], [5, 6, 7, 8, 2], RowChoice(0, 4)),  # a kept row sharing as much is taken whole: no copy
    ([0, 1, 2], [5, 6, 3], RowChoice(0, 2)),  # the row in use shares less than row 0
])
def test_a_row_in_use_is_a_source_never_a_row_to_take(free, prompt, expected):
    held = {r: t for r, t in HELD.items() if r in free}
    assert choose_row(free, held, prompt, sources={3: [5, 6, 7, 1]}) == expected


class _Rows:
    """A cache's rows as KeptRows sees them: bytes per row, and which were released."""

    def __init__(self, nbytes: dict[int, int]):
        self.bytes, self.released = nbytes, []

    def row_nbytes(self, row: int) -> int:
        return self.bytes[row]

    def release(self, row: int) -> None:
        self.released.append(row)


def test_kept_rows_are_chosen_counted_and_released_oldest_first():
    cache = _Rows({0: 100, 1: 10, 2: 1})
    kept = KeptRows(cache)
    kept.keep(0, None, [5, 6, 7, 8])
    kept.keep(1, None, [5, 9])
    kept.keep(0, None, [5, 6, 7, 8, 4])  # kept again: now the newest
    assert list(kept.held) == [1, 0] and kept.nbytes() == 110 and len(kept) == 2
    assert kept.choose([0, 1, 2], [5, 6, 7, 8, 4, 3]) == RowChoice(0, 5)
    assert kept.take(0) == [5, 6, 7, 8, 4] and kept.take(2) == [] and list(kept.held) == [1]
    assert kept.tokens(1) == [5, 9]
    kept.keep(2, "a", [1])
    assert kept.release_oldest() and cache.released == [1] and list(kept.held) == [2]
    kept.release_all()
    assert cache.released == [1, 2] and not kept.held and not kept.release_oldest()
