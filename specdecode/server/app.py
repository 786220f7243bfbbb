"""The FastAPI app: OpenAI-compatible routes over one Scheduler (which owns the Engine in its own thread).

Handlers only parse, validate, tokenise and wait for events; all model work happens in the scheduler thread.
Defaults follow OpenAI where it defines them (temperature 1, top_p 1, n 1); max_tokens defaults to the
server's --default-max-tokens, clipped to the context left after the prompt.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdecode.config import GenerationConfig, SamplingConfig, SpecConfig, Structure
from specdecode.core.drafting import Drafter
from specdecode.core.engine import Engine
from specdecode.core.infill import FimFormat, fim_format, infill_prompt
from specdecode.core.penalties import check_bias
from specdecode.core.target import Target
from specdecode.drafters import suffix_of
from specdecode.drafters.none import NoDrafter
from specdecode.errors import ConfigError
from specdecode.server import schemas as s
from specdecode.server.as_chat import AsChat
from specdecode.server.batch_routes import add_batch_routes
from specdecode.server.batches import BatchCreate, Batches
from specdecode.server.bodies import read_body, require_json
from specdecode.server.conversation_routes import KEEPING, add_conversation_routes, not_held, too_large
from specdecode.server.conversation_routes import SCHEMAS as CONVERSATION_BODIES
from specdecode.server.conversation_store import CONVERSATION_BYTES, ConversationStore
from specdecode.server.conversation_store import TooLarge as ConversationTooLarge
from specdecode.server.errors import APIError, bad_request, from_validation, shown
from specdecode.server.file_store import FILES_BYTES, FileStore
from specdecode.server.messages import (
    BLOCKS,
    CountTokensRequest,
    MessagesRequest,
    MessageWriter,
    OutputConfig,
    messages_error,
)
from specdecode.server.metrics import ServerMetrics
from specdecode.server.pages import page, page_query
from specdecode.server.playground import add_playground
from specdecode.server.policy import SpecPolicy
from specdecode.server.replies import Choice, Reply, sse, whole
from specdecode.server.response_store import RESPONSES_BYTES, RESPONSES_KEPT, ResponseStore
from specdecode.server.responses import INPUT_ITEMS, ResponsesRequest, ResponseWriter, TextConfig, responses_error
from specdecode.server.router import RoutingDrafter
from specdecode.server.scheduler import (
    NO_SPECULATION,
    Failed,
    Job,
    QueueFull,
    Scheduler,
    SchedulerConfig,
    Ticket,
    TooLarge,
)
from specdecode.server.tools import ToolError, ToolFormat, ToolUse, template_messages, tool_format, tool_use

log = logging.getLogger(__name__)
_Body = TypeVar("_Body", bound=s.ModelRequest)
RETRY_AFTER_S = 1  # a full queue drains in about one request's time: clients should come back soon, not at once
# headers an error of this status carries (RFC 6750 asks a 401 for a bearer token to name the scheme)
_ERROR_HEADERS = {401: {"WWW-Authenticate": "Bearer"}, 429: {"Retry-After": str(RETRY_AFTER_S)}}


@dataclass(frozen=True)
class ServerConfig:
    model_name: str
    max_batch: int = 8
    max_queue: int = 64
    default_max_tokens: int = 256
    max_body_bytes: int = 8 << 20  # a larger request body is a 413 before it is read whole
    body_timeout_s: float = 30.0  # a body that has not arrived whole by then is a 408 (a slow sender holds no task)
    # when set, /v1/* and the API's description (/openapi.json, /docs, /redoc) need `Authorization: Bearer
    # <api_key>`; /health and /metrics stay open
    api_key: str | None = None
    # KV memory requests may reserve: a request that does not fit now waits in the queue, one that never can is a 413
    kv_cache_bytes: int | None = None
    prefill_chunk: int = 256  # most prompt tokens prefilled per step (scheduler.py: chunked prefill)
    stall_s: float = 30.0  # /health answers 503 when a scheduler round has run longer than this
    # the Host header names one of these (port aside), else 400: a server on loopback refuses pages that reach it
    # through DNS rebinding (a name of theirs resolving to 127.0.0.1); None: any host
    allowed_hosts: tuple[str, ...] | None = None
    # Responses API responses kept for `previous_response_id` and GET /v1/responses/{id} (0: none kept; see
    # response_store.py)
    responses_kept: int = RESPONSES_KEPT
    # bytes of files the Files API holds (uploads, and the batches' output); 0: no Files or Batches API
    files_bytes: int = FILES_BYTES
    # bytes of conversation items and metadata kept, as JSON (conversation_store.py); 0 (or responses_kept 0): none
    conversation_bytes: int = CONVERSATION_BYTES
    # bytes of kept responses, as JSON (response_store.py); 0: none kept
    responses_bytes: int = RESPONSES_BYTES


@dataclass
class Service:
    """What the handlers share: read-only model facts, the scheduler, and the tokenizer (behind a lock, since
    the scheduler thread detokenises with it)."""

    config: ServerConfig
    target: Target
    scheduler: Scheduler
    metrics: ServerMetrics
    tokenizer_lock: threading.Lock
    created: int
    tool_format: ToolFormat | None  # how the chat template's model calls tools; None: it serves no tools
    added_tokens: frozenset[str]  # the tokenizer's added tokens (a tool-call marker may be one)
    fim: FimFormat | None  # the tokenizer's fill-in-the-middle markers; None: completions' suffix is a 400
    responses: ResponseStore | None = None  # kept Responses API responses; None: none are kept
    files: FileStore | None = None  # the Files API's files; None: no Files or Batches API
    batches: Batches | None = None  # the Batches API's batches (with files)
    conversations: ConversationStore | None = None  # the Conversations API's (kept as responses are)

    @property
    def drafters(self) -> list[str]:
        return list(self.scheduler.router.drafters)


def build_service(target: Target, drafters: Mapping[str, Drafter], default_drafter: str, config: ServerConfig,
                  spec: SpecConfig | None = None, policy: SpecPolicy | None = None) -> Service:
    if target.tokenizer is None:
        raise ConfigError("the server needs a model with a tokenizer")
    router = RoutingDrafter({NO_SPECULATION: NoDrafter(), **drafters}, default_drafter)
    # the scheduler's per-step policy owns K here (it also switches speculation off when it does not pay)
    spec = dataclasses.replace(spec or SpecConfig(), pause_below=0.0, pause_on_time=False)
    engine = Engine(target, router, spec, max_batch=config.max_batch)
    metrics = ServerMetrics()
    if target.device.type == "cpu":
        metrics.watch_row_cost(target.row_costs.peek)
    stores = {name: suffix_of(drafter) for name, drafter in drafters.items()}  # their size and hits on /metrics
    metrics.watch_stores({name: store.stats for name, store in stores.items() if store is not None})
    scheduling = SchedulerConfig(config.max_batch, config.max_queue, kv_cache_bytes=config.kv_cache_bytes,
                                 prefill_chunk=config.prefill_chunk, stall_s=config.stall_s)
    scheduler = Scheduler(engine, router, scheduling, metrics, policy)
    added = getattr(target.tokenizer, "get_added_vocab", dict)()
    kept = (ResponseStore(config.responses_kept, config.responses_bytes)
            if config.responses_kept > 0 and config.responses_bytes > 0 else None)
    conversations = (ConversationStore(config.responses_kept, config.conversation_bytes)
                     if config.responses_kept > 0 and config.conversation_bytes > 0 else None)
    files = FileStore(config.files_bytes) if config.files_bytes > 0 else None
    # a batch keeps at most half of the rows busy, so interactive requests keep the other half
    batches = None if files is None else Batches(files, max(1, config.max_batch // 2), config.api_key,
                                                  _own_host(config.allowed_hosts))
    return Service(config, target, scheduler, metrics, engine.tokenizer_lock, int(time.time()),
                   tool_format(target.tokenizer), frozenset(added), fim_format(target.tokenizer), kept, files, batches,
                   conversations)


def _own_host(allowed: tuple[str, ...] | None) -> str:
    """A Host header the app answers (_HostCheck), for the requests it sends itself (a batch's)."""
    if allowed is None or "*" in allowed or "127.0.0.1" in allowed:
        return "127.0.0.1"
    name = allowed[0]
    return f"[{name}]" if ":" in name else name


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

    @app.post("/v1/completions", dependencies=v1, openapi_extra=_json_body(s.CompletionRequest))
    async def completions(request: Request) -> Response:
        return await _counted(service, "completions", _handle(service, request, chat=False))

    @app.post("/v1/chat/completions", dependencies=v1, openapi_extra=_json_body(s.ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        return await _counted(service, "chat_completions", _handle(service, request, chat=True))

    @app.post("/v1/responses", dependencies=v1, openapi_extra=_json_body(ResponsesRequest))
    async def responses(request: Request) -> Response:
        return await _counted(service, "responses", _respond(service, request))

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

    @app.post("/v1/messages", dependencies=v1, openapi_extra=_json_body(MessagesRequest))
    async def messages(request: Request) -> Response:
        return await _counted(service, "messages", _message(service, request))

    @app.post("/v1/messages/count_tokens", dependencies=v1, openapi_extra=_json_body(CountTokensRequest))
    async def count_tokens(request: Request) -> Response:
        return await _counted(service, "count_tokens", _count_tokens(service, request))

    @app.post("/tokenize", dependencies=v1, openapi_extra=_json_body(s.TokenizeRequest))
    async def tokenize(request: Request) -> Response:
        return await _counted(service, "tokenize", _tokenize(service, request))

    @app.post("/detokenize", dependencies=v1, openapi_extra=_json_body(s.DetokenizeRequest))
    async def detokenize(request: Request) -> Response:
        return await _counted(service, "detokenize", _detokenize(service, request))

    @app.get("/openapi.json", dependencies=v1, include_in_schema=False)
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", dependencies=v1, include_in_schema=False)
    async def docs() -> Response:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="specdecode")

    @app.get("/redoc", dependencies=v1, include_in_schema=False)
    async def redoc() -> Response:
        return get_redoc_html(openapi_url="/openapi.json", title="specdecode")

    add_batch_routes(app, service.files, service.batches, v1, service.config.body_timeout_s,
                     lambda endpoint, work: _counted(service, endpoint, work))
    add_conversation_routes(app, service.conversations, v1, service.config.max_body_bytes,
                            service.config.body_timeout_s, lambda endpoint, work: _counted(service, endpoint, work))
    add_playground(app)  # GET /: the page is public; its API calls carry the key the user types
    app.openapi = lambda: _openapi(app, service)  # type: ignore[method-assign]
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


def _json_body(model: type[BaseModel]) -> dict:
    """The route's request body in OpenAPI terms: the handlers read raw JSON (so that bad input gets this API's own
    400 messages), so FastAPI cannot see the model; `_openapi` adds the models to the components."""
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


# the error statuses each route answers (its 200 is FastAPI's), each with this API's error body
_ERRORS = {"post": {400: "invalid request", 401: "missing or wrong API key", 404: "unknown model",
                    408: "the body did not arrive in time", 413: "body or prompt too large for the server",
                    415: "not application/json", 429: "too many requests waiting (Retry-After)",
                    500: "internal error"},
           "get": {401: "missing or wrong API key", 404: "unknown model, or no response kept with this id"},
           "delete": {401: "missing or wrong API key", 404: "no response kept with this id"}}
# the Files and Batches routes' own: (method, path) -> statuses added (a description) or dropped (None)
_ROUTE_ERRORS: dict[tuple[str, str], dict[int, str | None]] = {
    ("post", "/v1/files"): {403: "an upload from another origin", 404: None, 413: "file larger than the store's room",
                            415: "not multipart/form-data", 429: None},
    ("post", "/v1/batches"): {404: "no such input file", 429: "as many batches running as the server keeps"},
    ("post", "/v1/batches/{batch_id}/cancel"): {404: "no such batch", 408: None, 409: "the batch has ended",
                                                413: None, 415: None, 429: None},
    ("get", "/v1/responses/{response_id}/input_items"): {400: "invalid query"},
    ("post", "/v1/conversations"): {404: None, 429: None},
    ("post", "/v1/conversations/{conversation_id}"): {404: "no such conversation", 429: None},
    ("post", "/v1/conversations/{conversation_id}/items"): {404: "no such conversation", 429: None},
    ("get", "/v1/conversations/{conversation_id}"): {404: "no such conversation"},
    ("get", "/v1/conversations/{conversation_id}/items"): {400: "invalid query", 404: "no such conversation"},
    ("get", "/v1/conversations/{conversation_id}/items/{item_id}"): {404: "no such conversation or item"},
    ("delete", "/v1/conversations/{conversation_id}"): {404: "no such conversation"},
    ("delete", "/v1/conversations/{conversation_id}/items/{item_id}"): {404: "no such conversation or item"},
    ("get", "/v1/files"): {400: "invalid query, or the server keeps no files"},
    ("get", "/v1/batches"): {400: "invalid query, or the server keeps no batches"},
    ("get", "/v1/files/{file_id}"): {404: "no such file"},
    ("get", "/v1/files/{file_id}/content"): {404: "no such file"},
    ("get", "/v1/batches/{batch_id}"): {404: "no such batch"},
    ("delete", "/v1/files/{file_id}"): {404: "no such file"},
}


def _openapi(app: FastAPI, service: Service) -> dict:
    """FastAPI's schema plus the request models (see _request_schemas) and the error answers of each route: FastAPI
    lists only a 200, and a 422 for a path parameter that this API answers with a 404."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        schemas.update(_request_schemas(service))
        schemas.update(models_json_schema([(body, "validation") for body in (BatchCreate, *CONVERSATION_BODIES)],
                                          ref_template="#/components/schemas/{model}")[1]["$defs"])
        schemas.update(models_json_schema([(s.ErrorBody, "serialization")],
                                          ref_template="#/components/schemas/{model}")[1]["$defs"])
        error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
        for path, operations in schema.get("paths", {}).items():
            for method, operation in operations.items():
                responses = operation.setdefault("responses", {})
                responses.pop("422", None)
                statuses = dict(_ERRORS.get(method, {}))
                if method == "get" and "{" not in path:
                    statuses.pop(404)
                if path in ("/tokenize", "/detokenize", "/v1/messages/count_tokens"):  # no queue
                    statuses.pop(429)
                for status, what in _ROUTE_ERRORS.get((method, path), {}).items():
                    if what is None:
                        statuses.pop(status, None)
                    else:
                        statuses[status] = what
                if service.config.api_key is None:
                    statuses.pop(401)
                for status, what in statuses.items():
                    responses.setdefault(str(status), {"description": what, **error})
        app.openapi_schema = schema
    return app.openapi_schema


def _request_schemas(service: Service) -> dict[str, dict]:
    """The request models' JSON schemas, narrowed to what this server accepts (anything else is a 4xx): its model
    name and drafters, max_tokens within the context, at most 4 stop strings, unimplemented fields only at their
    neutral values. Schema-driven clients and fuzzers then know which requests decode."""
    bodies = (s.CompletionRequest, s.ChatCompletionRequest, s.TokenizeRequest, s.DetokenizeRequest, ResponsesRequest,
              MessagesRequest, CountTokensRequest)
    _, defs = models_json_schema([(body, "validation") for body in (*bodies, *INPUT_ITEMS, *BLOCKS)],
                                 ref_template="#/components/schemas/{model}")
    schemas = defs["$defs"]
    blocks = {"anyOf": [{"$ref": f"#/components/schemas/{block.__name__}"} for block in BLOCKS]}
    schemas["Message"]["properties"]["content"] = {  # read block by block (Message.blocks)
        "anyOf": [{"type": "string"}, {"type": "array", "items": blocks}]}
    items = {"anyOf": [{"$ref": f"#/components/schemas/{item.__name__}"} for item in INPUT_ITEMS]}
    schemas["ResponsesRequest"]["properties"]["input"] = {  # read item by item (ResponsesRequest.items)
        "anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "items": items, "minItems": 1}]}
    for model in (s.CompletionRequest, s.ChatCompletionRequest, s.ChatMessage, ResponsesRequest, TextConfig,
                  MessagesRequest, OutputConfig):
        properties = schemas[model.__name__]["properties"]
        for name, values in model.accepted_values().items():
            properties[name] = {"enum": [None, *values]}
    tokens = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": service.target.max_positions - 1},
                        {"type": "null"}]}
    for model in bodies:
        schemas[model.__name__]["properties"]["model"] = {"type": "string", "enum": [service.config.model_name]}
    for model in (s.CompletionRequest, s.ChatCompletionRequest):
        properties = schemas[model.__name__]["properties"]
        properties["stop"] = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"},
                                                              "maxItems": 4}, {"type": "null"}]}
        for name in ("max_tokens", "max_completion_tokens"):
            if name in properties:
                properties[name] = tokens
    scoring = {"anyOf": [{"type": "integer", "minimum": 0, "maximum": service.target.max_positions - 1},
                         {"type": "null"}], "description": "0: with echo only, the prompt scored and nothing generated"}
    schemas["CompletionRequest"]["properties"]["max_tokens"] = scoring
    schemas["SpeculationOptions"]["properties"]["drafter"] = {"enum": [None, *service.drafters]}
    schemas["CompletionRequest"]["properties"]["prompt"] = _prompt_schema(service.target.vocab_size,
                                                                    service.config.max_queue)
    if service.fim is None:  # a tokenizer without fill-in-the-middle markers: a suffix is a 400
        schemas["CompletionRequest"]["properties"]["suffix"] = {"enum": [None, ""]}
    if service.tool_format is None:  # a template that shows no calling format: tools are a 400
        schemas["ChatCompletionRequest"]["properties"]["tool_choice"] = {"enum": [None, "none", "auto"]}
        schemas["ResponsesRequest"]["properties"]["tool_choice"] = {"enum": [None, "none", "auto"]}
        schemas["ToolChoice"]["properties"]["type"] = {"enum": ["auto", "none"]}
        for name, field in (("ChatCompletionRequest", "tools"), ("TokenizeRequest", "tools"),
                            ("ChatMessage", "tool_calls"), ("ResponsesRequest", "tools"), ("MessagesRequest", "tools"),
                            ("CountTokensRequest", "tools")):
            schemas[name]["properties"][field] = {"enum": [None, []]}
    schemas["DetokenizeRequest"]["properties"]["tokens"] = {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": service.target.vocab_size - 1}}
    message = schemas["ChatMessage"]  # content may be null or left out only in an assistant message: not told here
    message["required"] = [*message.get("required", []), "content"]
    content = message["properties"]["content"]
    content["anyOf"] = [option for option in content["anyOf"] if option != {"type": "null"}]
    return schemas


def _prompt_schema(vocab: int, most: int) -> dict:
    """A non-empty text or list of token ids, alone or as a batch of up to `most` of them."""
    text = {"type": "string", "minLength": 1}
    ids = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": vocab - 1}}
    return {"anyOf": [text, {"type": "array", "items": text, "minItems": 1, "maxItems": most}, ids,
                      {"type": "array", "items": ids, "minItems": 1, "maxItems": most}]}


async def _counted(service: Service, endpoint: str, work) -> Response:
    """Count the request's answer by status, whatever it is (an unexpected error becomes a 500)."""
    try:
        response = await work
    except APIError as error:
        service.metrics.requests.labels(endpoint, str(error.status)).inc()
        raise
    except Exception:
        service.metrics.requests.labels(endpoint, "500").inc()
        raise
    service.metrics.requests.labels(endpoint, str(response.status_code)).inc()
    return response


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
    shape = await asyncio.to_thread(_output_shape, service, req)  # compiling a grammar must not stall the streams
    prompts = await asyncio.to_thread(_encode, service, req, shape.tools)  # a long prompt must not stall the streams
    n = req.n or 1
    if len(prompts) * n > service.config.max_queue:
        raise bad_request(f"the request asks for {len(prompts) * n} choices ({len(prompts)} prompts x n={n}); this "
                          f"server queues at most {service.config.max_queue} at once", "n" if n > 1 else "prompt",
                          "invalid_value")
    jobs = [_job(service, req, ids, shape) for ids in prompts]
    echoes = await asyncio.to_thread(_echoes, service, req, prompts)
    choices = _choices(jobs, echoes, n, asyncio.get_running_loop())
    _submit(service, [choice.ticket for choice in choices])
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    reply = Reply(service.config.model_name, chat, lambda token: _token_text(service, token),
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
    """OpenAI's Responses API, written as a Responses object (server/responses.py)."""
    req = await _body(service, request, ResponsesRequest)
    if req.previous_response_id is not None:
        req = req.after(_earlier_items(service, req.previous_response_id))
    elif req.conversation_id is not None:
        req = req.after(_conversation_items(service, req), "conversation")
    req = req.referenced(_kept_item(service) if service.responses is not None else None)
    ticket, shape, _ = await _as_chat(service, req, responses_error)
    writer = ResponseWriter(service.config.model_name, req, shape.tools.reading, service.responses,
                            lambda token: _token_text(service, token), service.conversations)
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
    """Anthropic's Messages API, written as an Anthropic message (server/messages.py)."""
    req = await _body(service, request, MessagesRequest)
    ticket, shape, prompt_tokens = await _as_chat(service, req, messages_error)
    writer = MessageWriter(service.config.model_name, req, shape.tools.reading, prompt_tokens)
    return await _answer(request, ticket, writer, bool(req.stream))


async def _as_chat(service: Service, req: AsChat,
                   named: Callable[[APIError], APIError]) -> tuple[Ticket, _OutputShape, int]:
    """Another API's request decoded as the chat request it amounts to, one choice, queued: its ticket, output shape
    and prompt tokens. A 400 names the field as that API's request does (`named`)."""
    try:
        chat = req.chat()
        shape = await asyncio.to_thread(_output_shape, service, chat)
        (ids,) = await asyncio.to_thread(_encode, service, chat, shape.tools)
        ticket = Ticket(_job(service, chat, ids, shape), asyncio.get_running_loop())
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
        shape = await asyncio.to_thread(_output_shape, service, chat)
        (ids,) = await asyncio.to_thread(_encode, service, chat, shape.tools)
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
            ids = _encode_prompt(service, req.prompt, bool(req.add_special_tokens))
    else:
        chat = req.chat()
        try:
            tools = tool_use(chat, service.tool_format, service.added_tokens)
        except ToolError as error:
            raise bad_request(str(error), error.param, "invalid_value") from None
        (ids,) = await asyncio.to_thread(_encode, service, chat, tools)
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
        choices += [Choice(Ticket(other, loop, first), echo, lead) for other in _nth(job, n)[1:]]
    return choices


def _nth(job: Job, n: int) -> list[Job]:
    """A prompt's n choices: choice j of a seeded request samples with seed + j (wrapping within the seed's
    range), so each is reproducible and they differ; unseeded choices each draw their own."""
    seed = job.sampling.seed
    if seed is None:
        return [job] * n
    return [dataclasses.replace(job, sampling=dataclasses.replace(job.sampling, seed=_wrapped(seed + j)))
            for j in range(n)]


def _wrapped(seed: int) -> int:
    return seed - (1 << 64) if seed >= 1 << 64 else seed


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


# -- validation and encoding ---------------------------------------------------------------------------------------
def _encode(service: Service, req: s.CompletionRequest | s.ChatCompletionRequest, tools: ToolUse) -> list[list[int]]:
    """The request's prompts as token ids (a chat request has one)."""
    with service.tokenizer_lock:
        if isinstance(req, s.ChatCompletionRequest):
            return [_encode_chat(service, req, tools)]
        if req.suffix:
            return [_encode_infill(service, prompt, req.suffix) for prompt in req.prompts()]
        return [_encode_prompt(service, prompt) for prompt in req.prompts()]  # type: ignore[union-attr]


def _encode_infill(service: Service, prompt: str | list[int], suffix: str) -> list[int]:
    """A fill-in-the-middle prompt: the middle between the prompt and the suffix (core/infill.py); an empty prompt
    is a middle at the start of the text."""
    if isinstance(prompt, list):
        _check_ids(service, prompt)
    try:
        return infill_prompt(service.target.tokenizer, service.fim, prompt, suffix)
    except ConfigError as error:
        raise bad_request(str(error), "suffix", "unsupported") from None


def _encode_prompt(service: Service, prompt: str | list[int], special: bool = True) -> list[int]:
    """A completion prompt's token ids (special: the tokenizer adds its special tokens to a text, as completions
    do; /tokenize may ask it not to)."""
    if not prompt:
        raise bad_request("the prompt is empty", "prompt", "invalid_value")
    if isinstance(prompt, list):
        _check_ids(service, prompt)
        return list(prompt)
    return [int(i) for i in service.target.tokenizer(prompt, add_special_tokens=special)["input_ids"]]


def _check_ids(service: Service, ids: list[int]) -> None:
    vocab = service.target.vocab_size
    if any(not 0 <= t < vocab for t in ids):
        raise bad_request(f"prompt token ids must be in [0, {vocab})", "prompt", "invalid_value")


def _echoes(service: Service, req: s.CompletionRequest | s.ChatCompletionRequest,
            prompts: list[list[int]]) -> list[str]:
    """What leads each prompt's choices: its text under completions' `echo` (token ids are decoded), else ""."""
    if not getattr(req, "echo", False):
        return [""] * len(prompts)
    with service.tokenizer_lock:
        return [prompt if isinstance(prompt, str) else service.target.tokenizer.decode(ids)
                for prompt, ids in zip(req.prompts(), prompts)]  # type: ignore[union-attr]


def _encode_chat(service: Service, req: s.ChatCompletionRequest, tools: ToolUse) -> list[int]:
    tokenizer = service.target.tokenizer
    if not getattr(tokenizer, "chat_template", None):
        raise bad_request("this model has no chat template; use /v1/completions", "messages", "no_chat_template")
    for i, m in enumerate(req.messages):
        if m.content is None and m.role != "assistant":
            raise bad_request(f"a {m.role} message needs content", f"messages.{i}.content", "invalid_value")
    # OpenAI's "developer" role is its newer name for "system"; a template that does not know it gets "system"
    developer = "developer" if "developer" in str(tokenizer.chat_template) else "system"
    try:
        messages = template_messages(req.messages, developer)
    except ToolError as error:
        raise bad_request(str(error), error.param, "invalid_value") from None
    own = sorted(set(req.chat_template_kwargs or {}) & s.ChatCompletionRequest.TEMPLATE_OWN)
    if own:
        raise bad_request(f"chat_template_kwargs may not set {own[0]!r}: the request's own fields do",
                          f"chat_template_kwargs.{own[0]}", "invalid_value")
    if req.continue_final_message:
        if req.add_generation_prompt and "add_generation_prompt" in req.model_fields_set:
            raise bad_request("continue_final_message and add_generation_prompt cannot both be true",
                              "continue_final_message", "invalid_value")
        if req.messages[-1].role != "assistant" or not req.messages[-1].text():
            raise bad_request("continue_final_message continues the last message: it must be an assistant's, with "
                              "content", "continue_final_message", "invalid_value")
    try:
        encoded = tokenizer.apply_chat_template(
            messages, tools=tools.tools, tokenize=True, continue_final_message=bool(req.continue_final_message),
            add_generation_prompt=bool(req.add_generation_prompt) and not req.continue_final_message,
            **(req.chat_template_kwargs or {}))
    except Exception as error:  # noqa: BLE001 - a template may reject a conversation (e.g. role order)
        raise bad_request(f"the chat template rejected the messages: {error}", "messages", "invalid_value") from None
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    return [int(i) for i in ids]


@dataclass(frozen=True)
class _OutputShape:
    """What a request asks of its output beyond text: a structure, logprobs (top-N), and its use of tools."""

    structure: Structure | None
    logprobs: int | None
    tools: ToolUse = ToolUse()


def _output_shape(service: Service, req: s.CompletionRequest | s.ChatCompletionRequest) -> _OutputShape:
    """The request's structure, compiled once here so that a bad schema, regex or grammar is a 400 naming it."""
    try:
        asked = req.structure()
        logprobs = req.top_logprobs_wanted()
        tools = (tool_use(req, service.tool_format, service.added_tokens)
                 if isinstance(req, s.ChatCompletionRequest) else ToolUse())
    except s.StructureError as error:
        raise bad_request(str(error), error.param, "invalid_structure") from None
    except ToolError as error:
        raise bad_request(str(error), error.param, "invalid_value") from None
    except ValueError as error:
        raise bad_request(str(error), "top_logprobs", "invalid_value") from None
    if asked is not None and tools.structure is not None:
        raise bad_request(f"{asked[0]} and tool_choice both shape the reply; send one of them", "tool_choice",
                          "invalid_value")
    if tools.structure is not None:
        asked = ("tools", tools.structure)
    if asked is None:
        return _OutputShape(None, logprobs, tools)
    param, structure = asked
    try:
        service.scheduler.engine.grammars.check(structure)
    except ValueError as error:  # ConfigError, or a grammar front end's own error: the request's text is at fault
        if param == "tools":
            raise _bad_tool(service, req) or bad_request(str(error), param, "invalid_structure") from None
        raise bad_request(str(error), param, "invalid_structure") from None
    return _OutputShape(structure, logprobs, tools)


def _bad_tool(service: Service, req: s.ChatCompletionRequest) -> APIError | None:
    """The 400 naming the first tool whose arguments' schema does not compile alone, if one does not."""
    for i, tool in enumerate(req.tools or []):
        try:
            service.scheduler.engine.grammars.check(Structure.json_schema(tool.function.parameters or {}))
        except ValueError as error:
            return bad_request(str(error), f"tools.{i}.function.parameters", "invalid_structure")
    return None


def _token_text(service: Service, token: int) -> str:
    with service.tokenizer_lock:
        return service.target.tokenizer.decode([token])


def _job(service: Service, req: s.CompletionRequest | s.ChatCompletionRequest, prompt_ids: list[int],
         shape: _OutputShape) -> Job:
    if not prompt_ids:
        raise bad_request("the prompt is empty", "prompt" if isinstance(req, s.CompletionRequest) else "messages")
    context = service.target.max_positions
    room = context - len(prompt_ids)
    param, max_tokens = "max_tokens", req.max_tokens
    if isinstance(req, s.ChatCompletionRequest) and req.max_completion_tokens is not None:
        if max_tokens is not None and max_tokens != req.max_completion_tokens:
            raise bad_request(f"max_tokens ({max_tokens}) and max_completion_tokens ({req.max_completion_tokens}) "
                              "disagree; send one of them", "max_completion_tokens", "invalid_value")
        param, max_tokens = "max_completion_tokens", req.max_completion_tokens
    echo = isinstance(req, s.CompletionRequest) and bool(req.echo)
    prompt_only = echo and max_tokens == 0  # the prompt scored, nothing generated (an evaluation's loglikelihood)
    if max_tokens is not None and max_tokens <= 0 and not prompt_only:
        raise bad_request(f"{param} must be a positive integer (0 only with echo), got {max_tokens}", param,
                          "invalid_value")
    if room < 1:
        raise bad_request(f"the prompt ({len(prompt_ids)} tokens) leaves no room in the model's context of {context} "
                          "tokens", "messages" if isinstance(req, s.ChatCompletionRequest) else "prompt",
                          "context_length_exceeded")
    if max_tokens is not None and max_tokens > room:
        raise bad_request(f"the prompt ({len(prompt_ids)} tokens) plus {param} ({max_tokens}) exceeds the model's "
                          f"context of {context} tokens", param, "context_length_exceeded")
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stop) > 4:
        raise bad_request("at most 4 stop sequences are allowed", "stop", "invalid_value")
    stops, kept = tuple(x for x in stop if x), bool(req.include_stop_str_in_output)
    vocab = service.target.vocab_size
    if any(not 0 <= token < vocab for token in req.stop_token_ids or ()):
        raise bad_request(f"stop_token_ids must be token ids in [0, {vocab})", "stop_token_ids", "invalid_value")
    least = req.min_tokens or 0
    if least and shape.structure is not None:  # a grammar may allow only the end before min_tokens
        raise bad_request("min_tokens cannot be combined with a structure or a forced tool call", "min_tokens",
                          "invalid_value")
    most = 1 if prompt_only else max_tokens or min(service.config.default_max_tokens, room)
    if least > most:
        raise bad_request(f"min_tokens ({least}) is more than the tokens the request may generate ({most})",
                          "min_tokens", "invalid_value")
    spec = req.speculation or s.SpeculationOptions()
    drafter = spec.drafter or service.scheduler.router.default
    if drafter not in service.drafters:
        raise bad_request(f"drafter {shown(drafter)} is not served here; choose one of: {', '.join(service.drafters)}",
                          "speculation.drafter", "invalid_value")
    if spec.k == 0:
        drafter = NO_SPECULATION
    try:
        bias = req.bias_pairs()
        check_bias(SamplingConfig(logit_bias=bias), service.scheduler.engine.target.vocab_size)
    except ConfigError as error:
        raise bad_request(str(error), "logit_bias", "invalid_value") from None
    try:
        sampling = SamplingConfig(temperature=1.0 if req.temperature is None else req.temperature,
                                  top_k=req.top_k or 0, top_p=1.0 if req.top_p is None else req.top_p, seed=req.seed,
                                  min_p=req.min_p or 0.0, presence_penalty=req.presence_penalty or 0.0,
                                  frequency_penalty=req.frequency_penalty or 0.0,
                                  repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
                                  logit_bias=bias)
        generation = GenerationConfig(max_new_tokens=most, min_new_tokens=least,
                                      stop_on_eos=not req.ignore_eos, stop_strings=() if kept else stops,
                                      stop_after=shape.tools.stop_after + (stops if kept else ()),
                                      stop_token_ids=tuple(req.stop_token_ids or ()) + _middle_ends(service, req),
                                      structure=shape.structure, logprobs=shape.logprobs, cache_salt=req.cache_salt,
                                      prompt_logprobs=shape.logprobs if echo else None)
    except ConfigError as error:
        raise bad_request(str(error)) from None
    return Job(tuple(prompt_ids), sampling, generation, drafter, spec.k, prompt_only=prompt_only)


def _middle_ends(service: Service, req: s.CompletionRequest | s.ChatCompletionRequest) -> tuple[int, ...]:
    """A filled middle also ends at its format's own end tokens (its pad and file tokens: the model is done)."""
    if isinstance(req, s.CompletionRequest) and req.suffix and service.fim is not None:
        return tuple(sorted(service.fim.ends))
    return ()


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
