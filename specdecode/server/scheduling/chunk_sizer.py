"""How many prompt tokens a step may carry while streams decode: a ladder of chunk sizes, each timed.

A step that carries a chunk of a long prompt costs the running streams what it adds over a plain step. That
cost need not be a line in the chunk's size: where a chunk wider than the decode rows is a pass of its own
(transformers' forward on a CPU; Target.rides), one token rides in the decode rows' pass for little, two or more
pay a fixed cost of about a whole step, and past that each token costs what the context it attends to makes it
cost. On the native decoder every chunk rides, and its cost starts near nothing. A straight line fitted
through a few small sizes read the jump from one token to two, and the noise, as the cost per token: the chunk
stayed at 1-2 tokens, and a 2,000-token prompt that takes 0.2 s alone took 13.6 s beside a stream, which ended
first (tiny model, 2-core CPU). So every size is timed on its own (the median of its last few steps, forgotten
after SAMPLE_AGE chunk steps), and:

- the bound: a chunk step adds at most `burst` plain steps, or, where a chunk wider than the decode rows is a
  pass of its own, twice what the cheapest chunk of MIN_CLIMB or more tokens adds, where that is more (its
  fixed part: the tokens then spread it, up to as much again);
- the climb: from the largest timed size within the bound, a larger one is tried, as far as its cost scaled
  to the bound allows (at most twice it), and never past half a size that went over the bound lately;
- the choice: the fewest tokens that load the prompt at least a third as fast (tokens per added second) as
  the best size within the bound. On the tiny model one riding token loads at a tenth of a 64-token chunk's
  speed, so chunks of ~16-30 go; SmolLM2 int4 on the native decoder, at a 1,000-token context, adds about
  2.3 ms for one riding token and about as much for each more, so one token goes (two now and then).

Both grow with the context the prompt's tokens attend to, so one chunk step in PROBE_EVERY carries one token
and one carries MIN_CLIMB tokens again, and the bound and the choice follow them.
"""
from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass, field

MIN_CHUNK = 1  # the fewest prompt tokens a step carries while rows decode
MIN_CLIMB = 2  # the smallest chunk that is a pass of its own beside one-token decode rows: the bound's fixed part
SAMPLES_PER_SIZE = 3  # a size's cost is the median of its last three steps: one noisy step does not move it
SAMPLE_AGE = 64  # chunk steps after which a sample is forgotten: a size's cost moves with the context
SPREAD = 2.0  # a chunk may add this times the fixed part, where that is more than `burst` plain steps
PROBE_EVERY = 32  # one chunk step in this many carries MIN_CHUNK tokens, one MIN_CLIMB: both stay current
SPEED_SHARE = 1 / 3  # the chosen size loads at least this share of the best speed within the bound (half:
# a noisy fast sample of a large size often ruled one token out on SmolLM2, whose steps then held streams 2-3x)


@dataclass
class ChunkSizer:
    """The chunk a step carries next, from the measured cost of the steps that carried one (see module doc)."""

    most: int  # the largest chunk (SchedulerConfig.prefill_chunk)
    burst: float  # the plain steps a chunk may add (SchedulerConfig.prefill_burst)
    # whether a chunk wider than the decode rows is a pass of its own (Target.rides): only then has a chunk a
    # fixed part that SPREAD lets the tokens share; a riding chunk's cost starts near nothing and grows
    own_pass: bool = True
    chunk: int = MIN_CHUNK  # what the next step carries
    _costs: dict[int, collections.deque[tuple[int, float]]] = field(default_factory=dict)  # size -> (step, s)
    _steps: int = 0

    def __post_init__(self) -> None:
        self.chunk = max(MIN_CHUNK, min(self.chunk, self.most))

    def observe(self, tokens: int, added: float, plain: float) -> int:
        """A step that carried `tokens` prompt tokens added `added` seconds to a plain step of `plain` seconds;
        returns the next chunk."""
        self._steps += 1
        self._costs.setdefault(tokens, collections.deque(maxlen=SAMPLES_PER_SIZE)).append((self._steps, added))
        self._forget()
        self.chunk = self._choose(plain)
        return self.chunk

    def bound(self, plain: float, costs: dict[int, float] | None = None) -> float:
        """The most seconds a chunk may add to a step: `burst` plain steps, or SPREAD x the fixed part.
        costs: each size's median (default: as timed now)."""
        fixed = [cost for size, cost in (self._medians() if costs is None else costs).items() if size >= MIN_CLIMB]
        if not fixed or not self.own_pass:
            return self.burst * plain
        return max(self.burst * plain, SPREAD * min(fixed))

    def _choose(self, plain: float) -> int:
        if self.most < MIN_CLIMB:
            return self.most
        for size in (MIN_CHUNK, MIN_CLIMB):  # time one token, and the fixed part, again
            samples = self._costs.get(size)
            if not samples or samples[-1][0] <= self._steps - PROBE_EVERY + 1:
                return size
        costs = self._medians()
        bound = self.bound(plain, costs)
        within = {size: cost for size, cost in costs.items() if cost <= bound}  # the fixed part is, if counted
        if not within:  # even one token adds more (a riding token late in a long prompt): the fewest go
            return MIN_CHUNK
        top = max(within)
        over = [size // 2 for size, cost in costs.items() if size > top]  # tried lately and over: stay below half
        reach = int(top * bound / max(within[top], 1e-9))  # where the cost would meet the bound, per token
        climb = min(self.most, 2 * top, reach, *over)
        if climb > top:
            return climb
        speed = {size: size / max(cost, 1e-9) for size, cost in within.items()}
        return min(size for size in within if speed[size] >= SPEED_SHARE * max(speed.values()))

    def _medians(self) -> dict[int, float]:
        return {size: statistics.median(cost for _, cost in samples) for size, samples in self._costs.items()}

    def _forget(self) -> None:
        for size in list(self._costs):
            samples = self._costs[size]
            while samples and samples[0][0] <= self._steps - SAMPLE_AGE:
                samples.popleft()
            if not samples:
                del self._costs[size]
