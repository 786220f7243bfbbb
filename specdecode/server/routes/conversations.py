"""The routes of OpenAI's Conversations API: `/v1/conversations` (create, read, update its metadata, delete) and its
items (add, list, read, delete). What they keep: conversation_store.py; a Responses request naming a conversation
continues it (app.py).

Items are checked as a Responses request's input items are (messages, function calls and their outputs; a 400
names the place of one that is not), at most 20 a request as in OpenAI's API; an add that would take a conversation
past the store's bytes (`serve --conversation-store`) is a 413. A server that keeps no responses or conversations
(`serve --responses-store 0` or `--conversation-store 0`, or `--replicas`) keeps no conversations: creating one is
a 400 naming the flags, reading one a 404.
"""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specdecode.server.protocol.bodies import read_body, require_json
from specdecode.server.protocol.errors import APIError, bad_request, from_validation, shown
from specdecode.server.protocol.pages import PageQuery, page, page_query
from specdecode.server.protocol.schemas import Metadata
from specdecode.server.routes.responses import read_item
from specdecode.server.stores.conversation_store import ITEMS_PER_REQUEST, Conversation, ConversationStore, TooLarge


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ConversationCreate(_Body):
    items: list[dict[str, Any]] | None = Field(default=None, max_length=ITEMS_PER_REQUEST)
    metadata: Metadata | None = None


class ConversationUpdate(_Body):
    metadata: Metadata


class ItemsAdd(_Body):
    items: list[dict[str, Any]] = Field(min_length=1, max_length=ITEMS_PER_REQUEST)


def add_conversation_routes(app: FastAPI, conversations: ConversationStore | None, dependencies: list,
                            limit: int, timeout_s: float) -> None:
    """limit, timeout_s: a body's most bytes and the most its arrival may take."""

    async def body(request: Request, schema: type[_Body]) -> Any:
        require_json(request)
        raw = await read_body(request, limit, timeout_s)
        try:
            return schema.model_validate_json(raw)
        except ValidationError as error:
            raise from_validation(error) from None

    async def create(request: Request) -> Response:
        store = _kept(conversations)
        req = await body(request, ConversationCreate)
        items = _checked(req.items or [])
        try:
            return JSONResponse(store.create(items, req.metadata).card())
        except TooLarge as error:
            raise too_large(error) from None

    async def add(request: Request, conversation_id: str) -> Response:
        held, store = _held(conversations, conversation_id), _kept(conversations)
        req = await body(request, ItemsAdd)
        try:
            items = store.add(held, _checked(req.items, held.items))
        except TooLarge as error:
            raise too_large(error) from None
        return JSONResponse(page(items, PageQuery(len(items), newest_first=False, after=None), "items"))

    async def update(request: Request, conversation_id: str) -> Response:
        held, store = _held(conversations, conversation_id), _kept(conversations)
        req = await body(request, ConversationUpdate)
        store.set_metadata(held, req.metadata)
        return JSONResponse(held.card())

    @app.post("/v1/conversations", dependencies=dependencies, openapi_extra=_json("ConversationCreate"))
    async def create_conversation(request: Request) -> Response:
        return await create(request)

    @app.get("/v1/conversations/{conversation_id}", dependencies=dependencies)
    async def conversation(conversation_id: str) -> dict:
        return _held(conversations, conversation_id).card()

    @app.post("/v1/conversations/{conversation_id}", dependencies=dependencies,
              openapi_extra=_json("ConversationUpdate"))
    async def update_conversation(conversation_id: str, request: Request) -> Response:
        return await update(request, conversation_id)

    @app.delete("/v1/conversations/{conversation_id}", dependencies=dependencies)
    async def delete_conversation(conversation_id: str) -> dict:
        if conversations is None or not conversations.delete(conversation_id):
            raise not_held(conversation_id)
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    @app.post("/v1/conversations/{conversation_id}/items", dependencies=dependencies,
              openapi_extra=_json("ItemsAdd"))
    async def add_items(conversation_id: str, request: Request) -> Response:
        return await add(request, conversation_id)

    @app.get("/v1/conversations/{conversation_id}/items", dependencies=dependencies)
    async def list_items(conversation_id: str, request: Request) -> dict:
        asked = page_query(request.query_params, 20, 100, "conversation items")
        return page(_held(conversations, conversation_id).items, asked, "items")

    @app.get("/v1/conversations/{conversation_id}/items/{item_id}", dependencies=dependencies)
    async def item(conversation_id: str, item_id: str) -> dict:
        held, store = _held(conversations, conversation_id), _kept(conversations)
        return _item_of(store, held, item_id)

    @app.delete("/v1/conversations/{conversation_id}/items/{item_id}", dependencies=dependencies)
    async def delete_item(conversation_id: str, item_id: str) -> dict:
        held, store = _held(conversations, conversation_id), _kept(conversations)
        store.remove_item(held, _item_of(store, held, item_id))
        return held.card()


SCHEMAS = (ConversationCreate, ConversationUpdate, ItemsAdd)  # the request bodies, for the OpenAPI document


def _json(name: str) -> dict:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "$ref": f"#/components/schemas/{name}"}}}}}


def _checked(items: list[dict[str, Any]], held: list[dict] | tuple = ()) -> list[dict[str, Any]]:
    """The items, each read as a Responses input item (a 400 names the place of one that is not), and each id a
    client gives new to the conversation (`held`: its items) and to the request: a 400 names the repeated one. Two
    items of one id made `after` in a listing name both, so paging by it returned the second forever."""
    taken = {item["id"] for item in held}
    for i, raw in enumerate(items):
        read_item(raw, f"items.{i}")
        given = raw.get("id")
        if isinstance(given, str):
            if given in taken:
                raise bad_request(f"items.{i}.id {shown(given)} is already an item's id in this conversation",
                                  f"items.{i}.id", "duplicate_id")
            taken.add(given)
    return items


# what makes a server keep conversations, for every answer that says it keeps none
KEEPING = "serve --responses-store N and --conversation-store BYTES; with --replicas none, as replicas share no memory"


def _kept(conversations: ConversationStore | None) -> ConversationStore:
    if conversations is None:
        raise bad_request(f"this server keeps no conversations ({KEEPING})", None, "unsupported")
    return conversations


def _held(conversations: ConversationStore | None, conversation_id: str) -> Conversation:
    held = conversations.get(conversation_id) if conversations is not None else None
    if held is None:
        raise not_held(conversation_id)
    return held


def not_held(conversation_id: str, param: str = "conversation_id") -> APIError:
    """The 404 for a conversation id this server does not hold; param: the field that named it."""
    return APIError(404, f"no conversation with id {shown(conversation_id)} is held here (never made, deleted, or "
                         "dropped for room)", "not_found_error", param=param, code="not_found")


def too_large(error: TooLarge, param: str = "items") -> APIError:
    """The 413 for items that would take a conversation past the store's bytes; param: the field that sent them."""
    return APIError(413, f"the conversation would hold {error.size} bytes of items as JSON, and this server keeps at "
                         f"most {error.limit} (serve --conversation-store)", param=param,
                    code="conversation_too_large")


def _item_of(store: ConversationStore, held: Conversation, item_id: str) -> dict:
    found = store.item_in(held, item_id)
    if found is None:
        raise APIError(404, f"conversation {held.id} holds no item with id {shown(item_id)}", "not_found_error",
                       param="item_id", code="not_found")
    return found
