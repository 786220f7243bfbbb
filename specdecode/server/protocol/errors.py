"""OpenAI-style errors: {"error": {"message", "type", "param", "code"}} with the matching HTTP status."""
from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from specdecode.server.protocol.schemas import ErrorBody, ErrorDetail


@dataclass
class APIError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None

    def body(self) -> dict:
        return ErrorBody(error=ErrorDetail(message=self.message, type=self.type, param=self.param,
                                           code=self.code)).model_dump()


def shown(value: object, limit: int = 64) -> str:
    """A client's value quoted in an error message, cut to `limit` characters (a 5,000-character name is not
    echoed whole)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def empty_content(param: str, parts: str) -> APIError:
    """A message's content array of no parts (`parts`: what the API calls them): OpenAI refuses it, where it was
    read as an empty text. A content of "" stays an empty text."""
    return APIError(400, f"{param} is an empty array: a message's content needs at least one {parts} (or a string)",
                    param=param, code="invalid_value")


def from_validation(error: ValidationError) -> APIError:
    """The first pydantic error as one readable line; malformed JSON is its own case."""
    first = error.errors(include_url=False)[0]
    if first["type"] == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}",
                        code="invalid_json")
    location = [str(part) for part in first["loc"] if not _is_union_tag(part)]
    param = ".".join(location) or None
    if first["type"] == "missing":
        return APIError(400, f"missing required field {param!r}", param=param, code="missing_field")
    if first["type"] == "extra_forbidden":
        return APIError(400, f"unknown field {param!r}", param=param, code="unknown_field")
    if first["type"] == "model_type":
        if param is None:
            return APIError(400, "the request body must be a JSON object", code="invalid_type")
        return APIError(400, f"invalid value for {param!r}: expected a JSON object", param=param, code="invalid_value")
    return APIError(400, f"invalid value for {param!r}: {first['msg']}", param=param, code="invalid_value")


def _is_union_tag(part) -> bool:
    """pydantic names union members in error locations ('str', 'list[int]'...): not part of the field path."""
    return isinstance(part, str) and (part in {"str", "int", "float", "bool"} or "[" in part or part.endswith("]"))
