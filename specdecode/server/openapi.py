"""The API's description (`/openapi.json`): FastAPI's schema, plus the request models narrowed to what this server
accepts and the error answers of each route, so that schema-driven clients and fuzzers know which requests
decode."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from specdecode.server.protocol import schemas as s
from specdecode.server.routes.conversations import SCHEMAS as CONVERSATION_BODIES
from specdecode.server.routes.messages import BLOCKS, CountTokensRequest, MessagesRequest, OutputConfig
from specdecode.server.routes.responses import INPUT_ITEMS, ResponsesRequest, TextConfig
from specdecode.server.service import Service
from specdecode.server.stores.batches import BatchCreate


def json_body(model: type[BaseModel]) -> dict:
    """The route's request body in OpenAPI terms: the handlers read raw JSON (so that bad input gets this API's own
    400 messages), so FastAPI cannot see the model; `openapi_document` adds the models to the components."""
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


def openapi_document(app: FastAPI, service: Service) -> dict:
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
    name and drafters, max_tokens within the context, at most 4 stop strings (none empty), content arrays of at least
    one part, unimplemented fields only at their neutral values. Schema-driven clients and fuzzers then know which
    requests decode."""
    bodies = (s.CompletionRequest, s.ChatCompletionRequest, s.TokenizeRequest, s.DetokenizeRequest, ResponsesRequest,
              MessagesRequest, CountTokensRequest)
    _, defs = models_json_schema([(body, "validation") for body in (*bodies, *INPUT_ITEMS, *BLOCKS)],
                                 ref_template="#/components/schemas/{model}")
    schemas = defs["$defs"]
    blocks = {"anyOf": [{"$ref": f"#/components/schemas/{block.__name__}"} for block in BLOCKS]}
    schemas["Message"]["properties"]["content"] = {  # read block by block (Message.blocks)
        "anyOf": [{"type": "string"}, {"type": "array", "items": blocks, "minItems": 1}]}
    items = {"anyOf": [{"$ref": f"#/components/schemas/{item.__name__}"} for item in INPUT_ITEMS]}
    schemas["ResponsesRequest"]["properties"]["input"] = {  # read item by item (ResponsesRequest.items)
        "anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "items": items, "minItems": 1}]}
    for model in (s.CompletionRequest, s.ChatCompletionRequest, s.ChatMessage, ResponsesRequest, TextConfig,
                  MessagesRequest, OutputConfig):
        properties = schemas[model.__name__]["properties"]
        for name, values in model.accepted_values().items():
            properties[name] = {"enum": [None, *values]}
    stop = {"type": "string", "minLength": 1}  # an empty stop string is a 400 (it would match everywhere)
    schemas["MessagesRequest"]["properties"]["stop_sequences"]["anyOf"][0]["items"] = stop
    tokens = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": service.target.max_positions - 1},
                        {"type": "null"}]}
    for model in bodies:
        schemas[model.__name__]["properties"]["model"] = {"type": "string", "enum": [service.config.model_name]}
    for model in (s.CompletionRequest, s.ChatCompletionRequest):
        properties = schemas[model.__name__]["properties"]
        properties["stop"] = {"anyOf": [stop, {"type": "array", "items": stop, "maxItems": 4}, {"type": "null"}]}
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
    for parts in (content, schemas["InputMessage"]["properties"]["content"]):  # an empty content array is a 400
        for option in parts["anyOf"]:
            if option.get("type") == "array":
                option["minItems"] = 1
    return schemas


def _prompt_schema(vocab: int, most: int) -> dict:
    """A non-empty text or list of token ids, alone or as a batch of up to `most` of them."""
    text = {"type": "string", "minLength": 1}
    ids = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": vocab - 1}}
    return {"anyOf": [text, {"type": "array", "items": text, "minItems": 1, "maxItems": most}, ids,
                      {"type": "array", "items": ids, "minItems": 1, "maxItems": most}]}
