"""`layer-skip`: self-speculative drafting (Draft & Verify, LayerSkip): the target's first L layers, its final
norm and LM head draft K tokens. The draft shares the target's KV cache: layers < L already hold the right
KV for every committed token, draft steps write the following slots, and the verify pass overwrites them."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from specdecode.config import DrafterConfig, SpecConfig
from specdecode.core.drafting import Capabilities, Draft, SequenceContext
from specdecode.core.target import Target
from specdecode.core.trees import build_block
from specdecode.drafters.common.base import BaseDrafter, DrafterSpec
from specdecode.drafters.common.model_step import choose
from specdecode.errors import ConfigError


class LayerSkip(BaseDrafter):
    name = "layer-skip"

    def __init__(self, target: Target, exit_layer: int, confidence: float = 0.0):
        if not 1 <= exit_layer < target.num_layers:
            raise ConfigError(f"exit layer must be in 1..{target.num_layers - 1}, got {exit_layer}")
        self.target, self.exit_layer, self.confidence = target, exit_layer, confidence
        self.capabilities = Capabilities(exit_layers=(exit_layer,))

    def propose(self, seqs: Sequence[SequenceContext]) -> list[Draft]:
        tokens: list[list[int]] = [[] for _ in seqs]
        qs: list[list[torch.Tensor]] = [[] for _ in seqs]
        drafting = [b for b, seq in enumerate(seqs) if seq.k > 0]
        step = 0
        while drafting:
            batch = [seqs[b] for b in drafting]
            block = build_block(
                [seq.cache_len + step for seq in batch],
                [[(seq.tokens[-1] if step == 0 else tokens[b][-1])] for b, seq in zip(drafting, batch)],
                [[-1] for _ in batch],
                self.target.pad_id,
                self.target.device,
            )
            cache = batch[0].cache
            cache.ensure(cache.num_rows, block.kv_len)
            out = self.target.forward(cache, [seq.row for seq in batch], block, num_layers=self.exit_layer)
            still = []
            for i, (b, seq) in enumerate(zip(drafting, batch)):
                token, q, top = choose(out.logits[i, -1], seq.sampling, seq.generator, self.target.vocab_size,
                                        bool(self.confidence))
                if self.confidence and top < self.confidence:
                    continue
                tokens[b].append(token)
                if q is not None:
                    qs[b].append(q)
                if len(tokens[b]) < seq.k:
                    still.append(b)
            drafting, step = still, step + 1
        return [Draft.chain(t, torch.stack(q) if q else None) for t, q in zip(tokens, qs)]


def _build(target: Target, config: DrafterConfig, spec: SpecConfig) -> LayerSkip:
    exit_layer = config.exit_layer if config.exit_layer is not None else max(1, target.num_layers // 3)
    return LayerSkip(target, exit_layer, spec.confidence)


SPEC = DrafterSpec("layer-skip", _build, "self-speculative: the target's first L layers + its LM head")
