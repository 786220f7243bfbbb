"""`hybrid`: free drafts first. A coding agent asks for the same file again with one change; most of each answer
is already in the prompt or in earlier answers, where suffix decoding drafts it for nothing, while a draft model
pays a pass for every token it proposes. So per step and per sequence this drafter takes suffix decoding's draft
when it is worth at least what the draft model's chain would buy for its cost, and otherwise runs the draft
model, its chain led by the free draft's first tokens where those are likelier to be accepted than the model's
own (they ride in the model's catch-up pass, costing no draft pass). The rule and its prices:
common/free_or_model.py.

The free drafter is `suffix`, not `prompt-lookup`: its index of the request's own prompt and output finds what
prompt lookup finds (the context's end earlier in the request, matched up to 24 tokens rather than 3), its store
adds earlier requests (an agent's previous turns and files), and it estimates every node's chance of being
accepted (its match length's rates x the node's frequency), which is what the rule weighs. Prompt lookup keeps
no per-node estimate and no store.

The draft model's side: R_j, its chance of being accepted to depth j, from its own chains' results in this
sequence (DepthYield, tokens after a seed not counted), starting from the drafter's record over earlier sequences
(a seeded sampled sequence: from MODEL_PRIOR_RATE, as suffix keeps such a sequence off its store). The costs are
the draft model's measured chain costs as the machine runs now (ChainBudget.costs); without them (off the CPU,
where measure_chain_costs prices passes flat, or a seeded sampled sequence on measured costs, which must not
follow timings) passes are priced flat and the rule compares expected tokens alone.

Lossless like its parts: a free draft is deterministic (one-hot q); a seeded chain's seed rows are one-hot and
the model's rows its own distribution, each token drawn after the path before it.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from specdecode.config import DrafterConfig, SpecConfig
from specdecode.core.drafting import Capabilities, Draft, SequenceContext
from specdecode.core.target import Target
from specdecode.drafters import draft_model, suffix
from specdecode.drafters.common.base import BaseDrafter, DrafterSpec
from specdecode.drafters.common.free_or_model import Hindsight, seed_length, take_free
from specdecode.drafters.common.row_budget import DepthYield
from specdecode.drafters.draft_model import DraftModel
from specdecode.drafters.suffix import Suffix, SuffixPlan
from specdecode.errors import ConfigError, OptionError

# a draft model's chance that its next token is accepted, before it has any results: about the Qwen pair's on code
# (tau ~3 at k 3, i.e. ~2 of 3 drafted tokens accepted: 0.8 + 0.8^2 + 0.8^3 = 1.95; docs/drafters.md, "draft-model")
MODEL_PRIOR_RATE = 0.8
FLAT = (0.0, (1.0,))  # costs when none are measured: draft passes free, every verify pass one pass


@dataclass(frozen=True)
class HybridConfig:
    """seed: lead the draft model's chain with the free draft's likeliest first tokens where they are at least
    as likely to be accepted as the model's own (free_or_model.seed_length). prior_rate: the draft model's
    acceptance per token before it has results (MODEL_PRIOR_RATE)."""

    seed: bool = True
    prior_rate: float = MODEL_PRIOR_RATE

    def __post_init__(self) -> None:
        if not 0 < self.prior_rate <= 1:
            raise ConfigError(f"hybrid needs prior_rate in (0, 1], got {self.prior_rate}")


@dataclass(frozen=True)
class Choice:
    """This step's draft for one sequence: the free draft (free True), or the draft model's chain led by the first
    `seed` tokens of the free draft's likeliest chain."""

    free: bool
    seed: int = 0


@dataclass
class _State:
    free: Any  # suffix's own state of the sequence
    model: Any  # the draft model's
    record: DepthYield  # the draft model's acceptance by depth, in this sequence
    hindsight: Hindsight  # how the free drafts the rule took fared against their estimates, in this sequence
    shared: bool  # its results also teach the drafter's record and hindsight (not a seeded sampled sequence's)
    seeded: int = 0  # the chain in flight: seed tokens ahead of the model's
    drafted: int = 0  # its length, seed included (0: none in flight, or the free draft)
    estimated: float | None = None  # the free draft in flight, when the rule took it: its accepted tokens expected


class Hybrid(BaseDrafter):
    name = "hybrid"

    def __init__(self, free: Suffix, model: DraftModel, config: HybridConfig | None = None, depth: int = 8):
        """depth: the deepest draft a step may ask for (SpecConfig.k, or max_k when adaptive)."""
        self.free, self.model = free, model
        self.config = config or HybridConfig()
        self.depth = depth
        # free_drafts: a step that allows no draft pass (ctx.free_only) gets suffix's draft or none
        self.capabilities = replace(Capabilities.union([free.capabilities, model.capabilities]), free_drafts=True)
        self.record = DepthYield((self.config.prior_rate,))  # over every unseeded sequence of this drafter
        self.hindsight = Hindsight()  # likewise
        self.free_drafts = self.model_drafts = self.seeded_drafts = 0  # steps that drafted each way

    def max_nodes(self, k: int) -> int:
        return max(self.free.max_nodes(k), self.model.max_nodes(k))

    def clear(self) -> None:
        """Forget what earlier sequences taught both sides (suffix's store and rates, the model's record) and the
        counts: a benchmark's warm-up must not seed them."""
        self.free.clear()
        self.record = DepthYield((self.config.prior_rate,))
        self.hindsight = Hindsight()
        self.free_drafts = self.model_drafts = self.seeded_drafts = 0

    def forget_prefixes(self) -> None:
        self.model.forget_prefixes()

    def kv_bytes_per_slot(self) -> int:
        return self.model.kv_bytes_per_slot()

    def parked_bytes(self) -> int:
        return self.model.parked_bytes()

    def evict_parked(self) -> bool:
        return self.model.evict_parked()

    def start(self, seq: SequenceContext) -> None:
        shared = not seq.sampling.seeded
        prior = [self.record.rate(j) for j in range(1, self.depth + 1)] if shared else [self.config.prior_rate]
        _, free = _as_part(seq, None, self.free.start)
        _, model = _as_part(seq, None, self.model.start)
        seq.state = _State(free, model, DepthYield(prior), Hindsight(self.hindsight.factor() if shared else 1.0),
                           shared)

    def propose(self, seqs: Sequence[SequenceContext]) -> list[Draft]:
        """Each sequence's free draft, or its row in one lockstep run of the draft model over every sequence that
        chose the model this step (DraftModel.draft_rows: a pass over four rows costs far less than four)."""
        drafts = [Draft()] * len(seqs)
        chains: list[tuple[int, SuffixPlan]] = []  # (index, the seed) of the sequences the model drafts for
        for index, seq in enumerate(seqs):
            outcome = self._plan_one(seq)
            if isinstance(outcome, Draft):
                drafts[index] = outcome
            else:
                chains.append((index, outcome))
        if not chains:
            return drafts
        chosen = [seqs[index] for index, _ in chains]
        states: list[_State] = [seq.state for seq in chosen]
        made, models = _as_parts(chosen, [state.model for state in states], lambda parts: self.model.draft_rows(
            parts, [seed.draft.tokens for _, seed in chains], [seed.estimates for _, seed in chains]))
        for (index, seed), seq, state, model, draft in zip(chains, chosen, states, models, made):
            state.model = model
            self._send(seq, seed)  # suffix is credited with what the target accepts of its seed
            state.seeded, state.drafted = len(seed.draft), len(draft)
            drafts[index] = draft
        return drafts

    def choose(self, plan: SuffixPlan, reach: Sequence[float], costs: tuple[float, Sequence[float]],
               k: int) -> Choice:
        """The rule (free_or_model.py): the free draft if it is worth at least the model's chain, else the chain,
        seeded when the configuration says so. plan: the free draft with its estimates as Hindsight scales them."""
        draft_pass, verify = costs
        if take_free(plan.estimates, reach, draft_pass, verify):
            return Choice(free=True)
        if not self.config.seed:
            return Choice(free=False)
        path = [plan.estimates[i] for i in plan.best_path()]
        return Choice(free=False, seed=seed_length(path, reach, k - 1))

    def _plan_one(self, seq: SequenceContext) -> Draft | SuffixPlan:
        """The sequence's draft when it is free (or empty), else the seed the draft model's chain starts with."""
        state: _State = seq.state
        state.seeded = state.drafted = 0
        state.estimated = None
        # read before suffix plans: their first measurement settles the row cost it plans with (pass_costs)
        costs = self._costs(seq) if seq.k > 0 and not seq.free_only else FLAT
        plan, state.free = _as_part(seq, state.free, self.free.plan)
        if seq.k <= 0:
            return Draft()
        if seq.free_only:  # the step allows no draft pass: suffix's draft, or none
            self.free_drafts += len(plan.draft) > 0
            return self._send(seq, plan)
        reach = _cumulative(state.record.rate(j) for j in range(1, seq.k + 1))
        trusted = replace(plan, estimates=state.hindsight.scaled(plan.estimates))  # the node order stays
        choice = self.choose(trusted, reach, costs, seq.k)
        if choice.free:
            self.free_drafts += 1
            state.estimated = plan.expected
            return self._send(seq, plan)
        self.model_drafts += 1
        self.seeded_drafts += choice.seed > 0
        return plan.chain(plan.best_path()[: choice.seed])

    def _send(self, seq: SequenceContext, plan: SuffixPlan) -> Draft:
        state: _State = seq.state
        draft, state.free = _as_part(seq, state.free, lambda s: self.free.send(s, plan))
        return draft

    def _costs(self, seq: SequenceContext) -> tuple[float, Sequence[float]]:
        """The draft model's chain costs to plan with now (FLAT where none may be used)."""
        budget = self.model.budget
        costs = budget.costs(seq.sampling.seeded) if budget is not None else None
        return FLAT if costs is None else costs

    def observe(self, seq: SequenceContext, accepted: int) -> None:
        state: _State = seq.state
        _, state.free = _as_part(seq, state.free, lambda s: self.free.observe(s, accepted))
        _, state.model = _as_part(seq, state.model, lambda s: self.model.observe(s, accepted))
        if state.estimated is not None:
            state.hindsight.add(state.estimated, accepted)
            if state.shared:
                self.hindsight.add(state.estimated, accepted)
        own = state.drafted - state.seeded  # the model's tokens, tried only past an accepted seed
        if own > 0 and accepted >= state.seeded:
            state.record.add(own, accepted - state.seeded)
            if state.shared:
                self.record.add(own, accepted - state.seeded)

    def finish(self, seq: SequenceContext) -> None:
        state: _State | None = seq.state
        if state is not None:
            _as_part(seq, state.free, self.free.finish)
            _as_part(seq, state.model, self.model.finish)
        seq.state = None


def _as_part(seq: SequenceContext, part_state: Any, call: Callable[[SequenceContext], Any]) -> tuple[Any, Any]:
    """call(seq) with seq.state the part's own (each part keeps its per-sequence state there); -> (what it
    returned, the part's state after it). The hybrid's own state is back in seq.state afterwards, even on error."""
    mine = seq.state
    seq.state = part_state
    try:
        return call(seq), seq.state
    finally:
        seq.state = mine


def _as_parts(seqs: Sequence[SequenceContext], part_states: Sequence[Any],
              call: Callable[[Sequence[SequenceContext]], Any]) -> tuple[Any, list[Any]]:
    """_as_part for several sequences at once: call(seqs) with each seq.state its part's; -> (what it returned, the
    parts' states after it). Each sequence's own state is back afterwards, even on error."""
    mine = [seq.state for seq in seqs]
    for seq, part in zip(seqs, part_states, strict=True):
        seq.state = part
    try:
        return call(seqs), [seq.state for seq in seqs]
    finally:
        for seq, own in zip(seqs, mine):
            seq.state = own


def _cumulative(rates: Iterable[float]) -> list[float]:
    out, reach = [], 1.0
    for rate in rates:
        reach *= rate
        out.append(reach)
    return out


def _build(target: Target, config: DrafterConfig, spec: SpecConfig) -> Hybrid:
    """suffix as the registry builds it, and the registry's draft model with its chain budget (a --confidence
    threshold is not read: the rule prices the model's chain by its measured costs)."""
    if not config.draft_model:
        raise OptionError("{drafter} hybrid needs {draft_model} (a path, packaged name or hub id)", "drafter",
                          "draft_model")
    model = draft_model.SPEC.build(target, replace(config, name="draft-model"), replace(spec, confidence=0.0))
    if not isinstance(model, DraftModel):
        raise ConfigError("hybrid needs a draft model with the target's tokenizer (its chain continues the free "
                          "draft's tokens); this one drafts across tokenizers")
    return around(target, model, config, spec)


def around(target: Target, model: DraftModel, config: DrafterConfig, spec: SpecConfig) -> Hybrid:
    """The hybrid of `model`, already built, and suffix as the registry builds it (`auto` builds the draft model
    first: only then is it known whether it shares the target's tokenizer)."""
    free = suffix.SPEC.build(target, replace(config, name="suffix"), spec)
    return Hybrid(free, model, HybridConfig(), spec.max_k if spec.adaptive else spec.k)


SPEC = DrafterSpec("hybrid", _build, "suffix decoding's free draft where it is worth more than the draft model's "
                                     "chain for its cost, else the chain (led by the free draft's likeliest tokens)",
                   needs_draft_model=True)
