"""`medusa`: N residual heads on the target's last feature, each predicting one more token ahead, drafted as a
STATIC tree (Cai et al. 2024). The tree is data: Medusa-style paths ([0], [0, 1], [1], ...) compiled once by
trees.compile_paths; node i takes candidate ranks[i] of head depths[i]. Paths come from the head's config
(built at training time from measured head accuracies, one tree per device budget), else DEFAULT_PATHS.

Verification is the engine's, exact and lossless. Medusa's "typical acceptance" (lossy) is not offered.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from specdecode.config import DrafterConfig, SpecConfig
from specdecode.core.drafting import Capabilities, Draft, SequenceContext
from specdecode.core.target import Target
from specdecode.core.trees import StaticTree, compile_paths
from specdecode.drafters.common.base import BaseDrafter, DrafterSpec
from specdecode.drafters.common.head_io import resolve_head
from specdecode.drafters.common.nets import DRAFT_VOCAB, FrozenVocab, MedusaHeads, MedusaNetConfig, fast_bf16_cpu

# A small generic tree (16 nodes, depth 4) for heads that carry none.
DEFAULT_PATHS = (
    (0,), (1,), (2,), (3,), (0, 0), (0, 1), (1, 0), (2, 0), (0, 2), (0, 0, 0), (0, 1, 0), (1, 0, 0), (0, 0, 1),
    (0, 0, 0, 0), (0, 1, 0, 0), (0, 0, 0, 1),
)


def medusa_paths(accuracy: list[list[float]], budget: int) -> list[list[int]]:
    """Greedy tree from per-head top-k accuracies (accuracy[h][r] = P(rank r of head h is the right token)):
    repeatedly add the candidate path with the largest product of accuracies along it (its expected
    contribution to the accepted length), as in the Medusa paper. Returns paths for trees.compile_paths."""
    chosen: list[tuple[int, ...]] = []
    frontier = {(r,): accuracy[0][r] for r in range(len(accuracy[0]))} if accuracy else {}
    while frontier and len(chosen) < budget:
        path = max(frontier, key=lambda p: (frontier[p], [-x for x in p]))
        value = frontier.pop(path)
        chosen.append(path)
        depth = len(path)
        if depth < len(accuracy):
            for r in range(len(accuracy[depth])):
                frontier[path + (r,)] = value * accuracy[depth][r]
    return [list(p) for p in chosen]


class Medusa(BaseDrafter):
    name = "medusa"
    capabilities = Capabilities(needs_hidden=True)

    def __init__(self, target: Target, net: MedusaHeads, tree: StaticTree, draft_vocab: int | None = None,
                 head_dtype: torch.dtype | None = None):
        if tree.max_depth > net.config.num_heads:
            raise ValueError(f"tree depth {tree.max_depth} exceeds the {net.config.num_heads} heads")
        self.net, self.tree = net, tree
        self.vocab = FrozenVocab(target.model, net.draft_ids, draft_vocab, head_dtype)
        self._trees: dict[int, StaticTree] = {}

    def _tree(self, depth: int) -> StaticTree:
        if depth not in self._trees:
            self._trees[depth] = self.tree.truncated(depth)
        return self._trees[depth]

    def max_nodes(self, k: int) -> int:
        """Largest draft at speculation length k (the fast path compiles up to it)."""
        return len(self._tree(k))

    @torch.inference_mode()
    def propose(self, seqs: Sequence[SequenceContext]) -> list[Draft]:
        live = [b for b, seq in enumerate(seqs) if seq.hidden is not None and seq.k > 0 and len(self.tree)]
        drafts = [Draft() for _ in seqs]
        if not live:
            return drafts
        last = torch.stack([seqs[b].hidden[-1] for b in live])  # [l, h] feature of the last committed token
        heads = self.net(last.to(self.vocab.embed_weight.dtype))[:, : self.tree.max_depth]  # [l, d, h]
        ranked = self.vocab.logits(heads).topk(max(self.tree.top_k), dim=-1).indices  # [l, d, top]
        ranked = self.vocab.draft_ids[ranked].tolist()
        for i, b in enumerate(live):
            tree = self._tree(seqs[b].k)
            tokens = tuple(ranked[i][d - 1][r] for d, r in zip(tree.depths, tree.ranks))
            drafts[b] = Draft(tokens, tree.parents)
        return drafts


def untrained(target: Target, paths=DEFAULT_PATHS, num_heads: int = 4, seed: int = 0) -> Medusa:
    """Random heads over the full vocabulary (tests: exactness must hold whatever the heads propose)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = MedusaHeads(MedusaNetConfig(target.config.hidden_size, num_heads, target.vocab_size))
        for block in net.blocks:
            torch.nn.init.normal_(block.linear.weight, std=target.config.hidden_size ** -0.5)
    return Medusa(target, net.to(target.device, target.dtype).eval(), compile_paths(paths))


def _build(target: Target, config: DrafterConfig, spec: SpecConfig) -> Medusa:
    net, head_config = resolve_head("medusa", target.model, config.draft_model, target.device, target.dtype)
    device_kind = "cuda" if target.device.type == "cuda" else "cpu"
    paths = head_config.get("trees", {}).get(device_kind) or DEFAULT_PATHS
    paths = [p for p in paths if len(p) <= net.config.num_heads]
    head_dtype = torch.bfloat16 if device_kind == "cpu" and fast_bf16_cpu() else None
    return Medusa(target, net, compile_paths(paths), DRAFT_VOCAB[device_kind], head_dtype)


SPEC = DrafterSpec("medusa", _build, "Medusa heads on target features, static draft tree "
                                      "(shipped head for the default model; --draft-model DIR for a trained one)",
                   untrained=lambda target, spec: untrained(target))
