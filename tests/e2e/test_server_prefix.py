"""The server keeps a finished request's KV in its row (a packed target): a conversation's next turn prefills only
what it adds, says so in OpenAI's `usage.prompt_tokens_details.cached_tokens` and on /metrics, and answers what a
fresh server answers; under a KV budget the parked rows give way, oldest first, to a request that needs the room."""
from __future__ import annotations

import httpx

from specdecode.config import DrafterConfig, GenerationConfig
from specdecode.core.kv_cache import GROWTH_ROUND
from specdecode.drafters import build_drafter
from tests.e2e.server_util import MODEL, SPEC, reference, serving, tiny_service

FIRST = "the cat sat on the mat. the cat sat on the"


def _complete(url: str, prompt: list[int], max_tokens: int = 16, salt: str | None = None) -> dict:
    reply = httpx.post(url + "/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
        **({"cache_salt": salt} if salt is not None else {})})
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_the_next_turn_reuses_the_finished_rows_kv(tiny_packed_target):
    tokenizer = tiny_packed_target.tokenizer
    first = tokenizer(FIRST)["input_ids"]
    service = tiny_service(tiny_packed_target, max_batch=4)
    assert service.scheduler.engine.prefix_reuse
    with serving(service) as server:
        answer = _complete(server.url, first)
        assert answer["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        turn = first + tokenizer(answer["choices"][0]["text"])["input_ids"] + tokenizer(" and the dog")["input_ids"]
        again = _complete(server.url, turn)
        metrics = httpx.get(server.url + "/metrics").text
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert len(first) <= cached < len(turn)
    assert f"specdecode_prompt_tokens_cached_total {float(cached)}" in metrics
    assert again["choices"][0]["text"] == reference(tiny_packed_target, turn, 16, stop_on_eos=False).text


def test_parked_rows_give_way_under_the_kv_budget(tiny_packed_target):
    """A budget of about two requests' KV: after two finished requests parked their rows, a third is admitted at
    once (the oldest parked row freed), not queued behind memory nobody uses."""
    tokenizer = tiny_packed_target.tokenizer
    prompts = [tokenizer(text)["input_ids"] for text in ("a b c a b c", "def f(x): return x", "Once upon a time")]
    sizing = tiny_service(tiny_packed_target).scheduler.engine
    generation = GenerationConfig(16)
    one = max(sizing.kv_bytes(len(p), generation) for p in prompts)  # a reservation
    slots = max(sizing.kv_slots(len(p), generation) for p in prompts)
    row = -(-slots // GROWTH_ROUND) * GROWTH_ROUND * (one // slots)  # a row's buffer: more than its reservation
    budget = 2 * row + one // 2
    service = tiny_service(tiny_packed_target, max_batch=4, kv_cache_bytes=budget)
    engine = service.scheduler.engine
    with serving(service) as server:
        for prompt in prompts[:2]:
            _complete(server.url, prompt)
        assert len(engine._parked) == 2 and engine.parked_bytes + one > budget  # the third does not fit beside both
        _complete(server.url, prompts[2])
        assert engine.parked_bytes <= budget and service.scheduler.kv_reserved == 0
        held = sorted(next(i for i, p in enumerate(prompts) if tokens[: len(p)] == p)
                      for _, tokens in engine._parked.held.values())
        assert held == [1, 2]  # the first request's row made room; the second kept its KV



def test_a_cache_salt_keeps_prefixes_apart(tiny_packed_target):
    """Kept KV serves only requests with the same cache_salt (none is a salt too): who shares none cannot tell from
    the time to first token what another sent. An empty salt is a 400 naming the field."""
    prompt = tiny_packed_target.tokenizer(FIRST)["input_ids"]
    service = tiny_service(tiny_packed_target, max_batch=4)

    def cached(url: str, salt: str | None) -> int:
        return _complete(url, prompt, salt=salt)["usage"]["prompt_tokens_details"]["cached_tokens"]

    with serving(service) as server:
        assert cached(server.url, "alice") == 0
        assert cached(server.url, "bob") == 0 and cached(server.url, None) == 0
        assert cached(server.url, "alice") == cached(server.url, "bob") == cached(server.url, None) == len(prompt) - 1
        reply = httpx.post(server.url + "/v1/completions", timeout=60,
                           json={"model": MODEL, "prompt": prompt, "max_tokens": 4, "cache_salt": ""})
    assert reply.status_code == 400 and "cache_salt" in reply.json()["error"]["message"]


def test_a_draft_models_kv_counts_in_the_budget(tiny_packed_target, tiny_draft_dir):
    """A request that drafts with a draft model reserves the draft's KV beside the target's: under a budget between
    the two sums it is refused (413) while a request that drafts without one is served."""
    prompt = tiny_packed_target.tokenizer(FIRST)["input_ids"]
    drafters = {name: build_drafter(tiny_packed_target, DrafterConfig(name, draft_model=draft), SPEC)
                for name, draft in (("prompt-lookup", None), ("draft-model", tiny_draft_dir))}
    sizing = tiny_service(tiny_packed_target, drafters).scheduler.engine
    generation = GenerationConfig(16)
    target_only = sizing.kv_bytes(len(prompt), generation)
    both = sizing.kv_bytes(len(prompt), generation, drafters["draft-model"])
    assert both > target_only
    service = tiny_service(tiny_packed_target, drafters, kv_cache_bytes=(target_only + both) // 2)
    with serving(service) as server:
        _complete(server.url, prompt)
        reply = httpx.post(server.url + "/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": prompt, "max_tokens": 16, "speculation": {"drafter": "draft-model"}})
    assert reply.status_code == 413 and "bytes of KV cache" in reply.json()["error"]["message"]


def _cached_total(url: str) -> float:
    line = next(line for line in httpx.get(url + "/metrics").text.splitlines()
                if line.startswith("specdecode_prompt_tokens_cached_total"))
    return float(line.split()[-1])


def test_a_requests_later_choices_copy_the_first_ones_prompt_kv(tiny_packed_target):
    """n choices of one prompt: the later ones wait for the first's prefill (three chunks here) and copy its KV
    rather than prefill the prompt again, and each answers what the prompt alone answers."""
    tokenizer = tiny_packed_target.tokenizer
    prompt = (tokenizer(FIRST)["input_ids"] * 60)[:600]
    service = tiny_service(tiny_packed_target, max_batch=4)
    with serving(service) as server:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True, "n": 3}
        reply = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
        assert _cached_total(server.url) == 2 * (len(prompt) - 1)
        sampled = {**body, "temperature": 1.0, "seed": 5, "prompt": prompt[:40]}
        many = httpx.post(server.url + "/v1/completions", json=sampled, timeout=60).json()["choices"]
    expected = reference(tiny_packed_target, prompt, 12, stop_on_eos=False).text
    assert [c["text"] for c in reply["choices"]] == [expected] * 3
    with serving(tiny_service(tiny_packed_target, max_batch=4)) as fresh:  # each choice as a request of its own
        alone = [httpx.post(fresh.url + "/v1/completions", json={**sampled, "n": 1, "seed": 5 + j},
                            timeout=60).json()["choices"][0]["text"] for j in range(3)]
    assert [c["text"] for c in many] == alone


def test_a_scored_prompt_is_prefilled_whole(tiny_packed_target):
    """Echo with logprobs needs every prompt token's logits: no parked row or sibling gives it KV, and its choices
    all carry the prompt's logprobs, equal (packed passes: bit for bit)."""
    prompt = tiny_packed_target.tokenizer(FIRST)["input_ids"]
    with serving(tiny_service(tiny_packed_target, max_batch=4)) as server:
        _complete(server.url, prompt)  # its row is parked with the prompt's KV
        body = {"model": MODEL, "prompt": prompt, "echo": True, "logprobs": 0, "max_tokens": 0, "n": 2}
        reply = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
        assert _cached_total(server.url) == 0
    first, second = (choice["logprobs"]["token_logprobs"] for choice in reply["choices"])
    assert len(first) == len(prompt) and first[0] is None and None not in first[1:]
    assert first == second
