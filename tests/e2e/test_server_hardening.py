"""The server against a careless client, each on a real uvicorn server on 127.0.0.1 with the tiny model:
extreme sampling values the schema accepts (they must decode, not produce NaN), spec-decode counters,
a client that hangs up mid-body, slow bodies, non-JSON bodies, the API key, the OpenAPI request bodies and the
`serve` flags that reach uvicorn."""
from __future__ import annotations

import dataclasses
import http.client
import json
import logging
import time
import types

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdecode.cli.main import main
from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig
from specdecode.core.engine import Engine
from specdecode.drafters import build_drafter
from specdecode.server.connections import ConnectionLimits, GuardedH11Protocol
from tests.e2e.server_util import MODEL, SPEC, reference, serving, tiny_service
from tests.fakes import Oracle

LOOKUP = DrafterConfig(name="prompt-lookup", row_cost=0.0)  # drafts every token it finds, on any device
ORACLE_PROMPT = "Count the drafts"
ORACLE_TOKENS = 10
API_KEY = "sekrit-key"


@pytest.fixture(scope="module")
def server(tiny_target):
    ids = tiny_target.tokenizer(ORACLE_PROMPT)["input_ids"]
    expected = ids + reference(tiny_target, ids, ORACLE_TOKENS, stop_on_eos=False).token_ids
    drafters = {"prompt-lookup": build_drafter(tiny_target, LOOKUP, SPEC),
                "oracle": Oracle(expected, right=2, vocab=tiny_target.vocab_size)}
    with serving(tiny_service(tiny_target, drafters, body_timeout_s=1.0)) as running:
        yield running


@pytest.fixture(scope="module")
def keyed_server(tiny_target):
    with serving(tiny_service(tiny_target, api_key=API_KEY)) as running:
        yield running


def _metrics(server) -> dict[tuple[str, tuple], float]:
    text = httpx.get(server.url + "/metrics").text
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def _delta(before: dict, after: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def _complete(server, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", json={"model": MODEL, **body}, headers=headers, timeout=60)


def _sse_text(server, body: dict) -> str:
    with httpx.stream("POST", server.url + "/v1/completions", json={"model": MODEL, **body, "stream": True},
                      timeout=60) as reply:
        assert reply.status_code == 200
        events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert not [c for c in chunks if "error" in c], chunks
    return "".join(c["choices"][0]["text"] for c in chunks if c["choices"])


# -- numerics: any temperature / top_p the schema accepts --------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("sampling", [{"temperature": 1e-38}, {"temperature": 5e-324}, {"top_p": 5e-324}],
                         ids=["temperature-1e-38", "temperature-5e-324", "top-p-5e-324"])
def test_extreme_sampling_values_decode_greedily(tiny_target, server, sampling, stream):
    """logits / 1e-38 overflowed float32 and top_p 5e-324 rounded to 0, dropping every token: a 500 (or, streaming,
    a 200 with an error event). Both are the greedy limit: the text is plain greedy decoding's."""
    prompt = "The quick brown fox"
    expected = reference(tiny_target, tiny_target.tokenizer(prompt)["input_ids"], 12).text
    body = {"prompt": prompt, "max_tokens": 12, "seed": 3, **sampling}
    if stream:
        assert _sse_text(server, body) == expected
    else:
        reply = _complete(server, body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["text"] == expected


# -- spec-decode counters ----------------------------------------------------------------------------------------------
def test_spec_decode_counters_are_exact_for_known_drafts(server):
    """K = 4, 10 tokens, the third draft token always wrong. Passes: the first token plain, draft 4 keep 2 (+1),
    draft 4 keep 2 (+1), then 3 tokens left: draft 2 keep 2 (+1): 3 drafts, 10 draft tokens, 6 accepted, positions
    0 and 1 accepted 3 times each."""
    before = _metrics(server)
    reply = _complete(server, {"prompt": ORACLE_PROMPT, "max_tokens": ORACLE_TOKENS, "temperature": 0,
                               "ignore_eos": True, "speculation": {"drafter": "oracle"}})
    after = _metrics(server)
    usage = reply.json()["usage"]
    assert (usage["completion_tokens"], usage["target_passes"], usage["acceptance_rate"]) == (10, 4, round(6 / 10, 4))
    counted = {name: _delta(before, after, f"specdecode_spec_decode_num_{name}_total")
               for name in ("drafts", "draft_tokens", "accepted_tokens")}
    assert counted == {"drafts": 3, "draft_tokens": 10, "accepted_tokens": 6}
    per_position = [_delta(before, after, "specdecode_spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
                    for i in range(4)]
    assert per_position == [3, 3, 0, 0]
    assert _delta(before, after, "specdecode_acceptance_rate_count") == 1


def test_spec_decode_counters_match_the_engines_own_metrics(tiny_target, server):
    """Prompt lookup on a repetitive prompt, greedy: the same drafts as the request decoded alone by an engine with
    the server's speculation settings, whose per-generation metrics count them independently."""
    prompt = "a b c a b c a b c a b"
    spec = dataclasses.replace(SPEC, pause_below=0.0, pause_on_time=False)  # the server's (the K policy is off)
    engine = Engine(tiny_target, build_drafter(tiny_target, LOOKUP, spec), spec)
    alone = engine.generate(tiny_target.tokenizer(prompt)["input_ids"], SamplingConfig(), GenerationConfig(24))
    before = _metrics(server)
    usage = _complete(server, {"prompt": prompt, "max_tokens": 24, "temperature": 0}).json()["usage"]
    after = _metrics(server)
    m = alone.metrics
    assert m.proposed > 0 and usage["target_passes"] == m.target_passes
    assert _delta(before, after, "specdecode_spec_decode_num_drafts_total") == m.proposed_at[0]
    assert _delta(before, after, "specdecode_spec_decode_num_draft_tokens_total") == m.proposed
    assert _delta(before, after, "specdecode_spec_decode_num_accepted_tokens_total") == m.accepted
    assert [_delta(before, after, "specdecode_spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
            for i in range(len(m.accepted_at))] == m.accepted_at
    assert usage["acceptance_rate"] == round(m.accepted / m.proposed, 4)


@pytest.mark.parametrize("drafter", ["prompt-lookup", "none"])
def test_a_generation_that_drafted_nothing_records_no_acceptance_rate(server, drafter):
    """max_tokens 1 leaves no room for a draft: no acceptance sample (it was recorded as 0.0, like a generation
    whose drafts all failed), no draft counted; the generation itself is recorded."""
    before = _metrics(server)
    reply = _complete(server, {"prompt": "x y z", "max_tokens": 1, "speculation": {"drafter": drafter}})
    after = _metrics(server)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 1
    assert _delta(before, after, "specdecode_tau_count") == 1
    assert _delta(before, after, "specdecode_acceptance_rate_count") == 0
    assert _delta(before, after, "specdecode_spec_decode_num_drafts_total") == 0


# -- transport: disconnects, slow bodies, content types ----------------------------------------------------------------
class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _partial_request(server, body: bytes, declared: int) -> http.client.HTTPConnection:
    """A POST that declares `declared` body bytes and sends only `body`."""
    connection = http.client.HTTPConnection(server.host, server.port, timeout=10)
    connection.putrequest("POST", "/v1/completions")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(declared))
    connection.endheaders(body)
    return connection


def test_client_disconnect_mid_body_is_one_log_line_and_a_499(server):
    """One log line (not a ClientDisconnect traceback) and a 499 counted in the request counter."""
    records = _Records()
    loggers = [logging.getLogger(name) for name in ("uvicorn", "specdecode")]
    for logger in loggers:
        logger.addHandler(records)
    try:
        before = _metrics(server)
        connection = _partial_request(server, b'{"model": "tiny", "prompt": "hal', declared=1000)
        time.sleep(0.3)  # the handler is waiting for the rest of the body
        connection.close()
        deadline = time.monotonic() + 5
        while _delta(before, _metrics(server), "specdecode_requests_total", endpoint="completions", status="499") < 1:
            assert time.monotonic() < deadline, "the disconnect was not counted as a 499"
            time.sleep(0.05)
        time.sleep(0.2)  # anything logged after the response would show up here
    finally:
        for logger in loggers:
            logger.removeHandler(records)
    lines = [r.getMessage() for r in records.records]
    assert not [r for r in records.records if r.exc_info], lines
    assert len(lines) == 1 and "disconnected" in lines[0] and "\n" not in lines[0], lines
    assert _complete(server, {"prompt": "still serving", "max_tokens": 2}).status_code == 200


def test_a_body_that_arrives_too_slowly_is_408(server):
    connection = _partial_request(server, b'{"model": "tiny", ', declared=100)
    try:
        reply = connection.getresponse()  # the server gives up after body_timeout_s (1 s here)
        status, error = reply.status, json.loads(reply.read())["error"]
    finally:
        connection.close()
    assert status == 408
    assert error["code"] == "request_timeout" and "\n" not in error["message"]


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          None])
def test_non_json_bodies_are_415_and_start_nothing(server, content_type):
    """A browser sends these cross-origin without a CORS preflight: they were parsed as JSON and decoded."""
    body = json.dumps({"model": MODEL, "prompt": "cross-origin", "max_tokens": 2}).encode()
    before = _metrics(server)
    headers = {} if content_type is None else {"Content-Type": content_type}
    reply = httpx.post(server.url + "/v1/chat/completions" if content_type == "multipart/form-data"
                       else server.url + "/v1/completions", content=body, headers=headers)
    assert reply.status_code == 415, reply.text
    error = reply.json()["error"]
    assert error["code"] == "unsupported_media_type" and "\n" not in error["message"]
    assert _delta(before, _metrics(server), "specdecode_prompt_tokens_total") == 0


def test_json_with_parameters_is_accepted(server):
    body = json.dumps({"model": MODEL, "prompt": "charset", "max_tokens": 2}).encode()
    reply = httpx.post(server.url + "/v1/completions", content=body,
                       headers={"Content-Type": "application/json; charset=utf-8"})
    assert reply.status_code == 200, reply.text


# -- API key -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method,path,headers", [
    ("GET", "/v1/models", {}),
    ("GET", "/v1/models/tiny", {}),
    ("POST", "/v1/completions", {"Authorization": "Bearer wrong"}),
    ("POST", "/v1/chat/completions", {"Authorization": f"Basic {API_KEY}"}),
    ("POST", "/v1/completions", {"Authorization": API_KEY}),
    ("POST", "/tokenize", {}),
    ("POST", "/detokenize", {"Authorization": "Bearer wrong"}),
])
def test_api_key_refuses_requests_without_it(keyed_server, method, path, headers):
    body = {"model": MODEL, "prompt": "x", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    reply = httpx.request(method, keyed_server.url + path, headers=headers, json=body if method == "POST" else None)
    assert reply.status_code == 401, reply.text
    assert reply.headers["www-authenticate"] == "Bearer"
    error = reply.json()["error"]
    assert error["code"] == "invalid_api_key" and "\n" not in error["message"]


def test_api_key_admits_the_bearer_and_leaves_health_and_metrics_open(keyed_server):
    client = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=2).usage.completion_tokens >= 1
    for path in ("/health", "/metrics"):
        assert httpx.get(keyed_server.url + path).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="nope", max_retries=0).models.list()


# -- OpenAPI -----------------------------------------------------------------------------------------------------------
def test_openapi_declares_both_request_bodies(server):
    """The handlers read raw JSON, so FastAPI declared no request body and schema tools could not test the API."""
    doc = httpx.get(server.url + "/openapi.json").json()
    schemas = doc["components"]["schemas"]
    for path, required in (("/v1/completions", "prompt"), ("/v1/chat/completions", "messages")):
        body = doc["paths"][path]["post"]["requestBody"]
        assert body["required"] is True
        ref = body["content"]["application/json"]["schema"]["$ref"]
        schema = schemas[ref.removeprefix("#/components/schemas/")]
        assert set(schema["required"]) == {"model", required}
        assert schema["properties"]["model"]["enum"] == [MODEL]
    refs = {part.split('"')[0] for part in json.dumps(doc).split('"$ref": "#/components/schemas/')[1:]}
    assert refs <= set(schemas)


def test_openapi_tells_that_empty_stop_strings_and_content_arrays_are_refused(server):
    """Both are a 400: a schema-driven client or fuzzer that follows the schema should not send them."""
    schemas = httpx.get(server.url + "/openapi.json").json()["components"]["schemas"]
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        text, array, _ = schemas[name]["properties"]["stop"]["anyOf"]
        assert text["minLength"] == array["items"]["minLength"] == 1
    assert schemas["MessagesRequest"]["properties"]["stop_sequences"]["anyOf"][0]["items"]["minLength"] == 1
    for name in ("ChatMessage", "Message", "InputMessage"):
        arrays = [part for part in schemas[name]["properties"]["content"]["anyOf"] if part.get("type") == "array"]
        assert arrays and all(part["minItems"] == 1 for part in arrays)


# -- serve flags -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,env,key", [([], None, None), ([], "from-env", "from-env"),
                                          (["--api-key", "from-flag"], "from-env", "from-flag")])
def test_serve_passes_the_key_and_connection_limits(monkeypatch, argv, env, key):
    seen: dict = {}
    service = types.SimpleNamespace(metrics=types.SimpleNamespace(count_rejected=lambda status: None),
                                    config=types.SimpleNamespace(kv_cache_bytes=None))
    monkeypatch.setattr("specdecode.cli.serve.build_service",
                        lambda config: seen.update(api_key=config.api_key) or service)
    monkeypatch.setattr("specdecode.cli.serve.create_app", lambda service: "app")
    monkeypatch.setattr("uvicorn.Config", lambda app, **settings: seen.update(settings))
    monkeypatch.setattr("uvicorn.Server", lambda config: types.SimpleNamespace(run=lambda sockets: seen.update(
        sockets=sockets)))
    if env is None:
        monkeypatch.delenv("SPECDECODE_API_KEY", raising=False)
    else:
        monkeypatch.setenv("SPECDECODE_API_KEY", env)
    assert main(["serve", "--max-connections", "7", "--max-connections-per-client", "2", "--head-timeout", "4.5",
                 "--timeout-keep-alive", "3", "--port", "0", *argv]) == 0
    assert seen["api_key"] == key
    assert len(seen["sockets"]) == 1 and seen["sockets"][0].fileno() == -1  # bound before loading, closed after
    assert seen["timeout_keep_alive"] == 3 and seen["limit_concurrency"] is None  # the protocol's cap replaces it
    assert issubclass(seen["http"], GuardedH11Protocol)
    assert seen["http"].limits == ConnectionLimits(7, 2, 4.5, 16 << 10)
    assert seen["h11_max_incomplete_event_size"] == 16 << 10


@pytest.mark.parametrize("flag", ["--max-connections", "--max-connections-per-client", "--timeout-keep-alive"])
def test_bad_connection_flags_are_one_line(capsys, flag):
    assert main(["serve", flag, "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{flag} must be >= 1" in err and "\n" not in err


# -- the API's description, hosts, methods, names ----------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/openapi.json", "/docs", "/redoc"])
def test_the_api_description_needs_the_key_when_there_is_one(keyed_server, server, path):
    """/openapi.json names the served model and drafters, which /v1/models hides without the key."""
    assert httpx.get(keyed_server.url + path).status_code == 401
    assert httpx.get(keyed_server.url + path, headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200
    assert httpx.get(server.url + path).status_code == 200  # no key: open, as before


def test_openapi_lists_the_error_answers(server, keyed_server):
    doc = httpx.get(server.url + "/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = doc["paths"][path]["post"]["responses"]
        assert {"200", "400", "404", "408", "413", "415", "429"} <= set(responses) and "401" not in responses
        assert responses["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    model = doc["paths"]["/v1/models/{model}"]["get"]["responses"]
    assert "404" in model and "422" not in model  # a wrong name is a 404, never a 422
    keyed = httpx.get(keyed_server.url + "/openapi.json", headers={"Authorization": f"Bearer {API_KEY}"}).json()
    assert "401" in keyed["paths"]["/v1/completions"]["post"]["responses"]


def test_a_wrong_method_is_405_with_allow(server):
    reply = httpx.get(server.url + "/v1/completions")
    assert reply.status_code == 405 and "POST" in reply.headers["allow"]
    assert reply.json()["error"]["type"] == "invalid_request_error"


def test_a_long_model_name_is_not_echoed_whole(server):
    reply = _complete(server, {"model": "m" * 5000, "prompt": "x", "max_tokens": 2})
    assert reply.status_code == 404 and len(reply.json()["error"]["message"]) < 200


def test_a_host_other_than_loopback_is_refused_on_a_loopback_server(tiny_target):
    """DNS rebinding: a page at http://evil.example:PORT whose name resolves to 127.0.0.1 sends Host: evil.example."""
    allowed = ("localhost", "127.0.0.1", "::1")
    with serving(tiny_service(tiny_target, allowed_hosts=allowed)) as running:
        refused = httpx.get(running.url + "/v1/models", headers={"Host": f"evil.example:{running.port}"})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_host"
        for host in (f"127.0.0.1:{running.port}", f"localhost:{running.port}", "[::1]", "LOCALHOST"):
            assert httpx.get(running.url + "/v1/models", headers={"Host": host}).status_code == 200, host


@pytest.mark.parametrize("argv,allowed", [
    (["--host", "127.0.0.1"], ("localhost", "127.0.0.1", "::1")),
    (["--host", "::1"], ("localhost", "127.0.0.1", "::1")),
    (["--host", "0.0.0.0"], None),
    (["--host", "0.0.0.0", "--allowed-hosts", "api.example,Other.example"], ("api.example", "other.example")),
    (["--host", "127.0.0.1", "--allowed-hosts", "*"], None),
])
def test_serve_chooses_the_allowed_hosts(argv, allowed):
    from specdecode.cli.main import build_parser
    from specdecode.cli.serve import allowed_hosts

    assert allowed_hosts(build_parser().parse_args(["serve", *argv])) == allowed


def test_an_internal_error_is_counted_and_does_not_leak_its_text(server, monkeypatch):
    service = server.app.state.service

    def broken(ticket):
        raise ValueError("secret internals /etc/passwd")

    monkeypatch.setattr(service.scheduler, "submit", broken)
    before = _metrics(server)
    reply = _complete(server, {"prompt": "x", "max_tokens": 2})
    assert reply.status_code == 500 and "secret" not in reply.text
    assert _delta(before, _metrics(server), "specdecode_requests_total", endpoint="completions", status="500") == 1


def test_every_answer_is_counted_whatever_route_or_none_answered_it(server):
    """GET and DELETE routes, the router's 404 and 405 and a list query's 400 are counted by endpoint and status, as
    the POST routes always were (they alone were counted); the monitors' own /health and /metrics are not."""
    asked = [("GET", "/v1/models", "models"), ("GET", "/v1/models/nope", "models"),
             ("GET", "/v1/files/nope", "files"), ("DELETE", "/v1/responses/nope", "responses"),
             ("GET", "/v1/conversations/nope/items?limit=0", "conversations"), ("GET", "/v1/nope", "unrouted"),
             ("PUT", "/v1/chat/completions", "chat_completions"), ("GET", "/health", None)]
    before = _metrics(server)
    answers = [(httpx.request(method, server.url + path, timeout=30).status_code, endpoint)
               for method, path, endpoint in asked]
    after = _metrics(server)
    assert {status for status, _ in answers} >= {200, 400, 404, 405}
    expected: dict[tuple[str, str], int] = {}
    for status, endpoint in answers:
        if endpoint is not None:
            expected[endpoint, str(status)] = expected.get((endpoint, str(status)), 0) + 1
    for (endpoint, status), count in expected.items():
        assert _delta(before, after, "specdecode_requests_total", endpoint=endpoint, status=status) == count, endpoint
    assert _delta(before, after, "specdecode_requests_total", endpoint="other", status="200") == 0
