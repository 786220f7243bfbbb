"""`specdecode serve --replicas N`: the same OpenAI-compatible app over N engine replicas on Ray Serve.

Ray Serve places the replicas on a cluster's machines, restarts the ones that die and scales their number with
the requests in flight, so this module only says what a replica is and how a request finds one:

- `EngineReplica` (N of them): each builds one Service (model, drafters, KV memory, scheduler) inside its own
  process and runs the unchanged app of app.py over ASGI, message by message, so validation, errors and
  streaming are the plain server's own.
- `Frontend` (one, no CPU reserved): the HTTP ingress. It forwards /v1/* to a replica through a streaming
  DeploymentHandle, answers /health and /metrics for all replicas, and turns a replica that dies under a request
  into the app's JSON error (or a final SSE error event), never a hang.
- `StickyRouter`: Serve's request router for the replicas. A request with a session key (the `X-Session-Id`
  header, else the body's `user`) goes to the replica that rendezvous hashing picks among the live ones, so its
  conversation keeps finding the same per-replica state; other requests go to the less loaded of two random
  replicas (Serve's default policy).

Imported only when `--replicas` is given: nothing else in specdecode imports Ray.
"""

import asyncio
import hashlib
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import ray
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.exceptions import DeploymentUnavailableError, ReplicaUnavailableError
from ray.serve.request_router import RequestRouter

from specdecode.server.app import create_app
from specdecode.server.heap import freeze_heap
from specdecode.server.protocol.bodies import read_body
from specdecode.server.protocol.errors import APIError
from specdecode.server.service import ServerConfig, Service

log = logging.getLogger(__name__)

APP_NAME = "specdecode"
ENGINE = "EngineReplica"
SESSION_HEADER = "x-session-id"
REPLICA_HEADER = "x-specdecode-replica"  # on every forwarded response: the rank of the replica that answered
_TO_REPLICA = "\0replica:"  # a session key that names one replica (health and metrics ask each replica)
_PROBE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class ReplicaSettings:
    """What Serve ships to each replica (picklable), and how many replicas. `build` runs inside the replica, so
    every replica loads its own model there; `threads` is its torch thread count."""

    build: Callable[[], Service]
    threads: int = 1
    cpus: float = 1.0  # Ray CPUs reserved per replica (placement)
    replicas: int = 1
    min_replicas: int | None = None  # both set: autoscale on requests in flight, starting at `replicas`
    max_replicas: int | None = None
    max_ongoing: int = 72  # requests one replica holds (its batch and queue; its own scheduler answers 429 beyond)
    target_ongoing: int = 8  # autoscaling aims at this many requests in flight per replica (one batch)

    def deployment_options(self) -> dict:
        scaling: dict = {"num_replicas": self.replicas}
        if self.min_replicas is not None and self.max_replicas is not None:
            scaling = {"autoscaling_config": {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                                              "initial_replicas": self.replicas,
                                              "target_ongoing_requests": self.target_ongoing}}
        return dict(name=ENGINE, ray_actor_options={"num_cpus": self.cpus}, max_ongoing_requests=self.max_ongoing,
                    request_router_config=RequestRouterConfig(request_router_class=StickyRouter),
                    health_check_period_s=2.0, max_constructor_retry_count=1, **scaling)


def application(settings: ReplicaSettings):
    """The Serve application: one Frontend over the engine replicas (`serve.run(application(settings))`)."""
    engines = serve.deployment(EngineReplica).options(**settings.deployment_options())
    return Frontend.options(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=100_000).bind(
        engines.bind(settings.build, settings.threads))


# -- start-up -------------------------------------------------------------------------------------------------
PATIENCE_S = 600.0  # how long start() waits for Serve's proxies and the replicas on a slow or busy machine
POLL_S = 1.0
STARTING = (TimeoutError, ray.exceptions.RayActorError)  # what serve.start / serve.run raise while Serve starts


def start(settings: ReplicaSettings, http_options: dict, patience_s: float = PATIENCE_S,
          clock: Callable[[], float] = time.monotonic) -> None:
    """Start Serve and run the application, waiting up to `patience_s` for its HTTP proxies and replicas.

    serve.start and serve.run each give up when the proxy actor is not serving yet, although Serve goes on
    starting it: after Ray's fixed 60 s (`HTTP_PROXY_TIMEOUT`, a TimeoutError), or at once when the controller
    kills a proxy that was not ready within its check (5 s, then 10, 15, ...: an ActorDiedError). On a 2-core
    machine whose cores other processes held, both happened and the replicas never started. So either is
    waited out here, from `serve.status()`, against our own deadline; a failed deployment still raises
    RuntimeError at once."""
    deadline = clock() + patience_s
    steps = (lambda: serve.start(http_options=http_options),  # after a failure the controller is up: run reuses it
             lambda: serve.run(application(settings), name=APP_NAME, route_prefix="/", blocking=False))
    failed = False
    for step in steps:
        try:
            step()
        except STARTING as error:
            failed = True
            log.warning("Serve's proxy is not serving yet (%s); waiting up to %.0f s in all.", _first_line(error),
                        patience_s)
    while failed and (waiting := _not_ready(serve.status())) is not None:
        if clock() > deadline:
            raise TimeoutError(f"Ray Serve did not start within {patience_s:.0f} s: {waiting}")
        time.sleep(POLL_S)


def _first_line(error: Exception) -> str:
    return next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)


def _not_ready(status) -> str | None:
    """What a serve.status() still waits for (None: every proxy serves and the application runs); a failed
    application raises RuntimeError, as serve.run does."""
    proxies = {str(getattr(state, "value", state)) for state in status.proxies.values()}
    if not proxies or proxies - {"HEALTHY"}:
        return f"proxies {sorted(proxies) or 'not started'}"
    app = status.applications.get(APP_NAME)
    state = str(getattr(app.status, "value", app.status)) if app is not None else "NOT_STARTED"
    if state == "DEPLOY_FAILED":
        raise RuntimeError(f"Deploying application {APP_NAME} failed: {app.message}")
    return None if state == "RUNNING" else f"application {state}"


# -- sticky routing ------------------------------------------------------------------------------------------------
def pick_replica(key: str, replicas: Sequence[str]) -> str:
    """Rendezvous (highest random weight) hashing: the same key picks the same replica while it lives, and when one
    replica leaves or joins only the keys it owned move."""
    return max(replicas, key=lambda replica: hashlib.blake2b(f"{replica}\0{key}".encode(), digest_size=8).digest())


def session_key(headers: Mapping[str, str], body: bytes) -> str | None:
    """The conversation a request belongs to: the X-Session-Id header, else the OpenAI body's `user` field."""
    header = headers.get(SESSION_HEADER, "").strip()
    if header:
        return "session:" + header
    try:
        user = json.loads(body).get("user") if body else None
    except (ValueError, AttributeError):  # not JSON, or not an object: the replica answers 400
        return None
    return "user:" + user if isinstance(user, str) and user else None


class StickyRouter(RequestRouter):
    """Serve request router (for the replicas' DeploymentHandle): a session key goes to `pick_replica` of the live
    replicas, then to the others if it is full; a key naming a replica goes to it; anything else goes to the less
    loaded of two random replicas (Serve's default policy). Serve's base router gives each request the replica
    chosen for it (its FIFO mixin, used by the default router, may hand it to an earlier request instead)."""

    async def choose_replicas(self, candidate_replicas, pending_request=None):
        if not candidate_replicas:
            return []
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True
        key = pending_request.metadata.session_id if pending_request is not None else ""
        by_id = {replica.replica_id.unique_id: replica for replica in candidate_replicas}
        if key.startswith(_TO_REPLICA):
            named = by_id.get(key[len(_TO_REPLICA):])
            return [[named]] if named is not None else [candidate_replicas]  # gone: the caller sees who answered
        if key:
            first = by_id[pick_replica(key, sorted(by_id))]
            others = [replica for replica in candidate_replicas if replica is not first]
            return [[first], others] if others else [[first]]
        return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]


# -- one replica ---------------------------------------------------------------------------------------------------
class EngineReplica:
    """One engine: builds its Service in this process and runs the app of app.py for forwarded requests."""

    def __init__(self, build: Callable[[], Service], threads: int):
        torch.set_num_threads(threads)
        self.service = build()
        self.service.scheduler.start()  # the app's lifespan does this in the plain server; ASGI calls here skip it
        self.app = create_app(self.service)
        freeze_heap()  # a replica is a process of its own: what it loaded stays out of the collector's walk
        context = serve.get_replica_context()
        self.rank = context.rank.rank if context.rank is not None else 0
        self.replica_id = context.replica_id.unique_id

    def __del__(self) -> None:
        service = getattr(self, "service", None)
        if service is not None:
            service.scheduler.stop()

    async def handle(self, request: dict) -> AsyncIterator[dict]:
        """The app's ASGI messages for one forwarded request; the response start carries this replica's rank."""
        async for message in asgi_messages(self.app, _scope(request), request["body"]):
            if message["type"] == "http.response.start":
                message = {**message, "replica": self.rank}
            yield message

    async def health(self) -> dict:
        scheduler = self.service.scheduler
        reason = scheduler.stalled()
        return {"replica": self.rank, "id": self.replica_id, "status": "ok" if reason is None else "stalled",
                "active": scheduler.active, "queued": scheduler.queued, "actor": ray.get_runtime_context()
                .get_actor_name(), **({} if reason is None else {"reason": reason})}

    async def metrics(self) -> dict:
        return {"replica": self.rank, "id": self.replica_id, "text": self.service.metrics.render().decode()}


def _scope(request: dict) -> dict:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
            "method": request["method"], "scheme": "http", "path": request["path"],
            "raw_path": request["path"].encode(), "query_string": request["query_string"], "root_path": "",
            "headers": request["headers"], "client": request.get("client"), "server": None}


async def asgi_messages(app, scope: dict, body: bytes) -> AsyncIterator[dict]:
    """Run an ASGI app on one request and yield what it sends, up to the end of the response. When the consumer
    stops early (its client left, the call was cancelled) the app sees http.disconnect and its task is cancelled,
    so the scheduler frees the request's row."""
    sent: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    pending_body = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if pending_body:
            return pending_body.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    task = asyncio.ensure_future(app(scope, receive, sent.put))
    task.add_done_callback(lambda done: sent.put_nowait(None))
    finished = False
    try:
        while (message := await sent.get()) is not None:
            yield message
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                finished = True
                return
        if not task.cancelled() and task.exception() is not None:  # the app failed before it answered
            raise task.exception()
    finally:
        gone.set()
        if not finished and not task.done():
            task.cancel()


# -- the ingress ---------------------------------------------------------------------------------------------------
def _is_sse(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    return any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)


async def _bodies(messages, sse: bool) -> AsyncIterator[bytes]:
    """The response body from the replica; a replica that dies mid-stream ends an SSE stream with an error event
    and [DONE] (a client that leaves cancels the replica's generation)."""
    finished = False
    try:
        async for message in messages:
            if message["type"] == "http.response.body":
                yield message.get("body", b"")
        finished = True
    except Exception as error:  # noqa: BLE001 - a replica that died or failed mid-response
        finished = True
        log.warning("a replica failed mid-response: %s: %s", type(error).__name__, error)
        if sse:
            yield f"data: {json.dumps(_failure(error).body(), separators=(',', ':'))}\n\n".encode()
            yield b"data: [DONE]\n\n"
    finally:
        if not finished:
            messages.cancel()


def _failure(error: Exception) -> APIError:
    """A replica's failure as the app's error body: 503 when the replica is gone (retry: Serve restarts it)."""
    if isinstance(error, (ray.exceptions.RayActorError, ReplicaUnavailableError, DeploymentUnavailableError)):
        return APIError(503, "the engine replica serving this request stopped; retry the request",
                        "server_error", code="replica_unavailable")
    return APIError(500, f"internal error: {type(error).__name__}: {error}".splitlines()[0], "server_error")


# -- metrics -------------------------------------------------------------------------------------------------------
def labelled_metrics(texts: Mapping[str, str]) -> bytes:
    """Each replica's Prometheus text with a `replica` label on every sample, merged family by family (one HELP
    and TYPE each), plus `specdecode_replicas`: how many replicas answered."""
    families: dict[str, Metric] = {}
    for replica, text in sorted(texts.items()):
        for family in text_string_to_metric_families(text):
            merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type,
                                                              family.unit))
            merged.samples.extend(sample._replace(labels={**sample.labels, "replica": replica})
                                  for sample in family.samples)
    registry = CollectorRegistry()
    Gauge("specdecode_replicas", "Engine replicas that answered this scrape", registry=registry).set(len(texts))
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)


class _Families(Collector):
    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return iter(self.families)


# serve.ingress pickles the class when it is defined: everything its methods use is defined above
_frontend_app = FastAPI(title="specdecode replicas", docs_url=None, redoc_url=None, openapi_url=None)


@serve.deployment(name="Frontend")
@serve.ingress(_frontend_app)
class Frontend:
    """The HTTP endpoint: forwards to the replicas and speaks for all of them on /health and /metrics."""

    def __init__(self, engines):
        self.engines = engines
        self.app_name = serve.get_replica_context().app_name

    @_frontend_app.get("/health")
    async def health(self) -> JSONResponse:
        """200 when at least one replica answers and is not stalled; each replica's state either way."""
        states = await self._ask_each("health")
        ok = any(state.get("status") == "ok" for state in states)
        return JSONResponse({"status": "ok" if ok else "unavailable", "replicas": states},
                            status_code=200 if ok else 503)

    @_frontend_app.get("/metrics")
    async def metrics(self) -> Response:
        answers = await self._ask_each("metrics")
        body = labelled_metrics({str(a["replica"]): a["text"] for a in answers if "text" in a})
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @_frontend_app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"])
    async def forward(self, path: str, request: Request) -> Response:
        config = ServerConfig("")  # the replicas' body limits (they check again)
        try:
            body = await read_body(request, config.max_body_bytes, config.body_timeout_s)
        except APIError as error:
            return JSONResponse(error.body(), status_code=error.status)
        key = session_key(request.headers, body)
        handle = self.engines.options(stream=True, **({"session_id": key} if key else {}))
        client = (request.client.host, request.client.port) if request.client else None
        messages = handle.handle.remote({"method": request.method, "path": request.url.path,
                                         "query_string": request.url.query.encode(), "headers": request.headers.raw,
                                         "body": body, "client": client})
        try:
            start = await messages.__anext__()
        except Exception as error:  # noqa: BLE001 - the replica died or failed before answering
            messages.cancel()
            failure = _failure(error)
            return JSONResponse(failure.body(), status_code=failure.status)
        response = StreamingResponse(_bodies(messages, _is_sse(start["headers"])), status_code=start["status"])
        response.raw_headers = [*start["headers"], (REPLICA_HEADER.encode(), str(start["replica"]).encode())]
        return response

    async def _ask_each(self, method: str) -> list[dict]:
        """Call `method` on every live replica (Serve names their actors), each within a timeout; a replica that
        does not answer is reported as unavailable."""
        prefix = f"SERVE_REPLICA::{self.app_name}#{ENGINE}#"
        ids = sorted(entry["name"][len(prefix):] for entry in ray.util.list_named_actors(all_namespaces=True)
                     if entry["name"].startswith(prefix))

        async def ask(replica_id: str) -> dict:
            call = getattr(self.engines.options(session_id=_TO_REPLICA + replica_id), method).remote()
            try:
                return await asyncio.wait_for(call, _PROBE_TIMEOUT_S)
            except Exception as error:  # noqa: BLE001 - dead, restarting or stuck: reported, not raised
                call.cancel()
                return {"id": replica_id, "status": "unavailable", "reason": f"{type(error).__name__}: {error}"}

        answers: dict[str, dict] = {}
        for replica_id in ids:  # one at a time: calls made concurrently from one request share its id, and Serve's
            answer = await ask(replica_id)  # router matches a routed replica to its call by that id
            answers.setdefault(answer["id"], answer)  # a replica that left is answered for by another: once
        return list(answers.values())
