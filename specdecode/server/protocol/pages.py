"""OpenAI's list pages (`{"object": "list", "data", "first_id", "last_id", "has_more"}`) and their query: `limit`,
`order` and an `after` cursor, each checked (a bad one is a 400 naming it). Used by the routes that list what the
server keeps: files, batches, a kept response's input items."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specdecode.server.protocol.errors import bad_request, shown


@dataclass(frozen=True)
class PageQuery:
    limit: int
    newest_first: bool
    after: str | None


def page_query(query: Mapping[str, str], default_limit: int, most: int, what: str,
               extra: tuple[str, ...] = ()) -> PageQuery:
    """The page a request asks for; what: the things listed, named in errors; extra: further parameters the route
    reads itself (any other is a 400)."""
    unknown = sorted(set(query) - {"limit", "order", "after", *extra})
    if unknown:
        raise bad_request(f"{unknown[0]} is not supported when listing {what}", unknown[0], "unsupported")
    limit, order = query.get("limit"), query.get("order", "desc")
    if limit is not None and not (limit.isascii() and limit.isdigit() and len(limit) <= 6 and 1 <= int(limit) <= most):
        raise bad_request(f"limit must be a whole number from 1 to {most}, got {shown(limit)}", "limit",
                          "invalid_value")
    if order not in ("asc", "desc"):
        raise bad_request(f"order must be 'asc' or 'desc', got {shown(order)}", "order", "invalid_value")
    return PageQuery(default_limit if limit is None else int(limit), order == "desc", query.get("after"))


def page(items: Sequence[dict], asked: PageQuery, what: str) -> dict:
    """items (oldest first, each with an "id") as the page asked for; an `after` that names none of them is a 400.
    Reads only the page's items, and those before `after` to find it: a conversation may hold millions, and copying
    them all for each page (as this once did) took ~0.2 s of the event loop a request at two million."""
    count = len(items)
    order = range(count - 1, -1, -1) if asked.newest_first else range(count)
    start = 0
    if asked.after is not None:
        start = next((k + 1 for k, i in enumerate(order) if items[i]["id"] == asked.after), -1)
        if start < 0:
            raise bad_request(f"after names none of the {what} held here: {shown(asked.after)}", "after",
                              "invalid_value")
    data = [items[i] for i in order[start:start + asked.limit]]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": start + asked.limit < count}
