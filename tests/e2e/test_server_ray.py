"""`serve --replicas` on a local Ray (2 CPUs, no dashboard): 2 replicas of the tiny model behind the Serve ingress,
checked with the official `openai` client: greedy answers equal the plain server's, 16 concurrent clients all
complete, sticky routing by `user` and X-Session-Id, and a replica killed mid-run fails only its own requests
(a 503 JSON body, an SSE error event) while Serve restarts it and the next requests succeed."""
from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.server_util import MODEL, PROMPTS, reference, tiny_service

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
replicas = pytest.importorskip("specdecode.server.replicas")

ROOT = Path(__file__).resolve().parents[2]
MAX_TOKENS = 16
# how long any one wait may take: generous, so that a machine other processes keep busy (with two busy loops on a
# 2-core machine this file took 13 min) slows the tests without failing them; a hang still fails
WAIT_S = 300


def tiny_replica_service():
    """Runs inside each replica: the same seeded tiny model as the `tiny_target` fixture, so every replica and
    the reference hold identical weights."""
    from specdecode.core.target import Target
    from tests.tiny import byte_tokenizer, tiny_llama

    return tiny_service(Target(tiny_llama(), byte_tokenizer()))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def url():
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})  # the replicas import tests.e2e from this checkout
    try:
        port = _free_port()
        settings = replicas.ReplicaSettings(tiny_replica_service, threads=1, cpus=1, replicas=2)
        replicas.start(settings, {"host": "127.0.0.1", "port": port})  # waits past Ray's 60 s on a busy machine
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=WAIT_S)


def _expected(tiny_target, prompt: str, max_tokens: int = MAX_TOKENS) -> str:
    ids = [int(i) for i in tiny_target.tokenizer(prompt, add_special_tokens=True)["input_ids"]]
    return reference(tiny_target, ids, max_tokens).text


def _health(url: str) -> dict:
    return httpx.get(url + "/health", timeout=WAIT_S).json()


def test_answers_equal_the_plain_servers_greedy_answers(url, client, tiny_target):
    assert [m.id for m in client.models.list().data] == [MODEL]
    for prompt in PROMPTS[:4]:
        expected = _expected(tiny_target, prompt)
        whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
        assert whole.choices[0].text == expected
        chunks = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                           stream=True)
        assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == expected
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                          temperature=0)
    assert chat.choices[0].finish_reason in ("length", "stop")
    with pytest.raises(openai.NotFoundError) as error:  # the replica's own validation and error body
        client.completions.create(model="other", prompt="x", max_tokens=2)
    assert error.value.body["code"] == "model_not_found"


def test_health_and_metrics_cover_every_replica(url, client):
    state = _health(url)
    assert state["status"] == "ok" and sorted(r["replica"] for r in state["replicas"]) == [0, 1]
    for i in range(6):  # both replicas serve something
        client.completions.create(model=MODEL, prompt=f"metrics {i}", max_tokens=2, temperature=0)
    text = httpx.get(url + "/metrics", timeout=WAIT_S).text
    assert "specdecode_replicas 2.0" in text
    assert text.count("# TYPE specdecode_requests_total counter") == 1
    assert 'replica="0"' in text and 'replica="1"' in text


def test_sticky_routing_by_user_and_session_header(url):
    def replica(**extra) -> str:
        headers = extra.pop("headers", {})
        body = {"model": MODEL, "prompt": "sticky", "max_tokens": 2, **extra}
        response = httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=WAIT_S)
        assert response.status_code == 200
        return response.headers[replicas.REPLICA_HEADER]

    for key in ("alice", "bob", "carol"):
        assert len({replica(user=key) for _ in range(4)}) == 1
        assert len({replica(headers={"X-Session-Id": key}, user=str(i)) for i in range(4)}) == 1
    assert len({replica() for _ in range(16)}) == 2  # no key: spread over both


def test_sixteen_concurrent_clients_all_complete(client, tiny_target):
    def one(prompt: str) -> str:
        return client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                         user=prompt).choices[0].text

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        texts = list(pool.map(one, PROMPTS))
    assert texts == [_expected(tiny_target, prompt) for prompt in PROMPTS]


def _stream(url: str, session: str) -> tuple[str, list[dict]]:
    """A long stream pinned by X-Session-Id; returns the replica that served it and its events."""
    body = {"model": MODEL, "prompt": "long", "max_tokens": 900, "ignore_eos": True, "stream": True}
    events = []
    with httpx.stream("POST", url + "/v1/completions", json=body, headers={"X-Session-Id": session},
                      timeout=WAIT_S) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(None if line == "data: [DONE]" else json.loads(line[6:]))
    return response.headers[replicas.REPLICA_HEADER], events


def test_a_killed_replica_fails_only_its_requests_and_is_restarted(url, tiny_target):
    ids = {r["replica"]: r["id"] for r in _health(url)["replicas"]}
    sessions = {rank: next(f"s{i}" for i in range(100)
                           if replicas.pick_replica(f"session:s{i}", sorted(ids.values())) == ids[rank])
                for rank in ids}
    victim = 0
    actor = next(r["actor"] for r in _health(url)["replicas"] if r["replica"] == victim)
    long = {"model": MODEL, "prompt": "long", "max_tokens": 900, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        streams = {rank: [pool.submit(_stream, url, sessions[rank]) for _ in range(2)] for rank in ids}
        whole = pool.submit(httpx.post, url + "/v1/completions", json=long,
                            headers={"X-Session-Id": sessions[victim]}, timeout=WAIT_S)
        deadline = time.monotonic() + WAIT_S
        while next(r["active"] for r in _health(url)["replicas"] if r["replica"] == victim) < 3:
            assert time.monotonic() < deadline, "the victim never had its requests in flight"
            time.sleep(0.02)
        ray.kill(ray.get_actor(actor, namespace="serve"), no_restart=True)
        failed = whole.result(timeout=WAIT_S)
        assert failed.status_code == 503 and failed.json()["error"]["code"] == "replica_unavailable"
        for future in streams[victim]:
            served_by, events = future.result(timeout=WAIT_S)
            assert served_by == str(victim) and events[-1] is None
            assert events[-2]["error"]["code"] == "replica_unavailable"
        for future in streams[1 - victim]:
            served_by, events = future.result(timeout=WAIT_S)
            assert served_by == str(1 - victim) and events[-1] is None
            assert events[-2]["choices"][0]["finish_reason"] == "length"
    deadline = time.monotonic() + WAIT_S
    while True:  # Serve replaces the dead replica
        state = _health(url)
        live = {r.get("actor") for r in state["replicas"] if r["status"] == "ok"}
        if len(live) == 2 and actor not in live:
            break
        assert time.monotonic() < deadline, f"the replica was not replaced: {state}"
        time.sleep(0.5)
    for prompt in PROMPTS[:4]:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
        response = httpx.post(url + "/v1/completions", json=body, headers={"X-Session-Id": sessions[victim]},
                              timeout=WAIT_S)
        assert response.status_code == 200
        assert response.json()["choices"][0]["text"] == _expected(tiny_target, prompt)
