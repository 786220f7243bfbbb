"""The drafter interface the loop calls: a Protocol with declared capabilities, the Draft value it returns (a
tree of tokens, as data) and what it may read of a sequence. Drafters themselves live in specdecode/drafters/."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from specdecode.config import SamplingConfig


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
    free:    it cost no draft pass (an index lookup: suffix, prompt lookup, lookahead's pool); a server learns such
             drafts' acceptance apart, for the steps where only they pay
             (server/scheduling/policy.py, SpecPolicy.choose).
    An empty draft (n = 0) is a value: the target then decodes one token, i.e. plain decoding.
    """

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    q: torch.Tensor | None = None  # [n, vocab]
    aux: AuxBranch | None = None
    free: bool = False

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError("tokens and parents differ in length")
        if any(not -1 <= p < i for i, p in enumerate(self.parents)):
            raise ValueError(f"parents must point to earlier nodes: {self.parents}")
        if self.q is not None and self.q.shape[0] != len(self.tokens):
            raise ValueError("q must have one row per node")

    @staticmethod
    def chain(tokens: Sequence[int], q: torch.Tensor | None = None, free: bool = False) -> Draft:
        return Draft(tuple(int(t) for t in tokens), tuple(range(-1, len(tokens) - 1)), q, free=free)

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
    # this step allows no draft passes (a server's K policy found a model's drafts do not pay at its batch size,
    # while free ones do; or the sequence's first step): a drafter with a free part (Capabilities.free_drafts)
    # drafts with it alone
    free_only: bool = False
    # a drafter's cache rows left by finished sequences serve only sequences with the same salt
    # (GenerationConfig.cache_salt)
    cache_salt: str | None = None

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
    hidden_layers: tuple[int, ...] = ()  # with needs_hidden: ctx.hidden holds what enters these target layers, side
    # by side (EAGLE-3's low, middle and high), instead of the last hidden state
    free_drafts: bool = False  # drafts that cost no draft pass, all of them (suffix, prompt lookup) or when a step
    # asks for them alone (hybrid: ctx.free_only); a server then lets it draft where a model's passes do not pay.
    # Several drafters: some of them have (a router serves a free_only step from those alone)

    @staticmethod
    def union(parts: Sequence[Capabilities]) -> Capabilities:
        """What drafters served together need. ctx.hidden holds one kind of state: drafters that read different
        ones (EAGLE-2's last state, EAGLE-3's three layers) cannot share an engine (ValueError)."""
        kinds = {c.hidden_layers for c in parts if c.needs_hidden}
        if len(kinds) > 1:
            raise ValueError(f"these drafters read different target states ({sorted(kinds)}): serve one of them")
        return Capabilities(any(c.needs_hidden for c in parts),
                            tuple(sorted({layer for c in parts for layer in c.exit_layers})),
                            any(c.prices_rows for c in parts), next(iter(kinds), ()),
                            any(c.free_drafts for c in parts))


def drafts_asked(capabilities: Capabilities, ctx: SequenceContext) -> int:
    """The draft length a drafter is asked for: none in a step that allows no draft pass (ctx.free_only) when it
    has no free drafts, else ctx.k. The engine asks its drafter so, and a router each of its drafters."""
    return 0 if ctx.free_only and not capabilities.free_drafts else ctx.k


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

    def kv_bytes_per_slot(self) -> int:
        """Bytes of the drafter's own KV cache per token of a sequence (0: it keeps none that grows with the
        sequence): a server's KV budget reserves them beside the target's."""

    def parked_bytes(self) -> int:
        """Bytes of its cache that finished sequences' rows hold for later ones (forget_prefixes' rows)."""

    def evict_parked(self) -> bool:
        """Free the row a finished sequence left longest ago; False if none is held."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two sequences share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


