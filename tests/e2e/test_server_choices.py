"""Many choices in one request on a real server (127.0.0.1, tiny model): `n` per prompt, a batch of prompts in
/v1/completions and `echo`, in bodies and streams. Each choice is its own row, so each must equal that request
decoded alone: greedy choices the plain greedy text, seeded choice j the single request with seed + j."""
from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import openai
import pytest
import torch

from specdecode.server.app import _submit
from specdecode.server.protocol.errors import APIError
from specdecode.server.protocol.replies import usage
from specdecode.server.scheduling.scheduler import QueueFull, RequestStats
from tests.e2e.server_util import MODEL, chat_ids, reference, serving, tiny_service, wait_idle

PROMPTS = ["Once upon a time", "The cat sat on"]


@pytest.fixture(scope="module")
def server(tiny_target):
    with serving(tiny_service(tiny_target, max_batch=4, max_queue=8)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _ids(tiny_target, text: str) -> list[int]:
    return [int(i) for i in tiny_target.tokenizer(text)["input_ids"]]


def _post(server, body: dict) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", json={"model": MODEL, **body}, timeout=60)


def _events(server, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", server.url + path, json={"model": MODEL, "stream": True, **body}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        lines = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_greedy_choices_of_a_batch_are_each_prompts_plain_greedy_text(server, client, tiny_target):
    reply = client.completions.create(model=MODEL, prompt=PROMPTS, n=3, max_tokens=12, temperature=0)
    assert [c.index for c in reply.choices] == list(range(6))
    expected = [reference(tiny_target, _ids(tiny_target, p), 12).text for p in PROMPTS]
    assert [c.text for c in reply.choices] == [expected[0]] * 3 + [expected[1]] * 3
    assert reply.usage.prompt_tokens == sum(len(_ids(tiny_target, p)) for p in PROMPTS)  # each prompt once
    assert reply.usage.completion_tokens == 6 * 12
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 6 * 12


def test_seeded_choice_j_is_the_request_with_seed_plus_j(server):
    sampled = {"prompt": PROMPTS[0], "max_tokens": 16, "temperature": 1.0, "seed": 7}
    many = _post(server, {**sampled, "n": 3}).json()["choices"]
    alone = [_post(server, {**sampled, "seed": 7 + j}).json()["choices"][0]["text"] for j in range(3)]
    assert [c["text"] for c in many] == alone
    assert len(set(alone)) > 1  # the choices are not one draw repeated
    assert [c["text"] for c in _post(server, {**sampled, "n": 3}).json()["choices"]] == alone  # reproducible


def test_the_largest_seed_wraps_for_later_choices(server):
    top = (1 << 64) - 1
    sampled = {"prompt": PROMPTS[0], "max_tokens": 8, "temperature": 1.0}
    many = _post(server, {**sampled, "n": 2, "seed": top}).json()["choices"]
    assert many[1]["text"] == _post(server, {**sampled, "seed": 0}).json()["choices"][0]["text"]


def test_a_stream_of_many_choices_carries_each_by_its_index(server, tiny_target):
    body = {"prompt": PROMPTS, "n": 2, "max_tokens": 10, "temperature": 0, "stream_options": {"include_usage": True}}
    chunks = _events(server, "/v1/completions", body)
    texts: dict[int, str] = {}
    finishes: dict[int, list] = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
        if choice["finish_reason"]:
            finishes.setdefault(choice["index"], []).append(choice["finish_reason"])
    expected = [reference(tiny_target, _ids(tiny_target, p), 10).text for p in PROMPTS]
    assert texts == {0: expected[0], 1: expected[0], 2: expected[1], 3: expected[1]}
    assert finishes == {i: ["length"] for i in range(4)}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 40
    assert len({chunk["id"] for chunk in chunks}) == 1


def test_chat_choices_stream_each_with_its_role(server, tiny_target):
    body = {"messages": [{"role": "user", "content": "hello"}], "n": 2, "max_tokens": 6, "temperature": 0}
    chunks = _events(server, "/v1/chat/completions", body)
    roles = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["delta"].get("role") == "assistant"]
    assert roles == [0, 1]
    expected = reference(tiny_target, chat_ids(tiny_target.tokenizer, "hello"), 6).text
    for index in (0, 1):
        parts = [c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"][0]["index"] == index]
        assert "".join(parts) == expected


def test_echo_leads_each_choice_with_its_prompt(server, tiny_target):
    generated = [reference(tiny_target, _ids(tiny_target, p), 8).text for p in PROMPTS]
    reply = _post(server, {"prompt": PROMPTS, "echo": True, "max_tokens": 8, "temperature": 0}).json()
    assert [c["text"] for c in reply["choices"]] == [p + g for p, g in zip(PROMPTS, generated)]
    ids = _ids(tiny_target, PROMPTS[1])  # token ids echo as their text
    reply = _post(server, {"prompt": [ids], "echo": True, "max_tokens": 8, "temperature": 0}).json()
    assert reply["choices"][0]["text"] == tiny_target.tokenizer.decode(ids) + generated[1]
    chunks = _events(server, "/v1/completions", {"prompt": PROMPTS[0], "echo": True, "max_tokens": 8,
                                                 "temperature": 0})
    assert chunks[0]["choices"][0]["text"] == PROMPTS[0]
    assert "".join(c["choices"][0]["text"] for c in chunks) == PROMPTS[0] + generated[0]


def test_more_choices_than_the_queue_holds_is_a_400(server):
    reply = _post(server, {"prompt": PROMPTS, "n": 5, "max_tokens": 2})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "n" and "10 choices" in reply.json()["error"]["message"]


def test_a_refused_choice_takes_back_those_already_queued():
    class Scheduler:
        def __init__(self):
            self.calls = 0

        def submit(self, ticket):
            self.calls += 1
            if self.calls == 3:
                raise QueueFull("too many requests waiting")

    tickets = [SimpleNamespace(cancelled=False) for _ in range(4)]
    for ticket in tickets:
        ticket.cancel = lambda t=ticket: setattr(t, "cancelled", True)
    with pytest.raises(APIError) as refused:
        _submit(SimpleNamespace(scheduler=Scheduler()), tickets)
    assert refused.value.status == 429
    assert [t.cancelled for t in tickets] == [True, True, False, False]


def test_usage_sums_choices_and_counts_each_prompt_once():
    def stats(prompt, done, passes, proposed, rate, cached=0):
        return RequestStats(prompt, done, passes, round(done / passes, 4), rate, "suffix", 0, cached, proposed)

    total = usage([stats(5, 8, 4, 6, 0.5, 2), stats(5, 6, 6, 0, 0.0), stats(7, 10, 2, 12, 0.75, 0),
                   stats(7, 4, 4, 0, 0.0, 3)], n=2)
    assert (total.prompt_tokens, total.completion_tokens, total.total_tokens) == (12, 28, 40)
    assert (total.target_passes, total.tau, total.acceptance_rate) == (16, round(28 / 16, 4), round(12 / 18, 4))
    assert total.prompt_tokens_details.cached_tokens == 2
    single = usage([stats(5, 8, 4, 6, 0.5)])
    assert (single.tau, single.acceptance_rate, single.drafter) == (2.0, 0.5, "suffix")



def _aborted(server) -> float:
    metrics = httpx.get(server.url + "/metrics").text
    return sum(float(line.split()[-1]) for line in metrics.splitlines()
               if line.startswith('specdecode_generations_total{reason="abort"}'))


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_hangs_up_frees_every_choices_row(server, stream):
    """Six choices on four rows (two queued): a client gone mid-answer frees the rows and the queue."""
    body = {"model": MODEL, "prompt": PROMPTS, "n": 3, "max_tokens": 900, "temperature": 0, "ignore_eos": True,
            "speculation": {"drafter": "none"}, "stream": stream}
    aborted = _aborted(server)
    if stream:
        with httpx.Client(timeout=30) as client, client.stream("POST", server.url + "/v1/completions",
                                                               json=body) as running:
            lines = running.iter_lines()
            assert next(lines).startswith("data: {")
            assert httpx.get(server.url + "/health").json() == {"status": "ok", "active": 4, "queued": 2}
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/v1/completions", json=body, timeout=httpx.Timeout(30, read=0.5))
    wait_idle(server, timeout=3.0)  # well before the 5 s the six choices take
    engine = server.app.state.service.scheduler.engine
    assert sorted(engine._free_rows) == [0, 1, 2, 3]
    assert _aborted(server) == aborted + 4  # the rows that ran; the two queued never started


def _prompt_logprobs(model, ids: list[int]) -> torch.Tensor:
    """The model's own log-softmax over a whole prompt in one forward: row i scores ids[i + 1]."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


@pytest.mark.parametrize("words", [3, 30])  # one prefill pass; three chunks (690 tokens: over 256)
def test_echo_with_logprobs_scores_the_prompt(server, tiny_target, tiny_model, words):
    text = " ".join(["the cat sat on the mat"] * words)
    ids = _ids(tiny_target, text)
    reply = _post(server, {"prompt": text, "echo": True, "logprobs": 2, "max_tokens": 0}).json()
    (choice,) = reply["choices"]
    assert choice["text"] == text and choice["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == 0 and reply["usage"]["prompt_tokens"] == len(ids)
    logprobs = choice["logprobs"]
    token_text = [tiny_target.tokenizer.decode([t]) for t in ids]
    assert logprobs["tokens"] == token_text
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    expected = _prompt_logprobs(tiny_model, ids)
    got = torch.tensor(logprobs["token_logprobs"][1:])
    assert torch.allclose(got, expected[torch.arange(len(ids) - 1), torch.tensor(ids[1:])], atol=1e-4)
    best = torch.tensor([max(top.values()) for top in logprobs["top_logprobs"][1:]])  # (texts may repeat in a dict)
    assert torch.allclose(best, expected[:-1].max(dim=-1).values, atol=1e-4)
    assert logprobs["text_offset"] == [sum(map(len, token_text[:i])) for i in range(len(ids))]


def test_echo_with_logprobs_then_generates(server, tiny_target):
    prompt = PROMPTS[0]
    ids = _ids(tiny_target, prompt)
    plain = _post(server, {"prompt": prompt, "logprobs": 1, "max_tokens": 6, "temperature": 0}).json()["choices"][0]
    echoed = _post(server, {"prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 6,
                            "temperature": 0}).json()["choices"][0]
    assert echoed["text"] == prompt + plain["text"]
    assert echoed["logprobs"]["tokens"][len(ids):] == plain["logprobs"]["tokens"]
    assert torch.allclose(torch.tensor(echoed["logprobs"]["token_logprobs"][len(ids):]),  # passes of other widths
                          torch.tensor(plain["logprobs"]["token_logprobs"]), atol=1e-4)
    chunks = _events(server, "/v1/completions", {"prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 6,
                                                 "temperature": 0})
    assert chunks[0]["choices"][0]["text"] == prompt
    assert chunks[0]["choices"][0]["logprobs"]["tokens"] == echoed["logprobs"]["tokens"][: len(ids)]
    streamed = [logprob for chunk in chunks if chunk["choices"][0]["logprobs"]
                for logprob in chunk["choices"][0]["logprobs"]["token_logprobs"]]
    assert streamed[0] is None and len(streamed) == len(ids) + 6
    assert torch.allclose(torch.tensor(streamed[1:]), torch.tensor(echoed["logprobs"]["token_logprobs"][1:]), atol=1e-4)


def test_max_tokens_zero_needs_echo(server):
    reply = _post(server, {"prompt": "x", "max_tokens": 0})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "max_tokens"


def test_an_evaluation_harness_request(server, tiny_target, tiny_model):
    """lm-evaluation-harness's `local-completions` scores continuations with a batch of token-id prompts, `echo`,
    `logprobs: 1` and one generated token, then reads each choice's `token_logprobs[context:-1]` by its index and
    calls a continuation greedy when each of its logprobs is the largest in its `top_logprobs`."""
    context = _ids(tiny_target, "The cat sat")
    greedy_tail = reference(tiny_target, context, 3, stop_on_eos=False).token_ids
    continuations = [_ids(tiny_target, " on the mat"), list(greedy_tail)]
    prompts = [context + continuation for continuation in continuations]
    body = {"prompt": prompts, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0, "seed": 1234}
    choices = sorted(_post(server, body).json()["choices"], key=lambda choice: choice["index"])
    assert [len(c["logprobs"]["token_logprobs"]) for c in choices] == [len(p) + 1 for p in prompts]
    for choice, prompt, continuation in zip(choices, prompts, continuations):
        scored = choice["logprobs"]["token_logprobs"][len(context) : -1]
        expected = _prompt_logprobs(tiny_model, prompt)[len(context) - 1 : len(prompt) - 1]
        picked = expected[torch.arange(len(continuation)), torch.tensor(continuation)]
        assert torch.allclose(torch.tensor(scored), picked, atol=1e-4)
        tops = choice["logprobs"]["top_logprobs"][len(context) : -1]
        greedy = all(logprob == max(top.values()) for logprob, top in zip(scored, tops))  # the harness's test
        assert greedy == (expected.argmax(dim=-1).tolist() == continuation)
    assert continuations[1] != continuations[0] and greedy  # the greedy continuation is found greedy
