"""Continuous batching: ONE worker thread owns the Engine and runs its loop body over all active sequences.

Between two steps the worker drops cancelled sequences (a client that disconnected frees its row before the
next step), admits queued requests into free rows, and picks the batch's draft-length cap (policy.py). Then
one `Engine.step` drafts, verifies and commits for every row that has finished its prefill (carrying a chunk
of a prompt still prefilling, below); each row keeps its own position, accepted length and K (ragged
acceptance). New text goes back to the request's asyncio queue on the HTTP event loop.

Chunked prefill: prompts are prefilled a chunk per round, so running streams keep decoding while a long one
loads, and a cancelled request stops at the next chunk; the prompts with the fewest tokens left go first. A
chunk rides in the step's target pass as one more row (`Engine.step(..., prefill=)`): a pass of its own would
add about a whole step of fixed cost on a small model or a CPU. On the native CPU decoder every chunk rides
(it computes real rows only, and scores none of the chunk's: Target.rides); through transformers' forward on a
CPU only a chunk no wider than the step's widest decode row does, since riding would pad every decode row to
its length. With nothing decoding, a round carries
`prefill_chunk` tokens, and so does a round while rows decode when short prompts (each at most `prefill_chunk`
tokens in all) wait: short prompts join the batch at once, as many as fit a chunk each round (32 streams of 12
tokens on 16 rows, tests/e2e/test_server_load.py, averaged 3.8-4.5 rows a step while short prompts came in small
bites, 13 while they join at once). A long prompt gets `prefill_share` of the decoding time, in bursts: a step
carries a chunk sized to add about `prefill_burst` plain steps (chunk_sizer.py, from the measured cost of each size),
then plain steps follow until their time, times the share, has paid for it (`_credit`).
Measured on the 2-core CPU, a step's cost jumps by about a whole step as soon as it carries a second row of
even one token (GEMV becomes GEMM) and then grows slowly with tokens, so a small chunk in every step slows every
token of the running streams and prefills slowest of all; a few larger ones leave most gaps alone and prefill
faster. A stream then runs at about 1 / (1 + share) of its idle speed. On the fixed-shape fast path (whose
captured steps must keep their shapes) each chunk is a pass of its own. Where one row's context is much longer
than the others', rows attend over their own contexts (target._uneven, attention.row_sdpa_forward), so a
loading prompt's length does not reach the other rows' attention; rows are still padded to the step's widest
row in tokens.

KV memory: a request reserves its KV (prompt + max new tokens, Engine.kv_bytes) from `kv_cache_bytes` when it
is admitted to the batch, and gives it back when it leaves; a row that keeps a finished request's KV for the next
prompts' prefixes (Engine.prefix_reuse) counts too, and is freed, oldest first, when a request needs the room.
One that can never fit is refused (TooLarge: 413);
one that does not fit now waits in the queue, first come first served (a later, smaller request does not pass
it, so a long prompt is not starved), and only a full queue is refused (429), as vLLM and TGI queue requests
for memory; the cache cannot outgrow its budget. The budget counts
the target's cache and a draft model's (`hybrid`'s too): a request reserves its chosen drafter's bytes per token
beside the target's, and the draft model's rows kept for the next prompts are parked rows like the target's.
(EAGLE's one-layer cache, a cross-tokenizer draft's, and the fast path's static cache, which keeps max_batch rows
at the largest capacity it has needed, are not counted.)

Liveness: `stalled()` names a worker that has spent more than `stall_s` in one round (a chunk and a step) while
work is pending, or that has died; /health reports it.

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

from specdecode.config import GenerationConfig, SamplingConfig
from specdecode.core.engine import Engine, Sequence, StepOutcome
from specdecode.core.logprobs import TokenLogprob
from specdecode.core.sequence import Origin
from specdecode.errors import StructureError
from specdecode.server.scheduling.chunk_sizer import MIN_CLIMB, ChunkSizer
from specdecode.server.scheduling.metrics import ServerMetrics
from specdecode.server.scheduling.policy import AcceptanceStats, DraftCost, DrafterEvidence, SpecPolicy, StepCap
from specdecode.server.scheduling.router import RoutingDrafter

NO_SPECULATION = "none"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch: int = 8  # rows decoded together (the engine's cache rows)
    max_queue: int = 64  # requests waiting while every row is busy; one more is answered 429
    kv_cache_bytes: int | None = None  # KV memory that admitted requests may reserve (None: unbounded)
    prefill_chunk: int = 256  # most prompt tokens prefilled per round
    prefill_share: float = 0.5  # while rows decode, prefill's time as a share of decoding time
    # while rows decode, a step carrying a chunk adds about this many plain steps: a running stream then waits
    # about 1 + prefill_burst times its usual gap (1: 2x, leaving room for the VM's noise below the 3x bound; 2 held
    # streams 5-8x with a 3,000-token prompt, 6 held them 12-24x; docs/serving.md)
    prefill_burst: float = 1.0
    stall_s: float = 30.0  # a round (chunk + step) longer than this, with work pending, is a stall

    def __post_init__(self) -> None:
        if self.kv_cache_bytes is not None and self.kv_cache_bytes <= 0:
            raise ValueError(f"kv_cache_bytes must be positive, got {self.kv_cache_bytes}")
        if self.prefill_chunk < 1 or not 0 < self.prefill_share or self.prefill_burst <= 0 or self.stall_s <= 0:
            raise ValueError("prefill_chunk must be >= 1; prefill_share, prefill_burst and stall_s > 0")


PLAIN_SAMPLES = 32  # the last plain steps kept: the quickest of them is a stream's usual step


@dataclass(frozen=True)
class Job:
    """A validated request, ready to decode."""

    prompt_ids: tuple[int, ...]
    sampling: SamplingConfig
    generation: GenerationConfig
    drafter: str
    k: int | None = None  # the request's draft length (None: the server's)
    prompt_only: bool = False  # score the prompt and generate nothing (completions' echo with max_tokens 0)


# -- events the worker sends to the request's handler --------------------------------------------------------
@dataclass(frozen=True)
class StepTrace:
    """What the step did with the request's draft (a stream's `speculation.trace`): the origin of each token, the
    draft length asked for, the draft's depth and how many of its tokens were accepted."""

    origins: tuple[Origin, ...]
    k: int
    depth: int
    accepted: int


@dataclass(frozen=True)
class TextDelta:
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per token, when the request asked for logprobs
    trace: StepTrace | None = None  # the step that committed the tokens


@dataclass(frozen=True)
class RequestStats:
    prompt_tokens: int
    completion_tokens: int
    target_passes: int
    tau: float
    acceptance_rate: float
    drafter: str
    forced: int = 0  # draft tokens the request's grammar forced
    cached: int = 0  # prompt tokens whose KV a finished request's row still held (Engine.prefix_reuse)
    proposed: int = 0  # draft tokens proposed (acceptance_rate's denominator: a request's choices are summed)


@dataclass(frozen=True)
class Finished:
    finish_reason: str  # OpenAI's: "stop" | "length"
    stats: RequestStats
    stop_reason: str | int | None = None  # vLLM's: the stop string or stop token that ended it (Sequence.stop_reason)


@dataclass(frozen=True)
class Failed:
    message: str
    status: int = 500  # 499: the client went away (nginx's "client closed request"); 400: the request's fault
    code: str = "generation_failed"

    @property
    def kind(self) -> str:
        """OpenAI's error type for the status."""
        return "invalid_request_error" if self.status < 500 else "server_error"


@dataclass(frozen=True)
class PromptLogprobs:
    """The prompt's tokens after the first with their logprobs, once it is prefilled (GenerationConfig.
    prompt_logprobs); before any of the request's text."""

    entries: tuple[TokenLogprob, ...]


Event = TextDelta | PromptLogprobs | Finished | Failed


class QueueFull(Exception):
    pass


class TooLarge(Exception):
    """The request's KV cache would not fit even in an empty server."""


class Ticket:
    """One submitted request: the HTTP side awaits events, the worker posts them from its thread."""

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop, leader: Ticket | None = None):
        self.job = job
        self.leader = leader  # the first choice of the same prompt in one request (its prefilled KV is copied)
        self.kv_bytes = 0  # reserved from the scheduler's budget while admitted
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


@dataclass(frozen=True)
class DraftLength:
    """A request's speculation length: its own K (or the engine policy's), capped per step by the scheduler's
    load policy (the engine asks through `Engine.step(..., draft_len=)`; adaptive updates still go to the
    engine's policy, `seq.length`). A seeded sampled request ignores the cap: its random draws depend on K, and
    the cap depends on the load, but a seed must give the same text at any load."""

    request_k: int | None
    speculates: bool
    seeded: bool = False

    def own(self, policy_k: int) -> int:
        if not self.speculates:
            return 0
        return policy_k if self.request_k is None else self.request_k

    def k(self, policy_k: int, cap: int) -> int:
        return self.own(policy_k) if self.seeded else min(self.own(policy_k), cap)


@dataclass
class _Slot:
    ticket: Ticket
    seq: Sequence
    length: DraftLength
    stats: AcceptanceStats = field(default_factory=AcceptanceStats)
    first_token_at: float | None = None
    drafted: bool = False  # its last step drafted (a step after none catches a draft model up: DraftCost)
    free_stats: AcceptanceStats = field(default_factory=AcceptanceStats)  # of its drafts that cost no pass alone
    drafts_free: bool = False  # its drafter has drafts that cost no pass (Capabilities.free_drafts)

    @property
    def own_k(self) -> int:
        return self.length.own(self.seq.length.k)

    @property
    def drafter(self) -> str:
        return self.seq.ctx.extra.get("drafter", "?")


class Scheduler:
    def __init__(self, engine: Engine, router: RoutingDrafter, config: SchedulerConfig, metrics: ServerMetrics,
                 policy: SpecPolicy | None = None):
        if engine.drafter is not router:
            raise ValueError("the engine must draft through the scheduler's RoutingDrafter")
        self.engine, self.router, self.config, self.metrics, self.policy = engine, router, config, metrics, policy
        self._pending: collections.deque[Ticket] = collections.deque()
        self._active: list[_Slot] = []
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._draft_cost = DraftCost()
        # times of the last steps that carried no prefill chunk; the quickest is a stream's usual step (their mean,
        # raised by a few slow steps and by the prompt's own tokenising, sized chunks that held streams 6-8x)
        self._plain_steps: collections.deque[float] = collections.deque(maxlen=PLAIN_SAMPLES)
        # a step's chunk while rows decode; whether a chunk wider than one-token decode rows is a pass of its own
        self._sizer = ChunkSizer(config.prefill_chunk, config.prefill_burst,
                                 own_pass=not engine.target.rides(MIN_CLIMB, 1))
        self._credit = 0.0  # seconds of prefill that decoding time has paid for; a chunk rides when it is >= 0
        self._round_began: float | None = None  # monotonic time the worker's current round began; None: idle
        self._drafters: dict[str, DrafterEvidence] = {}  # per drafter, over all its rows
        self.last_k_cap, self.last_free_only = 0, False
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
            self._size_kv(ticket)
            self._pending.append(ticket)
            self._wake.notify()

    def _size_kv(self, ticket: Ticket) -> None:
        """The KV the request will reserve when admitted; refused (TooLarge) when it exceeds the whole budget."""
        job = ticket.job
        need = self.engine.kv_bytes(len(job.prompt_ids), job.generation, self.router.drafters.get(job.drafter))
        budget = self.config.kv_cache_bytes
        if budget is not None and need > budget:
            raise TooLarge(f"the prompt ({len(job.prompt_ids)} tokens) and max_tokens "
                           f"({job.generation.max_new_tokens}) need {need} bytes of KV cache; this server has "
                           f"{budget}: shorten the prompt or lower max_tokens")
        ticket.kv_bytes = need

    @property
    def kv_reserved(self) -> int:
        """KV bytes reserved by the admitted requests."""
        return sum(s.ticket.kv_bytes for s in list(self._active))

    def _room(self, extra: int = 0) -> bool:
        """Whether `extra` bytes fit in the KV budget beside the admitted requests' reservations and the bytes the
        parked rows hold (finished requests' KV kept for the next prompts' prefixes), freeing parked rows, oldest
        first, until they do."""
        budget = self.config.kv_cache_bytes
        if budget is None:
            return True
        while self.kv_reserved + extra + self.engine.parked_bytes > budget:
            if not self.engine.evict_parked():
                return False
        return True

    def stalled(self) -> str | None:
        """Why the worker is not making progress, or None when it is (see the module docstring)."""
        if self._thread is None:
            return None
        if not self._thread.is_alive():
            return None if self._stopping else "the scheduler thread has stopped"
        began = self._round_began
        if began is not None and (seconds := time.monotonic() - began) > self.config.stall_s:
            return (f"the scheduler has not finished a step for {seconds:.1f} s "
                    f"({len(self._active)} active, {len(self._pending)} queued)")
        return None

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
        if self.engine.drafter.capabilities.prices_rows:
            try:  # measured here, on the thread that decodes, before the first request (row_budget.RowCost)
                _ = self.engine.target.row_cost
            except Exception:  # noqa: BLE001 - the first step measures it again, and fails that batch
                log.exception("measuring the row cost failed")
        while True:
            with self._wake:
                while not self._stopping and not self._pending and not self._active:
                    self._wake.wait()
                if self._stopping:
                    break
            self._round_began = time.monotonic()
            try:
                self._round()
            except Exception as error:  # noqa: BLE001 - a bug here must fail this batch, not stop the server
                log.exception("scheduler step failed")
                for slot in list(self._active):
                    self._fail(slot, f"internal error: {type(error).__name__}: {error}")
            finally:
                self._round_began = None
        for slot in list(self._active):
            self._fail(slot, "the server is shutting down")
        with self._wake:
            pending, self._pending = list(self._pending), collections.deque()
        for ticket in pending:
            ticket.post(Failed("the server is shutting down"))

    def _round(self) -> None:
        """Drop the cancelled, admit, then one step over the decoding rows that carries prefill chunks. (A method
        of its own: the worker's frame must not keep a finished request alive while it waits for work.)"""
        self._drop_cancelled()
        self._admit()
        self._score_prompts()
        decoding = [slot for slot in self._active if slot.seq.ready]
        short = [s for s in self._active if s.seq.prefilling and s.seq.prompt_len <= self.config.prefill_chunk]
        if not decoding:  # nobody waits on the pass: the most a round carries
            prefill = self._chunks(self.config.prefill_chunk)
        elif short:  # short prompts join the batch at once, up to a chunk's worth a round
            prefill = self._chunks(self.config.prefill_chunk, short)
        else:  # a long prompt loads in chunks that each cost the running streams about prefill_burst steps, paid
            # for by decoding time (from a plain step's time: the first step with rows decoding carries none)
            prefill = self._chunks(self._sizer.chunk) if self._prefill_paid() else []
        if prefill and self.engine.cache.static:  # fixed-shape steps keep their shapes: chunks go alone
            for slot, _ in prefill:
                self._prefill_alone(slot, self.config.prefill_chunk)
            prefill = []
        if decoding:
            self._step(decoding, prefill)
        elif prefill:
            try:
                self.engine.step([], [(slot.seq, tokens) for slot, tokens in prefill])
            except Exception:  # noqa: BLE001 - find the culprit: each chunk alone
                for slot, tokens in prefill:
                    self._prefill_alone(slot, tokens)

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
                if not self._pending or not self._room(self._pending[0].kv_bytes):  # the head waits for memory to free
                    return
                wait, like = self._first_choice(self._pending[0])
                if wait:
                    return
                ticket = self._pending.popleft()
            job = ticket.job
            try:
                seq = self.engine.admit(list(job.prompt_ids), job.sampling, job.generation, like)
            except Exception as error:  # noqa: BLE001 - one request's failure must not stop the server
                self.metrics.finished.labels("error").inc()
                ticket.post(Failed(f"could not start generation: {error}"))
                continue
            self.router.choose(seq.ctx, job.drafter)
            seeded = job.sampling.seeded
            length = DraftLength(job.k, job.drafter != NO_SPECULATION, seeded=seeded)
            self.metrics.prompt_tokens.inc(len(job.prompt_ids))
            self.metrics.cached_prompt_tokens.inc(seq.metrics.cached_prompt_tokens)
            slot = _Slot(ticket, seq, length)
            slot.drafts_free = self.router.drafters[slot.drafter].capabilities.free_drafts
            self._active.append(slot)

    def _score_prompts(self) -> None:
        """Prompts whose logprobs are asked for are prefilled in passes of their own (every row's logits: none rides
        in a step, whose pass scores only its decoding rows): a whole chunk each a round when nothing decodes; while
        rows decode, the sizer's chunk, paid for like a riding chunk (`_credit`) with the pass's whole time. Once
        one is prefilled its logprobs go out, and a prompt-only request ends."""
        decoding = any(slot.seq.ready for slot in self._active)
        for slot in [s for s in self._active if s.seq.prefilling and s.seq.generation.prompt_logprobs is not None]:
            if decoding and not self._prefill_paid():
                return
            began = time.perf_counter()
            self._prefill_alone(slot, self._sizer.chunk if decoding else self.config.prefill_chunk)
            if decoding:
                self._credit -= time.perf_counter() - began
            if slot.seq.ready and slot in self._active:
                slot.ticket.post(PromptLogprobs(tuple(slot.seq.prompt_logprobs)))
                if slot.ticket.job.prompt_only:
                    self._leave(slot, "length")

    def _first_choice(self, ticket: Ticket) -> tuple[bool, Sequence | None]:
        """(wait, like) for a later choice of a prompt: it waits while the prompt's first choice is prefilling, then
        copies that KV rather than prefill it again (where the engine reuses prefixes); a first choice that has
        finished left its row parked, where any prompt finds its prefix."""
        if ticket.leader is None or not self.engine.prefix_reuse or ticket.job.generation.prompt_logprobs is not None:
            return False, None  # a prompt whose logprobs are asked for is prefilled whole: nothing to wait for
        slot = next((slot for slot in self._active if slot.ticket is ticket.leader), None)
        if slot is None:
            return False, None
        return slot.seq.prefilling, slot.seq

    def _chunks(self, budget: int, among: list[_Slot] | None = None) -> list[tuple[_Slot, int]]:
        """Up to `budget` prompt tokens for the prefilling rows (or those `among` them), those with the fewest
        tokens left first (a short prompt is not queued behind a long one)."""
        rows = self._active if among is None else among
        slots = sorted((s for s in rows if s.seq.prefilling and s.seq.generation.prompt_logprobs is None),
                       key=lambda s: s.seq.prompt_len - s.seq.prefilled)
        chunks = []
        for slot in slots:
            if budget <= 0:
                break
            tokens = min(budget, max(1, slot.seq.prompt_len - 1 - slot.seq.prefilled))
            chunks.append((slot, tokens))
            budget -= tokens
        return chunks

    def _prefill_alone(self, slot: _Slot, tokens: int) -> None:
        try:
            self.engine.prefill_chunk(slot.seq, tokens)
        except Exception as error:  # noqa: BLE001 - one request's failure must not stop the server
            self._fail(slot, f"could not start generation: {type(error).__name__}: {error}")

    def _adapt_chunk(self, seconds: float, tokens: int) -> None:
        """After a step that carried `tokens` prompt tokens next to decoding rows: charge the time they added
        (over a plain step) to the credit, and size the next chunk from it (chunk_sizer.py)."""
        if not self._plain_steps:
            return
        plain = min(self._plain_steps)
        added = max(0.0, seconds - plain)
        self._credit -= added
        self._sizer.observe(tokens, added, plain)

    def _prefill_paid(self) -> bool:
        """Whether decoding time has paid for the next prefill chunk beside decoding rows (and a plain step has
        been timed to charge it against)."""
        return self._credit >= 0 and bool(self._plain_steps)

    def _earn(self, seconds: float) -> None:
        """A plain step while prompts wait: its time, times the share, pays for prefill; nothing is saved up
        while no prompt waits (a prompt that arrives later gets its first chunk at once, then its share)."""
        if any(slot.seq.prefilling for slot in self._active):
            self._credit = min(0.0, self._credit + self.config.prefill_share * seconds)
        else:
            self._credit = 0.0

    def _choose_cap(self, slots: list[_Slot]) -> StepCap:
        if self.policy is None:
            return StepCap(1 << 10)
        rows, free = [], []
        for slot in slots:
            if (own_k := slot.own_k) > 0:
                evidence = self._drafters.get(slot.drafter)
                prior = evidence.prior(self.policy, own_k) if evidence else None
                rows.append(slot.stats.estimate(self.policy, own_k, prior))
                free_prior = evidence.free_prior(self.policy, own_k) if evidence else None
                free.append(slot.free_stats.estimate(self.policy, own_k, free_prior) if slot.drafts_free else None)
        return self.policy.choose(len(slots), rows, self._draft_cost.ms_per_k(len(slots)), free)

    def _step(self, slots: list[_Slot], prefill: list[tuple[_Slot, int]]) -> None:
        cap = self._choose_cap(slots)
        self.last_k_cap, self.last_free_only = cap.k, cap.free_only
        self.metrics.k_cap.set(min(cap.k, 1 << 10))
        if cap.k == 0:
            self.metrics.speculation_off.inc()
        elif cap.free_only:
            self.metrics.free_only.inc()
        lengths = {slot.seq.ctx.seq_id: slot.length for slot in slots}
        for slot in slots:  # a seeded row keeps its own drafts at any load (DraftLength); the router asks a free-only
            slot.seq.ctx.free_only = cap.free_only and not slot.length.seeded  # row without free drafts for none

        def draft_len(seq: Sequence) -> int:
            return lengths[seq.ctx.seq_id].k(seq.length.k, cap.k)

        began = time.perf_counter()
        try:
            results = list(zip(slots, self.engine.step([s.seq for s in slots],
                                                       [(slot.seq, tokens) for slot, tokens in prefill], draft_len)))
            passes = 1
        except Exception:  # noqa: BLE001 - nothing was committed: find the culprit, each row alone
            results, passes = self._isolate(slots, draft_len)
            for slot, tokens in prefill:
                self._prefill_alone(slot, tokens)
            prefill = []
        elapsed = time.perf_counter() - began
        if not prefill:
            self._plain_steps.append(elapsed)
            self._earn(elapsed)
        else:
            self._adapt_chunk(elapsed, sum(tokens for _, tokens in prefill))
        self.metrics.step_seconds.observe(elapsed)
        self.metrics.batch_size.observe(len(slots))
        self.metrics.target_passes.inc(passes)
        self.metrics.sequence_passes.inc(len(results))
        drafted_ms, steady, drafting = [], True, False
        if self.policy is not None:
            for drafter in self._drafters.values():
                drafter.decay(self.policy)
        memory = self.policy.memory if self.policy else 1.0
        for slot, outcome in results:
            if outcome.error is None:
                self.metrics.observe_draft(outcome.depth, outcome.accepted)
                evidence = (outcome.k, outcome.depth, outcome.accepted)
                slot.stats.observe(*evidence, memory=memory)
                drafter = self._drafters.setdefault(slot.drafter, DrafterEvidence())
                drafter.observe(*evidence)
                if outcome.free or outcome.depth == 0:  # not a draft that paid passes: evidence of free ones alone
                    slot.free_stats.observe(*evidence, memory=memory)
                    drafter.free.observe(*evidence)
                drafting = drafting or outcome.k > 0
                if outcome.k > 0 and not outcome.free:  # a draft that cost passes (or asked for them)
                    drafted_ms.append(outcome.draft_s * 1000 / outcome.k)
                    steady = steady and slot.drafted
                slot.drafted = outcome.k > 0
            self._deliver(slot, outcome)
        if drafting and not cap.free_only:  # a step that allowed drafts with passes: did any pay (DraftCost)
            self._draft_cost.observe_step(len(results), bool(drafted_ms))
        if drafted_ms and steady and not cap.free_only:  # no drafter caught up on a prompt or on plain steps
            self._draft_cost.observe(len(results), max(drafted_ms))
        self._draft_cost.tick()

    def _isolate(self, slots: list[_Slot], draft_len) -> tuple[list[tuple[_Slot, StepOutcome]], int]:
        """A batched step raised before committing anything: step each row alone, fail the ones that raise."""
        results, passes = [], 1
        for slot in slots:
            try:
                (outcome,) = self.engine.step([slot.seq], draft_len=draft_len)
                passes += 1
                results.append((slot, outcome))
            except Exception as error:  # noqa: BLE001
                self._fail_with(slot, error)
        return results, passes

    def _deliver(self, slot: _Slot, outcome: StepOutcome) -> None:
        if outcome.error is not None:
            self._fail_with(slot, outcome.error)
            return
        tokens, now = outcome.token_ids, time.perf_counter()
        if tokens and slot.first_token_at is None:
            slot.first_token_at = now
            self.metrics.ttft.observe(now - slot.ticket.arrived)
        self.metrics.generated_tokens.inc(len(tokens))
        if outcome.text or tokens:
            trace = StepTrace(outcome.origins, outcome.k, outcome.depth, outcome.accepted)
            slot.ticket.post(TextDelta(outcome.text, tuple(tokens), outcome.logprobs, trace))
        if outcome.finish_reason is not None:
            self._leave(slot, outcome.finish_reason)

    def _stats(self, slot: _Slot) -> RequestStats:
        m = slot.seq.metrics
        return RequestStats(m.prompt_tokens, len(slot.seq.output_ids), m.target_passes, round(m.tau, 4),
                            round(m.acceptance_rate, 4), slot.drafter, m.forced, m.cached_prompt_tokens, m.proposed)

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
        slot.ticket.post(Finished("length" if reason == "length" else "stop", stats, slot.seq.stop_reason))

    def _fail_with(self, slot: _Slot, error: Exception) -> None:
        """A row's generation raised: the request's structure that this model cannot follow is the client's
        error (400, logged with its reason), anything else a bug (500, with its traceback)."""
        if isinstance(error, StructureError):
            log.warning("request %s: %s", slot.seq.ctx.seq_id, error)
            self._fail(slot, str(error), status=400, code="structure_not_followed")
        else:
            log.error("request %s failed", slot.seq.ctx.seq_id, exc_info=error)
            self._fail(slot, f"generation failed: {type(error).__name__}: {error}")

    def _fail(self, slot: _Slot, message: str, status: int = 500, code: str = "generation_failed") -> None:
        if slot in self._active:
            self._active.remove(slot)
            self._release(slot)
        self.metrics.finished.labels("error").inc()
        slot.ticket.post(Failed(message, status, code))

    def _release(self, slot: _Slot) -> None:
        try:
            self.engine.release(slot.seq)
        except Exception:  # noqa: BLE001 - the engine frees the row even when the drafter's cleanup raises
            log.exception("drafter cleanup failed for sequence %s", slot.seq.ctx.seq_id)
        self._room()  # a parked row holds its whole buffer, more than its reservation counted: within the budget
