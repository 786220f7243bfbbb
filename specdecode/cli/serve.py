"""`specdecode serve`: the OpenAI-compatible server on uvicorn, or over engine replicas on Ray Serve. The flags
become a ServeConfig (server/service.py) here, once; uvicorn's and Ray's settings stay here."""
from __future__ import annotations

import argparse
import functools
import ipaddress
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import uvicorn

from specdecode.cli.args import add_model_args, check_drafter_flags, drafter_config, model_config, spec_config
from specdecode.cli.commands import COMMANDS
from specdecode.errors import ConfigError
from specdecode.server.app import create_app
from specdecode.server.connections import ConnectionLimits, uvicorn_options
from specdecode.server.heap import freeze_heap
from specdecode.server.service import (
    AUTO_KV_SHARE,
    CONVERSATION_BYTES,
    FILES_BYTES,
    K_POLICIES,
    RESPONSES_BYTES,
    RESPONSES_KEPT,
    ServeConfig,
    build_service,
    kv_summary,
)

API_KEY_ENV = "SPECDECODE_API_KEY"
MAX_HEADER_BYTES = 16 << 10  # the largest request head; a larger one is answered 431 (connections.py)


def add_server_args(parser: argparse.ArgumentParser) -> None:
    # prompt lookup: it drafts for a whole batch at once and the K policy's cost table was measured with it
    add_model_args(parser, "prompt-lookup")
    parser.add_argument("--allow-drafters", default="",
                        help="comma-separated extra drafters a request may choose with "
                             "{\"speculation\": {\"drafter\": NAME}} (the default drafter and 'none' always can)")
    parser.add_argument("--served-model-name", default=None, help="the `model` name clients send")
    parser.add_argument("--max-batch", type=int, default=8, help="sequences decoded together")
    parser.add_argument("--max-queue", type=int, default=64, help="waiting requests before answering 429")
    parser.add_argument("--default-max-tokens", type=int, default=256, help="max_tokens when a request omits it")
    parser.add_argument("--kv-cache-memory", type=memory_size, default=None, metavar="BYTES",
                        help="KV cache memory that requests may reserve (prompt + max_tokens each), in bytes or "
                             "with a unit (2GiB, 512MB); a request that does not fit now waits in the queue, one "
                             f"that never can is answered 413 (default: {AUTO_KV_SHARE * 100:.0f}%% of the RAM, or "
                             "of the free GPU memory after loading)")
    parser.add_argument("--k-policy", choices=K_POLICIES, default="measured",
                        help="per-step draft length: measured (the built-in cost table for SmolLM2-135M, int4 or "
                             "fp32 on a 2-core CPU; any other model's verify passes timed at start-up, 11-13 s for "
                             "the Qwen 1.5B, and kept for later starts, which time two of them again, ~2 s), "
                             "calibrate (time this model's on a finer grid at start-up and print them), fixed "
                             "(always --k)")


_UNITS = {"": 1, "B": 1, "K": 1000, "KB": 1000, "M": 1000**2, "MB": 1000**2, "G": 1000**3, "GB": 1000**3,
          "T": 1000**4, "TB": 1000**4, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}


def memory_size(text: str) -> int:
    """argparse type: a positive byte count, alone or with a unit: 2GiB, 1.5GB, 512MiB, 1000000."""
    number, unit = text.strip(), ""
    while number and number[-1].isalpha():
        number, unit = number[:-1], number[-1] + unit
    try:
        value = float(number.strip()) * _UNITS[unit.upper()]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a size like 2GiB, 512MB or 1000000, got {text!r}") from None
    if not 1 <= value < float(1 << 62):
        raise argparse.ArgumentTypeError(f"the size must be at least one byte, got {text!r}")
    return int(value)


def serve_config(args: argparse.Namespace, api_key: str | None = None) -> ServeConfig:
    """The serve flags as a ServeConfig, every option checked (before anything loads; `auto` stays, as what it
    builds may depend on the draft model's tokenizer: service.build_drafters)."""
    allowed = tuple(n.strip() for n in args.allow_drafters.split(",") if n.strip())
    config = ServeConfig(model_config(args), drafter_config(args), allowed, spec_config(args), args.k_policy,
                         args.served_model_name, args.max_batch, args.max_queue, args.default_max_tokens,
                         args.kv_cache_memory, api_key, allowed_hosts(args), responses_kept(args), files_bytes(args),
                         conversation_bytes(args), responses_bytes(args))
    check_drafter_flags(args, list(config.resolved().drafters))  # resolved: its own checks, then the flags'
    return config


def responses_kept(args: argparse.Namespace) -> int:
    """--responses-store: none with --replicas (each replica would keep its own, so a follow-up could reach one
    that does not hold the response it names)."""
    return _one_process_store(args, "--responses-store", RESPONSES_KEPT, "kept responses")


def responses_bytes(args: argparse.Namespace) -> int:
    """--responses-store-bytes: none with --replicas (as for kept responses)."""
    return _one_process_store(args, "--responses-store-bytes", RESPONSES_BYTES, "kept responses")


def conversation_bytes(args: argparse.Namespace) -> int:
    """--conversation-store: none with --replicas (as for kept responses)."""
    return _one_process_store(args, "--conversation-store", CONVERSATION_BYTES, "conversations")


def files_bytes(args: argparse.Namespace) -> int:
    """--files-store: none with --replicas (a batch created on one replica could not read a file uploaded to
    another)."""
    return _one_process_store(args, "--files-store", FILES_BYTES, "files or batches")


def _one_process_store(args: argparse.Namespace, flag: str, default: int, kept: str) -> int:
    """The size of a store kept in the server's memory: `default` where the server is one process, none with
    --replicas (which share no memory: given there, it is an error naming `kept`)."""
    given, replicas = getattr(args, flag.removeprefix("--").replace("-", "_"), None), getattr(args, "replicas", None)
    if given is not None and replicas is not None and given > 0:
        raise ConfigError(f"{flag} needs a single server: replicas do not share {kept}")
    if given is None:
        return 0 if replicas is not None else default
    if given < 0:
        raise ConfigError(f"{flag} must be >= 0, got {given}")
    return given


def store_size(text: str) -> int:
    """argparse type: 0, or a byte count as memory_size reads it."""
    return 0 if text.strip() == "0" else memory_size(text)


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def allowed_hosts(args: argparse.Namespace) -> tuple[str, ...] | None:
    """--allowed-hosts, else on a loopback address the loopback names (a page whose own name resolves to 127.0.0.1
    is refused: DNS rebinding), else any host (None)."""
    given = getattr(args, "allowed_hosts", None)
    if given:
        names = tuple(name.strip().lower() for name in given.split(",") if name.strip())
        return None if "*" in names else names
    host = getattr(args, "host", "127.0.0.1")
    try:
        loopback = host in LOOPBACK_NAMES or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    return tuple(dict.fromkeys((*LOOPBACK_NAMES, host.lower()))) if loopback else None


def cmd_serve(args: argparse.Namespace) -> int:
    scaling = replica_flags(args)  # checked before the model loads (and before Ray starts)
    connection_limits(args)  # its errors before the model loads
    config = serve_config(args, api_key=args.api_key or os.environ.get(API_KEY_ENV) or None)
    listener = listening_socket(args.host, args.port)  # a host or port it cannot have: exit 2 before loading
    if scaling is not None:
        listener.close()  # Serve's proxy binds its own
        return _serve_replicas(args, config, scaling)
    with listener:
        service = build_service(config)  # (a KV budget that holds no request is an error: check_kv_budget)
        server = uvicorn.Server(uvicorn.Config(create_app(service), **uvicorn_settings(args,
                                                                                     service.metrics.count_rejected)))
        host, port = listener.getsockname()[:2]
        logging.getLogger("uvicorn.error").info(kv_summary(service))
        logging.getLogger("uvicorn.error").info("Froze %s loaded objects: a full garbage collection walks only what "
                                                "requests make (server/heap.py)", f"{freeze_heap():,}")
        logging.getLogger("uvicorn.error").info("Serving on http://%s:%d (Press CTRL+C to quit)",
                                                f"[{host}]" if ":" in host else host, port)
        server.run(sockets=[listener])
    return 0


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound (as uvicorn binds one) before the model loads: a host that does not resolve or a
    port in use is one line and exit 2 at once, where uvicorn said so after the load (exit code 3), and a second
    server on the port fails before it loads. Connections are refused until the server listens."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise ConfigError(f"cannot serve on {host}:{port}: {error.strerror or error}") from None
    sock.set_inheritable(True)
    return sock


@dataclass(frozen=True)
class Scaling:
    """The replica flags, checked: replicas to start, autoscaling bounds (None: a fixed count), Ray CPUs and torch
    threads per replica, and the cluster to join (None: start Ray here)."""

    replicas: int
    min_replicas: int | None
    max_replicas: int | None
    cpus: float
    threads: int
    ray_address: str | None


def replica_flags(args: argparse.Namespace, cores: int | None = None) -> Scaling | None:
    """The --replicas family of flags as a Scaling, or None without --replicas (then none of them may be given)."""
    if args.replicas is None:
        given = [name for name in ("ray_address", "min_replicas", "max_replicas", "cpus_per_replica")
                 if getattr(args, name) is not None]
        if given:
            raise ConfigError(f"--{given[0].replace('_', '-')} needs --replicas")
        return None
    if args.replicas < 1:
        raise ConfigError(f"--replicas must be >= 1, got {args.replicas}")
    low, high = args.min_replicas, args.max_replicas
    if low is not None or high is not None:
        low, high = low if low is not None else 1, high if high is not None else max(args.replicas, low or 1)
        if low < 1:
            raise ConfigError(f"--min-replicas must be >= 1, got {low}")
        if not low <= args.replicas <= high:
            raise ConfigError(f"need --min-replicas ({low}) <= --replicas ({args.replicas}) <= --max-replicas ({high})")
    cpus = args.cpus_per_replica
    if cpus is None:
        cpus = float(max(1, (cores or os.cpu_count() or 1) // args.replicas))
    if not cpus > 0:
        raise ConfigError(f"--cpus-per-replica must be > 0, got {cpus:g}")
    return Scaling(args.replicas, low, high, cpus, max(1, int(cpus)), args.ray_address)


def _serve_replicas(args: argparse.Namespace, config: ServeConfig, scaling: Scaling) -> int:
    """Serve the app over engine replicas on Ray Serve (replicas.py); blocks until interrupted. Each replica
    builds the same (checked) ServeConfig."""
    try:  # Ray is an optional dependency: imported only when --replicas is given
        import ray
        from ray import serve

        from specdecode.server.replicas import ReplicaSettings, start
    except ImportError:
        raise ConfigError("--replicas needs Ray Serve: pip install 'ray[serve]==2.60.0'") from None

    settings = ReplicaSettings(functools.partial(build_service, config), threads=scaling.threads,
                               cpus=scaling.cpus, replicas=scaling.replicas, min_replicas=scaling.min_replicas,
                               max_replicas=scaling.max_replicas, max_ongoing=args.max_batch + args.max_queue,
                               target_ongoing=args.max_batch)
    local = {} if scaling.ray_address else {"include_dashboard": False}
    ray.init(address=scaling.ray_address, **local)
    signal.signal(signal.SIGTERM, _interrupt)  # stopped like Ctrl-C: the application and Ray shut down cleanly
    try:
        try:
            start(settings, {"host": args.host, "port": args.port, "keep_alive_timeout_s": args.timeout_keep_alive})
        except (RuntimeError, TimeoutError) as error:  # a replica failed to start (Serve's message ends with the
            # cause), or Serve did not start within start()'s patience
            lines = [line for line in str(error).splitlines() if line.strip()]
            raise ConfigError(f"the replicas did not start: {lines[-1].strip() if lines else error}") from None
        while True:  # serving until Ctrl-C or SIGTERM (_interrupt)
            time.sleep(10)
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def connection_limits(args: argparse.Namespace) -> ConnectionLimits:
    """--max-connections, --max-connections-per-client, --head-timeout (server/connections.py)."""
    for name, low in (("--max-connections", 1), ("--max-connections-per-client", 1), ("--timeout-keep-alive", 1)):
        if getattr(args, name[2:].replace("-", "_")) < low:
            raise ConfigError(f"{name} must be >= {low}")
    if not 0 < args.head_timeout < float("inf"):
        raise ConfigError(f"--head-timeout must be a positive number of seconds, got {args.head_timeout}")
    return ConnectionLimits(args.max_connections, args.max_connections_per_client, args.head_timeout,
                            MAX_HEADER_BYTES)


def uvicorn_settings(args: argparse.Namespace, on_reject: Callable[[int], None] | None = None) -> dict:
    """uvicorn's keyword arguments: our h11 protocol with its connection limits (connection_limits), the idle
    keep-alive timeout; slow bodies are timed out by the app (ServerConfig.body_timeout_s)."""
    return dict(host=args.host, port=args.port, log_level=args.log_level, timeout_keep_alive=args.timeout_keep_alive,
                **uvicorn_options(connection_limits(args), on_reject))


def _port(text: str) -> int:
    """argparse type: a TCP port (uvicorn's own error for one out of range is a traceback after the model loads)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 0..65535, got {port}")
    return port


def register(subparsers, name: str) -> None:
    parser = subparsers.add_parser(name, help=COMMANDS[name].help)
    add_server_args(parser)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=_port, default=8000)
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    parser.add_argument("--api-key", default=None,
                        help=f"require 'Authorization: Bearer KEY' on /v1/* (default: ${API_KEY_ENV} if set); "
                             "/health and /metrics stay open")
    parser.add_argument("--allowed-hosts", default=None, metavar="NAMES",
                        help="comma list of host names the Host header may carry ('*': any); default: on a "
                             "loopback --host its loopback names only (no DNS rebinding), else any")
    parser.add_argument("--max-connections", type=int, default=512,
                        help="open connections; beyond this a new one closes the oldest idle one (no request in "
                             "flight), and is answered 503 only when all are working (/health still answered)")
    parser.add_argument("--max-connections-per-client", type=int, default=64,
                        help="connections one client address may hold; beyond this its oldest idle one is closed")
    parser.add_argument("--head-timeout", type=float, default=10.0,
                        help="seconds a request head (request line and headers) may take to arrive, from the "
                             "connection's start or the previous response; then the connection is closed")
    parser.add_argument("--timeout-keep-alive", type=int, default=5,
                        help="seconds an idle keep-alive connection stays open")
    parser.add_argument("--responses-store", type=int, default=None, metavar="N",
                        help="Responses API responses kept in memory for previous_response_id and GET "
                             "/v1/responses/ID, and as many conversations (/v1/conversations), least recently used "
                             f"dropped first (default {RESPONSES_KEPT}; 0: none; with --replicas none, as replicas "
                             "do not share them)")
    parser.add_argument("--responses-store-bytes", type=store_size, default=None, metavar="BYTES",
                        help="memory for the kept responses (their input items and output, as JSON), in bytes or "
                             "with a unit; least recently used responses are dropped past it (default "
                             f"{RESPONSES_BYTES >> 20}MiB; 0: none kept; with --replicas none)")
    parser.add_argument("--conversation-store", type=store_size, default=None, metavar="BYTES",
                        help="memory for the Conversations API's items and metadata (as JSON), in bytes or with a "
                             "unit; least recently used conversations are dropped past it, and an add that would "
                             f"take one conversation past it is answered 413 (default {CONVERSATION_BYTES >> 20}MiB; "
                             "0: no conversations; with --replicas none)")
    parser.add_argument("--files-store", type=store_size, default=None, metavar="BYTES",
                        help="memory for the Files API's files (batch inputs uploaded to /v1/files and the "
                             "outputs of /v1/batches), in bytes or with a unit; an upload beyond it is answered 413 "
                             f"(default {FILES_BYTES >> 20}MiB; 0: no Files or Batches API; with --replicas none)")
    scale = parser.add_argument_group("replicas (Ray Serve; docs/scaling.md)")
    scale.add_argument("--replicas", type=int, default=None, metavar="N",
                       help="serve over N engine replicas on Ray Serve, each with its own model, KV memory and "
                            "scheduler (the initial count when autoscaling)")
    scale.add_argument("--ray-address", default=None, metavar="ADDR",
                       help="join this Ray cluster ('auto': the one `ray start` runs here) instead of starting Ray")
    scale.add_argument("--min-replicas", type=int, default=None, help="autoscale on requests in flight, down to this")
    scale.add_argument("--max-replicas", type=int, default=None, help="autoscale on requests in flight, up to this")
    scale.add_argument("--cpus-per-replica", type=float, default=None,
                       help="Ray CPUs each replica reserves, and its torch threads (default: this machine's cores "
                            "divided by --replicas, at least 1)")
    parser.set_defaults(func=cmd_serve)
