"""`serve --replicas`: flag checks (one line, exit 2, before Ray starts), the plain path never importing Ray, and
the pure parts of the Ray Serve module: sticky hashing, session keys, per-replica metrics."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specdecode.cli.main import build_parser, main
from specdecode.cli.serve import replica_flags, responses_bytes, responses_kept
from specdecode.server.stores.response_store import RESPONSES_BYTES, RESPONSES_KEPT


@pytest.mark.parametrize("argv,message", [
    (["serve", "--replicas", "0"], "--replicas must be >= 1, got 0"),
    (["serve", "--ray-address", "auto"], "--ray-address needs --replicas"),
    (["serve", "--max-replicas", "3"], "--max-replicas needs --replicas"),
    (["serve", "--replicas", "2", "--min-replicas", "3", "--max-replicas", "4"],
     "need --min-replicas (3) <= --replicas (2) <= --max-replicas (4)"),
    (["serve", "--replicas", "3", "--max-replicas", "2"], "need --min-replicas (1) <= --replicas (3)"),
    (["serve", "--replicas", "2", "--min-replicas", "0"], "--min-replicas must be >= 1, got 0"),
    (["serve", "--replicas", "2", "--cpus-per-replica", "0"], "--cpus-per-replica must be > 0"),
    (["serve", "--replicas", "2", "--max-batch", "0"], "--max-batch must be >= 1"),
    (["serve", "--replicas", "2", "--allow-drafters", "nope"], "unknown drafter 'nope'"),
    (["serve", "--replicas", "2", "--responses-store", "8"], "--responses-store needs a single server"),
    (["serve", "--responses-store", "-1"], "--responses-store must be >= 0, got -1"),
    (["serve", "--replicas", "2", "--responses-store-bytes", "1MiB"], "--responses-store-bytes needs a single server"),
])
def test_bad_replica_flags_exit_2_with_one_line(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_replica_flags():
    parse = build_parser().parse_args
    assert replica_flags(parse(["serve"])) is None
    fixed = replica_flags(parse(["serve", "--replicas", "2"]), cores=2)
    assert (fixed.replicas, fixed.min_replicas, fixed.max_replicas, fixed.cpus, fixed.threads) == (2, None, None, 1, 1)
    assert replica_flags(parse(["serve", "--replicas", "3"]), cores=2).threads == 1  # at least one core each
    scaled = replica_flags(parse(["serve", "--replicas", "2", "--max-replicas", "4", "--cpus-per-replica", "2.5",
                                  "--ray-address", "auto"]), cores=2)
    assert (scaled.min_replicas, scaled.max_replicas, scaled.cpus, scaled.threads) == (1, 4, 2.5, 2)
    assert scaled.ray_address == "auto"


def test_replicas_keep_no_responses_unless_none_asked_for():
    """Replicas do not share kept responses, so a follow-up could reach one that lacks the response it names."""
    parse = build_parser().parse_args
    assert responses_kept(parse(["serve"])) == RESPONSES_KEPT
    assert responses_kept(parse(["serve", "--responses-store", "3"])) == 3
    assert responses_kept(parse(["serve", "--replicas", "2"])) == 0
    assert responses_kept(parse(["serve", "--replicas", "2", "--responses-store", "0"])) == 0
    assert responses_bytes(parse(["serve"])) == RESPONSES_BYTES
    assert responses_bytes(parse(["serve", "--responses-store-bytes", "1MiB"])) == 1 << 20
    assert responses_bytes(parse(["serve", "--replicas", "2"])) == 0


def test_the_plain_server_does_not_import_ray(tiny_model_dir):
    code = ("import sys; from specdecode.cli.main import build_parser; from specdecode.cli.serve import replica_flags, "
            "serve_config; from specdecode.server.service import build_service; from specdecode.server.app import "
            f"create_app; args = build_parser().parse_args(['serve', '--model', {tiny_model_dir!r}, "
            "'--kv-cache-memory', '1MiB']); assert replica_flags(args) is None; "
            "create_app(build_service(serve_config(args))); assert 'ray' not in sys.modules, 'ray imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# -- the Ray Serve module's pure parts ------------------------------------------------------------------------------
replicas = pytest.importorskip("specdecode.server.replicas")


def test_sticky_hash_is_stable_spread_and_moves_only_a_leaving_replicas_keys():
    ids = ["aa", "bb", "cc", "dd"]
    keys = [f"user:{i}" for i in range(400)]
    owners = {key: replicas.pick_replica(key, ids) for key in keys}
    assert owners == {key: replicas.pick_replica(key, list(reversed(ids))) for key in keys}  # order-free
    assert all(sum(owner == i for owner in owners.values()) > 60 for i in ids)  # about 100 each
    after = {key: replicas.pick_replica(key, ["aa", "bb", "dd"]) for key in keys}
    assert all(after[key] == owners[key] for key in keys if owners[key] != "cc")


def test_session_key_header_then_user():
    body = json.dumps({"model": "m", "user": "alice"}).encode()
    assert replicas.session_key({"x-session-id": "s1"}, body) == "session:s1"
    assert replicas.session_key({}, body) == "user:alice"
    assert replicas.session_key({}, b'{"user": ""}') is None
    assert replicas.session_key({}, b"not json") is None
    assert replicas.session_key({}, b"[1, 2]") is None
    assert replicas.session_key({}, b"") is None


def test_metrics_get_a_replica_label_and_one_header_per_family():
    from prometheus_client.parser import text_string_to_metric_families

    from specdecode.server.scheduling.metrics import ServerMetrics

    texts = {}
    for replica, count in (("0", 3), ("1", 5)):
        metrics = ServerMetrics()
        metrics.requests.labels("completions", "200").inc(count)
        metrics.ttft.observe(0.02)
        texts[replica] = metrics.render().decode()
    merged = replicas.labelled_metrics(texts).decode()
    assert merged.count("# TYPE specdecode_requests_total counter") == 1
    families = {family.name: family for family in text_string_to_metric_families(merged)}
    assert families["specdecode_replicas"].samples[0].value == 2
    requests = {s.labels["replica"]: s.value for s in families["specdecode_requests"].samples
                if s.name == "specdecode_requests_total"}
    assert requests == {"0": 3, "1": 5}
    assert {s.labels["replica"] for s in families["specdecode_time_to_first_token_seconds"].samples} == {"0", "1"}


class FakeServe:
    """serve.start / serve.run / serve.status as a busy machine gave them: start timed out after Ray's 60 s, run
    met a proxy the controller had killed for not being ready in time, and Serve went on starting: the proxy
    serves and the application runs `ready_after` polls later."""

    def __init__(self, ready_after: int, app_state: str = "RUNNING"):
        self.ready_after, self.app_state, self.polls, self.calls = ready_after, app_state, 0, []

    def start(self, http_options):
        self.calls.append("start")
        raise TimeoutError("HTTP proxies not available after 60s.")

    def run(self, app, name, route_prefix, blocking):
        self.calls.append("run")
        raise replicas.ray.exceptions.ActorDiedError()  # the controller killed a proxy not ready in its check

    def status(self):
        from types import SimpleNamespace
        self.polls += 1
        ready = self.polls > self.ready_after
        app = SimpleNamespace(status=self.app_state if ready else "DEPLOYING", message="replica crashed: boom")
        return SimpleNamespace(proxies={"node": "HEALTHY" if ready else "STARTING"},
                               applications={"specdecode": app})


def _start(monkeypatch, fake: FakeServe, patience_s: float):
    now = [0.0]
    monkeypatch.setattr(replicas, "serve", fake)
    monkeypatch.setattr(replicas, "application", lambda settings: "app")
    monkeypatch.setattr(replicas.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    replicas.start(None, {}, patience_s=patience_s, clock=lambda: now[0])
    return now[0]


def test_start_waits_out_rays_60_s_proxy_timeout_up_to_its_own_patience(monkeypatch):
    fake = FakeServe(ready_after=90)
    waited = _start(monkeypatch, fake, patience_s=600)
    assert fake.calls == ["start", "run"] and 89 <= waited <= 91
    with pytest.raises(TimeoutError, match="did not start within 30 s: proxies"):
        _start(monkeypatch, FakeServe(ready_after=90), patience_s=30)


def test_start_raises_a_failed_deployment_at_once(monkeypatch):
    with pytest.raises(RuntimeError, match="replica crashed: boom"):
        _start(monkeypatch, FakeServe(ready_after=3, app_state="DEPLOY_FAILED"), patience_s=600)
