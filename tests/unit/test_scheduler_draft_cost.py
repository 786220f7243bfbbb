"""The server's drafting cost per unit of K is measured online, and one slow step must not switch speculation off
for good: a request's first draft also runs a draft model over its prompt (the Qwen pair's 0.5B: 294 ms per
drafted token once, ~10 after), and with that sample no later step drafted, so none could correct it (DraftCost)."""
import asyncio
import time

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.drafting import Capabilities, Draft
from specdecode.core.engine import Engine
from specdecode.drafters import build_drafter
from specdecode.drafters.common.base import BaseDrafter
from specdecode.server.scheduling.metrics import ServerMetrics
from specdecode.server.scheduling.policy import CostTable, DraftCost, RowEstimate, SpecPolicy
from specdecode.server.scheduling.router import RoutingDrafter
from specdecode.server.scheduling.scheduler import Job, Scheduler, SchedulerConfig, Ticket

PROMPT = (5, 6, 7)
FLAT = CostTable(batches=(1, 2), qs=(1, 9), ms=((10.0, 10.0), (10.0, 10.0)))  # 10 ms a pass at any width


class Oracle(BaseDrafter):
    """Drafts the target's own greedy answer; its first proposal takes `first_s` seconds."""

    name = "oracle"

    def __init__(self, answer: list[int], first_s: float):
        self.answer, self.first_s = answer, first_s

    def propose(self, seqs):
        if self.first_s:
            time.sleep(self.first_s)
            self.first_s = 0.0
        return [Draft.chain(self.answer[len(s.tokens) - len(PROMPT):][: s.k]) for s in seqs]


def _rounds(scheduler: Scheduler) -> list[tuple[int, bool]]:
    """The scheduler's rounds until nothing is queued or decoding; -> each round's (cap, free drafts only)."""
    caps = []
    while scheduler._pending or scheduler._active:
        scheduler._round()
        caps.append((scheduler.last_k_cap, scheduler.last_free_only))
    return caps


def test_a_slow_first_draft_does_not_switch_speculation_off(tiny_target):
    spec = SpecConfig(k=4)
    plain = build_drafter(tiny_target, DrafterConfig(name="none"), spec)
    greedy, length = SamplingConfig(), GenerationConfig(max_new_tokens=30, stop_on_eos=False)
    answer = Engine(tiny_target, plain, spec).generate(list(PROMPT), greedy, length).token_ids
    router = RoutingDrafter({"oracle": Oracle(answer, first_s=0.4)}, "oracle")
    scheduler = Scheduler(Engine(tiny_target, router, spec), router, SchedulerConfig(max_batch=1), ServerMetrics(),
                          SpecPolicy(FLAT, max_k=4))
    loop = asyncio.new_event_loop()
    try:
        scheduler.submit(Ticket(Job(PROMPT, greedy, length, "oracle"), loop))
        caps = [k for k, _ in _rounds(scheduler)]
    finally:
        loop.close()
    # the first draft's 100 ms per token would price every later draft at 20 ms a token against 10 ms passes
    assert len(caps) < len(answer) and all(cap > 0 for cap in caps[1:])


def test_one_slow_step_does_not_move_the_draft_cost():
    cost = DraftCost()
    assert cost.ms_per_k(1) == 0.0  # nothing measured: drafting is tried
    for ms in (10.0, 11.0, 300.0, 9.0, 10.0):
        cost.observe(1, ms)
    cost.observe(4, 40.0)
    assert cost.ms_per_k(1) == 9.0 and cost.ms_per_k(4) == 40.0
    assert cost.ms_per_k(2) == 18.0 and cost.ms_per_k(8) == 80.0  # the nearest measured size's, by the rows
    policy, rows = SpecPolicy(FLAT, max_k=4), [RowEstimate(alpha=0.8, p_draft=1.0, max_k=4)]
    assert policy.choose_k(1, rows, cost.ms_per_k(1) / 10) > 0 and policy.choose_k(1, rows, cost.ms_per_k(4)) == 0


def test_a_drafter_keeps_its_own_acceptance_as_the_prior_while_nothing_drafts(tiny_target):
    """After a stretch with nothing drafted, a new request starts from its drafter's long-run record rather than the
    constants (0.6): here drafting pays only above 0.63 (K = 1: 1 + a tokens for 16 ms against 1 for 10 ms)."""
    spec = SpecConfig(k=4)
    plain = build_drafter(tiny_target, DrafterConfig(name="none"), spec)
    greedy = SamplingConfig()
    length = GenerationConfig(max_new_tokens=30, stop_on_eos=False)
    answer = Engine(tiny_target, plain, spec).generate(list(PROMPT), greedy, length).token_ids
    router = RoutingDrafter({"oracle": Oracle(answer, first_s=0.0), "none": plain}, "oracle")
    wide = CostTable(batches=(1, 2), qs=(1, 9), ms=((10.0, 58.0), (10.0, 58.0)))  # 10 ms + 6 per drafted token
    scheduler = Scheduler(Engine(tiny_target, router, spec), router, SchedulerConfig(max_batch=1), ServerMetrics(),
                          SpecPolicy(FLAT, max_k=4))
    loop = asyncio.new_event_loop()

    def run(drafter: str, tokens: int) -> list[int]:
        scheduler.submit(Ticket(Job(PROMPT, greedy, GenerationConfig(max_new_tokens=tokens, stop_on_eos=False),
                                    drafter), loop))
        return [k for k, _ in _rounds(scheduler)]

    try:
        assert any(run("oracle", 30))  # accepted throughout: the drafter's record
        scheduler.policy = SpecPolicy(wide, max_k=4)  # from here drafting pays at the record, not at 0.6
        assert run("oracle", 30)[1] > 0
        run("none", 300)  # 300 steps that draft nothing: the pooled evidence fades
        assert run("oracle", 30)[1] > 0  # a new request drafts from its first decoding step
    finally:
        loop.close()


class FreeOracle(Oracle):
    """An Oracle whose drafts cost no draft pass (as suffix's, or hybrid's when a step asks): records each row's
    ctx.free_only."""

    name = "free-oracle"
    capabilities = Capabilities(free_drafts=True)

    def __init__(self, answer: list[int]):
        super().__init__(answer, first_s=0.0)
        self.asked: list[bool] = []

    def propose(self, seqs):
        self.asked.extend(s.free_only for s in seqs)
        return [Draft.chain(draft.tokens, free=True) for draft in super().propose(seqs)]


def test_where_a_models_drafts_do_not_pay_free_drafts_still_run(tiny_target):
    """Drafting measured at 100 ms a token against 10 ms passes: no draft pays for its pass, so the batch's cap is
    0 for a drafter that must pay (plain decoding), while one that can draft without a pass gets steps that allow
    free drafts only; their ~0 ms of drafting is not taken for the cost of drafting with passes (DraftCost)."""
    spec = SpecConfig(k=4)
    plain = build_drafter(tiny_target, DrafterConfig(name="none"), spec)
    greedy, length = SamplingConfig(), GenerationConfig(max_new_tokens=30, stop_on_eos=False)
    answer = Engine(tiny_target, plain, spec).generate(list(PROMPT), greedy, length).token_ids
    free = FreeOracle(answer)
    router = RoutingDrafter({"oracle": Oracle(answer, first_s=0.0), "free-oracle": free}, "oracle")
    metrics = ServerMetrics()
    scheduler = Scheduler(Engine(tiny_target, router, spec), router, SchedulerConfig(max_batch=1), metrics,
                          SpecPolicy(FLAT, max_k=4))
    scheduler._draft_cost.observe(1, 100.0)
    loop = asyncio.new_event_loop()

    def run(drafter: str) -> tuple[list[tuple[int, bool]], list[int]]:
        ticket = Ticket(Job(PROMPT, greedy, length, drafter), loop)
        scheduler.submit(ticket)
        caps = _rounds(scheduler)
        loop.run_until_complete(asyncio.sleep(0))
        tokens = []
        while not ticket._events.empty():
            event = ticket._events.get_nowait()
            tokens.extend(getattr(event, "token_ids", ()))
        return caps, tokens

    try:
        caps, tokens = run("oracle")
        assert all(cap == (0, False) for cap in caps) and tokens == answer  # plain decoding
        caps, tokens = run("free-oracle")
        assert tokens == answer and len(caps) < len(answer)  # drafted, and accepted
        assert all(k > 0 and free_only for k, free_only in caps[1:]) and free.asked and all(free.asked)  # [0]: prefill
        assert list(scheduler._draft_cost.samples[1]) == [100.0]
        assert scheduler._drafters["free-oracle"].free.accepted > 0 and scheduler._drafters["oracle"].free.trials == 0
        assert metrics.free_only._value.get() == len(caps) - 1
    finally:
        loop.close()


def test_steps_of_free_drafts_are_not_the_cost_of_drafting(tiny_target):
    """A hybrid's step in which every row drafted freely costs ~0 ms; taken as the cost of drafting with passes,
    it priced its model's catch-ups at nothing (its 0.4 ms at 4 rows sent the cap from 1 to 4, steps of 290 ms
    against 100). Only steps in which some row's draft cost passes are samples."""
    spec = SpecConfig(k=4)
    plain = build_drafter(tiny_target, DrafterConfig(name="none"), spec)
    greedy, length = SamplingConfig(), GenerationConfig(max_new_tokens=30, stop_on_eos=False)
    answer = Engine(tiny_target, plain, spec).generate(list(PROMPT), greedy, length).token_ids
    router = RoutingDrafter({"free-oracle": FreeOracle(answer), "oracle": Oracle(answer, first_s=0.0)}, "free-oracle")
    scheduler = Scheduler(Engine(tiny_target, router, spec), router, SchedulerConfig(max_batch=1), ServerMetrics(),
                          SpecPolicy(FLAT, max_k=4))
    loop = asyncio.new_event_loop()

    def run(drafter: str) -> list[int]:
        scheduler.submit(Ticket(Job(PROMPT, greedy, length, drafter), loop))
        return [k for k, _ in _rounds(scheduler)]

    try:
        assert all(run("free-oracle")[1:]) and scheduler._draft_cost.samples == {}
        assert all(run("oracle")[1:]) and len(scheduler._draft_cost.samples[1]) > 0
        paying = scheduler._draft_cost.ms_per_k(1)
        run("free-oracle")  # steps of free drafts make a step that pays rarer: drafting costs less on average
        assert 0 < scheduler._draft_cost.ms_per_k(1) < paying and scheduler._draft_cost.paid[1] < 0.5
    finally:
        loop.close()


def test_a_cost_that_no_step_renews_is_forgotten():
    """A cost that keeps every step from drafting gets no new sample: after SAMPLE_LIFE steps without one it is
    forgotten and drafting is tried again; a size whose samples keep coming keeps them."""
    from specdecode.server.scheduling.policy import SAMPLE_LIFE

    cost = DraftCost()
    cost.observe(1, 500.0)
    cost.observe(4, 40.0)
    for _ in range(SAMPLE_LIFE - 1):
        cost.tick()
        cost.observe(4, 40.0)
    assert cost.ms_per_k(1) == 500.0
    cost.tick()
    assert cost.ms_per_k(1) == 10.0 and cost.ms_per_k(4) == 40.0  # size 1 now priced from size 4's, by the rows
    for _ in range(SAMPLE_LIFE):
        cost.tick()
    assert cost.ms_per_k(1) == cost.ms_per_k(4) == 0.0  # nothing renewed: drafting is tried
