"""The depth policy of table drafters (row_budget): draft what pays for its rows, probe what does not."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from specdecode.backends.cpu.own_thread import run_in_own_thread
from specdecode.config import SamplingConfig
from specdecode.core.drafting import SequenceContext
from specdecode.core.pass_costs import measure_row_cost
from specdecode.drafters.common.row_budget import (
    ChainWalk,
    DepthPolicy,
    DepthYield,
    Probe,
    RowCost,
    Yield,
    row_cost_for,
)
from specdecode.drafters.prompt_lookup import PromptLookup


@pytest.mark.parametrize("prior, accepted, rows, cost, every, verdicts", [
    (1.0, [], 4, 0.15, 8, [True] * 10),  # 1.0 accepted per try pays for 4 rows at 0.15
    (0.0, [], 4, 0.0, 8, [True] * 10),  # free rows: always worth it
    # probed on the 3rd chance, then after 6, 12, 24, 24 (the cap: 8 x 3)
    (0.0, [], 1, 0.15, 3, [False] * 2 + [True] + [False] * 5 + [True] + [False] * 11 + [True]
     + [False] * 23 + [True] + [False] * 23 + [True]),
    (2.0, [0, 0, 0, 0], 4, 0.15, 100, [True]),  # (2 x 2 + 0) / (2 + 4) = 0.67 >= 0.6
    (2.0, [0, 0, 0, 0, 0], 4, 0.15, 100, [False]),  # 4 / 7 = 0.57 < 0.6
])
def test_yield_decides_by_mean_and_probes(prior, accepted, rows, cost, every, verdicts):
    y = Yield(prior)
    for a in accepted:
        y.add(a)
    assert [y.worth(rows, cost, every) for _ in verdicts] == verdicts


def test_probe_resets_once_it_pays():
    probe = Probe()
    assert [probe.due(2) for _ in range(6)] == [False, True, False, False, False, True]  # 2, then 4
    probe.paid()
    assert [probe.due(2) for _ in range(2)] == [False, True]


@pytest.mark.parametrize("rates, available, cost, depth", [
    ((0.9,), 5, 0.13, 5),  # 0.9, 0.81, ... each beats a row at 0.13
    ((0.1,), 5, 0.13, 0),  # the first token is not worth its row
    ((0.1,), 5, 0.0, 5),  # free rows: everything
    ((0.2, 0.6, 0.68), 8, 0.13, 1),  # prompt lookup after a one-token match (measured rates)
    ((0.86, 0.81, 0.84), 5, 0.13, 5),  # ... after a three-token match
    ((0.9, 0.1), 4, 0.13, 1),  # the second token rarely follows: stop after one
    ((0.5,), 0, 0.13, 0),  # nothing available
])
def test_best_depth_maximises_tokens_per_cost(rates, available, cost, depth):
    assert DepthYield(rates).best_depth(available, cost) == depth


def test_results_outweigh_the_prior():
    kind = DepthYield((0.9,))
    assert kind.rate(1) == pytest.approx(0.9)
    for _ in range(8):
        kind.add(drafted=3, accepted=0)  # the first token always rejected
    assert kind.rate(1) == pytest.approx(1.8 / 10)
    assert kind.rate(2) == pytest.approx(0.9)  # never reached: still the prior
    # 0.18 alone barely beats a row at 0.13, but once the first passes the next ones likely do: all three
    assert kind.best_depth(3, 0.13) == 3
    for _ in range(8):
        kind.add(drafted=1, accepted=0)
    assert kind.best_depth(3, 0.13) == 0
    kind.add(drafted=2, accepted=2)  # reached and passed both
    assert kind.reached == [17, 1, 0] and kind.passed == [1, 1, 0]


def test_policy_probes_a_kind_that_does_not_pay():
    policy = DepthPolicy({"good": (0.9,), "bad": (0.05,)}, row_cost=0.13, probe_every=3)
    assert [policy.depth("good", 4) for _ in range(3)] == [4, 4, 4]
    assert [policy.depth("bad", 4) for _ in range(9)] == [0, 0, 1, 0, 0, 0, 0, 0, 1]  # one-token probes
    assert policy.depth("good", 0) == 0


def test_row_cost_configured_or_the_targets():
    class Measured:
        row_cost = 0.13

    assert row_cost_for(Measured()).value == 0.13
    assert row_cost_for(Measured(), 0.0).value == 0.0
    assert row_cost_for(Measured(), 0.5).value == 0.5
    assert RowCost().value == 0.0  # a bare drafter: rows are free


def test_row_cost_is_measured_by_the_thread_that_first_reads_it():
    """Building a drafter measures nothing; its first step, on the thread that decodes, does (a timing on a
    loading thread is skewed while another thread holds an OpenMP team: RowCost)."""
    class Counted:
        def __init__(self):
            self.threads = []

        @property
        def row_cost(self):
            self.threads.append(threading.current_thread())
            return 0.13

    target = Counted()
    built = run_in_own_thread(lambda: PromptLookup(row_cost=row_cost_for(target)))
    assert target.threads == []
    seq = SequenceContext(0, [1, 2, 3, 1, 2], 0, 3, SamplingConfig(), torch.Generator())
    built.start(seq)
    assert built.propose([seq]) and target.threads == [threading.current_thread()]
    built.propose([seq])
    assert len(target.threads) == 2  # read at every plan: the cost follows the machine (RowCostEstimate)


class _TimedTarget:
    """A stand-in whose passes take 2 ms plus 0.5 ms per extra token (row cost 0.25), on a given device."""

    vocab_size, pad_id, block_device = 50, 0, torch.device("cpu")

    def __init__(self, device: str = "cpu"):
        self.device, self.widths = torch.device(device), []

    def new_cache(self, rows: int, capacity: int):
        return None

    def forward(self, cache, rows, block, keep="all"):
        width = block.input_ids.shape[1]
        self.widths.append(width)
        if keep == "all":
            time.sleep(0.002 + 0.0005 * (width - 1))


def test_row_cost_is_measured_on_the_target():
    target = _TimedTarget()
    assert measure_row_cost(target) == pytest.approx(0.25, abs=0.1)
    assert target.widths[0] == 32 and set(target.widths[1:]) == {1, 8}  # prefill, then both widths in turns
    timed = len(target.widths)
    assert row_cost_for(target, configured=0.5).value == 0.5 and len(target.widths) == timed  # configured: not timed
    gpu = _TimedTarget("cuda")
    assert measure_row_cost(gpu) == 0.0 and gpu.widths == []  # rows are free there: nothing to time


def test_target_measures_once(monkeypatch, tiny_model):
    """Every table drafter built on a Target plans with one measurement (~0.5 s on the real model)."""
    from specdecode.core.target import Target

    calls = []
    monkeypatch.setattr("specdecode.core.target.measure_row_cost", lambda target: calls.append(target) or 0.2)
    target = Target(tiny_model)
    assert (target.row_cost, target.row_cost, len(calls)) == (0.2, 0.2, 1)


def test_best_depth_ties_go_deeper():
    """A tie in tokens per cost goes to the deeper draft (free rows on a GPU: propose all that cannot lose)."""
    assert DepthYield((0.5, 0.0)).best_depth(2, 0.0) == 2  # 1.5 tokens per pass either way
    assert DepthYield((0.5, 0.0)).best_depth(2, 0.1) == 1  # the second row costs and earns nothing


def _chain_depth(tops: list[float], row_cost: float, pass_cost: float, k: int = 16) -> int:
    """How many of a draft's tokens ChainWalk keeps, the draft's top probabilities given in order."""
    walk, kept = ChainWalk([1.0, 1.0 + row_cost], pass_cost), 0  # rows past the curve's end: its last row's cost
    for top in tops[:k]:
        if not walk.keep(top):
            break
        kept += 1
        if kept == k or not walk.go_on(top):
            break
    return kept


@pytest.mark.parametrize("tops, row_cost, pass_cost, depth", [
    ([0.1] * 8, 0.0, 0.0, 8),  # free rows and passes (a GPU): everything
    ([0.95] * 12, 0.05, 0.1, 12),  # a confident draft on cheap rows goes deep
    ([0.95] * 12, 0.2, 0.35, 4),  # the same draft where rows and passes cost more (best fixed depth: 4)
    ([0.99, 0.99, 0.3, 0.99], 0.05, 0.1, 3),  # an unsure token's pass is spent: kept for its row, no pass after
    ([0.99, 0.99, 0.05, 0.99], 0.2, 0.1, 2),  # a very unsure one is not worth even its row
    ([0.6] * 8, 0.2, 0.35, 1),  # (1 + 0.6 + 0.36) / 2.1 < 1.6 / 1.55: no second pass
    ([0.05], 0.2, 0.35, 0),  # even the first token does not pay for its row
])
def test_chain_walk_stops_where_a_token_no_longer_pays(tops, row_cost, pass_cost, depth):
    assert _chain_depth(tops, row_cost, pass_cost) == depth


def test_chain_walk_maximises_tokens_per_pass_for_a_steady_draft():
    """With every top probability p, the depth it reaches is the best fixed depth by (1 + p + ... + p^n) /
    (1 + pass_cost + n * row_cost + (n - 1) * pass_cost), within one token (it decides a pass ahead)."""
    for p in (0.5, 0.7, 0.85, 0.95):
        for row_cost, pass_cost in ((0.05, 0.1), (0.15, 0.3), (0.3, 0.4)):
            value = [sum(p ** j for j in range(n + 1)) / (1 + pass_cost + n * row_cost + max(n - 1, 0) * pass_cost)
                     for n in range(17)]
            best = max(range(17), key=value.__getitem__)
            assert abs(_chain_depth([p] * 16, row_cost, pass_cost) - best) <= 1, (p, row_cost, pass_cost)


def _walk(curve: list[float], draft_pass: float, tops: list[float]) -> int:
    walk, kept = ChainWalk(curve, draft_pass), 0
    for top in tops:
        if not walk.keep(top):
            break
        kept += 1
        if not walk.go_on(top):
            break
    return kept


def test_chain_walk_reads_a_measured_curve():
    """Where the first rows are free and later ones dear (as on AVX2), a confident draft stops where rows turn
    dear: depth 2 here, the best by the curve; a line through the curve's ends (0.3 a row) would make it 4."""
    curve = [1.0, 1.0, 1.0, 1.5, 2.0, 2.5]

    def value(verify, n):
        return sum(0.9 ** j for j in range(n + 1)) / (verify(n) + 0.1 * max(n, 1))

    best = max(range(9), key=lambda n: value(lambda m: curve[m] if m < 6 else 2.5 + 0.5 * (m - 5), n))
    line = max(range(9), key=lambda n: value(lambda m: 1 + 0.3 * m, n))
    assert (best, line) == (2, 4)
    assert _walk(curve, 0.1, [0.9] * 8) == best
    assert _walk([1.0, 1.3], 0.1, [0.9] * 8) == line


def test_a_sequence_plans_with_the_cost_as_it_is_now():
    """A cost that falls mid-sequence (a busy machine that calmed down) lets the same sequence draft deeper."""
    class Changing:
        row_cost = 5.0

    target = Changing()
    drafter = PromptLookup(row_cost=row_cost_for(target))
    seq = SequenceContext(0, [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3], 0, 4, SamplingConfig(), torch.Generator())
    drafter.start(seq)
    assert len(drafter.propose([seq])[0]) <= 1  # rows cost five passes each: nothing (or a one-token probe)
    target.row_cost = 0.13
    assert len(drafter.propose([seq])[0]) == 4  # a three-token match: all of it
