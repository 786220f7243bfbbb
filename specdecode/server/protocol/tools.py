"""Tool calls in chat completions: OpenAI's `tools`, `tool_choice` and `parallel_tool_calls`, an assistant
message's `tool_calls` and a tool message's `tool_call_id`.

The tools reach the model through its own chat template, which also teaches it how to call one. This module knows
that calling format (Hermes' `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, which Qwen2.5's template
teaches), reads calls back out of a reply's text, whole or as it streams (`CallReader`; a reply that is one bare
JSON call of an offered tool, fenced or not, is read as that call too: the shipped Qwen2.5-Coder models, asked with
"auto", write their calls so), and writes the grammar a
reply decodes under when `tool_choice` is "required" or names a function (`forced_calls`): such a call is always
well formed and its arguments match the tool's schema. Under "auto" the reply is the model's own text, so a reply
that calls no tool is exactly what the model writes without tools' parsing. A template with no calling format this
server knows serves no tools: a request with them is a 400 rather than tools the model never saw.
"""
from __future__ import annotations

import json
import uuid
from collections.abc import Collection
from dataclasses import dataclass

from specdecode.config import Structure
from specdecode.core.structured import JSON_LAYOUT
from specdecode.server.protocol import schemas as s


class ToolError(ValueError):
    """A request's tools or messages this server cannot serve as asked (the server's 400, naming `param`)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolFormat:
    """How a template's model writes a call: `open`, `pad`, {"name": NAME, "arguments": {...}}, `pad`, `close`; two
    calls are separated by `sep`."""

    name: str
    open: str
    close: str
    pad: str = "\n"
    sep: str = "\n"


HERMES = ToolFormat("hermes", "<tool_call>", "</tool_call>")
FORMATS = (HERMES,)


def tool_format(tokenizer) -> ToolFormat | None:
    """The calling format the tokenizer's chat template teaches, or None when it shows none this server knows."""
    template = str(getattr(tokenizer, "chat_template", None) or "")
    return next((fmt for fmt in FORMATS if fmt.open in template and "tools" in template), None)


@dataclass(frozen=True)
class Reading:
    """How a reply's calls are read: the template's format, and the offered tools' names (a reply that is one bare
    JSON call, {"name": NAME, "arguments": {...}} alone or in a ```json fence, is a call only to one of these)."""

    fmt: ToolFormat
    names: frozenset[str]


@dataclass(frozen=True)
class ToolUse:
    """What a chat request asks of tools, checked: the tools shown to the template (None: none), how replies are
    read for calls (None: they are not), the structure forcing calls (tool_choice "required" or a name), and the
    string that ends a reply allowed one call only."""

    tools: list[dict] | None = None
    reading: Reading | None = None
    structure: Structure | None = None
    stop_after: tuple[str, ...] = ()


def tool_use(req: s.ChatCompletionRequest, fmt: ToolFormat | None, added: Collection[str]) -> ToolUse:
    """Check a chat request's tools against each other and the template's format. added: the tokenizer's added
    tokens (a marker that is one of them is written as that token in grammars)."""
    tools, choice = req.tools or [], req.tool_choice
    if any(message.tool_calls for message in req.messages) and fmt is None:
        i = next(i for i, message in enumerate(req.messages) if message.tool_calls)
        raise ToolError(f"messages.{i}.tool_calls", "this model's chat template has no place for tool calls")
    if not tools:
        if choice not in (None, "none", "auto"):
            raise ToolError("tool_choice", "tool_choice needs tools")
        return ToolUse()
    if fmt is None:
        raise ToolError("tools", "this model's chat template shows no tool-calling format this server reads (it "
                                 "reads Hermes' <tool_call> format, as Qwen2.5's template teaches)")
    names = [tool.function.name for tool in tools]
    if len(set(names)) < len(names):
        twice = next(name for name in names if names.count(name) > 1)
        raise ToolError("tools", f"two tools are named {twice!r}")
    if choice == "none":
        return ToolUse()
    shown = [tool.model_dump(exclude_none=True) for tool in tools]
    reading, one = Reading(fmt, frozenset(names)), req.parallel_tool_calls is False
    if choice in (None, "auto"):
        return ToolUse(shown, reading, None, (fmt.close,) if one else ())
    if isinstance(choice, s.NamedToolChoice):
        if choice.function.name not in names:
            raise ToolError("tool_choice.function.name", f"no tool is named {choice.function.name[:64]!r}")
        tools, one = [tool for tool in tools if tool.function.name == choice.function.name], True
    return ToolUse(shown, reading, Structure.grammar(forced_calls(fmt, tools, one, added)))


def forced_calls(fmt: ToolFormat, tools: list[s.Tool], one: bool, added: Collection[str]) -> str:
    """A Lark grammar (llguidance's, with `%json` for each tool's arguments) of one call of one of `tools`, or of
    one or more calls, in the format's layout (json.dumps's separators, as the template writes calls)."""
    def literal(text: str) -> str:
        return text if text in added else json.dumps(text)  # an added token is matched as that token, `<name>`

    sep = json.dumps(fmt.sep)  # may also end the calls: a model that writes it after each call may then stop
    rules = [f"start: call{'' if one else f' ({sep} call)* {sep}?'}",
             f"call: {literal(fmt.open)} {json.dumps(fmt.pad + '{')} ({' | '.join(f'f{i}' for i in range(len(tools)))})"
             f" {json.dumps('}' + fmt.pad)} {literal(fmt.close)}"]
    for i, tool in enumerate(tools):
        schema = dict(tool.function.parameters or {"type": "object", "properties": {}})
        schema.setdefault("x-guidance", JSON_LAYOUT)
        rules += [f"f{i}: {json.dumps(json.dumps('name') + ': ' + json.dumps(tool.function.name) + ', ')}"
                  f" {json.dumps(json.dumps('arguments') + ': ')} a{i}",
                  f"a{i}: %json {json.dumps(schema)}"]
    return "\n".join(rules)


def template_messages(messages: list[s.ChatMessage], developer: str) -> list[dict]:
    """The conversation as chat templates read it: a call's arguments as an object (templates write them with
    `tojson`), a tool message's `tool_call_id`; OpenAI's "developer" role as `developer` names it."""
    out = []
    for i, message in enumerate(messages):
        entry: dict = {"role": developer if message.role == "developer" else message.role, "content": message.text()}
        if message.tool_calls:
            entry["tool_calls"] = [_template_call(call, f"messages.{i}.tool_calls.{j}.function.arguments")
                                   for j, call in enumerate(message.tool_calls)]
        if message.tool_call_id is not None:
            entry["tool_call_id"] = message.tool_call_id
        out.append(entry)
    return out


def _template_call(call: s.ToolCall, param: str) -> dict:
    try:
        arguments = json.loads(call.function.arguments)
    except json.JSONDecodeError as error:
        raise ToolError(param, f"a call's arguments must be JSON text of an object: {error}") from None
    if not isinstance(arguments, dict):
        raise ToolError(param, f"a call's arguments must be a JSON object, got {type(arguments).__name__}")
    body = {"type": "function", "function": {"name": call.function.name, "arguments": arguments}}
    return body if call.id is None else {"id": call.id, **body}


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # JSON text of an object

    def reply(self) -> s.ReplyCall:
        return s.ReplyCall(id="call_" + uuid.uuid4().hex[:24],
                           function=s.ReplyFunction(name=self.name, arguments=self.arguments))


class CallReader:
    """Reads calls out of one reply's text as it arrives. Text before a call passes through; whitespace and a tail
    that may begin a call are held until what follows shows whether a call opens there (whitespace before a call,
    and between calls, is the layout's, not content). A call's text is held until it closes and comes out as a
    Call, or, when it is not {"name": str, "arguments": object} JSON, as the text it was."""

    def __init__(self, reading: Reading):
        self.fmt, self.names, self.held, self.inside, self.calls = reading.fmt, reading.names, "", False, 0
        self.spoke = False  # text has come out: whitespace after a call then separates it from what follows
        self.bare = True  # all the reply's text so far may begin a bare call: it is held

    def feed(self, text: str) -> list[str | Call]:
        self.held += text
        if self.bare:
            self.bare = _may_be_bare(self.held.lstrip())
            if self.bare:
                return []
        out: list[str | Call] = []
        while True:
            if self.inside:
                end = self.held.find(self.fmt.close)
                if end < 0:
                    return out
                body, self.held, self.inside = self.held[:end], self.held[end + len(self.fmt.close):], False
                call = _call(body)
                if call is None:
                    out += self._text(self.fmt.open + body + self.fmt.close)
                else:
                    out.append(call)
                    self.calls += 1
                continue
            start = self.held.find(self.fmt.open)
            if start >= 0:
                out += self._text(self.held[:start].rstrip())
                self.held, self.inside = self.held[start + len(self.fmt.open):], True
                continue
            cut = _settled(self.held, self.fmt.open)
            out += self._text(self.held[:cut])
            self.held = self.held[cut:]
            return out

    def close(self) -> list[str | Call]:
        """The end of the reply: what is held is text (a call that never closed is the text it was), or a bare
        call."""
        if self.bare:
            self.bare = False
            call = _bare_call(self.held, self.names)
            if call is not None:
                self.calls, self.held = 1, ""
                return [call]
            return self.feed("") + self.close()
        held = (self.fmt.open if self.inside else "") + self.held
        self.held, self.inside = "", False
        return self._text(held.rstrip() if self.calls else held)

    def _text(self, text: str) -> list[str | Call]:
        if self.calls and not self.spoke:
            text = text.lstrip()  # the layout between calls, or after the first
        if not text:
            return []
        self.spoke = True
        return [text]


def read_pieces(reading: Reading | None, text: str) -> list[str | Call]:
    """A whole reply's text and calls in the order written (reading None: no tools, the text alone)."""
    if reading is None:
        return [text]
    reader = CallReader(reading)
    return reader.feed(text) + reader.close()


def read_calls(reading: Reading, text: str) -> tuple[str | None, list[Call]]:
    """A whole reply's (content, calls): content None when the reply is calls alone."""
    pieces = read_pieces(reading, text)
    calls = [piece for piece in pieces if isinstance(piece, Call)]
    content = "".join(piece for piece in pieces if isinstance(piece, str))
    return (content or None) if calls else content, calls


def _settled(text: str, marker: str) -> int:
    """How much of `text` is content whatever follows: all but a trailing run of whitespace or a tail that begins
    `marker` (with the whitespace before it)."""
    cut = len(text)
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            cut = len(text) - size
            break
    return len(text[:cut].rstrip())


_FENCES = ("```json", "```")


def _may_be_bare(text: str) -> bool:
    """Whether a reply beginning with `text` (whitespace stripped) may be one bare call: JSON, alone or fenced."""
    if any(fence.startswith(text) for fence in _FENCES):
        return True
    if text.startswith("```"):
        head, newline, text = text.partition("\n")
        if head.rstrip() not in _FENCES:
            return False
        if not newline:
            return True
        text = text.lstrip()
    return text[:1] in ("", "{")


def _bare_call(text: str, names: frozenset[str]) -> Call | None:
    """The call a whole reply is, when it is one {"name": NAME, "arguments": {...}} of an offered tool, alone or in
    a ```json fence."""
    text = text.strip()
    if text.startswith("```"):
        if not text.endswith("```") or len(text) < 6:
            return None
        text = text[3:-3].removeprefix("json")
    call = _call(text)
    return call if call is not None and call.name in names else None


def _call(body: str) -> Call | None:
    """The call `body` writes: {"name": str, "arguments": object or its JSON text}. Qwen2.5's template shows the
    format as `{{"name": ..., "arguments": ...}}` (its braces doubled inside a Jinja string), and its models may
    write calls so, or double the first brace only: such a body is read without the extra braces."""
    body = body.strip()
    undoubled = [body[1:-1], body[1:]] if body.startswith("{{") else []
    for text in (body, *undoubled):
        try:
            value = json.loads(text)
            break
        except json.JSONDecodeError:
            continue
    else:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters"))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return Call(value["name"], json.dumps(arguments, ensure_ascii=False))
