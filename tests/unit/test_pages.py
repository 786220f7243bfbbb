"""OpenAI's list pages: newest or oldest first, `after` a cursor past which the page starts (a 400 when it names
nothing held), `has_more` whether items are left past the page."""
from __future__ import annotations

import pytest

from specdecode.server.protocol.errors import APIError
from specdecode.server.protocol.pages import PageQuery, page

ITEMS = [{"id": f"i{n}"} for n in range(5)]


@pytest.mark.parametrize("limit, newest_first, after, ids, more", [
    (2, True, None, ["i4", "i3"], True),
    (2, True, "i3", ["i2", "i1"], True),
    (2, True, "i1", ["i0"], False),
    (5, False, None, ["i0", "i1", "i2", "i3", "i4"], False),
    (3, False, "i0", ["i1", "i2", "i3"], True),
    (3, False, "i4", [], False),
])
def test_a_page(limit, newest_first, after, ids, more):
    listed = page(ITEMS, PageQuery(limit, newest_first, after), "items")
    assert [item["id"] for item in listed["data"]] == ids and listed["has_more"] is more
    assert listed["first_id"] == (ids[0] if ids else None) and listed["last_id"] == (ids[-1] if ids else None)


def test_an_after_that_names_nothing_is_a_400():
    with pytest.raises(APIError) as refused:
        page(ITEMS, PageQuery(2, True, "gone"), "items")
    assert refused.value.status == 400 and refused.value.param == "after"
