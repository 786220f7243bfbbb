"""Structured outputs and logprobs through the server, with the official `openai` client (tiny random Llama, byte
tokenizer): response_format json_schema gives valid JSON for 20 prompts, logprobs equal plain decoding's (in
streams too), bad schemas and regexes are 400s naming the field, and a schema that cannot be finished within
max_tokens ends with finish_reason "length"."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig, Structure
from specdecode.core.engine import Engine
from specdecode.core.target import Target
from specdecode.drafters import build_drafter
from tests.e2e.server_util import MODEL, PROMPTS, SPEC, chat_ids, serving, tiny_service
from tests.tiny import byte_tokenizer_without, tiny_llama

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
    ({"structured_outputs": {"regx": "a+"}}, "structured_outputs.regx"),  # a misspelt key was ignored
    ({"structured_outputs": {"choice": ["a"], "disable_any_whitespace": True}},
     "structured_outputs.disable_any_whitespace"),
    ({"speculation": {"drafer": "none"}}, "speculation.drafer"),
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


# -- the whole of Unicode ----------------------------------------------------------------------------------------------
UNICODE = {  # the tiny byte tokenizer holds every byte: all of these can be generated
    "bmp": Structure.choice(["caf\u00e9", "\u4e2d\u6587", "\u00bd"]),
    "astral": Structure.choice(["\U0008de9b", "\U00041234\U0001f600"]),  # U+40000-U+BFFFF: a 500 once
    "astral class": Structure.regex("[\U00040000-\U000bffff]{2}"),
    "combining marks": Structure.choice(["e\u0301t\u00e9", "n\u0303o\u0308"]),
}


@pytest.mark.parametrize("kind", list(UNICODE))
def test_unicode_structures_equal_plain_constrained_decoding(server, tiny_target, tiny_tokenizer, kind):
    structure = UNICODE[kind]
    field = {"choice": json.loads(structure.text)} if structure.kind == "choice" else {"regex": structure.text}
    body = {"model": MODEL, "prompt": PROMPTS[2], "max_tokens": 24, "temperature": 0, "structured_outputs": field}
    reply = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    reference = plain(tiny_target, tiny_tokenizer(PROMPTS[2])["input_ids"], 24, structure)
    assert reply.json()["choices"][0]["text"] == reference.text


def test_surrogate_escapes_in_the_json_body(server, tiny_target, tiny_tokenizer):
    """A surrogate pair written as JSON escapes is the astral character it spells; a lone surrogate is a 400."""
    body = json.dumps({"model": MODEL, "prompt": PROMPTS[2], "max_tokens": 8, "temperature": 0,
                       "structured_outputs": {"choice": ["PAIR"]}}).replace("PAIR", "\\ud9f7\\ude9b")
    reply = httpx.post(server.url + "/v1/completions", content=body.encode(), timeout=60,
                       headers={"Content-Type": "application/json"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"] == "\U0008de9b"
    lone = body.replace("\\ud9f7\\ude9b", "\\ud800")
    refused = httpx.post(server.url + "/v1/completions", content=lone.encode(), timeout=60,
                         headers={"Content-Type": "application/json"})
    assert refused.status_code == 400, refused.text


@pytest.fixture(scope="module")
def lacking_server():
    """A tiny model whose tokenizer holds no token with the bytes 0xF1 and 0xF2 (as SmolLM2's)."""
    target = Target(tiny_llama(), byte_tokenizer_without(0xF1, 0xF2))
    with serving(tiny_service(target)) as running:
        yield running


def test_text_the_tokenizer_cannot_produce_is_a_400_not_a_500(lacking_server):
    """Needed from the start: refused when checked, naming the character. Needed after a choice the model made:
    that request ends with a 400 (an error event when streamed) and the server goes on."""
    url = lacking_server.url + "/v1/completions"
    ask = {"model": MODEL, "prompt": "Hi", "max_tokens": 8, "temperature": 0}
    refused = httpx.post(url, json={**ask, "structured_outputs": {"choice": ["\U0008de9b"]}}, timeout=60)
    assert refused.status_code == 400 and "U+8DE9B" in refused.json()["error"]["message"]
    assert refused.json()["error"]["param"] == "structured_outputs.choice"
    late = {**ask, "structured_outputs": {"choice": ["ab\U0008de9b", "ac\U00041234"]}}
    failed = httpx.post(url, json=late, timeout=60)
    assert failed.status_code == 400 and "cannot produce" in failed.json()["error"]["message"], failed.text
    assert failed.json()["error"]["code"] == "structure_not_followed"
    streamed = httpx.post(url, json={**late, "stream": True}, timeout=60)
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert events[-1]["error"]["type"] == "invalid_request_error" and "cannot produce" in events[-1]["error"]["message"]
    assert httpx.post(url, json={**ask, "structured_outputs": {"choice": ["ok"]}}, timeout=60).json()[
        "choices"][0]["text"] == "ok"
