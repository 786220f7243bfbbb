"""The OpenAI-compatible server on a tiny random Llama: a real uvicorn server on 127.0.0.1, the official `openai`
client (streaming and not), raw HTTP for malformed requests, 429 from a full queue, client disconnects, and
a failing request that fails alone."""
from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from specdecode.config import DrafterConfig
from specdecode.core.drafting import Draft
from specdecode.core.target import Target
from specdecode.drafters import build_drafter
from specdecode.drafters.common.base import BaseDrafter
from specdecode.server.scheduling.policy import CostTable, SpecPolicy
from tests.e2e.server_util import MODEL, SPEC, chat_ids, reference, serving, tiny_service, wait_idle
from tests.tiny import CHAT_TEMPLATE, byte_tokenizer


class Exploding(BaseDrafter):
    """A drafter that raises: requests that choose it must fail, and only they."""

    name = "explode"

    def propose(self, seqs):
        raise RuntimeError("drafter exploded")


class BadCleanup(BaseDrafter):
    """Drafts nothing, then raises when its sequence leaves: the request still completes, the row is freed."""

    name = "bad-cleanup"

    def propose(self, seqs):
        return [Draft() for _ in seqs]

    def finish(self, seq):
        raise RuntimeError("cleanup failed")


@pytest.fixture(scope="module")
def server(tiny_target):
    drafters = {name: build_drafter(tiny_target, DrafterConfig(name=name), SPEC)
                for name in ("prompt-lookup", "layer-skip")}
    service = tiny_service(tiny_target, {**drafters, "explode": Exploding(), "bad-cleanup": BadCleanup()})
    with serving(service) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def one_row_server(tiny_target):
    """One batch row and one queue slot: the second waiting request is refused."""
    with serving(tiny_service(tiny_target, max_batch=1, max_queue=1)) as running:
        yield running


def _state(server) -> dict:
    return httpx.get(server.url + "/health").json()


def _free_rows(server) -> list[int]:
    return sorted(server.app.state.service.scheduler.engine._free_rows)


def test_models_health_and_metrics(server, client, tiny_target):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert _state(server)["status"] == "ok"
    client.completions.create(model=MODEL, prompt="metrics please", max_tokens=4, temperature=0)
    text = httpx.get(server.url + "/metrics").text
    for name in ("specdecode_requests_total", "specdecode_generated_tokens_total", "specdecode_target_passes_total",
                 "specdecode_acceptance_rate_bucket", "specdecode_tau_bucket", "specdecode_queue_depth",
                 "specdecode_time_to_first_token_seconds_bucket", "specdecode_time_per_output_token_seconds_bucket"):
        assert name in text, name
    assert 'specdecode_requests_total{endpoint="completions",status="200"}' in text
    assert client.models.retrieve(MODEL).id == MODEL  # GET /v1/models/{model}
    context = tiny_target.max_positions  # vLLM's max_model_len, which clients size their prompts by
    assert client.models.retrieve(MODEL).max_model_len == context == client.models.list().data[0].max_model_len
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


@pytest.mark.parametrize("drafter", [None, "none", "layer-skip"])
def test_completion_equals_single_request_greedy(tiny_target, client, drafter):
    prompt = "The quick brown fox jumps over the lazy dog. The quick brown"
    expected = reference(tiny_target, tiny_target.tokenizer(prompt)["input_ids"], 24)
    extra = {} if drafter is None else {"speculation": {"drafter": drafter}}
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, extra_body=extra)
    assert reply.choices[0].text == expected.text
    assert reply.usage.completion_tokens == len(expected.token_ids)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.usage.drafter == (drafter or "prompt-lookup")
    assert 1.0 <= reply.usage.tau <= SPEC.k + 1
    assert reply.choices[0].finish_reason == ("stop" if expected.finish_reason == "eos" else "length")


def test_chat_stream_equals_single_request_greedy(tiny_target, client):
    content = "Write a haiku about the sea."
    expected = reference(tiny_target, chat_ids(tiny_target.tokenizer, content), 20, "layer-skip")
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=20, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"speculation": {"drafter": "layer-skip", "k": 3}}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["stop" if expected.finish_reason == "eos" else "length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(expected.token_ids)
    assert chunks[-1].usage.tau >= 1.0


def test_completion_stream_and_stop_string(tiny_target, client):
    prompt = "Once upon a time"
    ids = tiny_target.tokenizer(prompt)["input_ids"]
    full = reference(tiny_target, ids, 24)
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 2]
    expected = reference(tiny_target, ids, 24, stop=(stop,))
    assert stop and expected.text == full.text[: full.text.find(stop)]
    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=[stop],
                                       stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == expected.text
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].choices[0].stop_reason == stop  # vLLM's: which stop ended it
    assert all("stop_reason" not in c.choices[0].model_extra for c in chunks[:-1])  # absent until then
    kept = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=[stop, "\x00"],
                                     extra_body={"include_stop_str_in_output": True})  # vLLM's: the stop string kept
    assert kept.choices[0].text == expected.text + stop and kept.choices[0].finish_reason == "stop"
    assert kept.choices[0].stop_reason == stop
    assert "stop_reason" not in client.completions.create(model=MODEL, prompt=prompt, max_tokens=24,
                                                          temperature=0).choices[0].model_extra


def test_stop_token_ids_end_the_text_like_eos(tiny_target, client):
    """vLLM's stop_token_ids: the first of them ends the text, kept (as EOS is), whatever ignore_eos says; speculation
    on, the tokens are plain greedy decoding's up to there."""
    ids = tiny_target.tokenizer("Once upon a time")["input_ids"]
    full = reference(tiny_target, ids, 24, stop_on_eos=False).token_ids
    at = 10
    ended = client.completions.create(model=MODEL, prompt=ids, max_tokens=24, temperature=0,
                                      extra_body={"stop_token_ids": [full[at]], "ignore_eos": True})
    first = full.index(full[at])
    assert ended.usage.completion_tokens == first + 1 and ended.choices[0].finish_reason == "stop"
    assert ended.choices[0].stop_reason == full[at]
    assert ended.choices[0].text == tiny_target.tokenizer.decode(full[: first + 1], skip_special_tokens=True)
    # vLLM's min_tokens: no end before it; speculation on or off (k 0), the same text
    held = [client.completions.create(model=MODEL, prompt=ids, max_tokens=24, temperature=0, extra_body={
        "stop_token_ids": [full[at]], "min_tokens": first + 2, "speculation": {"k": k}}) for k in (None, 0)]
    assert held[0].choices[0].text == held[1].choices[0].text
    assert held[0].usage.completion_tokens >= first + 2
    for extra in ({"min_tokens": 25}, {"min_tokens": 2, "structured_outputs": {"regex": "[a-z]+"}}):
        answer = httpx.post(f"{client.base_url}completions", json={"model": MODEL, "prompt": "x", "max_tokens": 24,
                                                                   **extra})
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "min_tokens", answer.text


def test_chat_template_options(tiny_model):
    """vLLM's: continue_final_message continues the last assistant message (the reply is plain greedy decoding of
    the template's open-ended prompt), add_generation_prompt false leaves the turn unopened, chat_template_kwargs
    reach the template; a kwarg the request's own fields set, or a final message that is not an assistant's, is a
    400."""
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = "{% if persona %}<|persona|>{{ persona }}\n{% endif %}" + CHAT_TEMPLATE
    target = Target(tiny_model, tokenizer)
    opened = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is"}]

    def ids(messages, **options) -> list[int]:
        encoded = tokenizer.apply_chat_template(messages, tokenize=True, **options)
        return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)

    with serving(tiny_service(target)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)

        def ask(messages, **extra):
            return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0,
                                                  extra_body=extra)

        prompt = ids(opened, continue_final_message=True)
        assert tokenizer.decode(prompt).endswith("The colour is")
        reply = ask(opened, continue_final_message=True)
        assert reply.usage.prompt_tokens == len(prompt)
        assert reply.choices[0].message.content == reference(target, prompt, 12).text
        assert ask(opened[:1], add_generation_prompt=False).usage.prompt_tokens == len(ids(opened[:1]))
        assert ask(opened[:1], chat_template_kwargs={"persona": "a pirate"}).usage.prompt_tokens == len(
            ids(opened[:1], add_generation_prompt=True, persona="a pirate"))
        for extra, param in [({"continue_final_message": True}, "continue_final_message"),
                             ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs.tools"),
                             ({"chat_template_kwargs": {"add_generation_prompt": False}},
                              "chat_template_kwargs.add_generation_prompt")]:
            answer = httpx.post(server.url + "/v1/chat/completions",
                                json={"model": MODEL, "messages": opened[:1], "max_tokens": 2, **extra})
            assert answer.status_code == 400 and answer.json()["error"]["param"] == param
        both = httpx.post(server.url + "/v1/chat/completions", json={
            "model": MODEL, "messages": opened, "max_tokens": 2, "continue_final_message": True,
            "add_generation_prompt": True})
        assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"


def test_tokenize_and_detokenize(server, tiny_target):
    """vLLM's /tokenize gives the tokens the completion endpoints would decode from (a prompt with its special
    tokens, or a conversation through the template) and /detokenize their text; bad input is a 400 naming it."""
    tokenizer = tiny_target.tokenizer
    messages = [{"role": "user", "content": "Hi there"}]

    def post(path: str, **body):
        return httpx.post(server.url + path, json={"model": MODEL, **body})

    text = post("/tokenize", prompt="Hello", return_token_strs=True).json()
    assert text["tokens"] == tokenizer("Hello")["input_ids"] and text["count"] == len(text["tokens"])
    assert text["max_model_len"] == tiny_target.max_positions and "".join(text["token_strs"]) == "Hello"
    assert post("/tokenize", prompt="Hello", add_special_tokens=False).json()["tokens"] == tokenizer(
        "Hello", add_special_tokens=False)["input_ids"]
    chat = post("/tokenize", messages=messages).json()
    assert chat["tokens"] == chat_ids(tokenizer, "Hi there") and "token_strs" not in chat
    reply = httpx.post(server.url + "/v1/chat/completions", json={"model": MODEL, "messages": messages,
                                                                 "max_tokens": 1}).json()
    assert reply["usage"]["prompt_tokens"] == chat["count"]
    assert post("/detokenize", tokens=text["tokens"]).json() == {"prompt": tokenizer.decode(text["tokens"])}
    for path, body, param in [("/tokenize", {}, "prompt"), ("/tokenize", {"prompt": "a", "messages": messages},
                                                            "messages"),
                              ("/tokenize", {"messages": messages, "tools": [{"type": "function", "function": {
                                  "name": "f"}}]}, "tools"),
                              ("/detokenize", {"tokens": [10**6]}, "tokens"), ("/detokenize", {}, "tokens")]:
        answer = post(path, **body)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param, (path, answer.text)
    assert httpx.post(server.url + "/tokenize", json={"model": "other", "prompt": "a"}).status_code == 404


def test_seeded_sampling_is_reproducible(client):
    kwargs = dict(model=MODEL, prompt="Dear Sir or Madam,", max_tokens=16, temperature=0.9, top_p=0.9, seed=11)
    first, second = (client.completions.create(**kwargs).choices[0].text for _ in range(2))
    assert first == second


BAD_REQUESTS = [
    (b"{", 400, "invalid_json", None),
    (b"[1, 2]", 400, "invalid_type", None),
    (b'{"model": "tiny"}', 400, "missing_field", "prompt"),
    (b'{"model": "tiny", "prompt": "x", "max_tokens": "5"}', 400, "invalid_value", "max_tokens"),
    (b'{"model": "tiny", "prompt": "x", "max_tokens": 2.5}', 400, "invalid_value", "max_tokens"),
    (b'{"model": "tiny", "prompt": "x", "stream": "yes"}', 400, "invalid_value", "stream"),
    (b'{"model": "tiny", "prompt": "x", "temperature": "hot"}', 400, "invalid_value", "temperature"),
    (b'{"model": "tiny", "prompt": "x", "stop": [1, 2]}', 400, "invalid_value", "stop"),
    (b'{"model": "tiny", "prompt": "x", "speculation": {"k": "3"}}', 400, "invalid_value", "speculation.k"),
    (b'{"model": "tiny", "prompt": "x", "speculation": {"drafter": "nope"}}', 400, "invalid_value",
     "speculation.drafter"),
    (b'{"model": "tiny", "prompt": "x", "max_tokens": 0}', 400, "invalid_value", "max_tokens"),
    (b'{"model": "tiny", "prompt": "x", "max_tokens": -3}', 400, "invalid_value", "max_tokens"),
    (b'{"model": "tiny", "prompt": "x", "max_tokens": 100000}', 400, "context_length_exceeded", "max_tokens"),
    (b'{"model": "tiny", "prompt": "x", "n": 0}', 400, "invalid_value", "n"),
    (b'{"model": "tiny", "prompt": "x", "n": 129}', 400, "invalid_value", "n"),
    (b'{"model": "tiny", "prompt": "x", "logprobs": 21}', 400, "invalid_value", "logprobs"),
    (b'{"model": "tiny", "prompt": "x", "presence_penalty": 2.5}', 400, "invalid_value", "presence_penalty"),
    (b'{"model": "tiny", "prompt": "x", "logit_bias": {"abc": 1}}', 400, "invalid_value", "logit_bias"),
    (b'{"model": "tiny", "prompt": "x", "logit_bias": {"999999": 1}}', 400, "invalid_value", "logit_bias"),
    (b'{"model": "tiny", "prompt": "x", "logit_bias": {"5": 101}}', 400, "invalid_value", "logit_bias"),
    (b'{"model": "tiny", "prompt": "x", "logit_bias": {"5": "up"}}', 400, "invalid_value", "logit_bias.5"),
    # str.isdigit() admits these and int() refuses them: a 500 once
    ('{"model": "tiny", "prompt": "x", "logit_bias": {"\u00b2": 1}}'.encode(), 400, "invalid_value", "logit_bias"),
    ('{"model": "tiny", "prompt": "x", "logit_bias": {"\u2460": 1}}'.encode(), 400, "invalid_value", "logit_bias"),
    (b'{"model": "tiny", "prompt": "x", "logit_bias": {"' + b"7" * 5000 + b'": 1}}', 400, "invalid_value",
     "logit_bias"),
    (b'{"model": "tiny", "prompt": "x", "logit_bias": {" 5": 1}}', 400, "invalid_value", "logit_bias"),
    (b'{"model": "tiny", "prompt": "", "max_tokens": 2}', 400, "invalid_value", "prompt"),
    (b'{"model": "tiny", "prompt": [999999]}', 400, "invalid_value", "prompt"),
    (b'{"model": "gpt-4", "prompt": "x"}', 404, "model_not_found", "model"),
    (b'{"model": "tiny", "prompt": "x", "seed": 1180591620717411303424}', 400, "invalid_value", "seed"),
    (b'{"model": "tiny", "prompt": [[1, 2], []]}', 400, "invalid_value", "prompt"),
    (b'{"model": "tiny", "prompt": "x", "logprobs": true}', 400, "invalid_value", "logprobs"),  # a count here
    (b'{"model": "tiny", "prompt": "x", "min_p": 1.2}', 400, "invalid_value", "min_p"),
    (b'{"model": "tiny", "prompt": "x", "repetition_penalty": 0}', 400, "invalid_value", "repetition_penalty"),
    (b'{"model": "tiny", "prompt": "x", "repetition_penalty": 5e-324}', 400, "invalid_value", "repetition_penalty"),
    (b'{"model": "tiny", "prompt": "' + b"x" * 1100 + b'"}', 400, "context_length_exceeded", "prompt"),
    # chat's name for max_tokens, and keys our extensions do not know: each was ignored
    (b'{"model": "tiny", "prompt": "x", "max_completion_tokens": 3}', 400, "unsupported", "max_completion_tokens"),
    (b'{"model": "tiny", "prompt": "x", "speculation": {"drafer": "none"}}', 400, "unknown_field",
     "speculation.drafer"),
    (b'{"model": "tiny", "prompt": "x", "structured_outputs": {"regx": "a"}}', 400, "unknown_field",
     "structured_outputs.regx"),
]


@pytest.mark.parametrize("body,status,code,param", BAD_REQUESTS)
def test_malformed_completion_requests(server, body, status, code, param):
    reply = httpx.post(server.url + "/v1/completions", content=body, headers={"Content-Type": "application/json"})
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["param"]) == (code, param)
    assert error["message"] and "\n" not in error["message"]


@pytest.mark.parametrize("body,param", [
    ({"model": MODEL, "messages": []}, "messages"),
    ({"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
    ({"model": MODEL, "messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0},
     "max_completion_tokens"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
     "tools.0.function"),
    ({"model": MODEL, "messages": ["hi"]}, "messages.0"),
    ({"model": MODEL, "messages": [{"role": "user", "content": None}]}, "messages.0.content"),
    ({"model": MODEL, "messages": [{"role": "user"}]}, "messages.0.content"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi", "name": "bob"}]}, "messages.0.name"),
    ({"model": MODEL, "messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
                                   {"role": "user", "content": "hi"}]}, "messages.0.tool_calls.0.function"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "functions": [{"name": "f"}]}, "functions"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "high"},
     "reasoning_effort"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "modalities": ["text", "audio"]},
     "modalities"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "max_completion_tokens": 3},
     "max_completion_tokens"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x" * 1100}]}, "messages"),
])
def test_malformed_chat_requests(server, body, param):
    reply = httpx.post(server.url + "/v1/chat/completions", json=body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param
    assert "\n" not in reply.json()["error"]["message"]


@pytest.mark.parametrize("path,fields", [
    ("/v1/completions", {"prompt": "x", "stop": ""}),
    ("/v1/completions", {"prompt": "x", "stop": ["a", ""]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stop": ""}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stop": [""]}),
], ids=["completions-str", "completions-list", "chat-str", "chat-list"])
def test_an_empty_stop_string_is_a_400_naming_stop(server, path, fields):
    """An empty stop string matches everywhere: it was dropped without a word, where the library refuses it."""
    reply = httpx.post(server.url + path, json={"model": MODEL, "max_tokens": 2, **fields})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "stop", "invalid_value")
    assert "empty" in error["message"] and "\n" not in error["message"]


@pytest.mark.parametrize("messages,param", [
    ([{"role": "user", "content": []}], "messages.0.content"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": []}, {"role": "user", "content": "again"}],
     "messages.1.content"),
], ids=["user", "assistant"])
def test_an_empty_content_array_is_a_400_naming_the_message(server, messages, param):
    """OpenAI refuses a content array of no parts; it was read as an empty text. An empty string stays a text."""
    for path in ("/v1/chat/completions", "/tokenize"):
        reply = httpx.post(server.url + path, json={"model": MODEL, "max_tokens": 2, "messages": messages})
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert (error["param"], error["code"]) == (param, "invalid_value")
        assert "empty" in error["message"] and "\n" not in error["message"]
    emptied = [{**m, "content": ""} if m["content"] == [] else m for m in messages]
    reply = httpx.post(server.url + "/v1/chat/completions", json={"model": MODEL, "max_tokens": 2, "messages": emptied})
    assert reply.status_code == 200, reply.text


def test_unsupported_fields_at_their_neutral_value_are_accepted(server):
    body = {"model": MODEL, "messages": [{"role": "assistant", "content": None}, {"role": "user", "content": "hi"}],
            "max_tokens": 2, "max_completion_tokens": 2, "temperature": 0, "logprobs": False, "modalities": ["text"],
            "repetition_penalty": 1, "min_p": 0, "stop_token_ids": [], "seed": -1}
    reply = httpx.post(server.url + "/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] <= 2


def test_penalties_and_bias_change_the_output_and_stay_lossless(server, client):
    """OpenAI's penalties and logit_bias and vLLM's repetition_penalty and min_p are applied (the greedy text
    changes) and speculation keeps the output: the same text with speculation off (speculation.k 0)."""
    def ask(**extra):
        reply = client.completions.create(model=MODEL, prompt="the cat sat on the mat. the cat", max_tokens=24,
                                          temperature=0, **extra)
        return reply.choices[0].text

    plain = ask()
    penalties = dict(frequency_penalty=1.0, presence_penalty=0.5, logit_bias={"5": -100, "17": 3})
    penalized = ask(**penalties, extra_body={"repetition_penalty": 1.3})
    assert penalized != plain
    assert penalized == ask(**penalties, extra_body={"repetition_penalty": 1.3, "speculation": {"k": 0}})
    sampled = client.completions.create(model=MODEL, prompt="x", max_tokens=4, temperature=0.8, seed=3,
                                        extra_body={"min_p": 0.1})
    assert sampled.usage.completion_tokens == 4


def test_unknown_fields_are_ignored_and_openai_client_errors_are_typed(server, client):
    reply = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2,
                                                             "temperature": 0, "some_proxy_field": {"a": [1]}})
    assert reply.status_code == 200, reply.text
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="x")
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="x", max_tokens=0)
    assert httpx.get(server.url + "/v1/nothing-here").json()["error"]["type"] == "not_found_error"


def test_failing_request_fails_alone(tiny_target, server, client):
    prompt = "Why is the sky blue? Explain briefly."
    expected = reference(tiny_target, tiny_target.tokenizer(prompt)["input_ids"], 40, stop_on_eos=False)
    assert len(expected.token_ids) == 40
    good = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0, stream=True,
                                     extra_body={"ignore_eos": True})
    first = next(iter(good))  # the good request is in the batch when the bad one arrives
    with pytest.raises(openai.APIError, match="exploded"):
        list(client.completions.create(model=MODEL, prompt="boom", max_tokens=8, temperature=0, stream=True,
                                       extra_body={"speculation": {"drafter": "explode"}}))
    reply = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "boom", "max_tokens": 8,
                                                             "speculation": {"drafter": "explode"}})
    assert reply.status_code == 500 and "exploded" in reply.json()["error"]["message"]
    assert first.choices[0].text + "".join(c.choices[0].text for c in good) == expected.text
    again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0,
                                      extra_body={"ignore_eos": True, "speculation": {"drafter": "bad-cleanup"}})
    assert again.choices[0].text == expected.text  # a drafter whose cleanup raises still serves its request
    wait_idle(server)
    assert _free_rows(server) == list(range(8))


def test_full_queue_answers_429_and_disconnects_free_rows(one_row_server):
    url = one_row_server.url + "/v1/completions"
    body = {"model": MODEL, "prompt": "hold the row", "max_tokens": 900, "temperature": 0, "stream": True,
            "ignore_eos": True, "speculation": {"drafter": "none"}}
    with httpx.Client(timeout=30) as first, httpx.Client(timeout=30) as second:
        with first.stream("POST", url, json=body) as running:
            lines = running.iter_lines()
            assert next(lines).startswith("data: ")  # the row is taken and decoding
            with second.stream("POST", url, json=body) as waiting:
                deadline = time.monotonic() + 5
                while _state(one_row_server)["queued"] < 1:
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
                refused = httpx.post(url, json=body)
                assert refused.status_code == 429
                assert refused.json()["error"]["type"] == "rate_limit_error"
                assert refused.headers["retry-after"] == "1"
                assert waiting.status_code == 200
        # both clients hung up mid-stream: the rows and the queue empty within a step or so
        state = wait_idle(one_row_server, timeout=3.0)
    assert state == {"status": "ok", "active": 0, "queued": 0}
    assert _free_rows(one_row_server) == [0]
    metrics = httpx.get(one_row_server.url + "/metrics").text
    assert 'specdecode_generations_total{reason="abort"}' in metrics


def test_non_streaming_disconnect_frees_row(one_row_server):
    body = {"model": MODEL, "prompt": "hold the row", "max_tokens": 900, "temperature": 0, "ignore_eos": True,
            "speculation": {"drafter": "none"}}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(one_row_server.url + "/v1/completions", json=body, timeout=httpx.Timeout(30, read=0.5))
    wait_idle(one_row_server, timeout=3.0)
    reply = httpx.post(one_row_server.url + "/v1/completions", json={**body, "max_tokens": 3})
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] <= 3


def test_sse_wire_format(server):
    body = {"model": MODEL, "prompt": "wire", "max_tokens": 3, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body) as reply:
        assert reply.headers["content-type"].startswith("text/event-stream")
        events = [line for line in reply.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"text_completion"} and len({c["id"] for c in chunks}) == 1


def test_seeded_sampling_does_not_depend_on_load(tiny_target):
    """The K policy caps K by batch size; a seeded sampled request's random draws depend on K, so it keeps its own
    K: the same seed gives the same text alone and beside another request. This cost table makes K = 4 pay at
    batch 1 and K = 0 at batch 2."""
    table = CostTable(batches=(1, 2), qs=(1, 5), ms=((100.0, 100.0), (100.0, 10_000.0)))
    service = tiny_service(tiny_target, policy=SpecPolicy(table, max_k=4))
    body = {"model": MODEL, "prompt": "a b c a b c a b", "max_tokens": 24, "temperature": 0.9, "seed": 5,
            "ignore_eos": True, "speculation": {"drafter": "layer-skip"}}
    busy = {"model": MODEL, "prompt": "busy", "max_tokens": 900, "temperature": 0, "stream": True,
            "ignore_eos": True, "speculation": {"drafter": "none"}}
    with serving(service) as running:
        url = running.url + "/v1/completions"
        alone = httpx.post(url, json=body).json()["choices"][0]["text"]
        with httpx.stream("POST", url, json=busy, timeout=30) as other:
            assert next(other.iter_lines()).startswith("data: ")  # the other request is decoding
            beside = httpx.post(url, json=body, timeout=60).json()["choices"][0]["text"]
    assert beside == alone


def test_prompt_forms_and_developer_role(tiny_target, server):
    """A batch of one prompt of token ids is that prompt; a "developer" message is a system message to a template
    that does not know the role (OpenAI renamed system to developer)."""
    ids = tiny_target.tokenizer("The quick brown fox")["input_ids"]
    texts = [httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 6,
                                                              "temperature": 0}).json()["choices"][0]["text"]
             for prompt in (ids, [ids])]
    assert texts[0] == texts[1]
    chats = [httpx.post(server.url + "/v1/chat/completions", json={
        "model": MODEL, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
        "messages": [{"role": role, "content": "Be brief."}, {"role": "user", "content": "hi"}]}).json()
        for role in ("system", "developer")]
    assert chats[0]["usage"]["prompt_tokens"] == chats[1]["usage"]["prompt_tokens"]
    assert chats[0]["choices"][0]["message"] == chats[1]["choices"][0]["message"]


def test_oversized_body_is_413_whether_declared_or_streamed(server):
    body = b'{"model": "tiny", "prompt": "' + b"x" * (9 << 20) + b'"}'
    json_type = {"Content-Type": "application/json"}
    declared = httpx.post(server.url + "/v1/completions", content=body, headers=json_type, timeout=30)
    streamed = httpx.post(server.url + "/v1/completions", headers=json_type, timeout=30,
                          content=(body[i:i + (1 << 20)] for i in range(0, len(body), 1 << 20)))
    for reply in (declared, streamed):
        assert reply.status_code == 413, reply.text
        assert reply.json()["error"]["code"] == "request_too_large"
    assert _state(server)["status"] == "ok"


def test_a_zero_length_names_echo_only_where_the_request_has_it(server):
    """max_tokens 0 is allowed with completions' echo alone: a chat request's 400 does not send its client to a
    field it lacks (a Responses request with max_output_tokens 0 read the same)."""
    chat = httpx.post(server.url + "/v1/chat/completions", json={"model": MODEL, "max_tokens": 0,
                                                                   "messages": [{"role": "user", "content": "hi"}]})
    completion = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 0})
    assert chat.status_code == completion.status_code == 400
    assert "echo" not in chat.json()["error"]["message"] and "echo" in completion.json()["error"]["message"]
