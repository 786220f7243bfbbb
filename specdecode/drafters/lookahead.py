"""`lookahead`: model-free parallel drafting by Jacobi iteration (Fu et al. 2024, "Break the Sequential
Dependency of LLM Inference Using Lookahead Decoding").

Each target pass carries two branches under one attention mask:
- the verification branch: up to G n-grams from a pool whose first token is the pending token, as a tree of
  chains under the root (shared prefixes merged), verified like any draft (q one-hot: the pool is
  deterministic given the context, so greedy and rejection sampling stay lossless);
- the lookahead branch (an AuxBranch, never committed): a window of W columns x (N-1) levels of guesses. Level 0
  is a chain from the root; level j of column i hangs off level j-1 of column i, so it sees exactly
  root, level0[0..i], level1[i], ..., level_j[i] at consecutive positions. The target's argmax at the last level
  is one Jacobi update of every column at once; column i yields the n-gram
  (level0[i], ..., level_{N-2}[i], new[i]) for the pool, and the levels shift up by one.
The pool is seeded with the prompt's n-grams and grows with the committed text as well.
"""
from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from specdecode.config import DrafterConfig, SpecConfig
from specdecode.core.drafting import AuxBranch, Capabilities, Draft, SequenceContext
from specdecode.core.sampling import greedy_tokens
from specdecode.drafters.common.base import BaseDrafter, DrafterSpec
from specdecode.drafters.common.row_budget import DepthPolicy, RowCost, Yield, row_cost_for
from specdecode.errors import ConfigError


@dataclass(frozen=True)
class LookaheadConfig:
    """window W: Jacobi columns; ngram N: n-gram size (N-1 levels, candidates of N-1 tokens); candidates G:
    n-grams verified per pass.

    Defaults: width is what costs on a CPU, so the default keeps the smallest window that is still lookahead
    decoding, W=1, N=4, G=1. For the same reason a pass with nothing to verify (no pool n-gram starts with the
    pending token) is a plain one-token pass without the window, unless every_step (the paper's schedule, for
    GPUs where width is free: pass wider W, N, G there). Re-measure with `specdecode generate --drafter
    lookahead --lookahead W,N,G --json PROMPT` per setting; figures: docs/design-notes.md ("Measured defaults").

    row_cost: what one more row of a pass costs, in one-token passes; None = 0 (free rows) for a bare
    Lookahead, the target's measured cost when built through the registry (Target.row_cost; 0 on CUDA). Rows
    must earn their cost: for each kind of candidate (context-matched, i.e. the pool's n-gram was seen after
    the same two tokens, or matched on the last token only) the depth verified is the one that maximises
    expected tokens per pass cost by the acceptance measured so far in this sequence (row_budget.DepthPolicy),
    and the Jacobi window runs only while the tokens accepted from n-grams it harvested, per window pass, reach
    row_cost x its W(N-1) rows. What does not pay is still tried on the probe_every-th chance, then after twice
    as many, up to 8x (so a change is noticed and the window keeps harvesting a little). Acceptance by kind and
    the window's share of accepted tokens, as measured: docs/design-notes.md ("Measured defaults")."""

    window: int = 1
    ngram: int = 4
    candidates: int = 1
    pool_per_key: int = 8  # n-grams kept per first token (most recent first)
    seed: int = 0  # for the initial guesses drawn from the prompt
    every_step: bool = False
    row_cost: float | None = None
    probe_every: int = 8

    def __post_init__(self) -> None:
        if self.window < 0 or self.ngram < 2 or self.candidates < 0:
            raise ConfigError(
                f"lookahead needs window >= 0, ngram >= 2, candidates >= 0; got {self.window}, {self.ngram}, "
                f"{self.candidates}"
            )
        if (self.row_cost is not None and self.row_cost < 0) or self.probe_every < 1:
            raise ConfigError(f"lookahead needs row_cost >= 0 and probe_every >= 1; got {self.row_cost}, "
                              f"{self.probe_every}")


# acceptance rates by depth (token j given token j-1) measured for each kind on 48 bench answers (row_budget)
PRIOR_RATES = {True: (0.68, 0.78, 0.84), False: (0.22, 0.64, 0.72)}  # context-matched / last-token match


class Candidate(NamedTuple):
    tokens: tuple[int, ...]  # the continuation after the key token
    matched: bool  # its left context equals the sequence's second-to-last token
    from_window: bool  # harvested from the Jacobi window (else from the prompt or the committed text)


class NgramPool:
    """first token -> continuations of N-1 tokens, most recent first, without duplicates. Each continuation
    remembers the token seen before its first token (its left context) and whether the Jacobi window produced
    it; lookups rank continuations whose context matches the sequence's second-to-last token first (a 2-token
    match is a better bet than 1)."""

    def __init__(self, per_key: int):
        self.per_key = per_key
        self.table: dict[int, OrderedDict[tuple[int, ...], tuple[int | None, bool]]] = {}

    def add(self, key: int, continuation: tuple[int, ...], context: int | None = None,
            from_window: bool = False) -> None:
        entries = self.table.setdefault(key, OrderedDict())
        entries[continuation] = (context, from_window)
        entries.move_to_end(continuation, last=False)
        while len(entries) > self.per_key:
            entries.popitem(last=True)

    def add_text(self, tokens: list[int], n: int, start: int = 0) -> None:
        """Every complete n-gram of `tokens` beginning at index >= start, oldest first (so newest ranks first)."""
        for i in range(start, len(tokens) - n + 1):
            self.add(tokens[i], tuple(tokens[i + 1 : i + n]), tokens[i - 1] if i > 0 else None)

    def lookup(self, key: int, limit: int, context: int | None = None) -> list[Candidate]:
        entries = self.table.get(key, {})
        found = [Candidate(c, context is not None and ctx == context, window) for c, (ctx, window) in entries.items()]
        return sorted(found, key=lambda c: not c.matched)[:limit]  # stable: matched first, each newest first

    def get(self, key: int, limit: int, context: int | None = None) -> list[tuple[int, ...]]:
        return [c.tokens for c in self.lookup(key, limit, context)]


def candidate_tree(candidates: list[tuple[int, ...]], depth: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Merge chains (each truncated to `depth`) into a trie under the root -> (tokens, parents).

    Example: [(5, 6), (5, 7), (8,)] -> tokens (5, 6, 7, 8), parents (-1, 0, 0, -1)."""
    tokens: list[int] = []
    parents: list[int] = []
    children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    for chain in candidates:
        parent = -1
        for token in chain[:depth]:
            node = children.get((parent, token))
            if node is None:
                node = len(tokens)
                tokens.append(token)
                parents.append(parent)
                children[(parent, token)] = node
            parent = node
    return tuple(tokens), tuple(parents)


def window_parents(window: int, levels: int) -> tuple[int, ...]:
    """Aux parents of the W x (N-1) lookahead window, level-major (node j*W + i is level j, column i).

    Example W=2, levels=2: level 0 = chain (-1, 0); level 1 hangs off level 0 of its column: (0, 1)."""
    parents = [i - 1 for i in range(window)]
    for level in range(1, levels):
        parents.extend((level - 1) * window + i for i in range(window))
    return tuple(parents)


@dataclass
class _State:
    pool: NgramPool
    levels: list[list[int]]  # N-1 rows of W guesses; levels[0] is the oldest
    steps: int = 0  # Jacobi updates done (n-grams are harvested once every level came from the target)
    indexed: int = 0  # committed tokens already added to the pool as n-grams
    aux_parents: tuple[int, ...] = field(default_factory=tuple)
    root: int | None = None  # the pending token the window last hung from
    depths: DepthPolicy | None = None  # depth per kind of candidate (context-matched or not)
    window: Yield = field(default_factory=lambda: Yield(0.0))  # tokens accepted from its n-grams per window pass
    proposed: Candidate | None = None  # the first candidate of the draft in flight
    proposed_depth: int = 0  # ... and how many of its tokens were drafted
    window_ran: bool = False  # the draft in flight carries the window


class Lookahead(BaseDrafter):
    name = "lookahead"
    capabilities = Capabilities(prices_rows=True, free_drafts=True)

    def __init__(self, config: LookaheadConfig | None = None, cost: RowCost | None = None):
        """cost: where the row cost comes from when config.row_cost is None (the target's, measured on first
        use); a bare drafter's rows are free."""
        self.config = config or LookaheadConfig()
        self._cost = cost or RowCost(configured=self.config.row_cost)

    @property
    def row_cost(self) -> float:
        return self._cost.value

    def start(self, seq: SequenceContext) -> None:
        c = self.config
        pool = NgramPool(c.pool_per_key)
        pool.add_text(seq.tokens, c.ngram)
        rng = random.Random(c.seed)
        guesses = seq.tokens or [0]
        levels = [[rng.choice(guesses) for _ in range(c.window)] for _ in range(c.ngram - 1)]
        depths = DepthPolicy(PRIOR_RATES, self._cost.planner(seq.sampling.seeded), c.probe_every)
        seq.state = _State(pool, levels, indexed=len(seq.tokens), aux_parents=window_parents(c.window, c.ngram - 1),
                           depths=depths)

    def max_nodes(self, k: int) -> int:
        """Largest block after the root at speculation length k: candidates plus the Jacobi window."""
        c = self.config
        return c.candidates * min(k, c.ngram - 1) + c.window * (c.ngram - 1)

    def propose(self, seqs: Sequence[SequenceContext]) -> list[Draft]:
        return [self._draft_one(seq) for seq in seqs]

    def _draft_one(self, seq: SequenceContext) -> Draft:
        state: _State = seq.state
        state.proposed, state.proposed_depth, state.window_ran = None, 0, False
        if seq.k <= 0:
            return Draft()
        c = self.config
        context = seq.tokens[-2] if len(seq.tokens) > 1 else None
        candidates = state.pool.lookup(seq.tokens[-1], c.candidates, context)
        depth = {kind: state.depths.depth(kind, min(seq.k, c.ngram - 1)) for kind in {x.matched for x in candidates}}
        chains = [(x, x.tokens[: depth[x.matched]]) for x in candidates if depth[x.matched]]
        if not chains and not c.every_step:
            return Draft()
        state.root = seq.tokens[-1]
        if chains:
            state.proposed, state.proposed_depth = chains[0][0], len(chains[0][1])
        tokens, parents = candidate_tree([chain for _, chain in chains], seq.k)
        rows = c.window * (c.ngram - 1)
        state.window_ran = rows > 0 and (c.every_step or state.window.worth(rows, state.depths.row_cost, c.probe_every))
        if not state.window_ran:
            return Draft(tokens, parents, free=True) if tokens else Draft()
        aux = AuxBranch(tuple(t for level in state.levels for t in level), state.aux_parents)
        return Draft(tokens, parents, None, aux, free=True)

    def observe_aux(self, seq: SequenceContext, logits: torch.Tensor) -> None:
        # logits: [(N-1) * W, vocab]; the last level's argmax is the new level
        c, state = self.config, seq.state
        last = greedy_tokens(logits[(c.ngram - 2) * c.window :]).tolist()
        state.steps += 1
        if state.steps >= c.ngram - 1:  # every level now holds target outputs
            for column in range(c.window):
                gram = [level[column] for level in state.levels] + [last[column]]
                before = state.levels[0][column - 1] if column else state.root
                state.pool.add(gram[0], tuple(gram[1:]), before, from_window=True)
        state.levels = state.levels[1:] + [last]

    def observe(self, seq: SequenceContext, accepted: int) -> None:
        state: _State = seq.state
        if state.proposed is not None:  # (a tree's other candidates are not scored: G is 1 by default)
            state.depths.add(state.proposed.matched, state.proposed_depth, min(accepted, state.proposed_depth))
            if state.proposed.from_window:  # the window earns what its n-grams earn, whenever they are used
                state.window.credit(min(accepted, state.proposed_depth))
        if state.window_ran:
            state.window.spent()
        n = self.config.ngram
        state.pool.add_text(seq.tokens, n, start=max(0, state.indexed - n + 1))
        state.indexed = len(seq.tokens)


def _build(target, config: DrafterConfig, spec: SpecConfig) -> Lookahead:
    shape = {} if config.lookahead is None else dict(zip(("window", "ngram", "candidates"), config.lookahead))
    return Lookahead(LookaheadConfig(**shape, row_cost=config.row_cost), row_cost_for(target, config.row_cost))


SPEC = DrafterSpec("lookahead", _build, "Jacobi lookahead window + n-gram pool verified in one pass (model-free)")
