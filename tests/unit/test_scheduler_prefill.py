"""How much prompt a scheduler step carries while streams decode, without a worker thread: never more than the
chunk its measured costs allow (a 200-token remainder used to join at once, holding every stream for its whole
pass), and the chunk is sized from the fitted cost of a chunk step so that a stream waits about 1 +
prefill_burst of its usual steps."""
import asyncio

import pytest

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.drafters import build_drafter
from specdecode.server import scheduler as scheduling
from specdecode.server.metrics import ServerMetrics
from specdecode.server.router import RoutingDrafter
from specdecode.server.scheduler import Job, Scheduler, SchedulerConfig, Ticket


@pytest.fixture
def scheduler(tiny_target):
    spec = SpecConfig(k=2)
    router = RoutingDrafter({"none": build_drafter(tiny_target, DrafterConfig(name="none"), spec)}, "none")
    return Scheduler(Engine(tiny_target, router, spec, max_batch=2), router, SchedulerConfig(max_batch=2),
                     ServerMetrics())


def test_a_prompt_joining_running_streams_comes_in_chunks(scheduler):
    loop = asyncio.new_event_loop()
    try:
        stream = Job((5, 6, 7), SamplingConfig(), GenerationConfig(max_new_tokens=50), "none")
        scheduler.submit(Ticket(stream, loop))
        scheduler._round()  # the stream is admitted, prefilled and decodes
        long = Job(tuple(range(10, 410)), SamplingConfig(), GenerationConfig(max_new_tokens=2), "none")
        scheduler.submit(Ticket(long, loop))
        carried = []
        for _ in range(6):
            before = next((s.seq.prefilled for s in scheduler._active if s.seq.prefilling), None)
            scheduler._round()
            after = next((s.seq.prefilled for s in scheduler._active if s.seq.prompt_len == 400), None)
            if before is not None:
                carried.append(after - before)
        assert carried and max(carried) <= 2 * scheduling.FIRST_CHUNK * 2 ** 6  # a chunk, never all 399 at once
        assert max(carried) < 399
    finally:
        loop.close()


@pytest.mark.parametrize("fixed, per_token, plain", [(0.005, 0.002, 0.020), (0.030, 0.001, 0.020),
                                                     (0.0, 0.004, 0.006)])
def test_chunks_are_sized_from_the_fitted_cost_of_a_chunk_step(scheduler, fixed, per_token, plain):
    """Synthetic timings: a plain step `plain`, a chunk of n tokens adding fixed + n x per_token. The chunk settles
    where the step it rides in costs about 1 + prefill_burst plain steps (no more), at least one token."""
    scheduler._plain_steps.extend([plain] * 8)
    sizes = []
    for _ in range(24):
        n = scheduler._chunk
        scheduler._adapt_chunk(plain + fixed + n * per_token, n)
        sizes.append(scheduler._chunk)
    budget = scheduler.config.prefill_burst * plain
    # where carrying anything costs more than the bound, the tokens spread the fixed cost, up to as much again
    best = max(1, int((budget - fixed) / per_token)) if fixed < budget else int(fixed / per_token)
    assert scheduler._chunk == best
    assert fixed + scheduler._chunk * per_token <= max(budget, 2 * fixed) or scheduler._chunk == 1
    grown = [later / earlier for earlier, later in zip(sizes[1:], sizes[2:])]  # once the fit has two sizes
    assert all(ratio <= max(scheduling.GROWTH, 1 + 1 / earlier) for ratio, earlier in zip(grown, sizes[1:]))


def test_the_fit_separates_a_chunk_steps_fixed_cost():
    assert scheduling._fit([(2, 0.009), (4, 0.013), (8, 0.021)]) == pytest.approx((0.005, 0.002))
    assert scheduling._fit([(4, 0.02), (4, 0.02)]) is None  # one size: nothing tells them apart
    assert scheduling._fit([(2, 0.03), (6, 0.01)]) == (0.02, 0.0)  # cheaper when larger: noise, nothing per token


def test_a_short_prompt_joins_running_streams_at_once(scheduler):
    """Requests that come together are decoded together: a whole short prompt is not cut into bites."""
    loop = asyncio.new_event_loop()
    try:
        stream = Job((5, 6, 7), SamplingConfig(), GenerationConfig(max_new_tokens=50), "none")
        scheduler.submit(Ticket(stream, loop))
        scheduler._round()
        scheduler._round()  # a plain step: the stream decodes
        short = Job(tuple(range(10, 70)), SamplingConfig(), GenerationConfig(max_new_tokens=2), "none")
        scheduler.submit(Ticket(short, loop))
        scheduler._round()
        joined = next(s.seq for s in scheduler._active if s.seq.prompt_len == 60)
        assert not joined.prefilling
    finally:
        loop.close()
