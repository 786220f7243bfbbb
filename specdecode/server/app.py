"""The FastAPI app: OpenAI-compatible routes over one Scheduler (which owns the Engine in its own thread).

Handlers only parse, validate, tokenise and wait for events; all model work happens in the scheduler thread.
Defaults follow OpenAI where it defines them (temperature 1, top_p 1, n 1); max_tokens defaults to the
server's --default-max-tokens, clipped to the context left after the prompt.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdecode.server.jobs import (
    OutputShape,
    build_job,
    echo_texts,
    encode,
    encode_prompt,
    output_shape,
    seeded_choices,
    token_text,
)
from specdecode.server.openapi import json_body, openapi_document
from specdecode.server.playground import add_playground
from specdecode.server.protocol import schemas as s
from specdecode.server.protocol.as_chat import AsChat
from specdecode.server.protocol.bodies import read_body, require_json
from specdecode.server.protocol.errors import APIError, bad_request, from_validation, shown
from specdecode.server.protocol.pages import page, page_query
from specdecode.server.protocol.replies import Choice, Reply, sse, whole
from specdecode.server.protocol.tools import ToolError, tool_use
from specdecode.server.routes.conversations import KEEPING, add_conversation_routes, not_held, too_large
from specdecode.server.routes.files_batches import add_batch_routes
from specdecode.server.routes.messages import CountTokensRequest, MessagesRequest, MessageWriter, messages_error
from specdecode.server.routes.responses import ResponsesRequest, ResponseWriter, responses_error
from specdecode.server.scheduling.scheduler import Failed, Job, QueueFull, Ticket, TooLarge
from specdecode.server.service import Service
from specdecode.server.stores.conversation_store import TooLarge as ConversationTooLarge

log = logging.getLogger(__name__)
_Body = TypeVar("_Body", bound=s.ModelRequest)
RETRY_AFTER_S = 1  # a full queue drains in about one request's time: clients should come back soon, not at once
# headers an error of this status carries (RFC 6750 asks a 401 for a bearer token to name the scheme)
_ERROR_HEADERS = {401: {"WWW-Authenticate": "Bearer"}, 429: {"Retry-After": str(RETRY_AFTER_S)}}



def create_app(service: Service) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        service.scheduler.start()
        try:
            yield
        finally:
            if service.batches is not None:
                await service.batches.close()
            service.scheduler.stop()

    # the API's description is served below, behind the API key when there is one
    app = FastAPI(title="specdecode", lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.state.service = service
    if service.config.allowed_hosts is not None:
        app.add_middleware(_HostCheck, allowed=service.config.allowed_hosts)
    app.add_middleware(_Counting, count=lambda endpoint, status: service.metrics.requests.labels(endpoint,
                                                                                                  status).inc())

    @app.exception_handler(APIError)
    async def _api_error(request: Request, error: APIError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status, headers=_ERROR_HEADERS.get(error.status))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return JSONResponse(APIError(error.status_code, str(error.detail), kind).body(), status_code=error.status_code,
                            headers=error.headers)  # a 405's Allow

    @app.exception_handler(Exception)
    async def _server_error(request: Request, error: Exception) -> JSONResponse:
        """A bug: logged with its traceback, answered without its text (which may hold internals)."""
        log.error("internal error answering %s %s", request.method, request.url.path, exc_info=error)
        message = f"internal error ({type(error).__name__}); the server logged it"
        return JSONResponse(APIError(500, message, "server_error").body(), status_code=500)

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 {"status": "ok"}, or 503 {"status": "stalled", "reason": ...} when the scheduler makes no progress."""
        scheduler = service.scheduler
        state = {"status": "ok", "active": scheduler.active, "queued": scheduler.queued}
        reason = scheduler.stalled()
        if reason is not None:
            return JSONResponse({**state, "status": "stalled", "reason": reason}, status_code=503)
        return JSONResponse(state)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(service.metrics.render(), media_type=service.metrics.content_type)

    v1 = [Depends(_authorizer(service.config.api_key))]

    @app.get("/v1/models", dependencies=v1)
    async def models() -> dict:
        card = s.ModelCard(id=service.config.model_name, created=service.created,
                           max_model_len=service.target.max_positions)
        return s.ModelList(data=[card]).model_dump()

    @app.get("/v1/models/{model:path}", dependencies=v1)
    async def model(model: str) -> dict:
        if model != service.config.model_name:
            raise APIError(404, f"model {shown(model)} does not exist; this server serves "
                                f"{service.config.model_name!r}", param="model", code="model_not_found")
        return s.ModelCard(id=model, created=service.created, max_model_len=service.target.max_positions).model_dump()

    @app.post("/v1/completions", dependencies=v1, openapi_extra=json_body(s.CompletionRequest))
    async def completions(request: Request) -> Response:
        return await _handle(service, request, chat=False)

    @app.post("/v1/chat/completions", dependencies=v1, openapi_extra=json_body(s.ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        return await _handle(service, request, chat=True)

    @app.post("/v1/responses", dependencies=v1, openapi_extra=json_body(ResponsesRequest))
    async def responses(request: Request) -> Response:
        return await _respond(service, request)

    @app.get("/v1/responses/{response_id}", dependencies=v1)
    async def response(response_id: str) -> dict:
        kept = service.responses.get(response_id) if service.responses is not None else None
        if kept is None:
            raise _not_kept(response_id)
        return kept.response

    @app.get("/v1/responses/{response_id}/input_items", dependencies=v1)
    async def response_input_items(response_id: str, request: Request) -> dict:
        asked = page_query(request.query_params, 20, 100, "input items")
        kept = service.responses.get(response_id) if service.responses is not None else None
        if kept is None:
            raise _not_kept(response_id)
        return page(kept.input_items, asked, "input items")

    @app.delete("/v1/responses/{response_id}", dependencies=v1)
    async def delete_response(response_id: str) -> dict:
        if service.responses is None or not service.responses.delete(response_id):
            raise _not_kept(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    @app.post("/v1/messages", dependencies=v1, openapi_extra=json_body(MessagesRequest))
    async def messages(request: Request) -> Response:
        return await _message(service, request)

    @app.post("/v1/messages/count_tokens", dependencies=v1, openapi_extra=json_body(CountTokensRequest))
    async def count_tokens(request: Request) -> Response:
        return await _count_tokens(service, request)

    @app.post("/tokenize", dependencies=v1, openapi_extra=json_body(s.TokenizeRequest))
    async def tokenize(request: Request) -> Response:
        return await _tokenize(service, request)

    @app.post("/detokenize", dependencies=v1, openapi_extra=json_body(s.DetokenizeRequest))
    async def detokenize(request: Request) -> Response:
        return await _detokenize(service, request)

    @app.get("/openapi.json", dependencies=v1, include_in_schema=False)
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", dependencies=v1, include_in_schema=False)
    async def docs() -> Response:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="specdecode")

    @app.get("/redoc", dependencies=v1, include_in_schema=False)
    async def redoc() -> Response:
        return get_redoc_html(openapi_url="/openapi.json", title="specdecode")

    add_batch_routes(app, service.files, service.batches, v1, service.config.body_timeout_s)
    add_conversation_routes(app, service.conversations, v1, service.config.max_body_bytes,
                            service.config.body_timeout_s)
    add_playground(app)  # GET /: the page is public; its API calls carry the key the user types
    app.openapi = lambda: openapi_document(app, service)  # type: ignore[method-assign]
    return app


def _authorizer(api_key: str | None) -> Callable[[Request], Awaitable[None]]:
    """A dependency that refuses a request without `Authorization: Bearer <api_key>`, or Anthropic's `x-api-key:
    <api_key>` (none when no key is set). The comparison takes the same time wherever the tokens differ."""
    expected = None if api_key is None else api_key.encode()

    async def authorize(request: Request) -> None:
        if expected is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        bearer = scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode(), expected)
        anthropic = secrets.compare_digest(request.headers.get("x-api-key", "").strip().encode(), expected)
        if not (bearer or anthropic):
            raise APIError(401, "a valid API key is required: send the header 'Authorization: Bearer <key>'",
                           code="invalid_api_key")

    return authorize



# -- one request -------------------------------------------------------------------------------------------------
async def _body(service: Service, request: Request, schema: type[_Body]) -> _Body:
    """The request's JSON body as `schema`, for this server's model: else a 4xx naming what is wrong."""
    require_json(request)
    body = await read_body(request, service.config.max_body_bytes, service.config.body_timeout_s)
    try:
        req = schema.model_validate_json(body)
    except ValidationError as error:
        raise from_validation(error) from None
    for param, message in req.unsupported():
        raise bad_request(message, param, "unsupported")
    if req.model != service.config.model_name:
        raise APIError(404, f"model {shown(req.model)} does not exist; this server serves "
                            f"{service.config.model_name!r}",
                       param="model", code="model_not_found")
    return req


async def _handle(service: Service, request: Request, chat: bool) -> Response:
    req = await _body(service, request, s.ChatCompletionRequest if chat else s.CompletionRequest)
    trace = bool(req.speculation and req.speculation.trace)
    if trace and not req.stream:
        raise bad_request("speculation.trace needs \"stream\": true (the trace rides on the stream's chunks)",
                          "speculation.trace", "invalid_value")
    shape = await asyncio.to_thread(output_shape, service, req)  # compiling a grammar must not stall the streams
    prompts = await asyncio.to_thread(encode, service, req, shape.tools)  # a long prompt must not stall the streams
    n = req.n or 1
    if len(prompts) * n > service.config.max_queue:
        raise bad_request(f"the request asks for {len(prompts) * n} choices ({len(prompts)} prompts x n={n}); this "
                          f"server queues at most {service.config.max_queue} at once", "n" if n > 1 else "prompt",
                          "invalid_value")
    jobs = [build_job(service, req, ids, shape) for ids in prompts]
    echoes = await asyncio.to_thread(echo_texts, service, req, prompts)
    choices = _choices(jobs, echoes, n, asyncio.get_running_loop())
    _submit(service, [choice.ticket for choice in choices])
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    reply = Reply(service.config.model_name, chat, lambda token: token_text(service, token),
                  calls=shape.tools.reading, stops=frozenset([*stops, *(req.stop_token_ids or ())]))
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(sse(choices, reply, n, include_usage, trace), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    tickets = [choice.ticket for choice in choices]
    watcher = asyncio.create_task(_watch_disconnect(request, tickets))
    try:
        return JSONResponse(await whole(choices, reply, n, jobs[0].generation.logprobs is not None))
    finally:
        watcher.cancel()
        for ticket in tickets:
            ticket.cancel()


async def _respond(service: Service, request: Request) -> Response:
    """OpenAI's Responses API, written as a Responses object (server/routes/responses.py)."""
    req = await _body(service, request, ResponsesRequest)
    if req.previous_response_id is not None:
        req = req.after(_earlier_items(service, req.previous_response_id))
    elif req.conversation_id is not None:
        req = req.after(_conversation_items(service, req), "conversation")
    req = req.referenced(_kept_item(service) if service.responses is not None else None)
    ticket, shape, _ = await _as_chat(service, req, responses_error)
    writer = ResponseWriter(service.config.model_name, req, shape.tools.reading, service.responses,
                            lambda token: token_text(service, token), service.conversations)
    return await _answer(request, ticket, writer, bool(req.stream))


def _earlier_items(service: Service, response_id: str) -> list[dict]:
    """The conversation a kept response ends (its chain's input and output items), or a 400 naming why not."""
    if service.responses is None:
        raise APIError(400, "previous_response_id needs a server that keeps responses; this one keeps none "
                            "(serve --responses-store N)", param="previous_response_id", code="unsupported")
    items = service.responses.conversation(response_id)
    if items is None:
        raise APIError(400, f"previous response {shown(response_id)} is not held: it was never kept, was deleted, "
                            f"or it (or one it continued) was dropped for room (this server keeps the last "
                            f"{service.responses.capacity} responses, within {service.responses.max_bytes} bytes)",
                       param="previous_response_id",
                       code="previous_response_not_found")
    return items


def _conversation_items(service: Service, req: ResponsesRequest) -> list[dict]:
    """The items of the conversation the response continues, or a 4xx naming why not: a 413 where the request's
    own items would take it past the store's bytes (they join it when the response finishes, and the model reads
    none of their unknown fields, so the context does not bound them)."""
    if service.conversations is None:
        raise APIError(400, f"conversation needs a server that keeps conversations; this one keeps none ({KEEPING})",
                       param="conversation", code="unsupported")
    held = service.conversations.get(req.conversation_id)
    if held is None:
        raise not_held(req.conversation_id, "conversation")
    try:
        service.conversations.check_room(held, req.own_items())
    except ConversationTooLarge as error:
        raise too_large(error, "input") from None
    return list(held.items)


def _kept_item(service: Service) -> Callable[[str], dict | None]:
    """An item_reference's target: a kept response's item, else a conversation's."""
    def lookup(item_id: str) -> dict | None:
        found = service.responses.item(item_id) if service.responses is not None else None
        if found is None and service.conversations is not None:
            found = service.conversations.item(item_id)
        return found
    return lookup


def _not_kept(response_id: str) -> APIError:
    return APIError(404, f"no response with id {shown(response_id)} is kept here", "not_found_error",
                    param="response_id", code="not_found")


async def _message(service: Service, request: Request) -> Response:
    """Anthropic's Messages API, written as an Anthropic message (server/routes/messages.py)."""
    req = await _body(service, request, MessagesRequest)
    ticket, shape, prompt_tokens = await _as_chat(service, req, messages_error)
    writer = MessageWriter(service.config.model_name, req, shape.tools.reading, prompt_tokens)
    return await _answer(request, ticket, writer, bool(req.stream))


async def _as_chat(service: Service, req: AsChat,
                   named: Callable[[APIError], APIError]) -> tuple[Ticket, OutputShape, int]:
    """Another API's request decoded as the chat request it amounts to, one choice, queued: its ticket, output shape
    and prompt tokens. A 400 names the field as that API's request does (`named`)."""
    try:
        chat = req.chat()
        shape = await asyncio.to_thread(output_shape, service, chat)
        (ids,) = await asyncio.to_thread(encode, service, chat, shape.tools)
        ticket = Ticket(build_job(service, chat, ids, shape), asyncio.get_running_loop())
        _submit(service, [ticket])
    except ValidationError as error:  # the chat request the parts make (each part was read already)
        raise named(from_validation(error)) from None
    except APIError as error:
        raise named(error) from None
    return ticket, shape, len(ids)


async def _answer(request: Request, ticket: Ticket, writer: ResponseWriter | MessageWriter, stream: bool) -> Response:
    """The writer's stream of events, or its whole body once the ticket has finished (a client that leaves frees
    the row)."""
    if stream:
        return StreamingResponse(writer.events(ticket), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    watcher = asyncio.create_task(_watch_disconnect(request, [ticket]))
    try:
        return JSONResponse(await writer.whole(ticket))
    finally:
        watcher.cancel()
        ticket.cancel()


async def _count_tokens(service: Service, request: Request) -> Response:
    """Anthropic's count_tokens: the prompt tokens a Messages request with these messages, system and tools comes
    to, as /v1/messages would encode it."""
    req = await _body(service, request, CountTokensRequest)
    try:
        chat = req.request().chat()
        shape = await asyncio.to_thread(output_shape, service, chat)
        (ids,) = await asyncio.to_thread(encode, service, chat, shape.tools)
    except ValidationError as error:
        raise messages_error(from_validation(error)) from None
    except APIError as error:
        raise messages_error(error) from None
    return JSONResponse({"input_tokens": len(ids)})


async def _tokenize(service: Service, request: Request) -> Response:
    """vLLM's /tokenize: the tokens a prompt or a conversation is to the completion endpoints."""
    req = await _body(service, request, s.TokenizeRequest)
    if (req.prompt is None) == (req.messages is None):
        raise bad_request("send a prompt or messages (one of them)", "prompt" if req.prompt is None else "messages",
                          "invalid_value")
    if req.messages is None:
        with service.tokenizer_lock:
            ids = encode_prompt(service, req.prompt, bool(req.add_special_tokens))
    else:
        chat = req.chat()
        try:
            tools = tool_use(chat, service.tool_format, service.added_tokens)
        except ToolError as error:
            raise bad_request(str(error), error.param, "invalid_value") from None
        (ids,) = await asyncio.to_thread(encode, service, chat, tools)
    strs = None
    if req.return_token_strs:
        with service.tokenizer_lock:
            strs = service.target.tokenizer.convert_ids_to_tokens(list(ids))
    reply = s.TokenizeResponse(count=len(ids), max_model_len=service.target.max_positions, tokens=list(ids),
                               token_strs=strs)
    return JSONResponse(reply.model_dump(exclude_none=True))


async def _detokenize(service: Service, request: Request) -> Response:
    """vLLM's /detokenize: token ids back to text, as the completion endpoints decode them."""
    req = await _body(service, request, s.DetokenizeRequest)
    vocab = service.target.vocab_size
    if any(not 0 <= token < vocab for token in req.tokens):
        raise bad_request(f"tokens must be token ids in [0, {vocab})", "tokens", "invalid_value")
    with service.tokenizer_lock:
        text = service.target.tokenizer.decode(req.tokens)
    return JSONResponse(s.DetokenizeResponse(prompt=text).model_dump())


def _choices(jobs: list[Job], echoes: list[str], n: int, loop: asyncio.AbstractEventLoop) -> list[Choice]:
    """n choices per prompt, in OpenAI's order (prompt x n + j); a prompt's later choices name its first, whose
    prefilled KV they copy (Scheduler._first_choice)."""
    choices = []
    for job, echo in zip(jobs, echoes):
        lead = job.prompt_ids[0] if job.generation.prompt_logprobs is not None else None
        first = Ticket(job, loop)
        choices += [Choice(first, echo, lead)]
        choices += [Choice(Ticket(other, loop, first), echo, lead) for other in seeded_choices(job, n)[1:]]
    return choices



def _submit(service: Service, tickets: list[Ticket]) -> None:
    """All of a request's choices join the queue, or none: one refused takes back those already in."""
    for i, ticket in enumerate(tickets):
        try:
            service.scheduler.submit(ticket)
        except (QueueFull, TooLarge) as error:
            for taken in tickets[:i]:
                taken.cancel()
            if isinstance(error, QueueFull):
                raise APIError(429, str(error), "rate_limit_error", code="queue_full") from None
            raise APIError(413, str(error), param="max_tokens", code="kv_cache_too_small") from None


async def _watch_disconnect(request: Request, tickets: list[Ticket]) -> None:
    """The body is read, so the next ASGI message is http.disconnect: free the request's rows."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            for ticket in tickets:
                ticket.cancel()
                ticket.post(Failed("client disconnected", status=499))
            return



class _HostCheck:
    """ASGI middleware: a request whose Host header (port aside) is not one of `allowed` is answered 400 JSON. On a
    server bound to loopback it stops a web page whose own host name resolves to 127.0.0.1 (DNS rebinding) from
    reading the API; Starlette's TrustedHostMiddleware answers in plain text."""

    def __init__(self, app, allowed: tuple[str, ...]):
        self.app, self.allowed = app, {host.lower() for host in allowed}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and "*" not in self.allowed:
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1").lower()
            name = host[1:].partition("]")[0] if host.startswith("[") else host.rpartition(":")[0] or host
            if name not in self.allowed:
                error = APIError(400, f"the Host header {shown(host)} is not one this server answers to", param="host",
                                 code="invalid_host")
                await JSONResponse(error.body(), status_code=400)(scope, receive, send)
                return
        await self.app(scope, receive, send)


# a route's path -> its endpoint on /metrics (the first prefix that matches); the monitors' own routes go uncounted
ENDPOINTS = (("/v1/completions", "completions"), ("/v1/chat/completions", "chat_completions"),
             ("/v1/responses", "responses"), ("/v1/messages/count_tokens", "count_tokens"),
             ("/v1/messages", "messages"), ("/v1/conversations", "conversations"), ("/v1/files", "files"),
             ("/v1/batches", "batches"), ("/v1/models", "models"), ("/tokenize", "tokenize"),
             ("/detokenize", "detokenize"), ("/openapi.json", "docs"), ("/docs", "docs"), ("/redoc", "docs"))
UNCOUNTED = ("/health", "/metrics")


class _Counting:
    """ASGI middleware: every answer counted on /metrics by endpoint and status, whatever answered it (a route, the
    router's 404 or 405, a dependency's 401, an error handler; an exception that escapes is the 500 it becomes).
    Routes counting their own answers missed the GET and DELETE routes and every request no route took."""

    def __init__(self, app, count: Callable[[str, str], None]):
        self.app, self.count = app, count

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in UNCOUNTED:
            await self.app(scope, receive, send)
            return
        status: list[int] = []

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            self.count(_endpoint(scope), "500")
            raise
        if status:
            self.count(_endpoint(scope), str(status[0]))


def _endpoint(scope) -> str:
    """The endpoint a request's answer is counted under: its route's (the router put it in the scope), else
    "unrouted" (a path or method no route takes)."""
    path = getattr(scope.get("route"), "path", None)
    if path is None:
        return "unrouted"
    return next((name for prefix, name in ENDPOINTS if path == prefix or path.startswith(prefix + "/")), "other")
