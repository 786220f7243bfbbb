"""Request and response bodies of the OpenAI-compatible API (field names as in OpenAI's API reference).

Validation policy for request fields, in three kinds:
1. Fields we implement (model, prompt/messages, max_tokens, temperature, top_p, seed, stop, n, stream, ...)
   are validated strictly: a wrong type (`"max_tokens": "5"`, `"stream": "yes"`) or an out-of-range value is a
   400 `invalid_request_error` naming the field in `param`. Strict mode: no string-to-number coercion.
2. OpenAI fields we do not implement (logprobs, echo, best_of, penalties, logit_bias, suffix, tools, ...) are
   accepted only at their neutral value (null / false / 0 / 1 / empty); anything else is a 400 that says the
   field is unsupported, so a client never gets silently different behaviour.
3. Fields neither OpenAI nor we define are ignored: SDKs and proxies add fields freely, and such a field has no
   declared type to be wrong about.
Extensions: `speculation: {"drafter": NAME, "k": K}` chooses the drafter ("none" disables speculation) and sets
the request's draft length; `top_k` and `ignore_eos` (as in vLLM); and `usage.tau` (+ target passes, acceptance
rate, drafter) in responses.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class SpeculationOptions(_Request):
    """Extension: per-request drafter choice and draft length cap (k = 0 or drafter "none": no speculation)."""

    drafter: str | None = None
    k: int | None = Field(default=None, ge=0, le=64)


class StreamOptions(_Request):
    include_usage: bool | None = None


class _Sampling(_Request):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str
    max_tokens: int | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)  # extension (as in vLLM)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    speculation: SpeculationOptions | None = None  # extension
    ignore_eos: bool | None = False  # extension (as in vLLM): decode max_tokens tokens even past EOS
    # OpenAI fields accepted only at their neutral value (see unsupported()):
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    logprobs: Any = None

    def unsupported(self) -> list[tuple[str, str]]:
        """(param, message) for OpenAI features requested here that this server does not implement."""
        problems = []
        if self.n not in (None, 1):
            problems.append(("n", "only n=1 is supported"))
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                problems.append((name, f"{name} is not supported; omit it or send 0"))
        if self.logit_bias:
            problems.append(("logit_bias", "logit_bias is not supported"))
        if self.logprobs not in (None, False, 0):
            problems.append(("logprobs", "logprobs are not supported"))
        return problems


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int]
    echo: bool | None = False
    best_of: int | None = None
    suffix: str | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        problems = super().unsupported()
        if self.echo:
            problems.append(("echo", "echo is not supported"))
        if self.best_of not in (None, 1):
            problems.append(("best_of", "only best_of=1 is supported"))
        if self.suffix:
            problems.append(("suffix", "suffix is not supported"))
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str) and len(self.prompt) > 1:
            problems.append(("prompt", "only one prompt per request is supported"))
        return problems


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        problems = super().unsupported()
        if self.top_logprobs:
            problems.append(("top_logprobs", "logprobs are not supported"))
        if self.tools:
            problems.append(("tools", "tools are not supported"))
        if self.tool_choice not in (None, "none", "auto"):
            problems.append(("tool_choice", "tool_choice is not supported"))
        if self.response_format not in (None, {}, {"type": "text"}):
            problems.append(("response_format", "only response_format {\"type\": \"text\"} is supported"))
        return problems


# -- responses ----------------------------------------------------------------------------------------------------
class Usage(BaseModel):
    """OpenAI usage plus extensions: tau (tokens per target pass, counting the target's own token), the number of
    verification passes, draft acceptance rate and the drafter that served the request."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    tau: float
    target_passes: int
    acceptance_rate: float
    drafter: str


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "specdecode"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail
