"""What the other APIs this server speaks share: a request (OpenAI's Responses, Anthropic's Messages) that amounts to
a chat request of one choice, with the chat endpoint's extensions, read part by part with errors that name the
part's place in the request."""
from __future__ import annotations

from typing import Any, TypeVar

from pydantic import Field, ValidationError

from specdecode.server.protocol import schemas as s
from specdecode.server.protocol.errors import APIError, from_validation

_Part = TypeVar("_Part", bound=s.RequestBody)


class AsChat(s.ModelRequest):
    """A request of another API, decoded as the chat request `chat()` writes (one choice, not streamed: its own
    writer streams it). Its extensions are the chat endpoint's."""

    speculation: s.SpeculationOptions | None = None
    seed: int | None = Field(default=None, ge=-(1 << 63), lt=1 << 64)
    top_k: int | None = Field(default=None, ge=0)

    def unsupported(self) -> list[tuple[str, str]]:
        problems = super().unsupported()
        if self.speculation is not None and self.speculation.trace:
            problems.append(("speculation.trace", "speculation.trace rides on chat and completion chunks; it is not "
                                                  "supported here"))
        return problems

    def chat(self) -> s.ChatCompletionRequest:
        raise NotImplementedError


def read_part(model: type[_Part], raw: dict[str, Any], where: str) -> _Part:
    """One part of the request (an input item, a content block) as `model`; a 400 names its place (`where`)."""
    try:
        return model.model_validate(raw)
    except ValidationError as error:
        inner = from_validation(error)
        param = ".".join(filter(None, (where, inner.param)))
        message = inner.message.replace(repr(inner.param), repr(param)) if inner.param else inner.message
        raise APIError(400, message, param=param, code=inner.code) from None


def usage_extensions(counted: s.Usage) -> dict:
    """The chat endpoint's usage extensions (tau, target passes, acceptance rate, drafter, forced tokens)."""
    return counted.model_dump(exclude={"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"})
