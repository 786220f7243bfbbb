"""The time-based speculation pause (SpecConfig.pause_on_time): a pure state machine, driven here by injected
step times (no real timing, no sleeps), then wired through the engine with a fake clock."""
from __future__ import annotations

import pytest

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core import engine as engine_module
from specdecode.core.engine import Engine
from specdecode.core.speculation import PLAIN_SAMPLES, SpeculationLength
from specdecode.drafters.none import SPEC as NONE_SPEC
from specdecode.errors import ConfigError
from tests.fakes import TimedOracle

PLAIN_S = 0.030  # seconds per plain step (one committed token)


def policy(**overrides) -> SpeculationLength:
    config = dict(k=4, pause_below=0.3, pause_window=4, pause_steps=3, pause_time_margin=0.05)
    return SpeculationLength(SpecConfig(**{**config, **overrides}))


def plain_steps(length: SpeculationLength, n: int, seconds: float = PLAIN_S) -> None:
    for _ in range(n):
        length.update(drafted=0, accepted=0, seconds=seconds, committed=1)


def draft_window(length: SpeculationLength, seconds: float, accepted: int = 1) -> None:
    """One window of drafting steps (pause_window of them), each drafting K tokens."""
    for _ in range(length.config.pause_window):
        length.update(drafted=length.k, accepted=accepted, seconds=seconds, committed=accepted + 1)


@pytest.mark.parametrize("step_s, accepted, pauses", [
    (0.080, 1, True),  # 2 tokens for 80 ms: 40 ms per token > 30 ms per plain token, although 1 accepted per step
    (0.050, 1, False),  # 25 ms per token: drafting pays
    (0.062, 1, False),  # 31 ms per token: within the 5 % margin (31.5 ms)
    (0.064, 1, True),  # 32 ms per token: beyond it
    (0.100, 3, False),  # slow steps, but 4 tokens each: 25 ms per token
    (0.010, 0, True),  # cheap but accepts nothing: the acceptance rule still pauses
])
def test_time_rule_compares_cost_per_committed_token(step_s, accepted, pauses):
    length = policy()
    plain_steps(length, PLAIN_SAMPLES)  # e.g. prompt lookup without a match: timed plain steps
    draft_window(length, step_s, accepted)
    assert (length.k == 0) == pauses
    assert length.paused == (3 if pauses else 0)
    untimed_rule = policy(pause_on_time=False)  # the same steps with the time rule off: acceptance only
    plain_steps(untimed_rule, PLAIN_SAMPLES)
    draft_window(untimed_rule, step_s, accepted)
    assert (untimed_rule.k == 0) == (accepted == 0)


def test_time_rule_alone_pauses_without_the_acceptance_rule():
    length = policy(pause_below=0)
    plain_steps(length, PLAIN_SAMPLES)
    draft_window(length, 0.200, accepted=4)  # every draft passes, but 5 tokens for 200 ms: 40 ms per token
    assert length.k == 0
    off = policy(pause_below=0, pause_on_time=False)
    plain_steps(off, PLAIN_SAMPLES)
    draft_window(off, 0.200, accepted=4)
    assert off.k == 4


def test_time_pause_backs_off_while_drafting_costs_more_then_resets():
    length = policy()
    plain_steps(length, PLAIN_SAMPLES)
    pauses = []
    for _ in range(4):  # drafting always costs more: each retry pauses twice as long as the last
        draft_window(length, 0.080)
        pauses.append(0)
        while length.k == 0:
            pauses[-1] += 1
            plain_steps(length, 1)
        assert length.k == 1  # resumed with a cheap probe (min_k)
    assert pauses == [3, 6, 12, 24]
    draft_window(length, 0.040, accepted=1)  # a probe window that pays (20 ms per token): no pause
    assert length.k == 3  # the probes passed fully: back towards K by 2
    while length.k:  # it pays no longer (the window slides: judged after every step): the back-off is short again
        length.update(drafted=length.k, accepted=1, seconds=0.080, committed=2)
    assert length.paused == 3


def test_resumes_drafting_after_a_time_pause_and_keeps_going_when_it_pays():
    length = policy()
    plain_steps(length, PLAIN_SAMPLES)
    draft_window(length, 0.080)
    assert length.k == 0
    plain_steps(length, 3)
    assert length.k == 1
    for _ in range(20):  # now drafting is cheap per token: it never pauses again
        length.update(drafted=length.k, accepted=length.k, seconds=0.050, committed=length.k + 1)
        assert length.k > 0
    assert length.k == 4


def test_first_window_measures_the_plain_cost_then_judges_the_same_window():
    length = policy()
    draft_window(length, 0.080)  # nothing plain timed yet
    assert length.k == 0 and length.paused == PLAIN_SAMPLES and length.measuring
    plain_steps(length, PLAIN_SAMPLES)  # 30 ms per token: the window (40 ms) did not pay
    assert length.k == 0 and length.paused == 3  # the back-off pause starts at once, without a second window
    cheap = policy()
    draft_window(cheap, 0.050)
    plain_steps(cheap, PLAIN_SAMPLES - 1)
    assert cheap.k == 0
    plain_steps(cheap, 1)
    assert cheap.k == 4  # it paid: drafting goes on at K (a measuring pause is not a failed probe)
    partly = policy()
    plain_steps(partly, 2)  # two plain steps timed already: only the missing ones are measured
    draft_window(partly, 0.080)
    assert partly.paused == PLAIN_SAMPLES - 2


def test_plain_cost_is_a_median_so_one_slow_plain_step_does_not_hide_a_loss():
    length = policy()
    plain_steps(length, PLAIN_SAMPLES - 1)
    plain_steps(length, 1, seconds=1.0)  # one plain step 33x slower (a hiccup)
    draft_window(length, 0.080)
    assert length.k == 0 and not length.measuring


def test_untimed_steps_leave_the_time_rule_out():
    length = policy()
    plain_steps(length, PLAIN_SAMPLES)
    for _ in range(20):  # seconds=None (a seeded sampled sequence): never judged by time, never measured
        length.update(drafted=4, accepted=1)
        assert length.k == 4


@pytest.mark.parametrize("kwargs", [dict(pause_time_margin=-0.1), dict(pause_time_margin=1.0),
                                    dict(pause_on_time="yes")])
def test_time_pause_config_checked(kwargs):
    with pytest.raises(ConfigError):
        SpecConfig(**kwargs)


# -- through the engine, with a fake clock -----------------------------------------------------------------------

class FakeClock:
    """Stands in for the engine's `time` module: every reading is 10 ms after the last, so a plain step (two
    readings apart) takes 20 ms; drafting adds `advance` on top."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 0.010
        return self.now


SPEC = SpecConfig(k=4, pause_window=3, pause_steps=4)
N = 40


def k_trace(engine: Engine, ids: list[int], sampling: SamplingConfig) -> tuple[list[int], list[int]]:
    """The policy's K before every step, and the generated tokens."""
    seq = engine.start(ids, sampling, GenerationConfig(max_new_tokens=N, stop_on_eos=False))
    trace = []
    while not seq.finished:
        trace.append(seq.length.k)
        engine.step([seq])
    engine.release(seq)
    return trace, seq.output_ids


@pytest.mark.parametrize("cost, pauses", [(0.200, True), (0.040, False)])
def test_engine_times_steps_and_pauses_a_drafter_that_costs_more_per_token(cost, pauses, tiny_target, tiny_tokenizer,
                                                                           monkeypatch):
    ids = tiny_tokenizer("the cat sat on the mat")["input_ids"]
    plain = Engine(tiny_target, NONE_SPEC.build(tiny_target, DrafterConfig(), SPEC), SPEC).generate(
        ids, SamplingConfig(), GenerationConfig(max_new_tokens=N, stop_on_eos=False)).token_ids
    clock = FakeClock()
    monkeypatch.setattr(engine_module, "time", clock)
    engine = Engine(tiny_target, TimedOracle(plain, len(ids), clock, cost), SPEC)
    trace, output = k_trace(engine, ids, SamplingConfig())
    assert output == plain  # K never changes greedy output
    # every draft is fully accepted (5 tokens per step): 220 ms per step is 44 ms per token, more than a plain
    # step's 20; 60 ms per step is 12 ms per token, less (per STEP it is more: the rule must count tokens)
    # the first step drafts nothing (its time is a plain sample), the second is not timed (the drafter reads
    # the prompt): the first window timed throughout is steps 3-5, and it asks for the plain samples it lacks
    assert trace[:5] == [4] * 5
    assert trace[5:5 + PLAIN_SAMPLES - 1] == [0] * (PLAIN_SAMPLES - 1)
    assert (trace.count(0) > PLAIN_SAMPLES) == pauses


def test_a_slow_first_step_does_not_pause_a_drafter_that_pays(tiny_target, tiny_tokenizer, monkeypatch):
    """The drafter's one-off start (a draft model prefilling a long prompt: 2 s here) is not charged to the
    window: drafting at 12 ms per token against 20 plain goes on after the measuring pause."""
    ids = tiny_tokenizer("the cat sat on the mat")["input_ids"]
    plain = Engine(tiny_target, NONE_SPEC.build(tiny_target, DrafterConfig(), SPEC), SPEC).generate(
        ids, SamplingConfig(), GenerationConfig(max_new_tokens=N, stop_on_eos=False)).token_ids
    traces = []
    for first_cost in (2.0, 0.0):
        clock = FakeClock()
        monkeypatch.setattr(engine_module, "time", clock)
        engine = Engine(tiny_target, TimedOracle(plain, len(ids), clock, 0.040, first_cost), SPEC)
        traces.append(k_trace(engine, ids, SamplingConfig())[0])
    assert traces[0] == traces[1]
    assert traces[0].count(0) == PLAIN_SAMPLES - 1  # only the measuring pause (the first step was plain)


def test_the_next_sequence_starts_from_the_plain_cost_the_last_one_measured(tiny_target, tiny_tokenizer,
                                                                            monkeypatch):
    """A second request on the same engine is judged against the plain steps the first one timed: no measuring
    pause of its own, and a drafter that pays drafts all the way."""
    ids = tiny_tokenizer("the cat sat on the mat")["input_ids"]
    plain = Engine(tiny_target, NONE_SPEC.build(tiny_target, DrafterConfig(), SPEC), SPEC).generate(
        ids, SamplingConfig(), GenerationConfig(max_new_tokens=N, stop_on_eos=False)).token_ids
    clock = FakeClock()
    monkeypatch.setattr(engine_module, "time", clock)
    drafter = TimedOracle(plain, len(ids), clock, 0.040)
    engine = Engine(tiny_target, drafter, SPEC)
    first, _ = k_trace(engine, ids, SamplingConfig())
    assert first.count(0) == PLAIN_SAMPLES - 1  # the measuring pause (the first step was plain)
    second, output = k_trace(engine, ids, SamplingConfig())
    assert 0 not in second and output == plain
    fresh = Engine(tiny_target, drafter, SPEC)
    assert k_trace(fresh, ids, SamplingConfig())[0].count(0) == PLAIN_SAMPLES - 1  # nothing carried across engines


def test_seeded_sampling_ignores_step_times(tiny_target, tiny_tokenizer, monkeypatch):
    """A seed must give the same text however fast the machine is: K (and so the random draws) follows
    acceptance only for a seeded sampled sequence."""
    ids = tiny_tokenizer("the cat sat on the mat")["input_ids"]
    truth = list(range(40, 40 + N))
    spec = SpecConfig(k=4, pause_window=3, pause_steps=4, pause_below=0)  # only the time rule could pause
    runs = []
    for cost in (0.0, 1.0):
        clock = FakeClock()
        monkeypatch.setattr(engine_module, "time", clock)
        engine = Engine(tiny_target, TimedOracle(truth, len(ids), clock, cost), spec)
        runs.append(k_trace(engine, ids, SamplingConfig(temperature=1.0, seed=7)))
    (fast_trace, fast_out), (slow_trace, slow_out) = runs
    assert 0 not in slow_trace  # never paused, never measured
    assert slow_trace == fast_trace and slow_out == fast_out


def test_adaptive_k_grows_by_two_after_a_full_accept_and_shrinks_by_one_after_a_rejection():
    length = SpeculationLength(SpecConfig(k=3, adaptive=True, min_k=1, max_k=8, pause_on_time=False))
    ks = []
    for accepted_all in (True, True, True, False, False, False, False, False, False):
        k = length.k
        length.update(drafted=k, accepted=k if accepted_all else 0, seconds=None, committed=1)
        ks.append(length.k)
    assert ks == [5, 7, 8, 7, 6, 5, 4, 3, 2]


def test_acceptance_rule_pauses_only_below_the_threshold():
    """pause_below is "fewer than" draft tokens per step: a window at exactly the threshold keeps drafting."""
    at = policy(pause_below=0.5, pause_on_time=False)
    for accepted in (1, 0, 1, 0):  # 2 accepted over 4 steps = 0.5 per step
        at.update(drafted=at.k, accepted=accepted, seconds=None, committed=accepted + 1)
    assert at.k == 4
    below = policy(pause_below=0.5, pause_on_time=False)
    for accepted in (1, 0, 0, 0):
        below.update(drafted=below.k, accepted=accepted, seconds=None, committed=accepted + 1)
    assert below.k == 0
