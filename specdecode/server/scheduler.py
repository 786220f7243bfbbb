"""Continuous batching: ONE worker thread owns the Engine and runs its loop body over all active sequences.

Between two steps the worker drops cancelled sequences (a client that disconnected frees its row before the
next step), admits queued requests into free rows (prefill), and picks the batch's draft-length cap (policy.py).
Then one `Engine.step` drafts, verifies and commits for every row; each row keeps its own position, accepted
length and K (ragged acceptance). New text goes back to the request's asyncio queue on the HTTP event loop.

Failure isolation: when a batched step raises, rows that had already committed keep their tokens and every
other row is stepped alone; a row that fails alone fails its request only, and the server keeps serving.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass, field

from ..config import GenerationConfig, SamplingConfig
from ..engine import Engine, Sequence, StopText
from ..speculation import SpeculationLength
from .metrics import ServerMetrics
from .policy import AcceptanceStats, SpecPolicy
from .router import RoutingDrafter

NO_SPECULATION = "none"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch: int = 8  # rows decoded together (the engine's cache rows)
    max_queue: int = 64  # requests waiting while every row is busy; one more is answered 429


@dataclass(frozen=True)
class Job:
    """A validated request, ready to decode."""

    prompt_ids: tuple[int, ...]
    sampling: SamplingConfig
    generation: GenerationConfig
    drafter: str
    k: int | None = None  # the request's draft length (None: the server's)


# -- events the worker sends to the request's handler --------------------------------------------------------
@dataclass(frozen=True)
class TextDelta:
    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class RequestStats:
    prompt_tokens: int
    completion_tokens: int
    target_passes: int
    tau: float
    acceptance_rate: float
    drafter: str


@dataclass(frozen=True)
class Finished:
    finish_reason: str  # OpenAI's: "stop" | "length"
    stats: RequestStats


@dataclass(frozen=True)
class Failed:
    message: str
    status: int = 500  # 499: the client went away (nginx's "client closed request")


Event = TextDelta | Finished | Failed


class QueueFull(Exception):
    pass


class Ticket:
    """One submitted request: the HTTP side awaits events, the worker posts them from its thread."""

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop):
        self.job = job
        self.arrived = time.perf_counter()
        self._loop = loop
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """The client went away (or the handler finished): the worker frees the row before its next step."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def post(self, event: Event) -> None:
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the event loop has closed (server shutdown): nobody is listening
            pass

    async def next(self) -> Event:
        return await self._events.get()


@dataclass
class CappedLength:
    """Stands in for Sequence.length: the request's own K (or the engine's policy), capped per step by the
    scheduler; adaptive updates still go to the engine's policy. A seeded sampled request ignores the cap: its
    random draws depend on K, and the cap depends on the load, but a seed must give the same text at any load."""

    inner: SpeculationLength
    request_k: int | None
    speculates: bool
    cap: int = 1 << 10
    seeded: bool = False

    @property
    def own_k(self) -> int:
        if not self.speculates:
            return 0
        return self.inner.k if self.request_k is None else self.request_k

    @property
    def k(self) -> int:
        return self.own_k if self.seeded else min(self.own_k, self.cap)

    def update(self, drafted: int, accepted: int, seconds: float | None = None, committed: int = 1) -> None:
        self.inner.update(drafted, accepted, seconds=seconds, committed=committed)


@dataclass
class _Slot:
    ticket: Ticket
    seq: Sequence
    text: StopText
    stats: AcceptanceStats = field(default_factory=AcceptanceStats)
    first_token_at: float | None = None

    @property
    def length(self) -> CappedLength:
        return self.seq.length  # type: ignore[return-value]

    @property
    def drafter(self) -> str:
        return self.seq.ctx.extra.get("drafter", "?")


class Scheduler:
    def __init__(self, engine: Engine, router: RoutingDrafter, config: SchedulerConfig, metrics: ServerMetrics,
                 policy: SpecPolicy | None = None, tokenizer_lock: threading.Lock | None = None):
        if engine.drafter is not router:
            raise ValueError("the engine must draft through the scheduler's RoutingDrafter")
        self.engine, self.router, self.config, self.metrics, self.policy = engine, router, config, metrics, policy
        self.tokenizer_lock = tokenizer_lock or threading.Lock()
        self._pending: collections.deque[Ticket] = collections.deque()
        self._active: list[_Slot] = []
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._draft_ms_per_k = 0.0
        self._pooled: dict[str, AcceptanceStats] = {}  # per drafter, over all its rows (decaying)
        self.last_k_cap = 0
        metrics.watch(lambda: len(self._pending), lambda: len(self._active))

    # -- called from the HTTP side -----------------------------------------------------------------------------
    def submit(self, ticket: Ticket) -> None:
        with self._wake:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            self._prune_pending()
            free_rows = self.config.max_batch - len(self._active)
            if len(self._pending) >= self.config.max_queue + free_rows:
                raise QueueFull(f"too many requests waiting ({self.config.max_queue}); retry later")
            self._pending.append(ticket)
            self._wake.notify()

    @property
    def queued(self) -> int:
        return len(self._pending)

    @property
    def active(self) -> int:
        return len(self._active)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="specdecode-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the worker ---------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self._pending and not self._active:
                    self._wake.wait()
                if self._stopping:
                    break
            try:
                self._drop_cancelled()
                self._admit()
                if self._active:
                    self._step()
            except Exception as error:  # noqa: BLE001 - a bug here must fail this batch, not stop the server
                log.exception("scheduler step failed")
                for slot in list(self._active):
                    self._fail(slot, f"internal error: {type(error).__name__}: {error}")
        for slot in list(self._active):
            self._fail(slot, "the server is shutting down")
        with self._wake:
            pending, self._pending = list(self._pending), collections.deque()
        for ticket in pending:
            ticket.post(Failed("the server is shutting down"))

    def _prune_pending(self) -> None:
        if any(t.cancelled for t in self._pending):
            self._pending = collections.deque(t for t in self._pending if not t.cancelled)

    def _drop_cancelled(self) -> None:
        for slot in [s for s in self._active if s.ticket.cancelled]:
            self._leave(slot, "abort")

    def _admit(self) -> None:
        while len(self._active) < self.config.max_batch:
            with self._wake:
                self._prune_pending()
                if not self._pending:
                    return
                ticket = self._pending.popleft()
            job = ticket.job
            try:
                seq = self.engine.start(list(job.prompt_ids), job.sampling, job.generation)
            except Exception as error:  # noqa: BLE001 - one request's failure must not stop the server
                self.metrics.finished.labels("error").inc()
                ticket.post(Failed(f"could not start generation: {error}"))
                continue
            self.router.choose(seq.ctx, job.drafter)
            seeded = job.sampling.seed is not None and not job.sampling.greedy
            seq.length = CappedLength(seq.length, job.k, job.drafter != NO_SPECULATION,  # type: ignore[assignment]
                                      seeded=seeded)
            self.metrics.prompt_tokens.inc(len(job.prompt_ids))
            self._active.append(_Slot(ticket, seq, StopText(self.engine.target.tokenizer, job.generation.stop_strings)))

    def _choose_cap(self) -> int:
        if self.policy is None:
            return 1 << 10
        rows = []
        for slot in self._active:
            if slot.length.own_k > 0:
                pooled = self._pooled.get(slot.drafter)
                prior = pooled.estimate(self.policy, slot.length.own_k) if pooled else None
                rows.append(slot.stats.estimate(self.policy, slot.length.own_k, prior))
        return self.policy.choose_k(len(self._active), rows, self._draft_ms_per_k)

    def _step(self) -> None:
        cap = self.last_k_cap = self._choose_cap()
        self.metrics.k_cap.set(min(cap, 1 << 10))
        slots = list(self._active)
        before = []
        for slot in slots:
            slot.length.cap = cap
            m = slot.seq.metrics
            before.append((m.proposed, m.accepted, m.draft_s, len(slot.seq.ctx.tokens)))
        began = time.perf_counter()
        try:
            results = list(zip(slots, self.engine.step([s.seq for s in slots])))
            passes = 1
        except Exception:  # noqa: BLE001 - find the culprit below
            results, passes = self._isolate(slots, before)
        elapsed = time.perf_counter() - began
        self.metrics.step_seconds.observe(elapsed)
        self.metrics.batch_size.observe(len(slots))
        self.metrics.target_passes.inc(passes)
        self.metrics.sequence_passes.inc(len(results))
        drafted_ms = []
        if self.policy is not None:
            for pooled in self._pooled.values():
                pooled.decay(self.policy.pooled_memory)
        for slot, tokens in results:
            proposed, accepted, draft_s, _ = before[slots.index(slot)]
            m = slot.seq.metrics
            memory = self.policy.memory if self.policy else 1.0
            drafted, kept = m.proposed - proposed, m.accepted - accepted
            self.metrics.observe_draft(drafted, kept)
            evidence = (slot.seq.ctx.k, drafted, kept)
            slot.stats.observe(*evidence, memory=memory)
            self._pooled.setdefault(slot.drafter, AcceptanceStats()).observe(*evidence)
            if slot.seq.ctx.k > 0:
                drafted_ms.append((m.draft_s - draft_s) * 1000 / slot.seq.ctx.k)
            self._deliver(slot, tokens)
        if drafted_ms:
            self._draft_ms_per_k = 0.8 * self._draft_ms_per_k + 0.2 * max(drafted_ms)

    def _isolate(self, slots: list[_Slot], before: list[tuple]) -> tuple[list[tuple[_Slot, list[int]]], int]:
        """A batched step raised: keep what rows committed, retry the others alone, fail the ones that raise."""
        results, passes = [], 1
        for slot, (*_, length) in zip(slots, before):
            tokens = slot.seq.ctx.tokens
            if len(tokens) > length:  # committed before the error
                results.append((slot, tokens[length:]))
                continue
            try:
                (new,) = self.engine.step([slot.seq])
                passes += 1
                results.append((slot, new))
            except Exception as error:  # noqa: BLE001
                self._fail(slot, f"generation failed: {type(error).__name__}: {error}")
        return results, passes

    def _deliver(self, slot: _Slot, tokens: list[int]) -> None:
        seq = slot.seq
        try:
            with self.tokenizer_lock:
                text, stopped = slot.text.push(tokens, final=seq.finished)
        except Exception as error:  # noqa: BLE001
            self._fail(slot, f"detokenisation failed: {error}")
            return
        if stopped:
            seq.finish_reason = "stop"
        now = time.perf_counter()
        if tokens and slot.first_token_at is None:
            slot.first_token_at = now
            self.metrics.ttft.observe(now - slot.ticket.arrived)
        self.metrics.generated_tokens.inc(len(tokens))
        if text or tokens:
            slot.ticket.post(TextDelta(text, tuple(tokens)))
        if seq.finished:
            self._leave(slot, seq.finish_reason or "length")

    def _stats(self, slot: _Slot) -> RequestStats:
        m = slot.seq.metrics
        return RequestStats(m.prompt_tokens, len(slot.seq.output_ids), m.target_passes, round(m.tau, 4),
                            round(m.acceptance_rate, 4), slot.drafter)

    def _leave(self, slot: _Slot, reason: str) -> None:
        """The row leaves the batch; the request gets its final event unless it was aborted."""
        self._active.remove(slot)
        self._release(slot)
        self.metrics.finished.labels(reason).inc()
        if reason == "abort":
            return
        stats = self._stats(slot)
        self.metrics.tau.observe(stats.tau)
        if slot.seq.metrics.proposed > 0:  # a generation that drafted nothing has no acceptance rate (not 0.0)
            self.metrics.acceptance.observe(stats.acceptance_rate)
        if slot.first_token_at is not None and stats.completion_tokens > 1:
            self.metrics.tpot.observe((time.perf_counter() - slot.first_token_at) / (stats.completion_tokens - 1))
        slot.ticket.post(Finished("length" if reason == "length" else "stop", stats))

    def _fail(self, slot: _Slot, message: str) -> None:
        if slot in self._active:
            self._active.remove(slot)
            self._release(slot)
        self.metrics.finished.labels("error").inc()
        slot.ticket.post(Failed(message))

    def _release(self, slot: _Slot) -> None:
        try:
            self.engine.release(slot.seq)
        except Exception:  # noqa: BLE001 - the engine frees the row even when the drafter's cleanup raises
            log.exception("drafter cleanup failed for sequence %s", slot.seq.ctx.seq_id)
