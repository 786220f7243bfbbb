"""Request and response bodies of the OpenAI-compatible API (field names as in OpenAI's API reference).

Validation policy for request fields, in three kinds:
1. Fields we implement (model, prompt/messages, max_tokens, temperature, top_p, seed, stop, n, echo, stream, ...)
   are validated strictly: a wrong type (`"max_tokens": "5"`, `"stream": "yes"`) or an out-of-range value is a
   400 `invalid_request_error` naming the field in `param`. Strict mode: no string-to-number coercion.
2. OpenAI fields we do not implement (best_of, functions, audio, a message's name, ...) are accepted
   only at their neutral value (null / false / 0 / 1 / empty); anything else is a 400 that says the field is
   unsupported, so a client never gets silently different behaviour.
3. Other fields are ignored: SDKs and proxies add fields freely (and OpenAI's bookkeeping fields such as
   `metadata`, `store` or `service_tier` do not change the output), and such a field has no declared type to be
   wrong about.
Structured outputs: `response_format` ({"type": "json_object"} or {"type": "json_schema", "json_schema":
{"schema": ...}}) on both endpoints, and vLLM's `structured_outputs: {"json" | "regex" | "choice" | "grammar" |
"json_object": ...}` (its older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar` too); one per
request. Logprobs: completions' `logprobs: N` (with `echo`, the prompt's too; `max_tokens: 0` then scores it alone)
and chat's `logprobs: true` with `top_logprobs: N` (N <= 20).
Tools: chat's `tools`, `tool_choice`, `parallel_tool_calls`, an assistant message's `tool_calls` and a tool
message's `tool_call_id` (tools.py), where the model's chat template teaches a calling format.
Penalties: OpenAI's `presence_penalty`, `frequency_penalty` (-2..2) and `logit_bias` ({"token id": -100..100}),
and vLLM's `repetition_penalty` (0.01..10) and `min_p` (0..1); speculation stays lossless with them (penalties.py).
Extensions: `speculation: {"drafter": NAME, "k": K, "trace": true}` chooses the drafter ("none" disables
speculation), sets the request's draft length and, in a stream, traces each token's origin (SpeculationTrace);
`top_k`, `ignore_eos`, `include_stop_str_in_output`, `stop_token_ids`, `min_tokens` and `cache_salt` (as in vLLM:
kept prompt KV serves only requests with the same salt); and `usage.tau` (+ target passes, acceptance rate, drafter,
grammar-forced tokens) and OpenAI's `usage.prompt_tokens_details.cached_tokens` in responses.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from specdecode.config import MAX_TOP_LOGPROBS, REPETITION_PENALTY, Structure
from specdecode.errors import ConfigError

_TOKEN_ID = re.compile(r"[0-9]{1,10}")  # OpenAI's logit_bias keys: token ids as strings
TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"  # OpenAI's rule for function names
MAX_CHOICES = 128  # OpenAI's bound on n; a request's choices (prompts x n) are also bounded by the server's queue


def _bounded_metadata(metadata: dict[str, str]) -> dict[str, str]:
    if len(metadata) > 16 or any(len(key) > 64 or len(value) > 512 for key, value in metadata.items()):
        raise ValueError("metadata holds at most 16 pairs, keys of at most 64 characters and values of at most 512")
    return metadata


# OpenAI's metadata on the objects a client makes here (batches, conversations), with OpenAI's bounds
Metadata = Annotated[dict[str, str], AfterValidator(_bounded_metadata)]


class RequestBody(BaseModel):
    """A request body, or a part of one, checked strictly."""

    model_config = ConfigDict(extra="ignore", strict=True)

    # field -> the values that mean "not used", for fields this server does not implement (declared as `Any`)
    NEUTRAL: ClassVar[dict[str, tuple]] = {}
    # typed fields that unsupported() accepts only at these values (or null), told to OpenAPI readers
    ONLY: ClassVar[dict[str, tuple]] = {}

    @classmethod
    def accepted_values(cls) -> dict[str, tuple]:
        """field -> the only values accepted besides null (the request's other values are a 400)."""
        return {**cls.NEUTRAL, **cls.ONLY}

    def unsupported(self) -> list[tuple[str, str]]:
        """(param, message) for features requested here that this server does not implement, in this body and in
        the bodies it holds (param: the path to the field, `messages.0.name`)."""
        problems = [(name, f"{name} is not supported; omit it or send null")
                    for name, neutral in self.NEUTRAL.items()
                    if getattr(self, name) is not None and not any(_same(getattr(self, name), v) for v in neutral)]
        for where, body in self._held():
            problems += [(f"{where}.{param}", text) for param, text in body.unsupported()]
        return problems

    def _held(self) -> list[tuple[str, RequestBody]]:
        """(path, body) for the bodies this one holds: in a field, or in a list field."""
        held: list[tuple[str, RequestBody]] = []
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, RequestBody):
                held.append((name, value))
            elif isinstance(value, list):
                held += [(f"{name}.{i}", item) for i, item in enumerate(value) if isinstance(item, RequestBody)]
        return held


class ModelRequest(RequestBody):
    """A body that names the model it is for."""

    model: str


def _same(value: Any, neutral: Any) -> bool:
    """Equal and of the same kind (true is not 1 here)."""
    return value == neutral and isinstance(value, bool) == isinstance(neutral, bool)


class SpeculationOptions(RequestBody):
    """Extension: per-request drafter choice and draft length cap (k = 0 or drafter "none": no speculation); trace
    (streams only) adds a `speculation` field to each chunk that carries tokens: each token's origin. A key it does
    not know is a 400: a misspelt `drafter` would otherwise be served by the default drafter without a word."""

    model_config = ConfigDict(extra="forbid", strict=True)

    drafter: str | None = None
    k: int | None = Field(default=None, ge=0, le=64)
    trace: bool | None = None


class StreamOptions(RequestBody):
    include_usage: bool | None = None


class JsonSchemaFormat(RequestBody):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(RequestBody):
    """OpenAI's response_format: text, json_object, or json_schema with its schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(RequestBody):
    """vLLM's structured_outputs extension: exactly one of these. A key it does not know (a misspelt `regex`, or
    vLLM's `structural_tag` or `disable_any_whitespace`, not implemented) is a 400: ignoring it would drop or change
    the structure asked for."""

    model_config = ConfigDict(extra="forbid", strict=True)

    json_: dict[str, Any] | bool | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class _Sampling(ModelRequest):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    max_tokens: int | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)  # extension (as in vLLM)
    seed: int | None = Field(default=None, ge=-(1 << 63), lt=1 << 64)  # what torch.Generator.manual_seed takes
    stop: str | list[str] | None = None
    n: int | None = Field(default=None, ge=1, le=MAX_CHOICES)  # choices per prompt, each decoded on its own row
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    speculation: SpeculationOptions | None = None  # extension
    ignore_eos: bool | None = False  # extension (as in vLLM): decode max_tokens tokens even past EOS
    # extension (as in vLLM): the request reuses kept prompt KV of requests with the same salt only
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None  # extension (as in vLLM)
    guided_json: dict[str, Any] | bool | str | None = None  # vLLM's older names for structured_outputs
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None  # token id (as a string, as OpenAI's) -> bias in [-100, 100]
    min_p: float | None = Field(default=None, ge=0, le=1)  # extension (as in vLLM)
    repetition_penalty: float | None = Field(default=None, ge=REPETITION_PENALTY[0], le=REPETITION_PENALTY[1])
    include_stop_str_in_output: bool | None = False  # extension (as in vLLM): the stop string ends the text, kept
    stop_token_ids: list[int] | None = None  # extension (as in vLLM): tokens that end the text like EOS (kept)
    # extension (as in vLLM): tokens generated before EOS, a stop token or a stop string may end the text
    min_tokens: int | None = Field(default=None, ge=0)

    def bias_pairs(self) -> tuple[tuple[int, float], ...]:
        """logit_bias as (token id, bias) pairs. A key is a token id in ASCII decimal digits, at most 10 of them:
        str.isdigit() also admits "²" or "①", which int() refuses (a 500 once), and a 5,000-digit key is no
        token; anything else is a ConfigError."""
        pairs = []
        for key, bias in (self.logit_bias or {}).items():
            if not _TOKEN_ID.fullmatch(key):
                raise ConfigError(f"logit_bias keys must be token ids (decimal digits), got {key[:24]!r}"
                                  + ("..." if len(key) > 24 else ""))
            pairs.append((int(key), bias))
        return tuple(pairs)

    def structure(self) -> tuple[str, Structure] | None:
        """(the field that asked, the Structure) for the one structure the request asks for, or None. More than
        one, or a malformed one, is a ConfigError naming the field."""
        asked = []
        if self.response_format is not None and self.response_format.type != "text":
            asked.append(("response_format", self._response_format()))
        for name in ("json", "regex", "choice", "grammar", "json_object"):
            value = getattr(self.structured_outputs, name + "_" if name == "json" else name, None)
            if value is not None and value is not False:
                asked.append((f"structured_outputs.{name}", (name, value)))
        for name in ("json", "regex", "choice", "grammar"):
            value = getattr(self, f"guided_{name}")
            if value is not None:
                asked.append((f"guided_{name}", (name, value)))
        if len(asked) > 1:
            raise StructureError(", ".join(field for field, _ in asked), "a request may ask for one structure, got "
                                 + " and ".join(field for field, _ in asked))
        if not asked:
            return None
        field, (kind, value) = asked[0]
        try:
            if kind == "json":
                return field, Structure.json_schema(value)
            if kind == "json_object":
                return field, Structure.json_object()
            return field, getattr(Structure, kind)(value)
        except ConfigError as error:
            raise StructureError(field, str(error)) from None

    def _response_format(self) -> tuple[str, object]:
        fmt = self.response_format
        assert fmt is not None
        if fmt.type == "json_object":
            return "json_object", True
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise StructureError("response_format.json_schema", "response_format json_schema needs "
                                 "{\"json_schema\": {\"name\": ..., \"schema\": {...}}}")
        return "json", fmt.json_schema.schema_


class StructureError(ValueError):
    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]  # a list of strings or of id lists: a batch of prompts
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)  # OpenAI allows 5; vLLM 20
    echo: bool | None = False  # the prompt's text (and with logprobs, its tokens' logprobs) leads each choice's
    best_of: int | None = None
    suffix: str | None = None  # text after the completion: the model fills the middle (core/infill.py)
    max_completion_tokens: Any = None  # chat's name for max_tokens: here a 400, where it was ignored
    ONLY: ClassVar[dict[str, tuple]] = {**_Sampling.ONLY, "best_of": (1,)}

    def unsupported(self) -> list[tuple[str, str]]:
        problems = super().unsupported()
        if self.max_completion_tokens is not None:
            problems.append(("max_completion_tokens", "max_completion_tokens is a chat completions field; "
                                                      "/v1/completions takes max_tokens"))
        if self.best_of not in (None, 1):
            problems.append(("best_of", "only best_of=1 is supported"))
        if self.suffix and self.echo:
            problems.append(("echo", "echo is not supported with a suffix (the prompt is laid out around the middle)"))
        return problems

    def prompts(self) -> list[str | list[int]]:
        """The batch of prompts: a text or a list of token ids alone is a batch of one."""
        prompt = self.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            return [prompt]  # type: ignore[list-item]
        return list(prompt) or [[]]  # type: ignore[arg-type]  # [] is one empty prompt: a 400 where it is encoded

    def top_logprobs_wanted(self) -> int | None:
        return self.logprobs


class TextPart(RequestBody):
    type: Literal["text"]
    text: str


class FunctionCall(RequestBody):
    name: str = Field(pattern=TOOL_NAME)
    arguments: str  # JSON text of an object, as OpenAI writes it


class ToolCall(RequestBody):
    """A call the assistant made (in a message of the conversation, or in a reply)."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDefinition(RequestBody):
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object; none: no arguments
    strict: bool | None = None  # calls forced by tool_choice always match the schema; "auto" calls are the model's


class Tool(RequestBody):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(RequestBody):
    name: str


class NamedToolChoice(RequestBody):
    type: Literal["function"]
    function: NamedFunction


class ChatMessage(RequestBody):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None  # null only for an assistant message (see the app)
    tool_calls: list[ToolCall] | None = None  # an assistant message's calls
    tool_call_id: str | None = None  # a tool message's: the call it answers
    # the chat template has no place for these: accepted only when empty
    name: Any = None
    function_call: Any = None
    NEUTRAL: ClassVar[dict[str, tuple]] = {"name": (), "function_call": ()}

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    # vLLM chat extensions
    chat_template: Any = None  # a client's own template: not run here (code of the client's on the server)
    chat_template_kwargs: dict[str, Any] | None = None  # further variables the model's template reads
    add_generation_prompt: bool | None = True  # false: the template does not open the assistant's turn
    continue_final_message: bool | None = False  # the reply continues the last (assistant) message
    NEUTRAL: ClassVar[dict[str, tuple]] = {
        **_Sampling.NEUTRAL, "functions": ([],), "function_call": ("none", "auto"), "audio": (),
        "modalities": (["text"],), "reasoning_effort": (), "verbosity": (), "web_search_options": (),
        "chat_template": ()}
    # what apply_chat_template takes from the server itself: never from chat_template_kwargs
    TEMPLATE_OWN: ClassVar[frozenset[str]] = frozenset({
        "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
        "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
        "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"})

    def top_logprobs_wanted(self) -> int | None:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return (self.top_logprobs or 0) if self.logprobs else None


class TokenizeRequest(ModelRequest):
    """vLLM's /tokenize: a prompt, or chat messages through the model's template (with its options and tools), as
    the completion endpoints would encode them."""

    prompt: str | None = None
    add_special_tokens: bool | None = True  # a prompt's (as completions add them)
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    tools: list[Tool] | None = None
    add_generation_prompt: bool | None = True
    continue_final_message: bool | None = False
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool | None = False

    def chat(self) -> ChatCompletionRequest:
        """The messages as a chat request would carry them."""
        fields = {"model", "messages", "tools", "add_generation_prompt", "continue_final_message",
                  "chat_template_kwargs"} & self.model_fields_set
        return ChatCompletionRequest.model_validate({name: getattr(self, name) for name in fields})


class DetokenizeRequest(ModelRequest):
    """vLLM's /detokenize: token ids back to text."""

    tokens: list[int]


# -- responses ----------------------------------------------------------------------------------------------------
class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str


class PromptTokensDetails(BaseModel):
    """OpenAI's prompt_tokens_details: prompt tokens whose KV was already cached (not prefilled again)."""

    cached_tokens: int


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
    forced_tokens: int = 0  # draft tokens the request's grammar forced (structured outputs)
    prompt_tokens_details: PromptTokensDetails | None = None  # OpenAI's: cached_tokens


class CompletionLogprobs(BaseModel):
    """Completions' logprobs: per token its text, logprob, the top-N as {text: logprob}, its offset in the text."""

    tokens: list[str]
    token_logprobs: list[float | None]  # null for an echoed prompt's first token
    top_logprobs: list[dict[str, float] | None] | None
    text_offset: list[int]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None
    refusal: list[TokenLogprob] | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None
    stop_reason: str | int | None = None  # vLLM's: the stop string or stop token id that ended the text


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ReplyFunction(BaseModel):
    name: str  # as the model wrote it (under "auto" it may name no tool of the request's)
    arguments: str


class ReplyCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ReplyFunction


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None  # null when the reply is tool calls alone
    tool_calls: list[ReplyCall] | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    stop_reason: str | int | None = None  # vLLM's: the stop string or stop token id that ended the text


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CallDelta(ReplyCall):
    """A streamed call: each comes whole in one chunk (OpenAI's clients join a call's pieces by `index`)."""

    index: int


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[CallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    stop_reason: str | int | None = None  # vLLM's: the stop string or stop token id that ended the text


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class TracedToken(BaseModel):
    """One committed token of a traced stream: where it came from (core/sequence.py, Origin) and its position in
    the step's draft path (1: the first draft token; the target's own token comes one past the accepted ones)."""

    id: int
    text: str  # its own decoding, as in logprobs
    origin: Literal["draft", "grammar", "bonus", "correction", "target"]
    position: int
    logprob: float | None = None  # only when the request asked for logprobs


class SpeculationTrace(BaseModel):
    """A traced chunk's `speculation` field: the step that committed its tokens (drafted: the draft's depth, the
    longest path of a tree, as in usage and /metrics)."""

    k: int
    drafted: int
    accepted: int
    tokens: list[TracedToken]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "specdecode"
    max_model_len: int | None = None  # vLLM's: the context a prompt and its answer share (clients size prompts by it)


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
