"""Structured outputs and logprobs through the server, with the official `openai` client (tiny random Llama, byte
tokenizer): response_format json_schema gives valid JSON for 20 prompts, logprobs equal plain decoding's (in
streams too), bad schemas and regexes are 400s naming the field, and a schema that cannot be finished within
max_tokens ends with finish_reason "length"."""
from __future__ import annotations

import json

import openai
import pytest

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig, Structure
from specdecode.core.engine import Engine
from specdecode.drafters import build_drafter
from tests.e2e.server_util import MODEL, PROMPTS, SPEC, chat_ids, serving, tiny_service

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "kind": {"enum": ["person", "company", "other"]}},
          "required": ["name", "age", "kind"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "entity", "schema": SCHEMA, "strict": True}}
PROMPTS_20 = (PROMPTS + [f"Extract the entity from document {i}." for i in range(20)])[:20]
TOLERANCE = 1e-4  # fp32 passes of different widths (tests/e2e/test_structured_greedy.py)


@pytest.fixture(scope="module")
def server(tiny_target):
    with serving(tiny_service(tiny_target)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def plain(target, prompt_ids: list[int], max_tokens: int, structure: Structure | None = None, logprobs: int = 0):
    """The request decoded alone without speculation: tokens and logprobs to compare against."""
    engine = Engine(target, build_drafter(target, DrafterConfig(name="none"), SPEC), SpecConfig(k=4), max_batch=1)
    return engine.generate(prompt_ids, SamplingConfig(),
                           GenerationConfig(max_tokens, structure=structure, logprobs=logprobs))


def valid(text: str) -> bool:
    value = json.loads(text)
    return (set(value) == {"name", "age", "kind"} and isinstance(value["name"], str) and len(value["name"]) <= 8
            and isinstance(value["age"], int) and 0 <= value["age"] <= 120
            and value["kind"] in ("person", "company", "other"))


def test_json_schema_gives_valid_json_for_20_prompts(client):
    forced = 0
    for prompt in PROMPTS_20:
        reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                               temperature=0, max_tokens=160, response_format=FORMAT)
        choice = reply.choices[0]
        assert choice.finish_reason == "stop" and valid(choice.message.content), choice.message.content
        forced += reply.usage.model_extra["forced_tokens"]
    assert forced > 0  # the grammar drafted the keys and punctuation


def test_completions_take_response_format_and_the_vllm_extension(client, tiny_target, tiny_tokenizer):
    prompt = PROMPTS[1]
    reply = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=16,
                                      extra_body={"structured_outputs": {"choice": ["alpha", "beta", "gamma"]}})
    assert reply.choices[0].text in ("alpha", "beta", "gamma")
    reference = plain(tiny_target, tiny_tokenizer(prompt)["input_ids"], 16,
                      Structure.choice(["alpha", "beta", "gamma"]))
    assert reply.choices[0].text == reference.text
    reply = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=160,
                                      extra_body={"response_format": {"type": "json_object"}})
    assert isinstance(json.loads(reply.choices[0].text), dict)


def test_chat_logprobs_equal_plain_decoding_also_streamed(client, tiny_target, tiny_tokenizer):
    prompt = PROMPTS[3]
    reference = plain(tiny_target, chat_ids(tiny_tokenizer, prompt), 24, logprobs=3)
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                           temperature=0, max_tokens=24, logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == len(reference.token_ids) == reply.usage.completion_tokens
    for entry, expected in zip(content, reference.logprobs):
        assert entry.token == tiny_tokenizer.decode([expected.token])
        assert abs(entry.logprob - expected.logprob) <= TOLERANCE
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].logprob >= entry.logprob - TOLERANCE
        assert bytes(entry.bytes) == entry.token.encode("utf-8")
    streamed = []
    for chunk in client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                                temperature=0, max_tokens=24, logprobs=True, top_logprobs=3,
                                                stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed.extend(chunk.choices[0].logprobs.content)
    assert [e.token for e in streamed] == [e.token for e in content]
    assert max(abs(a.logprob - b.logprob) for a, b in zip(streamed, content)) <= TOLERANCE


def test_completion_logprobs_equal_plain_decoding(client, tiny_target, tiny_tokenizer):
    prompt = PROMPTS[0]
    reference = plain(tiny_target, tiny_tokenizer(prompt)["input_ids"], 20, logprobs=2)
    reply = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=20, logprobs=2)
    logprobs = reply.choices[0].logprobs
    assert len(logprobs.token_logprobs) == len(reference.logprobs)
    assert max(abs(a - b.logprob) for a, b in zip(logprobs.token_logprobs, reference.logprobs)) <= TOLERANCE
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)
    assert logprobs.text_offset[0] == 0 and "".join(logprobs.tokens) == reply.choices[0].text


def test_logprobs_of_a_structured_reply_list_only_allowed_tokens(client):
    """Where the grammar forces a token, its alternatives are -inf: they are left out (JSON has no -inf)."""
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "go"}], temperature=0,
                                           max_tokens=160, response_format=FORMAT, logprobs=True, top_logprobs=5)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert content[0].token == "{" and content[0].logprob == 0.0 and len(content[0].top_logprobs) == 1
    assert all(len(entry.top_logprobs) <= 5 for entry in content)


def test_structure_under_sampling_is_valid(client):
    for seed in range(3):
        reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "go"}],
                                               temperature=1.0, seed=seed, max_tokens=160, response_format=FORMAT)
        assert valid(reply.choices[0].message.content)


def test_a_schema_that_cannot_finish_ends_with_length(client):
    long = {"type": "object", "properties": {"text": {"type": "string", "minLength": 200}}, "required": ["text"]}
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], temperature=0, max_tokens=12,
        response_format={"type": "json_schema", "json_schema": {"name": "long", "schema": long}})
    assert reply.choices[0].finish_reason == "length"


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
      "properties": {"a": {"$ref": "#/definitions/missing"}}}}}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"grammar": "start: nothing_defined"}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"grammar": "0"}}, "structured_outputs.grammar"),  # neither Lark nor GBNF
    ({"structured_outputs": {"regex": "a+"}, "guided_choice": ["a"]}, "structured_outputs.regex, guided_choice"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
])
def test_bad_structures_are_400s_naming_the_field(client, extra, param):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                       extra_body=extra)
    body = error.value.body
    assert body["param"] == param and "\n" not in body["message"], body


def test_server_still_serves_after_bad_requests(client):
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4)
    assert reply.choices[0].finish_reason in ("stop", "length")
