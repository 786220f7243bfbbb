"""Schema fuzz of both POST routes: schemathesis generates request bodies from the server's own /openapi.json
(bodies that follow the schema, then bodies that break it) and sends them to a real server on 127.0.0.1 with the
tiny model. Every answer must be below 500: bad input is a 4xx, good input decodes. Examples are derandomized,
so a run is reproducible, and bounded (EXAMPLES per route and mode)."""
from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from tests.e2e.server_util import serving, tiny_service

EXAMPLES = 50


@pytest.fixture(scope="module")
def server(tiny_target):
    with serving(tiny_service(tiny_target)) as running:
        yield running


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_fuzzed_bodies_never_get_a_5xx(server, path, mode):
    operation = schemathesis.openapi.from_url(server.url + "/openapi.json")[path]["POST"]
    statuses: dict[int, int] = {}

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    def fuzz(case) -> None:
        response = case.call(base_url=server.url, timeout=60)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert response.status_code < 500, f"{response.status_code} for {case.body!r}: {response.text[:300]}"

    fuzz()
    if mode == GenerationMode.POSITIVE:
        assert statuses.get(200, 0) > 0, statuses  # some bodies got through validation and decoded
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
