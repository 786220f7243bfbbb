"""`speculation.trace`: a stream that asks for it gets each step's tokens with their origins (the playground's
colours); one that does not gets the bytes it got before the field existed. The server runs the tiny model with an
Oracle drafter whose drafts are known, so every origin is asserted exactly."""
from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from specdecode.core.logprobs import TokenLogprob
from specdecode.server.protocol.replies import Choice, Reply, sse
from specdecode.server.scheduling.scheduler import Finished, RequestStats, StepTrace, TextDelta, Ticket
from tests.e2e.server_util import MODEL, reference, serving, tiny_service
from tests.fakes import Oracle

PROMPT = "Count the drafts"
TOKENS = 10


# -- the bytes of a stream that does not ask ---------------------------------------------------------------------------
def _events(logprobs: bool) -> list:
    """A step of two tokens, one whose text is held back, one more, the end; each carrying its trace."""
    lp = (lambda *ts: tuple(TokenLogprob(t, -0.5 * t) for t in ts)) if logprobs else (lambda *ts: None)
    return [TextDelta("ab", (1, 2), lp(1, 2), StepTrace(("draft", "correction"), 4, 4, 1)),
            TextDelta("", (3,), lp(3), StepTrace(("target",), 0, 0, 0)),
            TextDelta("cd", (4,), lp(4), StepTrace(("bonus",), 4, 0, 0)),
            Finished("length", RequestStats(3, 4, 3, 1.3333, 0.5, "prompt-lookup", 0, proposed=4))]


def _stream(chat: bool, include_usage: bool, logprobs: bool, trace: bool) -> str:
    async def collect() -> str:
        ticket = Ticket(None, asyncio.get_running_loop())  # type: ignore[arg-type]
        reply = Reply("tiny", chat, lambda token: f"<{token}>")
        reply.id, reply.created = "x", 0
        for event in _events(logprobs):
            ticket.post(event)
        return "".join([piece async for piece in sse([Choice(ticket)], reply, 1, include_usage, trace)])

    return asyncio.run(collect())


# written by the server before `speculation.trace` existed, from the same events without their traces
BEFORE = {
    (False, False, True):
        'data: {"id":"x","object":"text_completion","created":0,"model":"tiny","choices":[{"index":0,"text":"ab",'
        '"logprobs":{"tokens":["<1>","<2>"],"token_logprobs":[-0.5,-1.0],"top_logprobs":null,"text_offset":[0,3]},'
        '"finish_reason":null}]}\n\n'
        'data: {"id":"x","object":"text_completion","created":0,"model":"tiny","choices":[{"index":0,"text":"",'
        '"logprobs":{"tokens":["<3>"],"token_logprobs":[-1.5],"top_logprobs":null,"text_offset":[6]},'
        '"finish_reason":null}]}\n\n'
        'data: {"id":"x","object":"text_completion","created":0,"model":"tiny","choices":[{"index":0,"text":"cd",'
        '"logprobs":{"tokens":["<4>"],"token_logprobs":[-2.0],"top_logprobs":null,"text_offset":[9]},'
        '"finish_reason":null}]}\n\n'
        'data: {"id":"x","object":"text_completion","created":0,"model":"tiny","choices":[{"index":0,"text":"",'
        '"logprobs":null,"finish_reason":"length"}]}\n\n'
        'data: [DONE]\n\n',
    (True, True, False):
        'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"tiny","choices":[{"index":0,'
        '"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
        'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"tiny","choices":[{"index":0,'
        '"delta":{"role":null,"content":"ab"},"logprobs":null,"finish_reason":null}]}\n\n'
        'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"tiny","choices":[{"index":0,'
        '"delta":{"role":null,"content":"cd"},"logprobs":null,"finish_reason":null}]}\n\n'
        'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"tiny","choices":[{"index":0,'
        '"delta":{"role":null,"content":""},"logprobs":null,"finish_reason":"length"}]}\n\n'
        'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"tiny","choices":[],"usage":'
        '{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7,"tau":1.3333,"target_passes":3,'
        '"acceptance_rate":0.5,"drafter":"prompt-lookup","forced_tokens":0,'
        '"prompt_tokens_details":{"cached_tokens":0}}}\n\n'
        'data: [DONE]\n\n',
}


@pytest.mark.parametrize("chat, include_usage, logprobs", sorted(BEFORE))
def test_a_stream_that_does_not_ask_keeps_its_bytes(chat, include_usage, logprobs):
    assert _stream(chat, include_usage, logprobs, trace=False) == BEFORE[chat, include_usage, logprobs]


def _chunks(sse: str) -> list[dict]:
    events = [line[6:] for line in sse.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(event) for event in events[:-1]]


@pytest.mark.parametrize("chat", [False, True])
def test_a_traced_stream_adds_the_field_and_the_held_back_steps(chat):
    """The same chunks plus `speculation`, and a chunk for the step whose text was held back."""
    plain, traced = _chunks(_stream(chat, True, True, False)), _chunks(_stream(chat, True, True, True))
    fields = [chunk.pop("speculation", None) for chunk in traced]
    held = 2 if chat else 1  # the step with no text (it has logprobs, so it was sent already)
    assert traced == plain and len(plain) == (6 if chat else 5)
    assert fields[held]["tokens"] == [{"id": 3, "text": "<3>", "origin": "target", "position": 1, "logprob": -1.5}]
    assert fields[held - 1] == {"k": 4, "drafted": 4, "accepted": 1, "tokens": [
        {"id": 1, "text": "<1>", "origin": "draft", "position": 1, "logprob": -0.5},
        {"id": 2, "text": "<2>", "origin": "correction", "position": 2, "logprob": -1.0}]}
    assert [f is None for f in fields] == [c["choices"] == [] or c["choices"][0]["finish_reason"] is not None
                                          or c["choices"][0].get("delta", {}).get("role") == "assistant"
                                          for c in plain]
    # without logprobs the held-back step is sent for its tokens alone, with empty text
    bare = _chunks(_stream(chat, False, False, True))
    steps = [chunk for chunk in bare if "speculation" in chunk]
    assert [len(chunk["speculation"]["tokens"]) for chunk in steps] == [2, 1, 1]
    assert "logprob" not in steps[0]["speculation"]["tokens"][0]
    assert (steps[1]["choices"][0]["delta"]["content"] if chat else steps[1]["choices"][0]["text"]) == ""


# -- on a real server --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tiny_target):
    ids = tiny_target.tokenizer(PROMPT)["input_ids"]
    expected = ids + reference(tiny_target, ids, TOKENS, stop_on_eos=False).token_ids
    drafters = {"oracle": Oracle(expected, right=2, vocab=tiny_target.vocab_size)}
    with serving(tiny_service(tiny_target, drafters, default="oracle")) as running:
        yield running


def _post(server, body: dict) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", json={"model": MODEL, **body}, timeout=60)


def _traced(server, body: dict) -> list[dict]:
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                      json={"model": MODEL, "stream": True, **body}) as reply:
        assert reply.status_code == 200
        return _chunks(reply.read().decode())


def test_each_token_is_named_by_its_origin(server, tiny_target):
    """K = 4, the third draft token always wrong: the first token is the target's alone, two steps keep two draft
    tokens and the target's correction, then three tokens are left: two drafted, both kept, and the bonus (as the
    server's spec-decode counters count them)."""
    body = {"prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True, "logprobs": 0,
            "speculation": {"trace": True}}
    chunks = _traced(server, body)
    steps = [chunk["speculation"] for chunk in chunks if "speculation" in chunk]
    assert [[t["origin"] for t in step["tokens"]] for step in steps] == [["target"]] + [
        ["draft", "draft", "correction"]] * 2 + [["draft", "draft", "bonus"]]
    assert [(step["k"], step["drafted"], step["accepted"]) for step in steps] == [(0, 0, 0)] + [(4, 4, 2)] * 2 + [
        (2, 2, 2)]
    assert all(t["position"] == i + 1 for step in steps for i, t in enumerate(step["tokens"]))
    ids = tiny_target.tokenizer(PROMPT)["input_ids"]
    expected = reference(tiny_target, ids, TOKENS, stop_on_eos=False)
    assert [t["id"] for step in steps for t in step["tokens"]] == expected.token_ids
    text = "".join(chunk["choices"][0]["text"] for chunk in chunks if chunk["choices"])
    assert text == expected.text
    logprobs = [lp for chunk in chunks if chunk["choices"] and (c := chunk["choices"][0])["logprobs"]
                for lp in c["logprobs"]["token_logprobs"]]
    assert [t["logprob"] for step in steps for t in step["tokens"]] == logprobs
    untraced = _traced(server, {**body, "speculation": {}})
    assert all("speculation" not in chunk for chunk in untraced)
    assert "".join(chunk["choices"][0]["text"] for chunk in untraced if chunk["choices"]) == text


def test_grammar_forced_tokens_are_named(server):
    """Without a drafter the grammar's forced chain is the draft: its tokens are "grammar", as many as usage's
    forced_tokens."""
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 3}}, "required": ["answer"]}
    structure = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    chunks = _traced(server, {"prompt": "JSON:", "max_tokens": 24, "temperature": 0, "response_format": structure,
                              "stream_options": {"include_usage": True},
                              "speculation": {"drafter": "none", "trace": True}})
    origins = [t["origin"] for chunk in chunks if "speculation" in chunk for t in chunk["speculation"]["tokens"]]
    forced = chunks[-1]["usage"]["forced_tokens"]
    assert forced > 0 and origins.count("grammar") == forced
    assert set(origins) <= {"grammar", "bonus", "target"}


@pytest.mark.parametrize("speculation, stream, message", [
    ({"trace": "yes"}, True, "speculation.trace"),
    ({"trace": 1}, True, "speculation.trace"),
    ({"trace": True}, False, 'speculation.trace needs "stream": true'),
])
def test_bad_trace_requests_are_400s(server, speculation, stream, message):
    reply = _post(server, {"prompt": "x", "max_tokens": 2, "stream": stream, "speculation": speculation})
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["param"] == "speculation.trace" and message in error["message"]
    assert "\n" not in error["message"]


def test_the_openai_client_reads_a_traced_stream(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True, "speculation": {"trace": True}}))
    traces = [chunk.model_extra["speculation"] for chunk in chunks if "speculation" in (chunk.model_extra or {})]
    assert sum(len(trace["tokens"]) for trace in traces) == 4
