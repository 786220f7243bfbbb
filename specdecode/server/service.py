"""What `specdecode serve` builds, as one frozen value (ServeConfig), and building it: the model, the drafters a
request may choose, the per-step draft-length policy and the limits, ready for the app (app.py) or for each Ray
Serve replica (replicas.py), which builds the same value inside the replica. What is built is a Service, the state
the handlers share (ServerConfig: the server's limits), assembled from a loaded model and its drafters (assemble)."""
from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from specdecode.backends.cpu import native
from specdecode.backends.cpu.own_thread import run_in_own_thread
from specdecode.config import DrafterConfig, GenerationConfig, ModelConfig, SpecConfig
from specdecode.core.drafting import Drafter
from specdecode.core.engine import KV_SLACK, Engine
from specdecode.core.infill import FimFormat, fim_format
from specdecode.core.pass_costs import time_passes
from specdecode.core.target import Target
from specdecode.drafters import AUTO, best_drafter_name, build_drafter, check_options_read, registry, suffix_of
from specdecode.drafters.none import NoDrafter
from specdecode.errors import ConfigError, OptionError
from specdecode.loading.load import check_kv_half, load_model
from specdecode.paths import cache_root
from specdecode.server.protocol.tools import ToolFormat, tool_format
from specdecode.server.scheduling import cost_store
from specdecode.server.scheduling.metrics import ServerMetrics
from specdecode.server.scheduling.policy import SpecPolicy, builtin_fits, builtin_table, calibrate
from specdecode.server.scheduling.router import RoutingDrafter
from specdecode.server.scheduling.scheduler import NO_SPECULATION, Scheduler, SchedulerConfig
from specdecode.server.stores.batches import Batches
from specdecode.server.stores.conversation_store import CONVERSATION_BYTES, ConversationStore
from specdecode.server.stores.file_store import FILES_BYTES, FileStore
from specdecode.server.stores.response_store import RESPONSES_BYTES, RESPONSES_KEPT, ResponseStore

K_POLICIES = ("measured", "calibrate", "fixed")
# --k-policy measured for a model without a built-in table: the cost grid's tokens per row and rounds (the Qwen
# 1.5B on the 2-core Zen 4 VM: 11-13 s at start-up over batches 1-8; a later start checks the kept table in ~2 s)
QUICK_QS, QUICK_ROUNDS = (1, 2, 3, 5, 9), 3
CONTEXT = 256  # cached tokens per row while the passes are timed
SAY_AFTER_S = 2.0  # ... said on stderr when it took this long (a tiny model's 0.2 s is not worth a line)
AUTO_KV_SHARE = 0.4  # kv_cache_bytes' default: this share of the machine's RAM (or free GPU memory)


@dataclass(frozen=True)
class ServerConfig:
    model_name: str
    max_batch: int = 8
    max_queue: int = 64
    default_max_tokens: int = 256
    max_body_bytes: int = 8 << 20  # a larger request body is a 413 before it is read whole
    body_timeout_s: float = 30.0  # a body that has not arrived whole by then is a 408 (a slow sender holds no task)
    # when set, /v1/* and the API's description (/openapi.json, /docs, /redoc) need `Authorization: Bearer
    # <api_key>`; /health and /metrics stay open
    api_key: str | None = None
    # KV memory requests may reserve: a request that does not fit now waits in the queue, one that never can is a 413
    kv_cache_bytes: int | None = None
    prefill_chunk: int = 256  # most prompt tokens prefilled per step (scheduler.py: chunked prefill)
    stall_s: float = 30.0  # /health answers 503 when a scheduler round has run longer than this
    # the Host header names one of these (port aside), else 400: a server on loopback refuses pages that reach it
    # through DNS rebinding (a name of theirs resolving to 127.0.0.1); None: any host
    allowed_hosts: tuple[str, ...] | None = None
    # Responses API responses kept for `previous_response_id` and GET /v1/responses/{id} (0: none kept; see
    # response_store.py)
    responses_kept: int = RESPONSES_KEPT
    # bytes of files the Files API holds (uploads, and the batches' output); 0: no Files or Batches API
    files_bytes: int = FILES_BYTES
    # bytes of conversation items and metadata kept, as JSON (conversation_store.py); 0 (or responses_kept 0): none
    conversation_bytes: int = CONVERSATION_BYTES
    # bytes of kept responses, as JSON (response_store.py); 0: none kept
    responses_bytes: int = RESPONSES_BYTES


@dataclass
class Service:
    """What the handlers share: read-only model facts, the scheduler, and the tokenizer (behind a lock, since
    the scheduler thread detokenises with it)."""

    config: ServerConfig
    target: Target
    scheduler: Scheduler
    metrics: ServerMetrics
    tokenizer_lock: threading.Lock
    created: int
    tool_format: ToolFormat | None  # how the chat template's model calls tools; None: it serves no tools
    added_tokens: frozenset[str]  # the tokenizer's added tokens (a tool-call marker may be one)
    fim: FimFormat | None  # the tokenizer's fill-in-the-middle markers; None: completions' suffix is a 400
    responses: ResponseStore | None = None  # kept Responses API responses; None: none are kept
    files: FileStore | None = None  # the Files API's files; None: no Files or Batches API
    batches: Batches | None = None  # the Batches API's batches (with files)
    conversations: ConversationStore | None = None  # the Conversations API's (kept as responses are)

    @property
    def drafters(self) -> list[str]:
        return list(self.scheduler.router.drafters)


def assemble(target: Target, drafters: Mapping[str, Drafter], default_drafter: str, config: ServerConfig,
             spec: SpecConfig | None = None, policy: SpecPolicy | None = None) -> Service:
    """The Service over a loaded target and its drafters (the default one named): engine, scheduler, stores."""
    if target.tokenizer is None:
        raise ConfigError("the server needs a model with a tokenizer")
    router = RoutingDrafter({NO_SPECULATION: NoDrafter(), **drafters}, default_drafter)
    # the scheduler's per-step policy owns K here (it also switches speculation off when it does not pay)
    spec = dataclasses.replace(spec or SpecConfig(), pause_below=0.0, pause_on_time=False)
    engine = Engine(target, router, spec, max_batch=config.max_batch)
    metrics = ServerMetrics()
    if target.device.type == "cpu":
        metrics.watch_row_cost(target.row_costs.peek)
    stores = {name: suffix_of(drafter) for name, drafter in drafters.items()}  # their size and hits on /metrics
    metrics.watch_stores({name: store.stats for name, store in stores.items() if store is not None})
    scheduling = SchedulerConfig(config.max_batch, config.max_queue, kv_cache_bytes=config.kv_cache_bytes,
                                 prefill_chunk=config.prefill_chunk, stall_s=config.stall_s)
    scheduler = Scheduler(engine, router, scheduling, metrics, policy)
    added = getattr(target.tokenizer, "get_added_vocab", dict)()
    kept = (ResponseStore(config.responses_kept, config.responses_bytes)
            if config.responses_kept > 0 and config.responses_bytes > 0 else None)
    conversations = (ConversationStore(config.responses_kept, config.conversation_bytes)
                     if config.responses_kept > 0 and config.conversation_bytes > 0 else None)
    files = FileStore(config.files_bytes) if config.files_bytes > 0 else None
    # a batch keeps at most half of the rows busy, so interactive requests keep the other half
    batches = None if files is None else Batches(files, max(1, config.max_batch // 2), config.api_key,
                                                  _own_host(config.allowed_hosts))
    return Service(config, target, scheduler, metrics, engine.tokenizer_lock, int(time.time()),
                   tool_format(target.tokenizer), frozenset(added), fim_format(target.tokenizer), kept, files, batches,
                   conversations)


def kv_per_token(service: Service) -> int:
    """KV bytes a request reserves a token: the target's, and the default drafter's own cache (a draft model's)."""
    router = service.scheduler.router
    return service.target.kv_bytes_per_slot + router.drafters[router.default].kv_bytes_per_slot()


def kv_longest(service: Service) -> int | None:
    """The most tokens (prompt and max_tokens) one request may reserve within the KV budget (None: no budget): the
    inverse of _kv_reserve."""
    budget = service.config.kv_cache_bytes
    return None if budget is None else max(0, budget // kv_per_token(service) - KV_SLACK)


def _kv_reserve(service: Service, tokens: int) -> int:
    """The KV bytes a request of `tokens` (prompt and max_tokens, >= 2) reserves with the default drafter, as the
    scheduler reserves it (Engine.kv_bytes)."""
    router = service.scheduler.router
    return service.scheduler.engine.kv_bytes(tokens - 1, GenerationConfig(max_new_tokens=1),
                                             router.drafters[router.default])


def check_kv_budget(service: Service) -> None:
    """A KV budget that holds no request (a prompt token and a new one) is a ConfigError: every request would be
    a 413."""
    budget = service.config.kv_cache_bytes
    if budget is not None and budget < (least := _kv_reserve(service, 2)):
        raise ConfigError(f"--kv-cache-memory holds no request: {budget} bytes, less than the {least} that the "
                          "smallest request reserves")


def kv_summary(service: Service) -> str:
    """One line for the start-up log: what the KV budget holds, in tokens and in requests of the whole context;
    where it cannot hold one request of the whole context, the longest it can (a longer one is a 413)."""
    budget, longest = service.config.kv_cache_bytes, kv_longest(service)
    if budget is None or longest is None:
        return "KV memory: unbounded"
    per_token = kv_per_token(service)
    context = service.target.max_positions
    whole = _kv_reserve(service, context)
    line = (f"KV memory: {budget / (1 << 30):.2f} GiB for requests, {budget // per_token:,} tokens at "
            f"{per_token / 1024:.0f} KiB each; a request of the whole context ({context:,} tokens) reserves "
            f"{whole / (1 << 20):.0f} MiB")
    if whole <= budget:
        return f"{line}: {budget // whole:,} at once"
    return f"{line}, more than it holds: the longest request it holds is {longest:,} tokens (prompt and max_tokens; " \
           "a longer one is a 413)"


def _own_host(allowed: tuple[str, ...] | None) -> str:
    """A Host header the app answers (app.py, _HostCheck), for the requests it sends itself (a batch's)."""
    if allowed is None or "*" in allowed or "127.0.0.1" in allowed:
        return "127.0.0.1"
    name = allowed[0]
    return f"[{name}]" if ":" in name else name


@dataclass(frozen=True)
class ServeConfig:
    """The server as configured.

    drafter: the default drafter (its name, `auto` allowed, and the options every built drafter reads);
    allowed: further drafters a request may choose ({"speculation": {"drafter": NAME}}; the default and `none`
    always can); k_policy: how each step's draft length is chosen (measured: the built-in cost table where it
    describes this model, else this model's timed at start-up on a coarse grid; calibrate: this model's, timed
    at start-up on the full grid and printed; fixed: spec.k); served_name: the `model` clients send (None: the
    model's own name); kv_cache_bytes: KV memory requests may reserve (None: AUTO_KV_SHARE of the RAM, or of the free
    GPU memory after loading); api_key: when set, /v1/* needs `Authorization: Bearer <api_key>`; allowed_hosts:
    the Host headers answered (None: any; ServerConfig.allowed_hosts)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    drafter: DrafterConfig = field(default_factory=lambda: DrafterConfig("prompt-lookup"))
    allowed: tuple[str, ...] = ()
    spec: SpecConfig = field(default_factory=SpecConfig)
    k_policy: str = "measured"
    served_name: str | None = None
    max_batch: int = 8
    max_queue: int = 64
    default_max_tokens: int = 256
    kv_cache_bytes: int | None = None
    api_key: str | None = None
    allowed_hosts: tuple[str, ...] | None = None  # ServerConfig.allowed_hosts
    responses_kept: int = RESPONSES_KEPT  # ServerConfig.responses_kept
    files_bytes: int = FILES_BYTES  # ServerConfig.files_bytes
    conversation_bytes: int = CONVERSATION_BYTES  # ServerConfig.conversation_bytes
    responses_bytes: int = RESPONSES_BYTES  # ServerConfig.responses_bytes

    def __post_init__(self) -> None:
        # max_queue: a request waits in the queue before it gets a row, and one asking for more choices than it
        # holds is refused (app.py), so 0 would refuse every request
        for name, low in (("max_batch", 1), ("max_queue", 1), ("default_max_tokens", 1), ("responses_kept", 0),
                          ("files_bytes", 0), ("conversation_bytes", 0), ("responses_bytes", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise OptionError(f"{{{name}}} must be >= {low}, got {value!r}", name)
        if self.k_policy not in K_POLICIES:
            raise OptionError(f"{{k_policy}} must be one of {', '.join(K_POLICIES)}, got {self.k_policy!r}",
                              "k_policy")
        unknown = [name for name in (self.drafter.name, *self.allowed) if name not in (*registry(), AUTO)]
        if unknown:
            raise ConfigError(f"unknown drafter {unknown[0]!r}; choose from: {', '.join(registry())}")

    def resolved(self) -> ServeConfig:
        """The same config with `auto` resolved to a drafter's name (requests and metrics name it), every
        drafter option checked against the drafters that read it: what to build, checked before anything loads."""
        name = self.drafter.name
        if name == AUTO:
            name = best_drafter_name(self.model.device.partition(":")[0], self.drafter.draft_model is not None,
                                     self.spec.confidence != 0)
        config = dataclasses.replace(self, drafter=dataclasses.replace(self.drafter, name=name))
        check_options_read(self.drafter.given(self.spec), list(config.drafters))
        return config

    @property
    def drafters(self) -> tuple[str, ...]:
        """The drafters to build, the default first, each once."""
        return tuple(dict.fromkeys((self.drafter.name, *self.allowed)))


def default_kv_memory(device: str) -> int:
    """AUTO_KV_SHARE of the free GPU memory (after the model is loaded) on CUDA, of the physical RAM elsewhere."""
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(AUTO_KV_SHARE * free)
    return int(AUTO_KV_SHARE * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def build_service(config: ServeConfig) -> Service:
    """Load the model and the drafters; returns the app's Service (its scheduler not started). On the CPU the
    load runs on a thread that ends, so that the scheduler's thread, which decodes, owns the only OpenMP team
    (backends/cpu/own_thread.py)."""
    if config.model.on_cuda:
        return _build_service(config)
    return run_in_own_thread(_build_service, config)


def _build_service(config: ServeConfig) -> Service:
    auto = config.drafter.name == AUTO
    config = config.resolved()
    if config.model.on_cuda and not torch.cuda.is_available():
        raise OptionError("{device} cuda requested but no CUDA device is available", "device")
    check_kv_half(config.model)
    loaded = load_model(config.model)
    fast = config.model.fast_path  # compiled per (batch size, block bucket) as they first occur
    target = Target(loaded.model, loaded.tokenizer, fast, kv_half=config.model.kv_half)
    drafters = build_drafters(target, config, auto)
    limits = ServerConfig(config.served_name or loaded.name, config.max_batch, config.max_queue,
                          config.default_max_tokens, api_key=config.api_key,
                          kv_cache_bytes=config.kv_cache_bytes or default_kv_memory(config.model.device),
                          allowed_hosts=config.allowed_hosts, responses_kept=config.responses_kept,
                          files_bytes=config.files_bytes, conversation_bytes=config.conversation_bytes,
                          responses_bytes=config.responses_bytes)
    service = assemble(target, drafters, next(iter(drafters)), limits, config.spec, _policy(config, target))
    check_kv_budget(service)
    if fast.enabled:
        service.scheduler.engine.warmup()
    return service


def build_drafters(target: Target, config: ServeConfig, auto: bool) -> dict[str, Drafter]:
    """Name -> drafter, the default first. An `auto` default is built as `auto` (its name resolved, `hybrid`
    with a draft model on the CPU, becomes `draft-model` when that model has another tokenizer) and named by
    what it built."""
    default = build_drafter(target, dataclasses.replace(config.drafter, name=AUTO if auto else config.drafter.name),
                            config.spec)
    drafters = {default.name: default}
    for name in config.drafters[1:]:
        if name not in drafters:
            drafters[name] = build_drafter(target, dataclasses.replace(config.drafter, name=name), config.spec)
    return drafters


def _policy(config: ServeConfig, target: Target) -> SpecPolicy | None:
    """The per-step draft length policy `k_policy` names (None: fixed, spec.k every step)."""
    spec = config.spec
    max_k = spec.max_k if spec.adaptive else spec.k
    if config.k_policy == "fixed":
        return None
    if config.k_policy == "measured" and builtin_fits(target.config):
        return SpecPolicy(builtin_table(target.packed_decoder), max_k=max_k, ragged=target.packed_decoder)
    batches = _powers(config.max_batch)
    if config.k_policy == "calibrate":
        table = calibrate(target, batches=batches)
        print(f"verify-pass cost (ms) measured for --k-policy calibrate:\n{table.markdown()}", file=sys.stderr)
    else:  # measured, for a model the built-in tables do not describe: its own passes, on a coarser grid
        began = time.perf_counter()
        grid = (batches, QUICK_QS)
        path = cost_store.path_for(cache_root(), _cost_key(config, target, grid))
        had = cost_store.checked_table(
            path, grid, lambda: calibrate(target, batches=batches, qs=QUICK_QS, context=CONTEXT, repeats=QUICK_ROUNDS),
            lambda shapes: time_passes(target, shapes, context=CONTEXT, rounds=QUICK_ROUNDS), worth_s=SAY_AFTER_S)
        table = had.table
        if (seconds := time.perf_counter() - began) >= SAY_AFTER_S:  # a wait the user notices says why
            if had.source == "stored":
                print(f"--k-policy measured: verify-pass costs of an earlier start, two of them timed again "
                      f"({seconds:.1f} s; {path})", file=sys.stderr)
            else:
                kept = f"kept for the next start in {path}" if had.kept else f"not kept: {path} cannot be written"
                print(f"--k-policy measured: no built-in verify-pass costs for this model, so they were timed at "
                      f"start-up ({seconds:.1f} s; {had.reason}; {kept}; --k-policy calibrate times more and prints "
                      f"them)", file=sys.stderr)
    return SpecPolicy(table, max_k=max_k, ragged=target.packed_decoder)


def _cost_key(config: ServeConfig, target: Target, grid: tuple[tuple[int, ...], tuple[int, ...]]) -> dict:
    """What decides a model's verify-pass costs on this machine (cost_store): the model as configured and its
    architecture, the kernels, the threads, the CPU and the grid."""
    kernels = os.environ.get(native.CHOICE) or (native.best_variant() if native.missing() is None else None)
    return {"model": dataclasses.asdict(config.model), "architecture": target.config.to_dict(),
            "packed": target.packed_decoder, "kernels": kernels, "threads": torch.get_num_threads(),
            "cpu": native.cpu_name(), "cpus": os.cpu_count(), "grid": grid, "context": CONTEXT,
            "rounds": QUICK_ROUNDS}


def _powers(limit: int) -> tuple[int, ...]:
    sizes, b = [], 1
    while b < limit:
        sizes.append(b)
        b *= 2
    return tuple(sizes + [limit])
