"""Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) over the chat machinery.

A Messages request is a chat request written differently: `system` is a system message, a message's content is a
text or a list of blocks (text; the assistant's `tool_use`; the user's `tool_result`, which answers one), `tools`
carry an `input_schema`, `tool_choice` is `auto` / `any` / `tool` / `none`, and `max_tokens` is required.
`MessagesRequest.chat()` writes it as a `ChatCompletionRequest`, decoded as any chat request (one choice), so every
drafter, tool call and stop sequence serves it; `MessageWriter` writes the reply as Anthropic's content blocks and
stop reason, whole or as its stream events. What this server does not implement (images, documents, extended
thinking, server tools) is a 400 naming the field.
"""
from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any, ClassVar, Literal

from pydantic import Field

from specdecode.server.protocol import schemas as s
from specdecode.server.protocol.as_chat import AsChat, read_part, usage_extensions
from specdecode.server.protocol.errors import APIError, empty_content, shown
from specdecode.server.protocol.replies import collect, usage
from specdecode.server.protocol.tools import Call, CallReader, Reading, read_pieces
from specdecode.server.scheduling.scheduler import Finished, PromptLogprobs, TextDelta, Ticket


class TextBlock(s.RequestBody):
    type: Literal["text"]
    text: str
    cache_control: Any = None  # a prompt-caching hint: this server reuses prompt KV by itself


class ToolUseBlock(s.RequestBody):
    """A call the assistant made earlier in the conversation."""

    type: Literal["tool_use"]
    id: str
    name: str = Field(pattern=s.TOOL_NAME)
    input: dict[str, Any]
    cache_control: Any = None


class ToolResultBlock(s.RequestBody):
    """A call's result, which the client sends back in a user message."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool | None = None
    cache_control: Any = None

    def text(self) -> str:
        text = self.content if isinstance(self.content, str) else "".join(block.text for block in self.content)
        return f"Error: {text}" if self.is_error else text


Block = TextBlock | ToolUseBlock | ToolResultBlock
BLOCKS = (TextBlock, ToolUseBlock, ToolResultBlock)  # the content blocks this server reads
_BLOCKS: dict[str, type[s.RequestBody]] = {"text": TextBlock, "tool_use": ToolUseBlock, "tool_result": ToolResultBlock}


class Message(s.RequestBody):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]  # read by blocks(), each 400 naming its place

    def blocks(self, where: str) -> list[Block]:
        if isinstance(self.content, str):
            return [TextBlock(type="text", text=self.content)]
        if not self.content:
            raise empty_content(f"{where}.content", "content block")
        return [_block(raw, f"{where}.content.{i}") for i, raw in enumerate(self.content)]


class ToolDefinition(s.RequestBody):
    type: Literal["custom"] | None = None  # Anthropic's server tools (web search, ...) are not run here
    name: str = Field(pattern=s.TOOL_NAME)
    description: str | None = None
    input_schema: dict[str, Any]
    cache_control: Any = None


class ToolChoice(s.RequestBody):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class JsonOutput(s.RequestBody):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(s.RequestBody):
    format: JsonOutput | None = None  # structured outputs: the reply's text matches the schema
    effort: Any = None  # how long a thinking model thinks: none thinks here
    NEUTRAL: ClassVar[dict[str, tuple]] = {"effort": ()}


class MessagesRequest(AsChat):
    max_tokens: int = Field(ge=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    stream: bool | None = False
    output_config: OutputConfig | None = None
    metadata: dict[str, Any] | None = None  # a user id for abuse tracking: not read here
    # not implemented: accepted only at their neutral values
    thinking: Any = None
    container: Any = None
    mcp_servers: Any = None
    NEUTRAL: ClassVar[dict[str, tuple]] = {"thinking": ({"type": "disabled"},), "container": (), "mcp_servers": ([],)}

    def chat(self) -> s.ChatCompletionRequest:
        """The same request on the chat endpoint (one choice, not streamed: the writer here streams it)."""
        fmt = self.output_config.format if self.output_config is not None else None
        response_format = None if fmt is None else s.ResponseFormat(type="json_schema", json_schema=s.JsonSchemaFormat(
            name="output", schema=fmt.schema_))
        tools = [s.Tool(type="function", function=s.FunctionDefinition(
            name=tool.name, description=tool.description, parameters=tool.input_schema))
            for tool in self.tools] if self.tools is not None else None
        choice: Any = None
        parallel = None
        if self.tool_choice is not None:
            kind = self.tool_choice.type
            if kind == "tool" and not self.tool_choice.name:
                raise APIError(400, "tool_choice of type tool needs the tool's name", param="tool_choice.name",
                               code="invalid_value")
            choice = {"auto": "auto", "any": "required", "none": "none"}.get(kind) or s.NamedToolChoice(
                type="function", function=s.NamedFunction(name=self.tool_choice.name or ""))
            parallel = False if self.tool_choice.disable_parallel_tool_use else None
        return s.ChatCompletionRequest(
            model=self.model, messages=self._messages(), max_completion_tokens=self.max_tokens,
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, stop=self.stop_sequences,
            tools=tools, tool_choice=choice, parallel_tool_calls=parallel, response_format=response_format,
            speculation=self.speculation, seed=self.seed)

    def _messages(self) -> list[s.ChatMessage]:
        """system, then each message: a user's tool results become tool messages before its text, an assistant's
        tool uses its message's calls."""
        system = self.system if isinstance(self.system, str) or self.system is None else "".join(
            block.text for block in self.system)
        messages = [s.ChatMessage(role="system", content=system)] if system else []
        for i, message in enumerate(self.messages):
            blocks = message.blocks(f"messages.{i}")
            text = "".join(block.text for block in blocks if isinstance(block, TextBlock))
            if message.role == "assistant":
                if any(isinstance(block, ToolResultBlock) for block in blocks):
                    raise APIError(400, "tool_result blocks belong in a user message", param=f"messages.{i}.content",
                                   code="invalid_value")
                calls = [s.ToolCall(id=block.id, function=s.FunctionCall(name=block.name,
                                                                          arguments=json.dumps(block.input)))
                         for block in blocks if isinstance(block, ToolUseBlock)]
                messages.append(s.ChatMessage(role="assistant", content=text or (None if calls else ""),
                                              tool_calls=calls or None))
                continue
            if any(isinstance(block, ToolUseBlock) for block in blocks):
                raise APIError(400, "tool_use blocks belong in an assistant message", param=f"messages.{i}.content",
                               code="invalid_value")
            messages += [s.ChatMessage(role="tool", tool_call_id=block.tool_use_id, content=block.text())
                         for block in blocks if isinstance(block, ToolResultBlock)]
            if text or not any(isinstance(block, ToolResultBlock) for block in blocks):
                messages.append(s.ChatMessage(role="user", content=text))
        return messages


def _block(raw: dict[str, Any], where: str) -> Block:
    """One content block, read by its type; a type this server does not read is a 400 naming it."""
    kind = raw.get("type")
    if not isinstance(kind, str) or kind not in _BLOCKS:
        raise APIError(400, f"content blocks of type {shown(kind)} are not supported here (text, tool_use and "
                            "tool_result are)", param=f"{where}.type", code="unsupported")
    return read_part(_BLOCKS[kind], raw, where)  # type: ignore[return-value]


class CountTokensRequest(s.ModelRequest):
    """count_tokens: what a Messages request's prompt comes to, without decoding it."""

    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None

    def request(self) -> MessagesRequest:
        return MessagesRequest(model=self.model, max_tokens=1, messages=self.messages, system=self.system,
                               tools=self.tools, tool_choice=self.tool_choice)


# the chat request's fields as the Messages request names them, for a 400 about one of them
_PARAMS = {"max_completion_tokens": "max_tokens", "stop": "stop_sequences",
           "response_format": "output_config.format"}


def messages_error(error: APIError) -> APIError:
    """A chat request's error as the Messages request names its field (tools.0.function.parameters ->
    tools.0.input_schema)."""
    param = error.param
    if param is None:
        return error
    head = param.partition(".")[0]
    if head in ("tools", "tool_choice"):
        named = param.replace(".function.parameters", ".input_schema").replace(".function.", ".")
    elif head in _PARAMS:
        named = _PARAMS[head] + param[len(head):]
    else:
        return error
    message = error.message.replace("max_completion_tokens", "max_tokens").replace(
        "stop sequences", "stop_sequences").replace("response_format", "output_config.format")
    return dataclasses.replace(error, param=named, message=message)


class MessageWriter:
    """Writes one request's reply as an Anthropic message, whole or as its stream of events."""

    def __init__(self, model: str, req: MessagesRequest, calls: Reading | None, prompt_tokens: int):
        self.model, self.req, self.calls, self.prompt_tokens = model, req, calls, prompt_tokens
        self.id = "msg_" + uuid.uuid4().hex

    async def whole(self, ticket: Ticket) -> dict:
        text, _, event = await collect(ticket)
        pieces = read_pieces(self.calls, text)
        content: list[dict] = []
        for piece in pieces:
            if isinstance(piece, Call):
                content.append(_tool_use(piece))
            elif piece and content and content[-1]["type"] == "text":
                content[-1]["text"] += piece
            elif piece:
                content.append({"type": "text", "text": piece})
        reason, sequence = self._stop(event, any(block["type"] == "tool_use" for block in content))
        return {**self._head(), "content": content, "stop_reason": reason, "stop_sequence": sequence,
                "usage": _usage(event)}

    async def events(self, ticket: Ticket) -> AsyncIterator[str]:
        """message_start, each content block's start, deltas and stop (a text's as it comes, a tool use whole once
        it has closed), message_delta with the stop reason and usage, message_stop; an error event if it fails."""
        reader = CallReader(self.calls) if self.calls is not None else None
        blocks = 0
        text_open = False
        used = False  # a tool use was written
        try:
            start = {**self._head(), "content": [], "stop_reason": None, "stop_sequence": None,
                     "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0}}
            yield _event("message_start", message=start)
            while True:
                event = await ticket.next()
                if isinstance(event, PromptLogprobs):
                    continue
                if not isinstance(event, TextDelta | Finished):
                    yield _event("error", error={"type": event.kind, "message": event.message})
                    return
                text = event.text if isinstance(event, TextDelta) else ""
                pieces = [text] if reader is None else reader.feed(text)
                if isinstance(event, Finished) and reader is not None:
                    pieces += reader.close()
                for piece in pieces:
                    if isinstance(piece, Call):
                        if text_open:
                            yield _event("content_block_stop", index=blocks)
                            blocks, text_open = blocks + 1, False
                        block = _tool_use(piece)
                        yield _event("content_block_start", index=blocks, content_block={**block, "input": {}})
                        yield _event("content_block_delta", index=blocks,
                                     delta={"type": "input_json_delta", "partial_json": piece.arguments})
                        yield _event("content_block_stop", index=blocks)
                        blocks, used = blocks + 1, True
                    elif piece:
                        if not text_open:
                            yield _event("content_block_start", index=blocks,
                                         content_block={"type": "text", "text": ""})
                            text_open = True
                        yield _event("content_block_delta", index=blocks, delta={"type": "text_delta", "text": piece})
                if isinstance(event, Finished):
                    if text_open:
                        yield _event("content_block_stop", index=blocks)
                    reason, sequence = self._stop(event, used)
                    yield _event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence},
                                 usage=_usage(event))
                    yield _event("message_stop")
                    return
        finally:
            ticket.cancel()

    def _head(self) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model}

    def _stop(self, event: Finished, used_tools: bool) -> tuple[str, str | None]:
        """Anthropic's stop reason, and the stop sequence that ended the text."""
        if event.finish_reason == "length":
            return "max_tokens", None
        if isinstance(event.stop_reason, str) and event.stop_reason in (self.req.stop_sequences or ()):
            return "stop_sequence", event.stop_reason
        return ("tool_use" if used_tools else "end_turn"), None


def _tool_use(call: Call) -> dict:
    return {"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:24], "name": call.name,
            "input": json.loads(call.arguments)}


def _event(kind: str, **fields) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, separators=(',', ':'))}\n\n"


def _usage(event: Finished) -> dict:
    """Anthropic's usage, with the chat endpoint's extensions (tau, target passes, ...)."""
    counted = usage([event.stats])
    cached = counted.prompt_tokens_details.cached_tokens  # Anthropic counts them apart from input_tokens
    return {"input_tokens": counted.prompt_tokens - cached, "output_tokens": counted.completion_tokens,
            "cache_read_input_tokens": cached, **usage_extensions(counted)}
