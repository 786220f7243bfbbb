"""How much prompt a scheduler step carries while streams decode, without a worker thread: never more than the
chunk its measured costs allow (a 200-token remainder used to join at once, holding every stream for its whole
pass), and the chunk is sized from the timed cost of each size (chunk_sizer.py): within the bound, not starved
by noise, below a size that is a pass of its own, following the context's growth."""
import asyncio
import random

import pytest

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.drafters import build_drafter
from specdecode.server.scheduling import chunk_sizer
from specdecode.server.scheduling.chunk_sizer import MIN_CHUNK, MIN_CLIMB, ChunkSizer
from specdecode.server.scheduling.metrics import ServerMetrics
from specdecode.server.scheduling.router import RoutingDrafter
from specdecode.server.scheduling.scheduler import Job, Scheduler, SchedulerConfig, Ticket


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
        assert carried and max(carried) <= MIN_CLIMB * 2 ** 6  # a chunk, never all 399 at once
        assert max(carried) < 399
    finally:
        loop.close()


def _run(sizer: ChunkSizer, cost, plain: float, steps: int) -> list[tuple[int, float]]:
    """Feed the sizer `steps` chunk steps whose added seconds are cost(tokens); returns (tokens, added) per step."""
    seen = []
    for _ in range(steps):
        tokens = sizer.chunk
        added = cost(tokens)
        seen.append((tokens, added))
        sizer.observe(tokens, added, plain)
    return seen


@pytest.mark.parametrize("fixed, per_token, plain", [(0.005, 0.002, 0.020), (0.030, 0.001, 0.020),
                                                     (0.0, 0.004, 0.006), (0.004, 0.00006, 0.003)])
def test_chunks_climb_within_the_bound_and_load_at_a_share_of_the_best_speed(fixed, per_token, plain):
    """Synthetic timings: a chunk of n tokens adds fixed + n x per_token to a plain step (the last row is the tiny
    model's own: 2 tokens add 4 ms to a 3 ms step, 80 tokens 9 ms). No step adds more than the bound (burst plain
    steps, or twice what MIN_CLIMB tokens add), and the chunk loads at least SPEED_SHARE as fast as the fastest
    size within it."""
    sizer = ChunkSizer(most=256, burst=1.0)
    seen = _run(sizer, lambda n: fixed + n * per_token, plain, 40)
    bound = max(plain, chunk_sizer.SPREAD * (fixed + MIN_CLIMB * per_token))
    fastest = min(256, int((bound - fixed) / per_token + 1e-9))  # the speed n / (fixed + n x per_token) grows with n
    speed = lambda n: n / (fixed + n * per_token)  # noqa: E731
    assert sizer.bound(plain) == pytest.approx(bound)
    assert all(added <= bound + 1e-12 for _, added in seen)
    assert speed(sizer.chunk) >= 0.9 * chunk_sizer.SPEED_SHARE * speed(fastest)  # 0.9: the climb's sizes are few


def test_one_riding_token_goes_where_it_loads_about_as_fast_as_a_pass_of_its_own():
    """SmolLM2 int4 at a 1,000-3,000-token context beside a stream of 7 ms steps (scripts/prefill_gaps.py): one
    token adds 2.8 ms, 2 tokens 10 ms, 8 tokens 15.6 ms. One token loads at 0.36 tokens a ms, the best size
    within the bound at ~0.6: one token a step goes (a stream's step grows 1.4x, not 3x)."""
    plain = 0.007
    sizer = ChunkSizer(most=256, burst=1.0)
    _run(sizer, lambda n: 0.0028 if n == 1 else 0.008 + n * 0.001, plain, 30)
    assert sizer.chunk == 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_long_prompt_is_not_starved_by_noisy_small_chunks(seed):
    """The tiny model's costs beside a stream of 3 ms steps: one token rides for 1 ms, two or more are a pass of
    their own (4 ms + 0.06 ms a token), each step +-40 % noise. A line fitted through sizes 1 and 2 read the
    jump as a cost per token of a whole step: the chunk stayed at 1-2 tokens, a 2,000-token prompt took ~1,900
    chunk steps here (13.6 s beside the stream on the server, 0.2 s alone) and the stream ended first. Timed per
    size, it takes a few dozen."""
    noise = random.Random(seed)
    sizer = ChunkSizer(most=256, burst=1.0)
    left, steps = 2000, 0
    while left > 0 and steps < 2000:
        tokens = min(left, sizer.chunk)
        cost = 0.001 if tokens == 1 else 0.004 + tokens * 0.00006
        sizer.observe(tokens, cost * noise.uniform(0.6, 1.4), 0.003)
        left, steps = left - tokens, steps + 1
    assert steps <= 200


def test_a_chunk_that_rides_cheaply_stays_below_the_step_that_is_a_pass_of_its_own():
    """Up to 4 tokens ride in the decode rows' pass for a fifth of a step; 8 are a pass of their own. The chunk
    stays at 4 and tries 8 again only once its sample is forgotten."""
    plain = 0.010
    sizer = ChunkSizer(most=256, burst=1.0)
    seen = _run(sizer, lambda n: 0.002 if n <= 4 else 0.012 + n * 0.0001, plain, 200)
    assert sizer.chunk <= 4
    over = [tokens for tokens, added in seen if added > plain]
    assert len(over) <= 200 // chunk_sizer.SAMPLE_AGE + 1


def test_where_every_chunk_rides_a_step_adds_at_most_the_burst():
    """SmolLM2 int4 on the native decoder, where every chunk rides (Target.rides): one token adds 0.26 of a plain
    step, each more 0.3 (8.8 ms steps, 2026-11-28). With no pass of its own there is no fixed part for tokens to
    share, so the bound stays `burst` plain steps: the SPREAD rule would let 2 x 0.56 through, and steps of 3x."""
    plain = 0.0088
    costs = {"own_pass": ChunkSizer(most=256, burst=1.0), "rides": ChunkSizer(most=256, burst=1.0, own_pass=False)}
    seen = {name: _run(sizer, lambda n: plain * (0.26 + 0.3 * (n - 1)), plain, 300) for name, sizer in costs.items()}
    assert costs["rides"].bound(plain) == pytest.approx(plain)
    assert max(added for _, added in seen["rides"][64:]) <= plain * 1.0001
    assert costs["own_pass"].bound(plain) > 1.1 * plain  # the rule for a pass of its own would allow more


def test_where_even_one_riding_token_adds_more_than_the_bound_one_token_goes():
    """Late in a long prompt one riding token attends over thousands of cached ones and may add more than the
    bound by itself: the fewest tokens go (no size is within the bound; the sizer raised here once)."""
    sizer = ChunkSizer(most=256, burst=0.5, own_pass=False)
    seen = _run(sizer, lambda n: 0.010 * (0.8 + 0.3 * n), 0.010, 100)
    assert [tokens for tokens, _ in seen[-32:]].count(MIN_CHUNK) >= 30


def test_the_bound_follows_the_fixed_cost_as_the_context_grows():
    """Each step the fixed part grows (a longer context to attend to): the smallest chunk is timed again every
    PROBE_EVERY steps, and the bound follows it rather than the first prompt tokens' cost."""
    plain = 0.003
    sizer = ChunkSizer(most=256, burst=1.0)
    step = iter(range(10**6))
    seen = _run(sizer, lambda n: 0.004 * (1 + next(step) / 100) + n * 0.00006, plain, 300)
    probes = [i for i, (tokens, _) in enumerate(seen) if tokens == MIN_CLIMB]
    assert max(b - a for a, b in zip(probes, probes[1:])) <= chunk_sizer.PROBE_EVERY
    assert sizer.bound(plain) > 2 * 0.004 * 3  # three times the first prompt tokens' fixed cost, and more


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
