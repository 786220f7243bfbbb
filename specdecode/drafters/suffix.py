"""`suffix`: SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975): draft what followed the longest match of the
context's end in earlier requests (a store shared by every sequence of this drafter) and in this request's own
prompt and output, as a tree of the most frequent continuations.

Per step: find the longest suffix match (at most `max_match` tokens) in the request's own index and in the
store, and merge the continuations after each match's occurrences into a trie with counts (`suffix_store`);
matches of equal length share one trie. A node's frequency is count / occurrences (the paper's product of count
ratios along the path). Nodes are taken greedily by estimated acceptance, highest first:
    P(node) = reach(kind, depth) * count / occurrences
where reach is the chance that a chain drafted after a match of this length (the kind: 1, 2, 3, 4+, 8+, 16+
tokens) is accepted that deep (row_budget.DepthYield: measured prior rates updated by the results of every
request of this drafter), so the match length sizes the draft. The tree stops at `nodes`, at depth k (or
spec_factor * match length, the paper's MAX_SPEC, when set), below frequency `min_prob` (the paper's
threshold), and on a CPU where one more row no longer pays:
    P(node) <= row_cost * (1 + sum of P so far) / (1 + row_cost * nodes so far)
(rows are free on a GPU: row_cost 0). Of the two trees (own, store) the one with more expected accepted tokens
(sum of P) is drafted, as the paper picks between its prompt and global trees by score. A kind whose first token
does not pay is probed with one token now and then, like prompt lookup. Drafts are deterministic (q one-hot):
greedy and sampled output stay exact.

The store is filled in `finish` with the sequence's prompt and output, so it lives as long as the drafter: across
requests of one SpecDecoder, one server, one benchmark method. A seeded sampled sequence drafts from its own
index only, with rates of its own: its random draws depend on its drafts, and a seed must give the same text
whatever ran before.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from specdecode.config import DrafterConfig, SpecConfig
from specdecode.core.drafting import Capabilities, Draft, SequenceContext
from specdecode.drafters.common.base import BaseDrafter, DrafterSpec
from specdecode.drafters.common.row_budget import DepthYield, Probe, RowCost, row_cost_for
from specdecode.drafters.common.suffix_store import StoreStats, SuffixStore, TokenIndex, TrieNode, continuation_trie
from specdecode.errors import ConfigError

KINDS = (16, 8, 4, 3, 2, 1)  # match-length classes, longest first


def kind_of(match: int) -> int:
    """The match-length class of a match of `match` >= 1 tokens: 1, 2, 3, 4 (4-7), 8 (8-15) or 16 (16+)."""
    return next(kind for kind in KINDS if match >= kind)


# acceptance by depth (token j given token j-1) of the most frequent continuation, per kind, measured on the
# default model's greedy answers (96 tokens) to the agentic category and 3 built-in questions per category (50
# turns, in order, the store filled with the earlier ones), replaying the lookups at every position
PRIOR_RATES = {1: (0.22, 0.51, 0.47, 0.71, 0.77), 2: (0.46, 0.54, 0.69, 0.76, 0.85), 3: (0.55, 0.66, 0.71, 0.86, 0.82),
               4: (0.7, 0.76, 0.79, 0.82, 0.8), 8: (0.83, 0.84, 0.85, 0.87, 0.9), 16: (0.97,)}


@dataclass(frozen=True)
class SuffixConfig:
    """store_tokens: the store's cap in tokens (oldest sequences evicted past it; ~160 bytes per token).
    max_match: longest suffix match looked for (the paper's tree depth; vLLM's default is 24).
    candidates: occurrences of the longest key examined per lookup, newest first (8: on replayed answers the
    newest few predicted a little better than counts over 32; docs/drafters.md, "suffix").
    nodes: most draft nodes per step (a tree may hold more nodes than k; its depth is at most k).
    spec_factor: depth at most spec_factor * match length (the paper's MAX_SPEC; vLLM uses 1.0); None: no such
    cap, the kind's learned rates size the draft (replayed: tau 2.28 against 2.20 at 1.0 on the agentic set).
    min_prob: a node's frequency below its matched context must reach this (vLLM's min_token_prob, 0.1).
    row_cost: one more verify row in one-token passes; None = 0 for a bare Suffix, the target's measured cost
    through the registry."""

    store_tokens: int = 65536
    max_match: int = 24
    candidates: int = 8
    nodes: int = 32
    spec_factor: float | None = None
    min_prob: float = 0.1
    row_cost: float | None = None
    probe_every: int = 8

    def __post_init__(self) -> None:
        if self.store_tokens < 1:
            raise ConfigError(f"the suffix store needs at least one token, got {self.store_tokens}")
        if self.max_match < 1 or self.candidates < 1 or self.nodes < 1 or self.probe_every < 1:
            raise ConfigError("suffix needs max_match, candidates, nodes and probe_every >= 1")
        if ((self.spec_factor is not None and self.spec_factor <= 0) or not 0 <= self.min_prob <= 1
                or (self.row_cost is not None and self.row_cost < 0)):
            raise ConfigError("suffix needs spec_factor > 0, min_prob in [0, 1] and row_cost >= 0")


def select_nodes(trie: list[TrieNode], occurrences: int, reach: Sequence[float], row_cost: float, max_nodes: int,
                 min_prob: float) -> list[int]:
    """Trie nodes to draft, a parent before its children: highest estimated acceptance
    P = reach[depth - 1] * count / occurrences first, while the node's frequency count / occurrences >= min_prob,
    fewer than max_nodes are taken and P > row_cost * (1 + sum P) / (1 + row_cost * taken) (it pays for its row).
    P never grows down a path (counts and reach only fall), so the taken set is a tree.

    Example: continuations [5, 6], [5, 7], [5, 6], [8] (4 occurrences), reach 1.0 everywhere: P is 5: 0.75,
    6: 0.5, 8: 0.25, 7: 0.25 -> taken in that order with row_cost 0 and min_prob 0; min_prob 0.3 keeps 5 and 6;
    row_cost 0.5 keeps only 5 (6 would need P > 0.5 * 1.75 / 1.5)."""
    def estimate(i: int) -> float:
        return reach[trie[i].depth - 1] * trie[i].count / occurrences

    order = sorted(range(len(trie)), key=lambda i: (-estimate(i), trie[i].depth, i))
    taken: list[int] = []
    chosen: set[int] = set()
    expected = 1.0  # tokens per pass: the target's own token plus the P of every node taken
    for i in order:
        if len(taken) >= max_nodes:
            break
        if trie[i].count < min_prob * occurrences or (trie[i].parent >= 0 and trie[i].parent not in chosen):
            continue
        if estimate(i) <= row_cost * expected / (1 + row_cost * len(taken)):
            break  # later nodes have no higher P, and the bar only rises
        taken.append(i)
        chosen.add(i)
        expected += estimate(i)
    return taken


def tree_draft(trie: list[TrieNode], taken: list[int]) -> Draft:
    """The taken trie nodes as a Draft (tokens, parents renumbered in taken order)."""
    index = {node: i for i, node in enumerate(taken)}
    return Draft(tuple(trie[i].token for i in taken), tuple(index.get(trie[i].parent, -1) for i in taken), free=True)


@dataclass(frozen=True)
class _Proposal:
    match: int  # tokens matched
    kind: int  # kind_of(match)
    trie: list[TrieNode]  # the continuations after its occurrences
    taken: list[int]  # trie nodes worth drafting (select_nodes)
    firsts: list[int]  # depth-1 nodes frequent enough to probe with
    reach: list[float]  # [depth - 1]: the kind's chance that a chain is accepted that deep
    occurrences: int  # continuations counted
    from_store: bool  # some occurrences are in earlier requests

    def estimate(self, node: int) -> float:
        """P of a trie node: its chance of being accepted (reach at its depth times its frequency)."""
        return self.reach[self.trie[node].depth - 1] * self.trie[node].count / self.occurrences

    @property
    def expected(self) -> float:
        """Expected accepted tokens of the taken nodes (sum of P)."""
        return sum(self.estimate(i) for i in self.taken)


@dataclass(frozen=True)
class SuffixPlan:
    """A suffix draft before it is sent, with what the drafter expects of it: `estimates[i]` is node i's chance
    of being accepted (P above), so their sum is the draft's expected accepted tokens. A drafter that weighs this
    draft against another's (hybrid.py) reads it; `Suffix.send` makes it the draft in flight."""

    draft: Draft = field(default_factory=Draft)
    estimates: tuple[float, ...] = ()
    kind: int = 0  # the match-length class (0: no draft)
    from_store: bool = False

    @property
    def expected(self) -> float:
        return sum(self.estimates)

    def best_path(self) -> list[int]:
        """Nodes of the most likely chain from the root: at each depth the child with the highest P (the first
        of equals). P never grows down a path, so this is the draft's best prefix at every depth."""
        path: list[int] = []
        parent = -1
        while True:
            children = [i for i, p in enumerate(self.draft.parents) if p == parent]
            if not children:
                return path
            parent = max(children, key=lambda i: (self.estimates[i], -i))
            path.append(parent)

    def chain(self, nodes: Sequence[int]) -> SuffixPlan:
        """The plan cut to `nodes`, a path from the root (best_path's prefix): a chain draft."""
        draft = Draft.chain([self.draft.tokens[i] for i in nodes], free=True)
        return SuffixPlan(draft, tuple(self.estimates[i] for i in nodes), self.kind if nodes else 0,
                          self.from_store and bool(nodes))


@dataclass
class Learned:
    """Per kind: acceptance by depth (from PRIOR_RATES, updated by results) and when to probe a kind that does
    not pay."""

    rates: dict[int, DepthYield] = field(default_factory=lambda: {k: DepthYield(r) for k, r in PRIOR_RATES.items()})
    probes: dict[int, Probe] = field(default_factory=lambda: {k: Probe() for k in PRIOR_RATES})


@dataclass
class _State:
    local: TokenIndex  # this request's prompt + output
    use_store: bool  # False for a seeded sampled sequence (see the module docstring)
    learned: Learned  # the drafter's, shared by its requests; a seeded sampled sequence's own
    cost: Callable[[], float]  # RowCost.planner: the machine's cost now, a seeded sampled sequence's fixed one
    kind: int = 0  # the kind of the draft in flight (0: none)
    drafted: int = 0  # its depth


class Suffix(BaseDrafter):
    name = "suffix"
    capabilities = Capabilities(prices_rows=True, free_drafts=True)

    def __init__(self, config: SuffixConfig | None = None, cost: RowCost | None = None):
        """cost: where the row cost comes from when config.row_cost is None (the target's, measured on first
        use); a bare Suffix's rows are free."""
        self.config = config or SuffixConfig()
        self._cost = cost or RowCost(configured=self.config.row_cost)
        c = self.config
        self.store = SuffixStore(c.store_tokens, c.max_match, c.candidates)
        self.learned = Learned()
        self.drafts = self.hits = 0

    @property
    def row_cost(self) -> float:
        return self._cost.value

    def max_nodes(self, k: int) -> int:
        """Largest draft at speculation length k (the fast path compiles up to it)."""
        return self.config.nodes if k > 0 else 0

    def stats(self) -> StoreStats:
        s = self.store.stats()
        return StoreStats(s.tokens, s.sequences, s.capacity, s.evicted, self.drafts, self.hits)

    def clear(self) -> None:
        """Forget every stored sequence, learned rate and count (a benchmark's warm-up must not seed them)."""
        c = self.config
        self.store = SuffixStore(c.store_tokens, c.max_match, c.candidates)
        self.learned = Learned()
        self.drafts = self.hits = 0

    def start(self, seq: SequenceContext) -> None:
        seeded = seq.sampling.seeded
        local = TokenIndex(self.config.max_match, self.config.candidates)
        local.extend(seq.tokens)
        seq.state = _State(local, not seeded, Learned() if seeded else self.learned, self._cost.planner(seeded))

    def propose(self, seqs: Sequence[SequenceContext]) -> list[Draft]:
        return [self.send(seq, self.plan(seq)) for seq in seqs]

    def plan(self, seq: SequenceContext) -> SuffixPlan:
        """This step's draft and its estimates, not yet in flight (`send`): the tree of whichever match, the
        request's own or the store's, expects more accepted tokens, or a one-token probe now and then."""
        state: _State = seq.state
        state.local.extend(seq.tokens[state.local.end :])
        state.kind = state.drafted = 0
        if seq.k <= 0:
            return SuffixPlan()
        own = state.local.find(seq.tokens)
        stored = self.store.find(seq.tokens) if state.use_store else (0, [])
        if own[0] == stored[0]:  # occurrences of the same context: counted together
            sources = [(own[0], [(state.local, own[1]), (self.store.index, stored[1])])]
        else:
            sources = [(own[0], [(state.local, own[1])]), (stored[0], [(self.store.index, stored[1])])]
        proposals = [self._proposal(state, match, found, seq.k) for match, found in sources if match]
        proposals = [p for p in proposals if p is not None]
        if not proposals:
            return SuffixPlan()
        best = max(proposals, key=lambda p: (p.expected, p.match))  # the paper's choice by score
        taken = best.taken
        probe = state.learned.probes[best.kind]
        if taken:
            probe.paid()
        elif best.firsts and probe.due(self.config.probe_every):  # nothing pays: one token now and then
            taken = [max(best.firsts, key=lambda i: best.trie[i].count)]
        if not taken:
            return SuffixPlan()
        return SuffixPlan(tree_draft(best.trie, taken), tuple(best.estimate(i) for i in taken), best.kind,
                          best.from_store)

    def send(self, seq: SequenceContext, plan: SuffixPlan) -> Draft:
        """`plan`'s draft, now the one in flight: `observe` credits its kind with what the target accepts."""
        state: _State = seq.state
        state.kind, state.drafted = plan.kind, plan.draft.depth
        if len(plan.draft):
            self.drafts += 1
            self.hits += plan.from_store
        return plan.draft

    def _proposal(self, state: _State, match: int, found: list[tuple[TokenIndex, list[int]]],
                  k: int) -> _Proposal | None:
        """The tree drafted from the continuations after the occurrences of a match of `match` tokens."""
        c = self.config
        depth = k if c.spec_factor is None else min(k, math.ceil(c.spec_factor * match))
        continuations = [x for index, positions in found for p in positions if (x := index.continuation(p, depth))]
        if not continuations:
            return None
        trie = continuation_trie(continuations)
        kind = kind_of(match)
        rates = state.learned.rates[kind]
        reach = _cumulative(rates.rate(j) for j in range(1, depth + 1))
        taken = select_nodes(trie, len(continuations), reach, state.cost(), c.nodes, c.min_prob)
        firsts = [i for i, node in enumerate(trie) if node.parent < 0 and node.count >= c.min_prob * len(continuations)]
        from_store = any(index is self.store.index and positions for index, positions in found)
        return _Proposal(match, kind, trie, taken, firsts, reach, len(continuations), from_store)

    def observe(self, seq: SequenceContext, accepted: int) -> None:
        state: _State = seq.state
        if state.kind:
            state.learned.rates[state.kind].add(state.drafted, min(accepted, state.drafted))

    def finish(self, seq: SequenceContext) -> None:
        self.store.insert(seq.tokens)
        seq.state = None


def _cumulative(rates) -> list[float]:
    out, reach = [], 1.0
    for rate in rates:
        reach *= rate
        out.append(reach)
    return out


def _build(target, config: DrafterConfig, spec: SpecConfig) -> Suffix:
    store = {} if config.suffix_store is None else {"store_tokens": config.suffix_store}
    return Suffix(SuffixConfig(**store, row_cost=config.row_cost), row_cost_for(target, config.row_cost))


SPEC = DrafterSpec("suffix", _build, "tree of frequent continuations of the longest suffix match in earlier "
                                     "requests and this one (model-free, store shared across requests)")
