"""OpenAI's Responses API (`POST /v1/responses`) over the chat machinery.

A Responses request is a chat request written differently: `instructions` is a system message, `input` a text or a
list of items (messages, the assistant's `function_call`s and their `function_call_output`s), `tools` are flat
functions, `text.format` is the response format and `max_output_tokens` the cap. `ResponsesRequest.chat()` writes
it as a `ChatCompletionRequest`, which the server decodes as any chat request (one choice), so every drafter,
structure and tool call serves it; `ResponseWriter` writes the reply as Responses' output items: a message with
`output_text`, and each call as a `function_call` item, whole or as Responses' typed events. A response is kept
(`store`, true unless the request says false) in the server's ResponseStore when it has one, and a request naming it
as `previous_response_id` continues its conversation (response_store.py). `conversation` (OpenAI's stored
conversations) is a 400, as are the API's other features this server does not implement.
"""
from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar, Literal

from pydantic import Field, PrivateAttr

from specdecode.config import MAX_TOP_LOGPROBS
from specdecode.server.protocol import schemas as s
from specdecode.server.protocol.as_chat import AsChat, read_part, usage_extensions
from specdecode.server.protocol.errors import APIError, empty_content, shown
from specdecode.server.protocol.logprobs import TokenText, chat_logprobs
from specdecode.server.protocol.replies import collect, usage
from specdecode.server.protocol.tools import Call, CallReader, Reading, read_pieces
from specdecode.server.scheduling.scheduler import Finished, PromptLogprobs, TextDelta, Ticket
from specdecode.server.stores.conversation_store import ConversationStore, with_id
from specdecode.server.stores.response_store import Kept, ResponseStore


class InputText(s.RequestBody):
    type: Literal["input_text", "output_text"]
    text: str


class InputMessage(s.RequestBody):
    type: Literal["message"] | None = None
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[InputText]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class FunctionCallItem(s.RequestBody):
    """A call the assistant made earlier in the conversation."""

    type: Literal["function_call"]
    call_id: str
    name: str = Field(pattern=s.TOOL_NAME)
    arguments: str  # JSON text of an object


class FunctionCallOutput(s.RequestBody):
    """A call's result, which the client sends back."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText]

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(part.text for part in self.output)


class FunctionTool(s.RequestBody):
    type: Literal["function"]
    name: str = Field(pattern=s.TOOL_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(s.RequestBody):
    type: Literal["function"]
    name: str


class TextFormat(s.RequestBody):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(s.RequestBody):
    format: TextFormat | None = None
    verbosity: Any = None
    NEUTRAL: ClassVar[dict[str, tuple]] = {"verbosity": ("medium",)}


INPUT_ITEMS = (InputMessage, FunctionCallItem, FunctionCallOutput)  # the input items this server reads
LOGPROBS_INCLUDE = "message.output_text.logprobs"  # the one `include` this server serves
_ITEMS: dict[str | None, type[s.RequestBody]] = {None: InputMessage, "message": InputMessage,
                                                 "function_call": FunctionCallItem,
                                                 "function_call_output": FunctionCallOutput}


class ConversationRef(s.RequestBody):
    id: str


class ResponsesRequest(AsChat):
    input: str | list[dict[str, Any]]  # a text, or items: read by items(), each 400 naming its place
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    stream: bool | None = False
    store: bool | None = None  # keep the response (None: true, as in OpenAI's API) where the server keeps responses
    metadata: s.Metadata | None = None  # returned with the response (OpenAI's bounds: 16 pairs of 64 / 512 characters)
    previous_response_id: str | None = None  # the kept response this request continues
    # the output text's logprobs: with LOGPROBS_INCLUDE in include, or top_logprobs > 0 (its top-N alternatives)
    include: list[str] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    conversation: str | ConversationRef | None = None  # the conversation (conversation_store.py) it continues
    # not implemented: accepted only at their neutral values
    background: Any = None
    reasoning: Any = None
    truncation: Any = None
    prompt: Any = None
    max_tool_calls: Any = None
    NEUTRAL: ClassVar[dict[str, tuple]] = {
        "background": (False,), "reasoning": ({},), "truncation": ("disabled",), "prompt": (), "max_tool_calls": ()}
    _earlier: list[dict[str, Any]] = PrivateAttr(default_factory=list)  # the earlier items, oldest first
    _source: str = PrivateAttr(default="previous_response_id")  # where they come from (named in a 400)

    @property
    def conversation_id(self) -> str | None:
        return self.conversation.id if isinstance(self.conversation, ConversationRef) else self.conversation

    def after(self, earlier: list[dict[str, Any]], source: str = "previous_response_id") -> ResponsesRequest:
        """This request continuing a conversation whose items (kept responses', or a conversation's: `source`)
        come first."""
        continued = self.model_copy()
        continued._earlier, continued._source = earlier, source
        return continued

    def referenced(self, lookup: Callable[[str], dict | None] | None) -> ResponsesRequest:
        """This request with each `item_reference` in its input replaced by the kept item it names (lookup: a kept
        item by id; None where none are kept). One that names no kept item is a 400 naming its place."""
        if not isinstance(self.input, list) or not any(raw.get("type") == "item_reference" for raw in self.input):
            return self
        items = []
        for i, raw in enumerate(self.input):
            if raw.get("type") != "item_reference":
                items.append(raw)
                continue
            item_id = raw.get("id")
            found = lookup(item_id) if lookup is not None and isinstance(item_id, str) else None
            if found is None:
                why = "no kept item has this id" if lookup is not None else \
                    "this server keeps no responses (serve --responses-store N)"
                raise APIError(400, f"input item reference {shown(item_id)} cannot be read: {why}",
                               param=f"input.{i}.id", code="item_not_found")
            items.append(found)
        return self.model_copy(update={"input": items})  # the earlier items (private) come with the copy

    def unsupported(self) -> list[tuple[str, str]]:
        problems = super().unsupported()
        if self.conversation is not None and self.previous_response_id is not None:
            problems.append(("conversation", "conversation and previous_response_id cannot both be given: each names "
                                             "the conversation the response continues"))
        problems += [(f"include.{i}", f"include {shown(name)} is not supported; this server includes only "
                                      f"{LOGPROBS_INCLUDE!r}") for i, name in enumerate(self.include or [])
                     if name != LOGPROBS_INCLUDE]
        if self.logprobs_wanted() is not None and self.tools and self.tool_choice != "none":
            problems.append(("top_logprobs" if self.top_logprobs else "include", "the output text's logprobs are not "
                             "supported with tools that may be called (chat completions give them)"))
        return problems

    def logprobs_wanted(self) -> int | None:
        """The top-N alternatives each output token's logprob comes with (0: none), or None: no logprobs."""
        if LOGPROBS_INCLUDE in (self.include or []) or self.top_logprobs:
            return self.top_logprobs or 0
        return None

    def own_items(self) -> list[dict[str, Any]]:
        """The input as items, as this request sent them (a text is one user message): what a kept response
        holds of its input."""
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user", "content": self.input}]
        return list(self.input)

    def chat(self) -> s.ChatCompletionRequest:
        """The same request on the chat endpoint (one choice, not streamed: the writer here streams it)."""
        tools = [s.Tool(type="function", function=s.FunctionDefinition(
            name=tool.name, description=tool.description, parameters=tool.parameters, strict=tool.strict))
            for tool in self.tools] if self.tools is not None else None
        choice = self.tool_choice
        if isinstance(choice, FunctionChoice):
            choice = s.NamedToolChoice(type="function", function=s.NamedFunction(name=choice.name))
        return s.ChatCompletionRequest(
            model=self.model, messages=self._messages(), max_completion_tokens=self.max_output_tokens,
            temperature=self.temperature, top_p=self.top_p, tools=tools, tool_choice=choice,
            parallel_tool_calls=self.parallel_tool_calls, response_format=self._format(),
            speculation=self.speculation, seed=self.seed, top_k=self.top_k,
            logprobs=True if self.logprobs_wanted() is not None else None, top_logprobs=self.logprobs_wanted())

    def _messages(self) -> list[s.ChatMessage]:
        """instructions, then the items; the assistant's calls join its message (one turn, as chat writes it)."""
        messages = [s.ChatMessage(role="system", content=self.instructions)] if self.instructions else []
        for item in self.items():
            if isinstance(item, FunctionCallItem):
                call = s.ToolCall(id=item.call_id, function=s.FunctionCall(name=item.name, arguments=item.arguments))
                if messages and messages[-1].role == "assistant":
                    messages[-1].tool_calls = [*(messages[-1].tool_calls or []), call]
                else:
                    messages.append(s.ChatMessage(role="assistant", content=None, tool_calls=[call]))
            elif isinstance(item, FunctionCallOutput):
                messages.append(s.ChatMessage(role="tool", tool_call_id=item.call_id, content=item.text()))
            else:
                messages.append(s.ChatMessage(role=item.role, content=item.text()))
        if not messages:
            raise APIError(400, "input holds no messages", param="input", code="invalid_value")
        return messages

    def items(self) -> list[InputMessage | FunctionCallItem | FunctionCallOutput]:
        """The earlier responses' items, then the input's, each read by its type; one this server does not know is
        a 400 naming it."""
        items = [read_item(raw, self._source) for raw in self._earlier]
        if isinstance(self.input, str):
            return [*items, InputMessage(role="user", content=self.input)]
        return [*items, *(read_item(raw, f"input.{i}") for i, raw in enumerate(self.input))]

    def _format(self) -> s.ResponseFormat | None:
        fmt = self.text.format if self.text is not None else None
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return s.ResponseFormat(type="json_object")
        if fmt.schema_ is None:
            raise APIError(400, "text.format json_schema needs a schema", param="text.format.schema",
                           code="invalid_value")
        return s.ResponseFormat(type="json_schema", json_schema=s.JsonSchemaFormat(
            name=fmt.name, description=fmt.description, schema=fmt.schema_, strict=fmt.strict))


def read_item(raw: dict[str, Any], where: str) -> InputMessage | FunctionCallItem | FunctionCallOutput:
    kind = raw.get("type")
    if not isinstance(kind, str | None) or kind not in _ITEMS:
        raise APIError(400, f"input items of type {shown(kind)} are not supported here (messages, function_call, "
                            "function_call_output and item_reference are)", param=f"{where}.type", code="unsupported")
    item = read_part(_ITEMS[kind], raw, where)
    if isinstance(item, InputMessage) and item.content == []:
        raise empty_content(f"{where}.content", "text part")
    return item  # type: ignore[return-value]


# the chat request's fields as the Responses request names them, for a 400 about one of them
_PARAMS = {"max_completion_tokens": "max_output_tokens", "max_tokens": "max_output_tokens",
           "response_format": "text.format", "messages": "input"}


def responses_error(error: APIError) -> APIError:
    """A chat request's error as the Responses request names its field (tools.0.function.name -> tools.0.name)."""
    param = error.param
    if param is None:
        return error
    head, _, rest = param.partition(".")
    if head == "tools":
        named = param.replace(".function.", ".", 1)
    elif head == "messages":
        named = "input"
    elif head in _PARAMS:
        named = ".".join(filter(None, (_PARAMS[head], rest)))
    else:
        return error
    message = error.message
    for chat_name in ("max_completion_tokens", "response_format"):
        message = message.replace(chat_name, _PARAMS[chat_name])
    return dataclasses.replace(error, param=named, message=message)


class ResponseWriter:
    """Writes one request's reply as a Responses object, whole or as its stream of typed events."""

    def __init__(self, model: str, req: ResponsesRequest, calls: Reading | None, store: ResponseStore | None = None,
                 token_text: TokenText | None = None, conversations: ConversationStore | None = None):
        """store: where the finished response is kept (None: not kept, or the request said `store` false);
        token_text: a token's text, for the output text's logprobs (needed when the request asks for them);
        conversations: where the request's conversation is, which the finished response's items join."""
        self.model, self.req, self.calls, self.token_text = model, req, calls, token_text
        self.conversations = conversations
        self.store = store if req.store is not False else None
        self.id, self.created = "resp_" + uuid.uuid4().hex, int(time.time())
        self.sequence = 0

    async def whole(self, ticket: Ticket) -> dict:
        text, entries, event = await collect(ticket)
        pieces = read_pieces(self.calls, text)
        status = _status(event)
        output: list[dict] = []
        for piece in pieces:
            if isinstance(piece, Call):
                output.append(_call_item(piece, "completed"))
            elif piece and output and output[-1]["type"] == "message":
                output[-1]["content"][0]["text"] += piece
            elif piece:
                output.append(_message_item(piece, status))
        if not output:
            output.append(_message_item("", status))
        if self.req.logprobs_wanted() is not None:  # no calls (unsupported() refuses them): one message
            output[0]["content"][0]["logprobs"] = self._logprobs(entries)
        return self._kept(self._response(status, output, event))

    def _logprobs(self, entries) -> list[dict]:
        """Logprob entries as output_text's: token, logprob, bytes, top_logprobs (chat's content entries)."""
        assert self.token_text is not None, "a request asking for logprobs needs the writer's token_text"
        return chat_logprobs(entries, self.token_text).model_dump()["content"]

    async def events(self, ticket: Ticket) -> AsyncIterator[str]:
        """Responses' server-sent events: created, in progress, each output item's (a message's text deltas, a
        call whole once it has closed), then completed (incomplete at the token cap; an error event and failed
        when the request fails)."""
        reader = CallReader(self.calls) if self.calls is not None else None
        logprobs = self.req.logprobs_wanted() is not None
        pending: list[dict] = []  # logprob entries of tokens whose text has not been sent yet
        output: list[dict] = []
        message: dict | None = None  # the message item being written
        try:
            yield self._event("response.created", response=self._response("in_progress", [], None))
            yield self._event("response.in_progress", response=self._response("in_progress", [], None))
            while True:
                event = await ticket.next()
                if isinstance(event, PromptLogprobs):
                    continue
                if isinstance(event, TextDelta | Finished):
                    text = event.text if isinstance(event, TextDelta) else ""
                    if logprobs and isinstance(event, TextDelta) and event.logprobs:
                        pending += self._logprobs(event.logprobs)  # sent with the next text (this may be held)
                    pieces = [text] if reader is None else reader.feed(text)
                    if isinstance(event, Finished) and reader is not None:
                        pieces += reader.close()
                    for piece in pieces:
                        if isinstance(piece, Call):
                            if message is not None:
                                for body in self._close_message(message, output, "completed"):
                                    yield body
                                message = None
                            for body in self._call_events(piece, output):
                                yield body
                        elif piece:
                            if message is None:
                                message = _message_item("", "in_progress")
                                for body in self._open_message(message, output):
                                    yield body
                            message["content"][0]["text"] += piece
                            message["content"][0]["logprobs"] += pending
                            yield self._event("response.output_text.delta", item_id=message["id"],
                                              output_index=len(output), content_index=0, delta=piece,
                                              logprobs=pending)
                            pending = []
                    if isinstance(event, Finished):
                        status = _status(event)
                        if message is None and not output:
                            message = _message_item("", "in_progress")
                            for body in self._open_message(message, output):
                                yield body
                        if message is not None:
                            message["content"][0]["logprobs"] += pending  # tokens whose text never showed
                            for body in self._close_message(message, output, status):
                                yield body
                        done = "response.completed" if status == "completed" else "response.incomplete"
                        yield self._event(done, response=self._kept(self._response(status, output, event)))
                        return
                else:
                    yield self._event("error", code=event.code, message=event.message, param=None)
                    failed = self._response("failed", output, None)
                    failed["error"] = {"code": event.code or "server_error", "message": event.message}
                    yield self._event("response.failed", response=failed)
                    return
        finally:
            ticket.cancel()

    def _open_message(self, message: dict, output: list[dict]) -> list[str]:
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [self._event("response.output_item.added", output_index=len(output),
                            item={**message, "content": []}),
                self._event("response.content_part.added", item_id=message["id"], output_index=len(output),
                            content_index=0, part=part)]

    def _close_message(self, message: dict, output: list[dict], status: str) -> list[str]:
        index, part = len(output), message["content"][0]
        message["status"] = status
        output.append(message)
        return [self._event("response.output_text.done", item_id=message["id"], output_index=index, content_index=0,
                            text=part["text"], logprobs=part["logprobs"]),
                self._event("response.content_part.done", item_id=message["id"], output_index=index,
                            content_index=0, part=part),
                self._event("response.output_item.done", output_index=index, item=message)]

    def _call_events(self, call: Call, output: list[dict]) -> list[str]:
        item, index = _call_item(call, "completed"), len(output)
        output.append(item)
        return [self._event("response.output_item.added", output_index=index,
                            item={**item, "arguments": "", "status": "in_progress"}),
                self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                            delta=item["arguments"]),
                self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                            name=item["name"], arguments=item["arguments"]),
                self._event("response.output_item.done", output_index=index, item=item)]

    def _kept(self, response: dict) -> dict:
        """The finished response, kept in the store when there is one (its input items and output, for a follow-up
        naming it); its input and output items join the conversation it continues."""
        inputs = [with_id(item) for item in self.req.own_items()]
        if self.store is not None:
            items = (*inputs, *response["output"])
            self.store.put(self.id, Kept(response, items, self.req.previous_response_id, len(inputs)))
        conversation = self.req.conversation_id
        held = self.conversations.get(conversation) if self.conversations is not None and conversation else None
        if held is not None:  # (deleted while the response was written: nothing to join)
            self.conversations.add(held, [*inputs, *response["output"]], strict=False)
        return response

    def _event(self, kind: str, **fields) -> str:
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(body, separators=(',', ':'))}\n\n"

    def _response(self, status: str, output: list[dict], event: Finished | None) -> dict:
        req = self.req
        fmt = req.text.format if req.text is not None and req.text.format is not None else None
        choice = req.tool_choice
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status, "model": self.model,
            "output": output, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "tools": [tool.model_dump(exclude_none=True) for tool in req.tools or []],
            "tool_choice": choice.model_dump() if isinstance(choice, FunctionChoice) else choice or "auto",
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
            "previous_response_id": req.previous_response_id, "store": self.store is not None,
            "metadata": req.metadata or {}, "truncation": "disabled", "top_logprobs": req.top_logprobs or 0,
            "conversation": {"id": req.conversation_id} if req.conversation is not None else None,
            "usage": None if event is None else _usage(event)}


def _status(event: Finished) -> str:
    return "incomplete" if event.finish_reason == "length" else "completed"


def _message_item(text: str, status: str) -> dict:
    return {"id": "msg_" + uuid.uuid4().hex, "type": "message", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _call_item(call: Call, status: str) -> dict:
    reply = call.reply()
    return {"id": "fc_" + uuid.uuid4().hex, "type": "function_call", "status": status, "call_id": reply.id,
            "name": call.name, "arguments": call.arguments}


def _usage(event: Finished) -> dict:
    """Responses' usage, with the chat endpoint's extensions (tau, target passes, ...)."""
    counted = usage([event.stats])
    return {"input_tokens": counted.prompt_tokens, "output_tokens": counted.completion_tokens,
            "total_tokens": counted.total_tokens,
            "input_tokens_details": {"cached_tokens": counted.prompt_tokens_details.cached_tokens},
            "output_tokens_details": {"reasoning_tokens": 0}, **usage_extensions(counted)}
