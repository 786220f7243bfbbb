"""Tool calls (server/protocol/tools.py): calls read out of a reply whole and as it streams (every split gives the
same), the grammar of forced calls (the format's layout, the tool's argument schema, one or many calls), the
conversation as templates read it, and a request's tools checked against each other and the template."""
from __future__ import annotations

import json
import random

import llguidance
import pytest

from specdecode.core.structured import Grammars, grammar_text
from specdecode.server.protocol import schemas as s
from specdecode.server.protocol.tools import (
    HERMES,
    Call,
    CallReader,
    Reading,
    ToolError,
    forced_calls,
    read_calls,
    template_messages,
    tool_use,
)
from tests.tiny import TOOL_TEMPLATE, byte_tokenizer

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                          "required": ["city"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"],
    "additionalProperties": False}}}
PARIS = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SUM = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
READING = Reading(HERMES, frozenset({"get_weather", "add", "café"}))

READS = [  # reply text -> (content, [(name, arguments)])
    ("Hello world", ("Hello world", [])),
    ("  padded  \n", ("  padded  \n", [])),  # no call: the text exactly as written
    ("Let me look.\n\n" + PARIS, ("Let me look.", [("get_weather", '{"city": "Paris"}')])),
    (PARIS + "\n" + SUM + "\n", (None, [("get_weather", '{"city": "Paris"}'), ("add", '{"a": 1, "b": 2}')])),
    ("Done. Now " + SUM + " then more", ("Done. Now then more", [("add", '{"a": 1, "b": 2}')])),
    ('<tool_call>{"name":"add","arguments":"{\\"a\\": 1, \\"b\\": 2}"}</tool_call>',  # arguments as JSON text
     (None, [("add", '{"a": 1, "b": 2}')])),
    ('<tool_call>\n{"name": "add", "arguments": {bad}}\n</tool_call>',  # not JSON: the text it was
     ('<tool_call>\n{"name": "add", "arguments": {bad}}\n</tool_call>', [])),
    ('<tool_call>\n{"name": "add", "arguments": [1]}\n</tool_call>', ('<tool_call>\n{"name": "add", "arguments": [1]}'
                                                                     '\n</tool_call>', [])),
    ('<tool_call>\n{"name": "add", "argu', ('<tool_call>\n{"name": "add", "argu', [])),  # cut by max_tokens
    ("x <tool_ y", ("x <tool_ y", [])),
    ('<tool_call>{"name": "café", "arguments": {"q": "ü"}}</tool_call>', (None, [("café", '{"q": "ü"}')])),
    # a bare call (as Qwen2.5-Coder writes them under "auto"): the whole reply, fenced or not, naming an offered tool
    ('```json\n{\n  "name": "add",\n  "arguments": {"a": 1, "b": 2}\n}\n```\n', (None, [("add", '{"a": 1, "b": 2}')])),
    (' {"name": "add", "arguments": {"a": 1}}', (None, [("add", '{"a": 1}')])),
    ('{"name": "mul", "arguments": {}}', ('{"name": "mul", "arguments": {}}', [])),  # no such tool: text
    ('{"name": "add", "arguments": {}} and then', ('{"name": "add", "arguments": {}} and then', [])),
    ('```json\n{"a": 1}\n```', ('```json\n{"a": 1}\n```', [])),
    ("```python\nprint(1)\n```", ("```python\nprint(1)\n```", [])),
    # Qwen2.5's template shows the call's braces doubled, and its models may write them so
    ('{{"name": "add", "arguments": {"a": 1}}}', (None, [("add", '{"a": 1}')])),
    ('<tool_call>\n{{"name": "add", "arguments": {}}}\n</tool_call>', (None, [("add", "{}")])),
    ('{{"name": "add", "arguments": {"a": 1}}', (None, [("add", '{"a": 1}')])),  # the first brace doubled only
    ('{{"name": "add", "arguments": {"a": 1}', ('{{"name": "add", "arguments": {"a": 1}', [])),
    ("`x` is {1}", ("`x` is {1}", [])),
]


@pytest.mark.parametrize("text,expected", READS)
def test_calls_are_read_whole_and_in_every_split_alike(text, expected):
    content, calls = read_calls(READING, text)
    assert (content, [(call.name, call.arguments) for call in calls]) == expected
    rng = random.Random(0)
    for _ in range(40):
        reader, pieces, at = CallReader(READING), [], 0
        while at < len(text):
            step = rng.randint(1, 6)
            pieces += reader.feed(text[at:at + step])
            at += step
        pieces += reader.close()
        streamed = [piece for piece in pieces if isinstance(piece, Call)]
        joined = "".join(piece for piece in pieces if isinstance(piece, str))
        assert streamed == calls and (joined or None if calls else joined) == content


def test_text_that_may_begin_a_call_is_held_until_it_shows_it_does_not():
    reader = CallReader(READING)
    assert reader.feed("Sure, <tool") == ["Sure,"]  # " <tool" may open a call
    assert reader.feed("box>") == [" <toolbox>"]
    assert reader.feed(" ok ") == [" ok"]
    assert reader.close() == [" "]
    fenced = CallReader(READING)  # a reply that may be a bare call is held whole, up to the first sign it is not
    assert fenced.feed("```") == [] and fenced.feed("json\n{") == [] and fenced.close() == ["```json\n{"]
    code = CallReader(READING)
    assert code.feed("```") == [] and code.feed("py") == ["```py"]


@pytest.fixture(scope="module")
def grammars():
    tokenizer = byte_tokenizer()
    return tokenizer, Grammars(tokenizer, len(tokenizer), [tokenizer.eos_token_id])


def accepts(grammars, grammar: str, text: str) -> bool:
    tokenizer, compiled = grammars
    matcher = llguidance.LLMatcher(compiled.tokenizer, grammar_text(s.Structure.grammar(grammar)), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return all(matcher.consume_token(token) for token in tokenizer(text)["input_ids"]) and matcher.is_accepting()


def tools(*defs) -> list[s.Tool]:
    return [s.Tool.model_validate(one) for one in defs]


def test_forced_calls_take_the_format_and_each_tools_schema(grammars):
    many = forced_calls(HERMES, tools(WEATHER, ADD), one=False, added=set())
    assert accepts(grammars, many, PARIS)
    assert accepts(grammars, many, PARIS + "\n" + SUM)
    assert accepts(grammars, many, PARIS + "\n" + SUM + "\n")  # the separator may also end the calls
    assert not accepts(grammars, many, PARIS.replace("Paris", "1").replace('"1"', "1"))  # city is a string
    assert not accepts(grammars, many, SUM.replace("add", "mul"))  # no such tool
    assert not accepts(grammars, many, SUM.replace('{"a"', '{"a" '))  # the template's layout: json.dumps'
    assert not accepts(grammars, many, "Sure. " + PARIS)
    one = forced_calls(HERMES, tools(WEATHER, ADD), one=True, added=set())
    assert accepts(grammars, one, SUM) and not accepts(grammars, one, PARIS + "\n" + SUM)


def test_markers_that_are_added_tokens_are_matched_as_those_tokens():
    """Qwen2.5's <tool_call> is an added token: llguidance matches it as the token (`<tool_call>`), never as text."""
    grammar = forced_calls(HERMES, tools(ADD), one=True, added={"<tool_call>", "</tool_call>"})
    assert 'call: <tool_call> "\\n{"' in grammar and "</tool_call>\n" in grammar
    assert '"<tool_call>"' in forced_calls(HERMES, tools(ADD), one=True, added=set())


def request(**fields) -> s.ChatCompletionRequest:
    return s.ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                   **fields})


def test_tool_use_by_tool_choice():
    assert tool_use(request(), HERMES, set()).tools is None
    auto = tool_use(request(tools=[WEATHER, ADD]), HERMES, set())
    assert [tool["function"]["name"] for tool in auto.tools] == ["get_weather", "add"]
    assert auto.reading == READING.__class__(HERMES, frozenset({"get_weather", "add"}))
    assert auto.structure is None and auto.stop_after == ()
    assert tool_use(request(tools=[ADD], parallel_tool_calls=False), HERMES, set()).stop_after == ("</tool_call>",)
    assert tool_use(request(tools=[ADD], tool_choice="none"), HERMES, set()).tools is None
    named = tool_use(request(tools=[WEATHER, ADD], tool_choice={"type": "function", "function": {"name": "add"}}),
                     HERMES, set())
    assert named.structure is not None and '\\"add\\"' in named.structure.text
    assert "get_weather" not in named.structure.text and "call)*" not in named.structure.text
    assert "call)*" in tool_use(request(tools=[ADD], tool_choice="required"), HERMES, set()).structure.text


@pytest.mark.parametrize("fields,fmt,param", [
    ({"tools": [WEATHER]}, None, "tools"),  # the template shows no calling format
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "add", "arguments": "{}"}}]}]}, None,
     "messages.0.tool_calls"),
    ({"tool_choice": "required"}, HERMES, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "add"}}}, HERMES,
     "tool_choice.function.name"),
    ({"tools": [ADD, ADD]}, HERMES, "tools"),
])
def test_tools_the_server_cannot_serve_are_errors_naming_the_field(fields, fmt, param):
    with pytest.raises(ToolError) as caught:
        tool_use(request(**fields), fmt, set())
    assert caught.value.param == param


def test_the_conversation_as_templates_read_it():
    messages = [s.ChatMessage.model_validate(one) for one in [
        {"role": "developer", "content": "be brief"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "3"}]]
    assert template_messages(messages, "system") == [
        {"role": "system", "content": "be brief"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
        {"role": "tool", "content": "3", "tool_call_id": "c1"}]
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = TOOL_TEMPLATE
    text = tokenizer.apply_chat_template(template_messages(messages, "system"), tools=[ADD], tokenize=False)
    assert SUM in text and json.dumps(ADD) in text
    for arguments in ("[1, 2]", "not json"):
        bad = s.ChatMessage.model_validate({"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": arguments}}]})
        with pytest.raises(ToolError) as caught:
            template_messages([bad], "system")
        assert caught.value.param == "messages.0.tool_calls.0.function.arguments"
