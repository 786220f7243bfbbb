"""What one more verify row costs, followed from the passes the engine runs (pass_costs.RowCostEstimate), on
synthetic timings and a fake clock: a spike at load, a spike later, a slowdown that lasts, and no evidence."""
from __future__ import annotations

import pytest

from specdecode.core.pass_costs import PRIOR_ROW_COST, ChainCostEstimate, RowCostEstimate


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _run(estimate: RowCostEstimate, clock: Clock, one: float, five: float, count: int = 6) -> None:
    """`count` one-token passes of `one` seconds and as many five-token passes of `five`, 0.1 s apart."""
    for _ in range(count):
        clock.now += 0.1
        estimate.observe(1, one)
        estimate.observe(5, five)


def test_a_busy_measurement_at_load_gives_way_to_the_passes():
    clock = Clock()
    estimate = RowCostEstimate(lambda: 1.87, clock=clock)  # timed while another process took a core
    assert estimate.value == pytest.approx(1.87)
    _run(estimate, clock, one=0.010, five=0.0156)  # quiet: (1.56 - 1) / 4 = 0.14
    assert estimate.value == pytest.approx(0.14)


def test_a_spike_later_is_a_sample_of_a_median_and_leaves_with_its_window():
    clock = Clock()
    estimate = RowCostEstimate(lambda: 0.14, clock=clock)
    _run(estimate, clock, one=0.010, five=0.0156)
    for _ in range(2):  # two passes slowed tenfold by a neighbour
        estimate.observe(5, 0.156)
    assert estimate.value == pytest.approx(0.14)
    _run(estimate, clock, one=0.030, five=0.060, count=8)  # a minute of load that costs rows more
    assert estimate.value == pytest.approx(0.25, abs=0.02)
    clock.now += 31  # it passes: those samples are gone, the quiet ones that follow decide
    _run(estimate, clock, one=0.010, five=0.0156)
    assert estimate.value == pytest.approx(0.14)


def test_a_slowdown_of_every_pass_alike_leaves_the_row_cost():
    clock = Clock()
    estimate = RowCostEstimate(lambda: 0.5, clock=clock)
    _run(estimate, clock, one=0.010, five=0.0156)
    _run(estimate, clock, one=0.020, five=0.0312, count=24)  # everything twice as slow, for good
    assert estimate.value == pytest.approx(0.14)


def test_without_evidence_the_last_estimate_drifts_back_to_the_prior():
    """A cost too high to draft at gets no wide passes to correct it; it is not kept for the process's life."""
    clock = Clock()
    estimate = RowCostEstimate(lambda: 1.87, clock=clock, window_s=30)
    assert estimate.value == pytest.approx(1.87)
    clock.now = 30
    assert estimate.value == pytest.approx(1.87)  # within its first window it stands
    clock.now = 60
    assert estimate.value == pytest.approx(PRIOR_ROW_COST + (1.87 - PRIOR_ROW_COST) / 2)
    clock.now = 300
    assert estimate.value == pytest.approx(PRIOR_ROW_COST, abs=0.01)


def test_the_latest_passes_decide_not_one_token_passes_of_another_period():
    """One-token passes timed while the machine was busy, then a quiet period of drafting whose passes are wide:
    the old one-token passes have left the latest passes, and the estimate waits for new ones (the last estimate
    stands) rather than comparing times of two periods."""
    clock = Clock()
    estimate = RowCostEstimate(lambda: 0.5, clock=clock, keep=48)
    for _ in range(6):
        clock.now += 0.1
        estimate.observe(1, 0.030)  # busy
    for _ in range(24):
        clock.now += 0.1
        estimate.observe(3, 0.0128)  # quiet: 48 passes push the busy ones out
        estimate.observe(5, 0.0156)
    assert estimate.value == pytest.approx(0.5)  # no one-token pass of this period yet: the measurement
    for _ in range(3):
        estimate.observe(1, 0.010)  # quiet plain steps arrive
    assert estimate.value == pytest.approx(0.14)


def test_one_token_passes_alone_say_nothing_and_peek_never_measures():
    calls = []
    estimate = RowCostEstimate(lambda: calls.append(1) or 0.2, clock=Clock())
    assert estimate.peek() is None and calls == []
    for _ in range(10):
        estimate.observe(1, 0.01)
    assert estimate.value == pytest.approx(0.2) and calls == [1]  # no wider pass yet: the measurement
    assert estimate.peek() == pytest.approx(0.2)


def test_the_engine_reports_its_passes(tiny_target, tiny_tokenizer):
    from specdecode.config import DrafterConfig, GenerationConfig, SpecConfig
    from specdecode.core.engine import Engine
    from specdecode.drafters import build_drafter

    spec = SpecConfig(k=3, pause_on_time=False)
    engine = Engine(tiny_target, build_drafter(tiny_target, DrafterConfig("prompt-lookup", row_cost=0.0), spec),
                    spec)
    engine.generate(tiny_tokenizer("a b c a b c a b c a b")["input_ids"], generation=GenerationConfig(24))
    widths = {width for _, width, _ in tiny_target.row_costs._passes}
    assert widths and all(width >= 1 for width in widths)  # each pass of the generation, by its width


def _chain(clock: Clock) -> tuple[ChainCostEstimate, RowCostEstimate]:
    """A draft pass measured at 0.3 of a target pass, and the verify curve [1, 1.1, 1.2, 1.4] (a pass of 1 + n
    tokens costs verify[n] one-token passes)."""
    passes = RowCostEstimate(lambda: 0.14, clock=clock)
    return ChainCostEstimate(lambda: (0.3, [1.0, 1.1, 1.2, 1.4]), passes), passes


def test_a_draft_pass_is_priced_from_recent_passes_of_both_models():
    clock = Clock()
    chain, passes = _chain(clock)
    assert chain() == (0.3, [1.0, 1.1, 1.2, 1.4])  # nothing observed: the measurement
    for _ in range(6):  # the target's 3-token verify passes (1.2 one-token passes) take 24 ms: a pass is 20 ms
        clock.now += 0.1
        passes.observe(3, 0.024)
        for _ in range(3):
            chain.observe_draft(0.006)  # quiet: 0.3 of a pass
    assert chain()[0] == pytest.approx(0.3)
    for _ in range(48):  # a busy core: the draft's short passes slow threefold, the target's by a third
        clock.now += 0.1
        passes.observe(3, 0.032)
        chain.observe_draft(0.018)
    draft_pass, verify = chain()
    assert draft_pass == pytest.approx(0.018 / (0.032 / 1.2)) and verify == [1.0, 1.1, 1.2, 1.4]


def test_the_draft_price_leaves_with_its_window_and_needs_both_models():
    clock = Clock()
    chain, passes = _chain(clock)
    for _ in range(6):
        clock.now += 0.1
        passes.observe(6, 0.036)  # past the curve's end: 1.4 + 2 x 0.2 = 1.8 one-token passes
        chain.observe_draft(0.012)
    assert chain()[0] == pytest.approx(0.012 / (0.036 / 1.8))
    clock.now += passes.window_s + 1
    assert chain()[0] == 0.3  # the window passed: the measurement again
    for _ in range(6):
        clock.now += 0.1
        chain.observe_draft(0.012)  # the draft alone says nothing about what a target pass costs
    assert chain()[0] == 0.3


def test_the_chain_measurement_settles_the_row_cost_without_timing_it_again():
    clock = Clock()
    timed = []
    passes = RowCostEstimate(lambda: timed.append(1) or 0.14, clock=clock)
    chain = ChainCostEstimate(lambda: (0.3, [1.0, 1.1, 1.2, 1.4]), passes)
    chain()
    assert passes.value == pytest.approx((1.4 - 1) / 3) and timed == []  # a 4-token pass's extra rows
    passes = RowCostEstimate(lambda: 0.14, clock=clock)
    assert passes.value == pytest.approx(0.14)
    passes.settle(0.5)  # a first ask's measurement stands
    assert passes.value == pytest.approx(0.14)
