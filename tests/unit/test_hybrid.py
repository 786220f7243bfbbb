"""The hybrid drafter's selection rule: table tests of its prices (drafters/common/free_or_model.py), then the rule
inside the drafter over a real suffix drafter and a stand-in draft model with given costs: the free draft is taken
when its match is long, the draft model runs when it is short, a free token likelier than the model's own leads
the model's chain, and results are credited to the part that drafted."""
from __future__ import annotations

import pytest
import torch

from specdecode.config import DrafterConfig, SamplingConfig, SpecConfig
from specdecode.core.drafting import Draft, SequenceContext
from specdecode.drafters import build_drafter, suffix_of
from specdecode.drafters.common.base import BaseDrafter
from specdecode.drafters.common.free_or_model import (
    HINDSIGHT_KEEP,
    Hindsight,
    free_value,
    model_value,
    seed_length,
    take_free,
)
from specdecode.drafters.common.row_budget import ChainBudget
from specdecode.drafters.draft_model import DraftModel
from specdecode.drafters.hybrid import FLAT, Hybrid, HybridConfig
from specdecode.drafters.suffix import Suffix, SuffixConfig
from specdecode.errors import OptionError
from tests.fakes import FIXED_ROW_COST, fixed_chain

VERIFY = [1.0, 1.0, 1.1]  # a second verify row rides free, a third costs a tenth of a pass


@pytest.mark.parametrize("estimates, value", [((), 1.0), ((0.9,), 1.9), ((0.9, 0.8), 2.7 / 1.1),
                                              ((0.9, 0.8, 0.7), 3.4 / 1.2)])  # past the curve: its last row's cost
def test_free_value(estimates, value):
    assert free_value(estimates, VERIFY) == pytest.approx(value)


@pytest.mark.parametrize("reach, draft_pass, value", [
    ((0.8, 0.64), 0.25, 2.44 / 1.6),  # the docstring's example: depth 2 is best
    ((0.8, 0.64), 0.0, 2.44 / 1.1),  # free passes
    ((0.1, 0.01), 0.25, 1.0),  # no depth beats plain decoding
    ((0.9, 0.2), 1.0, 1.0),
    ((0.9, 0.2), 0.05, 1.9 / 1.05),  # depth 1: the second token does not pay for its row
])
def test_model_value(reach, draft_pass, value):
    assert model_value(reach, draft_pass, VERIFY) == pytest.approx(value)


@pytest.mark.parametrize("estimates, reach, draft_pass, free", [
    ((0.97, 0.94), (0.8, 0.64), 0.3, True),  # a long match: likely tokens for no draft pass
    ((0.22,), (0.8, 0.64), 0.3, False),  # a one-token match: the model buys more, even paying its passes
    ((0.22,), (0.8, 0.64), 2.0, True),  # ... unless its passes cost more than a target pass
    ((0.7, 0.5), (0.9, 0.81), 0.0, False),  # free draft passes: the likelier chain wins
    ((0.8, 0.64), (0.8, 0.64), 0.0, True),  # a tie goes to the free draft
    ((), (0.1,), 5.0, False),  # nothing free: the model runs (its own chain budget decides its depth)
])
def test_take_free(estimates, reach, draft_pass, free):
    assert take_free(estimates, reach, draft_pass, VERIFY) is free


@pytest.mark.parametrize("path, reach, limit, n", [
    ((0.9, 0.5), (0.8, 0.64, 0.51), 4, 1),  # the docstring's example
    ((0.9, 0.7), (0.8, 0.64, 0.51), 4, 2),
    ((0.9, 0.7), (0.8, 0.64, 0.51), 1, 1),  # at most limit (k - 1: the model drafts at least one)
    ((0.5,), (0.8,), 4, 0),  # less likely than the model's own token: no seed
    ((), (0.8,), 4, 0),
    ((0.8,), (0.8,), 4, 1),  # as likely, and free
])
def test_seed_length(path, reach, limit, n):
    assert seed_length(path, reach, limit) == n


def test_hindsight():
    hindsight = Hindsight()
    assert hindsight.factor() == 1.0 and hindsight.scaled((0.9, 0.5)) == (0.9, 0.5)
    hindsight.add(2.0, 0)
    assert hindsight.factor() == pytest.approx(0.8)  # the docstring's example
    assert hindsight.scaled((0.9, 0.5)) == pytest.approx((0.72, 0.4))
    for _ in range(200):  # estimates that came true since: the early miss fades
        hindsight.add(2.0, 2)
    assert hindsight.factor() == pytest.approx(1.0 - 2.0 * HINDSIGHT_KEEP ** 200 / (8 + hindsight.estimated))
    hindsight.add(1.0, 5)  # more accepted than estimated never raises the estimates
    assert hindsight.factor() == 1.0
    assert Hindsight(start=0.5).factor() == 0.5


class StandInModel(BaseDrafter):
    """A draft model stand-in: drafts `chain` after whatever seed it is handed (recorded), with given costs."""

    name = "stand-in"

    def __init__(self, chain: list[int], budget: ChainBudget):
        self.chain, self.budget = chain, budget
        self.seeds: list[tuple[int, ...]] = []

    def draft_after(self, seq, seed=(), reaches=()) -> Draft:
        self.seeds.append(tuple(seed))
        return Draft.chain([*seed, *self.chain][: seq.k])

    def draft_rows(self, seqs, seeds=None, reaches=None) -> list[Draft]:
        seeds = seeds if seeds is not None else [()] * len(seqs)
        return [self.draft_after(seq, seed) for seq, seed in zip(seqs, seeds)]

    def propose(self, seqs):
        return self.draft_rows(seqs)


MODEL_CHAIN = [250, 251, 252, 253]


def _hybrid(draft_pass: float = 0.3, config: HybridConfig | None = None,
            budget: ChainBudget | None = None) -> tuple[Hybrid, StandInModel]:
    model = StandInModel(MODEL_CHAIN, budget or fixed_chain(draft_pass))
    return Hybrid(Suffix(SuffixConfig(row_cost=FIXED_ROW_COST)), model, config, depth=4), model


def _seq(tokens: list[int], k: int = 4, sampling: SamplingConfig | None = None) -> SequenceContext:
    return SequenceContext(0, list(tokens), 0, k, sampling or SamplingConfig(), torch.Generator().manual_seed(0))


LONG_MATCH = list(range(10, 40)) + list(range(10, 30))  # its last 20 tokens occurred before, followed by 30, 31, ...
SHORT_MATCH = [10, 11, 12, 13, 14, 10]  # only its last token occurred before


def _propose(hybrid: Hybrid, tokens: list[int], **kwargs) -> tuple[Draft, SequenceContext]:
    seq = _seq(tokens, **kwargs)
    hybrid.start(seq)
    return hybrid.propose([seq])[0], seq


def test_a_long_match_takes_the_free_draft():
    hybrid, model = _hybrid()
    draft, _ = _propose(hybrid, LONG_MATCH)
    assert draft.tokens == (30, 31, 32, 33) and draft.free  # a server learns its acceptance apart
    assert model.seeds == [] and (hybrid.free_drafts, hybrid.model_drafts) == (1, 0)  # no draft pass spent


def test_a_short_match_runs_the_model():
    hybrid, model = _hybrid()
    draft, _ = _propose(hybrid, SHORT_MATCH)
    assert draft.tokens == tuple(MODEL_CHAIN) and not draft.free
    assert model.seeds == [()] and (hybrid.free_drafts, hybrid.model_drafts) == (0, 1)


def test_a_dear_model_leaves_even_a_short_match_to_the_free_draft():
    hybrid, model = _hybrid(draft_pass=2.0)  # a draft pass costs two target passes: no chain pays
    draft, _ = _propose(hybrid, SHORT_MATCH)
    assert draft.tokens == (11,) and model.seeds == []


def test_a_step_that_allows_no_draft_pass_gets_the_free_draft_or_none():
    """A server's step where a model's drafts do not pay (ctx.free_only): the free draft, even where the model's
    chain is worth more, and nothing where there is no free draft; the draft model never runs."""
    hybrid, model = _hybrid()
    assert hybrid.capabilities.free_drafts
    seq = _seq(SHORT_MATCH)
    hybrid.start(seq)
    seq.free_only = True
    assert hybrid.propose([seq])[0].tokens == (11,)  # where the model's chain was chosen without the flag
    seq = _seq([1, 2, 3, 4])  # no match at all
    hybrid.start(seq)
    seq.free_only = True
    assert len(hybrid.propose([seq])[0]) == 0
    assert model.seeds == [] and hybrid.model_drafts == 0


def test_a_likelier_free_token_leads_the_models_chain():
    """The store's match is long but ends after one token: the model, cheap and likely (rate 0.9), is worth more
    than that one token, and the token (0.97) is likelier than the model's first: it leads the chain."""
    hybrid, model = _hybrid(draft_pass=0.0, config=HybridConfig(prior_rate=0.9))
    hybrid.free.store.insert([*range(1, 21), 99])
    draft, _ = _propose(hybrid, list(range(1, 21)))
    assert model.seeds == [(99,)] and draft.tokens == (99, *MODEL_CHAIN[:3])
    assert hybrid.seeded_drafts == 1
    unseeded, model = _hybrid(draft_pass=0.0, config=HybridConfig(prior_rate=0.9, seed=False))
    unseeded.free.store.insert([*range(1, 21), 99])
    _propose(unseeded, list(range(1, 21)))
    assert model.seeds == [()]


def test_results_go_to_the_part_that_drafted():
    hybrid, _ = _hybrid()
    draft, seq = _propose(hybrid, LONG_MATCH)  # a free draft of a 16+ token match
    rates = hybrid.free.learned.rates[16]
    hybrid.observe(seq, 2)
    assert rates.reached[:3] == [1, 1, 1] and rates.passed[:3] == [1, 1, 0]
    assert seq.state.record.reached == [] and hybrid.record.reached == []  # the model drafted nothing
    seq.tokens += [30, 31, 10]  # two accepted and the target's own, which only a one-token match finds: the model runs
    assert hybrid.propose([seq])[0].tokens == tuple(MODEL_CHAIN)
    hybrid.observe(seq, 1)
    assert seq.state.record.reached == [1, 1, 0, 0] and seq.state.record.passed == [1, 0, 0, 0]
    assert hybrid.record.reached == [1, 1, 0, 0]  # an unseeded sequence teaches the drafter's record too
    assert rates.reached[:3] == [1, 1, 1]  # and suffix, which did not draft, learned nothing


def test_tokens_after_a_seed_teach_the_model_only_past_an_accepted_seed():
    hybrid, _ = _hybrid(draft_pass=0.0, config=HybridConfig(prior_rate=0.9))
    hybrid.free.store.insert([*range(1, 21), 99])
    _, seq = _propose(hybrid, list(range(1, 21)))  # seed 99, then 3 of the model's
    hybrid.observe(seq, 0)  # the seed was rejected: the model's tokens were never tried
    assert seq.state.record.reached == []
    assert hybrid.free.learned.rates[16].reached[:1] == [1]  # suffix's token was


def test_a_seeded_sampled_sequence_does_not_plan_with_measured_costs():
    """Measured costs that price every chain out (a draft pass of a whole target pass) decide an unseeded
    sequence; a seeded sampled one compares expected tokens alone (FLAT), where the model (rate 0.99) wins."""
    def measured():
        return 1.0, [1.0 + n * FIXED_ROW_COST for n in range(9)]

    config = HybridConfig(prior_rate=0.99)
    hybrid, model = _hybrid(config=config, budget=ChainBudget(measured, measured=True))
    _propose(hybrid, LONG_MATCH)
    assert model.seeds == []
    seeded = SamplingConfig(temperature=1.0, seed=3)
    assert hybrid._costs(_seq(LONG_MATCH, sampling=seeded)) == FLAT
    _propose(hybrid, LONG_MATCH, sampling=seeded)
    assert model.seeds == [()]


def test_its_suffix_store_is_found_for_the_server_and_the_benchmark():
    hybrid, _ = _hybrid()
    assert suffix_of(hybrid) is hybrid.free and suffix_of(hybrid.free) is hybrid.free
    assert suffix_of(hybrid.model) is None


def test_the_registry_builds_it_only_with_a_draft_model(tiny_target, tiny_draft_dir):
    with pytest.raises(OptionError, match="hybrid needs draft_model"):
        build_drafter(tiny_target, DrafterConfig("hybrid"))
    hybrid = build_drafter(tiny_target, DrafterConfig("hybrid", draft_model=tiny_draft_dir), SpecConfig(k=3))
    assert isinstance(hybrid, Hybrid) and isinstance(hybrid.free, Suffix) and isinstance(hybrid.model, DraftModel)
    assert hybrid.depth == 3 and hybrid.capabilities.prices_rows


def test_clear_forgets_what_earlier_sequences_taught():
    hybrid, _ = _hybrid()
    hybrid.free.store.insert([*range(1, 21), 99])
    _, seq = _propose(hybrid, SHORT_MATCH)
    hybrid.observe(seq, 0)
    assert hybrid.record.rate(1) < HybridConfig().prior_rate and hybrid.model_drafts == 1
    hybrid.clear()
    assert hybrid.record.rate(1) == HybridConfig().prior_rate and hybrid.model_drafts == 0
    assert hybrid.free.stats().sequences == 0


class Spy(Hybrid):
    """A hybrid whose rule records the estimates it was given, and suffix's own (raw) estimates of that step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.raw: list[tuple[float, ...]] = []
        plan = self.free.plan
        self.free.plan = lambda seq: self._keep(plan(seq))

    def _keep(self, plan):
        self.raw.append(plan.estimates)
        return plan

    def choose(self, plan, reach, costs, k):
        self.given = plan.estimates
        return super().choose(plan, reach, costs, k)


def test_free_drafts_that_missed_lower_the_estimates_the_rule_weighs():
    """A free draft the rule took and the target rejected scales later estimates by Hindsight, in its sequence
    and in the next sequences that share the drafter's record; a seeded sampled sequence starts unscaled."""
    hybrid = Spy(Suffix(SuffixConfig(row_cost=FIXED_ROW_COST)), StandInModel(MODEL_CHAIN, fixed_chain(0.3)), depth=4)
    draft, seq = _propose(hybrid, LONG_MATCH)
    assert draft.free and hybrid.given == hybrid.raw[-1]  # nothing learned yet: unscaled
    assert seq.state.estimated == pytest.approx(sum(hybrid.raw[-1]))
    hybrid.observe(seq, 0)
    factor = seq.state.hindsight.factor()
    assert factor < 1 and hybrid.hindsight.factor() == factor
    _, fresh = _propose(hybrid, LONG_MATCH)
    assert fresh.state.hindsight.start == factor
    assert hybrid.given == pytest.approx(tuple(p * factor for p in hybrid.raw[-1])) and min(hybrid.raw[-1]) > 0
    _, seeded = _propose(hybrid, LONG_MATCH, sampling=SamplingConfig(temperature=1.0, seed=3))
    assert seeded.state.hindsight.start == 1.0
