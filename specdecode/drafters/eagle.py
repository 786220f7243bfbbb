"""`eagle`: feature-level drafting with a one-layer draft network and an EAGLE-2 dynamic tree (Li et al. 2024).

The draft net (nets.EagleNet) keeps its own one-layer KV cache of the committed prefix: row i holds
(target feature f_i, token x_{i+1}). Each step it first feeds the rows the last verification made available
(seq.hidden), whose last output is the predicted feature of the pending token: its logits rank the depth-1
candidates. Then, per depth, the top_k best frontier nodes (by cumulative draft log-probability) are fed
together as one tree-masked block, each proposing its top_k children; the best top_k children form the next
frontier. At the end the `nodes` best candidates of all depths form the draft tree (a parent always outranks
its child, so the set is ancestor-closed). Tokens are chosen deterministically (q = None), which keeps
multi-candidate rejection sampling over siblings lossless.

Tree budget per device (TREE_BUDGETS): small on a CPU, where every extra verified node costs time (3/3/3), large
on a GPU, where a pass is flat up to ~128 tokens (10/8/63). The copy branch (prompt lookup's continuation
grafted on, at most `depth` more nodes) lifts summaries and RAG; an 8192-token bf16 draft head on the CPU
halves drafting time for little tau. Re-measure with `specdecode bench --limit 1 --methods
specdecode-none,specdecode-eagle` per budget; figures in docs/design-notes.md ("Measured defaults").
The depth is also capped by seq.k (the engine's speculation length).
"""
from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specdecode.backends.cpu.skinny import SkinnyLinears
from specdecode.config import DrafterConfig, SpecConfig
from specdecode.core.drafting import Capabilities, Draft, SequenceContext
from specdecode.core.kv_cache import RollbackCache
from specdecode.core.target import Target, eager_attention
from specdecode.core.trees import children_of
from specdecode.drafters.common.base import DrafterSpec, RowStateDrafter
from specdecode.drafters.common.head_io import resolve_head
from specdecode.drafters.common.nets import DRAFT_VOCAB, EagleNet, EagleNetConfig, FrozenVocab, fast_bf16_cpu
from specdecode.drafters.common.ngram_index import NgramIndex
from specdecode.errors import ConfigError


@dataclass(frozen=True)
class TreeBudget:
    """EAGLE-2 tree shape: top_k children per expanded node and frontier width; depth; total node budget.
    copy_branch: also graft the prompt-lookup continuation (n-gram match in the context) onto the tree, which
    costs at most `depth` extra nodes and helps where answers copy the prompt (summaries, RAG, code edits)."""

    top_k: int = 8
    depth: int = 6
    nodes: int = 24
    copy_branch: bool = True

    def __post_init__(self) -> None:
        if self.top_k < 1 or self.depth < 1 or self.nodes < 1:
            raise ConfigError(f"tree budget values must be positive, got {self}")


TREE_BUDGETS = {"cpu": TreeBudget(top_k=3, depth=3, nodes=3), "cuda": TreeBudget(top_k=10, depth=8, nodes=63)}


@dataclass
class _State:
    row: int  # this sequence's row in the draft cache
    fed: int = 0  # committed rows (positions 0..fed-1) held by the draft cache
    root_feature: torch.Tensor | None = None  # [h] predicted feature of the pending token
    ngrams: NgramIndex = field(default_factory=lambda: NgramIndex(1, 3))  # for the copy branch


def graft_chain(draft: Draft, chain: Sequence[int]) -> Draft:
    """Add a chain of tokens below the root, sharing the nodes of the tree that already spell its start.
    Example: tree (5, 7) with parents (-1, 0), chain [5, 9] -> tokens (5, 7, 9), parents (-1, 0, 0)."""
    tokens, parents = list(draft.tokens), list(draft.parents)
    children = children_of(parents)
    node = -1
    for token in chain:
        match = next((c for c in children.get(node, []) if tokens[c] == token), None)
        if match is None:
            tokens.append(int(token))
            parents.append(node)
            match = len(tokens) - 1
            children[match] = []
        node = match
    return Draft(tuple(tokens), tuple(parents))


class Eagle(RowStateDrafter):
    name = "eagle"
    state_type = _State
    capabilities = Capabilities(needs_hidden=True)

    def __init__(self, target: Target, net: EagleNet, budget: TreeBudget, draft_vocab: int | None = None,
                 head_dtype: torch.dtype | None = None, vocab=None):
        """vocab: what the tree search reads of the vocabulary (embed, logits, draft_ids); default the target's
        embeddings and LM head restricted to the head's draft vocabulary (FrozenVocab)."""
        self.net, self.budget = net, budget
        self.vocab = vocab or FrozenVocab(target.model, net.draft_ids, draft_vocab, head_dtype)
        self.device = target.device
        self.cache = RollbackCache(1, rows=1, capacity=256)
        # the draft layer's few-row products take the target's CPU kernel too (bf16 draft head excepted: oneDNN
        # is fast there)
        self._linears = SkinnyLinears(net, target.skinny_rows) if target.skinny_rows else contextlib.nullcontext()
        super().__init__()

    def max_nodes(self, k: int) -> int:
        """Largest draft this drafter proposes at speculation length k (the fast path compiles up to it)."""
        return self.budget.nodes + (min(self.budget.depth, k) if self.budget.copy_branch else 0)

    # -- sequence lifetime ------------------------------------------------------------------------------------

    # -- drafting ---------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, seqs: Sequence[SequenceContext]) -> list[Draft]:
        drafts = []
        for seq in seqs:
            state: _State = seq.state
            self._feed_committed(seq, state)
            depth = min(self.budget.depth, seq.k)
            draft = Draft() if depth <= 0 or state.root_feature is None else self._expand(state, depth)[0]
            if self.budget.copy_branch and depth > 0:
                state.ngrams.extend(seq.tokens)
                draft = graft_chain(draft, state.ngrams.lookup(seq.tokens, depth))
            drafts.append(draft)
        return drafts

    def _run(self, row: int, first_slot: int, tokens: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
             mask: torch.Tensor) -> torch.Tensor:
        """Feed q rows at slots first_slot.. of the draft cache. tokens [q], features [q, h], positions [q],
        mask [q, kv_len] -> predicted features [q, h]."""
        q = tokens.shape[0]
        self.cache.ensure(self._pool.rows, first_slot + q)
        self.cache.prepare([row], first_slot, first_slot + q)
        with eager_attention(self.device), self._linears:
            out = self.net(self.vocab.embed(tokens)[None], features[None].to(self.vocab.embed_weight.dtype),
                           positions[None], mask[None, None], self.cache)
        return out[0]

    def _feed_committed(self, seq: SequenceContext, state: _State) -> None:
        """Rows (f_i, x_{i+1}) for the features the last verification (or the prefill) produced."""
        hidden = seq.hidden  # [m, h] features of positions len(tokens) - 1 - m ..
        if hidden is None:
            return
        start = len(seq.tokens) - 1 - hidden.shape[0]
        if start + hidden.shape[0] <= state.fed:
            return  # already fed
        if start > state.fed:
            raise RuntimeError(f"eagle: missing target features for positions {state.fed}..{start - 1}")
        hidden = self._features(hidden[state.fed - start :])  # [m, h]
        first, m = state.fed, hidden.shape[0]
        tokens = torch.tensor(seq.tokens[first + 1 : first + m + 1], device=self.device)
        positions = torch.arange(first, first + m, device=self.device)
        mask = torch.ones((m, first + m), dtype=torch.bool, device=self.device)
        mask[:, first:] = torch.ones((m, m), dtype=torch.bool, device=self.device).tril()
        out = self._run(state.row, first, tokens, hidden, positions, mask)
        state.fed, state.root_feature = first + m, out[-1]

    def _features(self, hidden: torch.Tensor) -> torch.Tensor:
        """The draft layer's features from what the target gave (ctx.hidden): its last hidden state, as is."""
        return hidden

    def _expand(self, state: _State, depth: int) -> tuple[Draft, torch.Tensor]:
        """EAGLE-2 dynamic tree (see the module docstring) -> (draft of at most budget.nodes nodes, [n] each
        node's cumulative draft log-probability)."""
        k, prefix, device = self.budget.top_k, state.fed, self.device
        logp = self.vocab.logits(state.root_feature).float().log_softmax(-1)  # [vd]
        score, token = logp.topk(min(k, logp.shape[-1]))
        scores, tokens, parents, depths = [score], [token], [torch.full_like(token, -1)], [torch.ones_like(token)]
        frontier = torch.arange(token.shape[0], device=device)  # candidate indices of the nodes to expand next
        frontier_input = state.root_feature.expand(token.shape[0], -1)  # [f, h] feature each frontier row gets
        fed_nodes: list[int] = []  # candidate index of every tree row in the draft cache, in slot order
        fed_visible = torch.zeros((0, 0), dtype=torch.bool, device=device)  # [F, F] ancestor-or-self among fed
        all_parents = parents[0]
        for d in range(2, depth + 1):
            n_fed, f = len(fed_nodes), frontier.shape[0]
            # each frontier row sees the prefix, its parent's row and the parent's ancestors, and itself
            parent_rows = [fed_nodes.index(p) if p >= 0 else -1 for p in all_parents[frontier].tolist()]
            has_parent = torch.tensor([row >= 0 for row in parent_rows], device=device)  # [f]
            inherited = fed_visible[torch.tensor([max(row, 0) for row in parent_rows], device=device)] if n_fed \
                else torch.zeros((f, 0), dtype=torch.bool, device=device)  # [f, n_fed]
            visible = torch.cat([inherited & has_parent[:, None], torch.eye(f, dtype=torch.bool, device=device)], 1)
            mask = torch.cat([torch.ones((f, prefix), dtype=torch.bool, device=device), visible], dim=1)
            positions = torch.full((f,), prefix + d - 2, device=device)
            frontier_tokens = torch.cat(tokens)[frontier]
            out = self._run(state.row, prefix + n_fed, self.vocab.draft_ids[frontier_tokens], frontier_input,
                            positions, mask)  # [f, h]
            grown = torch.zeros((n_fed + f, n_fed + f), dtype=torch.bool, device=device)
            grown[:n_fed, :n_fed] = fed_visible
            grown[n_fed:] = visible
            fed_visible = grown
            fed_nodes.extend(frontier.tolist())
            child_logp = self.vocab.logits(out).float().log_softmax(-1)  # [f, vd]
            child_score, child_token = child_logp.topk(min(k, child_logp.shape[-1]), dim=-1)  # [f, k]
            child_score = child_score + torch.cat(scores)[frontier][:, None]
            base = int(all_parents.shape[0])
            scores.append(child_score.flatten())
            tokens.append(child_token.flatten())
            parents.append(frontier[:, None].expand_as(child_token).flatten())
            depths.append(torch.full((child_token.numel(),), d, device=device))
            all_parents = torch.cat(parents)
            best = child_score.flatten().topk(min(k, child_score.numel())).indices
            frontier = base + best
            frontier_input = out[best // child_token.shape[1]]
        return self._select(torch.cat(scores), torch.cat(tokens), all_parents, torch.cat(depths))

    def _select(self, scores: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor
                ) -> tuple[Draft, torch.Tensor]:
        """Keep the budget's best candidates. A child's log-prob sum never exceeds its parent's; the depth
        tie-break makes it strictly lower, so the kept set is ancestor-closed."""
        key = scores - 1e-6 * depths.float()
        keep = key.topk(min(self.budget.nodes, key.shape[0])).indices.tolist()
        depth_list, key_list = depths.tolist(), key.tolist()  # one read-back each, not one per node
        keep.sort(key=lambda i: (depth_list[i], -key_list[i]))
        new_index = {old: new for new, old in enumerate(keep)}
        parent_list = parents.tolist()
        draft_tokens = self.vocab.draft_ids[tokens[keep]].tolist()
        draft_parents = tuple(new_index[parent_list[i]] if parent_list[i] >= 0 else -1 for i in keep)
        return Draft(tuple(draft_tokens), draft_parents), scores[keep]


def untrained(target: Target, budget: TreeBudget = TreeBudget(), seed: int = 0) -> Eagle:
    """A randomly initialised drafter over the full vocabulary: for tests, since exactness must hold whatever
    the head proposes."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = EagleNet(EagleNetConfig.from_target(target.config, target.vocab_size))
    return Eagle(target, net.to(target.device, target.dtype).eval(), budget)


def _device_kind(target: Target) -> str:
    return "cuda" if target.device.type == "cuda" else "cpu"


def _build(target: Target, config: DrafterConfig, spec: SpecConfig) -> Eagle:
    net, _ = resolve_head("eagle", target.model, config.draft_model, target.device, target.dtype)
    device = _device_kind(target)
    head_dtype = torch.bfloat16 if device == "cpu" and fast_bf16_cpu() else None
    return Eagle(target, net, TREE_BUDGETS[device], DRAFT_VOCAB[device], head_dtype)


SPEC = DrafterSpec("eagle", _build, "EAGLE-2: one-layer draft net on target features, dynamic draft tree "
                                    "(shipped head for the default model; --draft-model DIR for a trained one)",
                   untrained=lambda target, spec: untrained(target))
