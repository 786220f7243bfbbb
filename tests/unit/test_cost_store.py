"""server/scheduling/cost_store.py: a verify-pass cost table kept between starts, used only once checked against
the machine as it runs now."""
from __future__ import annotations

from pathlib import Path

import pytest

from specdecode.paths import write_whole
from specdecode.server.scheduling.cost_store import TOLERANCE, checked_table, path_for
from specdecode.server.scheduling.policy import CostTable

GRID = ((1, 2, 4), (1, 3, 9))
TABLE = CostTable(*GRID, ms=((10.0, 12.0, 20.0), (12.0, 18.0, 35.0), (16.0, 30.0, 66.0)))
OTHER = CostTable(*GRID, ms=((11.0, 13.0, 22.0), (13.0, 19.0, 37.0), (17.0, 31.0, 70.0)))


def _spot(table: CostTable, scale: float = 1.0):
    """A spot timer answering `table`'s cells (in seconds) times `scale`, recording what it was asked."""
    asked = []

    def spot(shapes):
        asked.append(list(shapes))
        return {(b, q): scale * table.ms[table.batches.index(b)][table.qs.index(q)] / 1000 for b, q in shapes}

    spot.asked = asked
    return spot


def _never():
    pytest.fail("the grid was timed again")


def test_a_first_start_times_and_stores_the_table(tmp_path):
    path = tmp_path / "pass-costs" / "x.json"
    had = checked_table(path, GRID, lambda: TABLE, _spot(TABLE))
    assert (had.table, had.source, had.kept) == (TABLE, "timed", True) and path.is_file()
    spot = _spot(TABLE)
    again = checked_table(path, GRID, _never, spot)
    assert (again.table, again.source) == (TABLE, "stored")
    assert spot.asked == [[(4, 1), (1, 9)]]


@pytest.mark.parametrize("scale", [1 - TOLERANCE + 0.01, 1 + TOLERANCE - 0.01])
def test_a_stored_table_within_the_tolerance_is_used(tmp_path, scale):
    path = tmp_path / "t.json"
    checked_table(path, GRID, lambda: TABLE, _spot(TABLE))
    assert checked_table(path, GRID, _never, _spot(TABLE, scale)).table == TABLE


@pytest.mark.parametrize("scale", [1 - TOLERANCE - 0.02, 1 + TOLERANCE + 0.02])
def test_a_stored_table_the_machine_no_longer_agrees_with_is_timed_again_and_replaced(tmp_path, scale):
    path = tmp_path / "t.json"
    checked_table(path, GRID, lambda: TABLE, _spot(TABLE))
    had = checked_table(path, GRID, lambda: OTHER, _spot(TABLE, scale))
    assert (had.table, had.source) == (OTHER, "retimed") and "a pass of 4 x 1 tokens took" in had.reason
    assert checked_table(path, GRID, _never, _spot(OTHER)).table == OTHER


def test_an_unreadable_or_other_grids_file_is_timed_over(tmp_path):
    path = tmp_path / "t.json"
    for text in ("{not json", '{"batches": [1, 2], "qs": [1, 3, 9], "ms": [[1, 2, 3], [4, 5, 6]]}',
                 '{"batches": [1, 2, 4], "qs": [1, 3, 9], "ms": [[1, 2, 3]]}', '{"ms": "x"}', "[]"):
        path.write_text(text)
        had = checked_table(path, GRID, lambda: TABLE, _spot(TABLE))
        assert (had.table, had.source) == (TABLE, "timed"), text


def test_a_quick_timing_is_not_stored(tmp_path):
    path = tmp_path / "t.json"
    had = checked_table(path, GRID, lambda: TABLE, _spot(TABLE), worth_s=60.0)
    assert (had.table, had.kept) == (TABLE, False) and not path.exists()


def test_a_cache_that_cannot_be_written_still_serves_the_table(tmp_path):
    blocker = tmp_path / "pass-costs"
    blocker.write_text("a file where the directory would be")
    path = blocker / "t.json"
    had = checked_table(path, GRID, lambda: TABLE, _spot(TABLE))
    assert (had.table, had.kept) == (TABLE, False) and list(tmp_path.iterdir()) == [blocker]


def test_each_key_has_its_own_file(tmp_path):
    key = {"model": "m", "threads": 2, "grid": GRID}
    assert path_for(tmp_path, key) == path_for(tmp_path, dict(reversed(list(key.items()))))
    assert path_for(tmp_path, key) != path_for(tmp_path, {**key, "threads": 1})
    assert path_for(tmp_path, key).parent == tmp_path / "pass-costs"



def test_a_write_that_fails_leaves_neither_file_nor_staging(tmp_path):
    """paths.write_whole, which the packed-model cache shares: the file appears whole or not at all."""
    path = tmp_path / "t.json"

    def half(staging):
        Path(staging).write_text('{"batches": [1')
        raise OSError("disk full")

    assert write_whole(path, half) is False and list(tmp_path.iterdir()) == []
    assert write_whole(path, lambda staging: Path(staging).write_text("{}")) is True
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"] and path.read_text() == "{}"
