"""The drafter interface: a Protocol, the Draft value it returns, and the registry that names drafters."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import torch

from ..config import SamplingConfig


@dataclass(frozen=True)
class AuxBranch:
    """Extra tokens fed in the same target pass as a draft but never verified or committed (lookahead
    decoding's Jacobi window). Like the draft, a tree rooted at the pending token: parents[i] indexes into the
    branch (-1 = the root). Draft nodes never see aux nodes, aux nodes never see draft nodes; aux KV lands in
    slots after the draft's and is dropped. The engine hands the aux logits back via `observe_aux`."""

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError("aux tokens and parents differ in length")
        if any(not -1 <= p < i for i, p in enumerate(self.parents)):
            raise ValueError(f"aux parents must point to earlier nodes: {self.parents}")

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class Draft:
    """A tree of proposed tokens rooted at the sequence's pending (last committed, not yet cached) token.

    tokens:  node tokens, len n.
    parents: parents[i] is the index of node i's parent, -1 for a child of the root; parents[i] < i.
             A chain of k tokens has parents [-1, 0, 1, ..., k-2].
    q:       [n, vocab] the distribution node i's token was drawn from (a function of its parent's path),
             or None when the drafter chose tokens deterministically: verification then treats q as one-hot.
    aux:     optional AuxBranch evaluated in the same pass, invisible to the draft (see AuxBranch).
    An empty draft (n = 0) is a value: the target then decodes one token, i.e. plain decoding.
    """

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    q: torch.Tensor | None = None  # [n, vocab]
    aux: AuxBranch | None = None

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError("tokens and parents differ in length")
        if any(not -1 <= p < i for i, p in enumerate(self.parents)):
            raise ValueError(f"parents must point to earlier nodes: {self.parents}")
        if self.q is not None and self.q.shape[0] != len(self.tokens):
            raise ValueError("q must have one row per node")

    @staticmethod
    def chain(tokens: Sequence[int], q: torch.Tensor | None = None) -> "Draft":
        return Draft(tuple(int(t) for t in tokens), tuple(range(-1, len(tokens) - 1)), q)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depth(self) -> int:
        """Length of the longest root-to-leaf path (k for a chain)."""
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return max(depths, default=0)


@dataclass
class SequenceContext:
    """What a drafter may read about one sequence. `tokens` ends with the pending token; the target cache
    holds KV for tokens[:cache_len] (cache_len == len(tokens) - 1) in row `row`."""

    seq_id: int
    tokens: list[int]
    row: int
    k: int
    sampling: SamplingConfig
    generator: torch.Generator
    state: Any = None  # drafter-private per-sequence state, set in start()
    hidden: torch.Tensor | None = None  # [n, hidden] target features of the tokens committed last step
    cache: Any = None  # the target's RollbackCache (row `row` is this sequence's), for self-drafting
    extra: dict = field(default_factory=dict)

    @property
    def cache_len(self) -> int:
        return len(self.tokens) - 1


@dataclass(frozen=True)
class Capabilities:
    """What a drafter needs from the engine beyond the Protocol's calls, declared rather than probed for, so a
    drafter that routes to others (the server's) can report the union of theirs (`union`)."""

    needs_hidden: bool = False  # reads the target's hidden states of committed tokens (ctx.hidden): EAGLE, Medusa
    exit_layers: tuple[int, ...] = ()  # drafts with partial target passes of these depths (layer skip): warmed up
    prices_rows: bool = False  # plans its depth with the target's row cost (row_budget.RowCost): the thread that
    # decodes may measure it before the first step (the server's scheduler does), else the first step does

    @staticmethod
    def union(parts: "Sequence[Capabilities]") -> "Capabilities":
        return Capabilities(any(c.needs_hidden for c in parts),
                            tuple(sorted({layer for c in parts for layer in c.exit_layers})),
                            any(c.prices_rows for c in parts))


class Drafter(Protocol):
    """Proposes drafts for a batch of sequences and learns from what the target accepted."""

    name: str
    capabilities: Capabilities

    def start(self, seq: SequenceContext) -> None:
        """A sequence begins (after prefill): set up seq.state."""

    def propose(self, seqs: Sequence[SequenceContext]) -> list[Draft]:
        """One draft per sequence, of depth at most seq.k."""

    def observe(self, seq: SequenceContext, accepted: int) -> None:
        """The step committed `accepted` draft tokens plus one target token (already in seq.tokens)."""

    def observe_aux(self, seq: SequenceContext, logits: torch.Tensor) -> None:
        """The target's output at each node of the draft's AuxBranch (logits [len(aux), vocab]); called after the
        pass and before `observe`, only for drafts that carry one."""

    def finish(self, seq: SequenceContext) -> None:
        """The sequence left the batch: free its resources."""

    def max_nodes(self, k: int) -> int:
        """Most nodes (draft plus aux) one draft may hold at speculation length k: k for chains, more for trees.
        The fixed-shape fast path compiles passes up to this width."""

    def forget_prefixes(self) -> None:
        """Drop what finished sequences left for later ones to start from (a draft model's cached prompt KV);
        what the drafter learned stays. The benchmark calls it after its untimed warm-up."""


@dataclass(frozen=True)
class DrafterConfig:
    """Drafter choice and its knobs; each drafter reads the fields it needs."""

    name: str = "prompt-lookup"
    draft_model: str | None = None  # path or hub id, for draft-model
    exit_layer: int | None = None  # layer-skip: draft with the first L layers (default: a third of them)
    max_ngram: int = 3  # prompt-lookup: longest n-gram matched
    min_ngram: int = 1
    lookahead: tuple[int, int, int] | None = None  # lookahead: (window W, n-gram size N, candidates G)
    # prompt-lookup, lookahead: cost of one more verify row in one-token passes; None = by device (row_budget)
    row_cost: float | None = None
    draft_weights: str = "auto"  # draft-model: "auto" (int8 on the CPU), "int8" or "same" (int8_draft.py)
    draft_vocab: int | None = None  # draft-model: score only its head's first N ids + those seen (shortlist.py)
    suffix_store: int | None = None  # suffix: the store's cap in tokens (None: SuffixConfig's default)


@dataclass(frozen=True)
class DrafterSpec:
    """Registry entry: how to build a drafter from the target and its config."""

    name: str
    build: Callable[..., "Drafter"]  # build(target, DrafterConfig, SpecConfig) -> Drafter
    help: str
    needs_draft_model: bool = False
    # drafters with trained weights (heads): build one with random weights for any target (tests, tiny models);
    # untrained(target, SpecConfig) -> Drafter. Losslessness must hold whatever the weights.
    untrained: Callable[..., "Drafter"] | None = None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two sequences share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class RowPool:
    """Rows of a drafter's own cache, one per live sequence: reused after `give`, a new one when none is free."""

    rows: int = 0
    free: list[int] = field(default_factory=list)

    def take(self, prefer: Callable[[int], int] | None = None) -> int:
        """A free row (the one `prefer` scores highest, the first of equals), else a new one."""
        if not self.free:
            self.free.append(self.rows)
            self.rows += 1
        if prefer is None:
            return self.free.pop()
        best = max(self.free, key=prefer)
        self.free.remove(best)
        return best

    def give(self, row: int) -> None:
        self.free.append(row)


class BaseDrafter:
    """Defaults for drafters that keep no per-sequence state or need no feedback."""

    name = "base"
    capabilities = Capabilities()

    def start(self, seq: SequenceContext) -> None:
        pass

    def max_nodes(self, k: int) -> int:
        return k

    def forget_prefixes(self) -> None:
        pass

    def observe(self, seq: SequenceContext, accepted: int) -> None:
        pass

    def observe_aux(self, seq: SequenceContext, logits: torch.Tensor) -> None:
        pass

    def finish(self, seq: SequenceContext) -> None:
        seq.state = None


class RowStateDrafter(BaseDrafter):
    """A drafter with a cache of its own: each live sequence holds one row of it (from a RowPool) in its state,
    an instance of `state_type` built from that row; the row is given back when the sequence finishes."""

    state_type: Callable[[int], Any]

    def __init__(self) -> None:
        self._pool = RowPool()

    def start(self, seq: SequenceContext) -> None:
        seq.state = self.state_type(self._pool.take())

    def finish(self, seq: SequenceContext) -> None:
        if seq.state is not None:
            self._pool.give(seq.state.row)
        seq.state = None
