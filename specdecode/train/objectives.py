"""Training objectives, as pure functions of a batch of cached target features.

Targets are the target model's own next-token distributions (soft labels, restricted to the draft vocabulary
and renormalised), computed from the cached features with the frozen LM head.

EAGLE is trained with "training-time test" unrolling (EAGLE-3 / HASS): step 0 feeds true features; step j
feeds the features the net itself predicted at step j - 1, with the attention pattern it has when drafting
depth j + 1 of a tree (the committed prefix, then its own predicted ancestors), so deeper draft positions are
trained on the inputs they actually get. Smooth-L1 feature regression (EAGLE-1) keeps predictions in the
target's feature space.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from specdecode.drafters.common.eagle3_net import Eagle3Net
from specdecode.drafters.common.nets import EagleNet, FrozenVocab, MedusaHeads


@dataclass(frozen=True)
class Batch:
    tokens: torch.Tensor  # [b, t] int64, right-padded
    features: torch.Tensor  # [b, t, h] target features
    lengths: torch.Tensor  # [b]
    loss_start: torch.Tensor  # [b]


def target_positions(batch: Batch, shift: int) -> torch.Tensor:
    """[b, t - shift] bool: row i's target is the distribution at position j = i + shift, which must predict
    a real token (j + 1 < length) inside the trained region (j + 1 >= loss_start)."""
    b, t = batch.tokens.shape
    j = torch.arange(shift, t, device=batch.tokens.device)[None, :]  # [1, t - shift]
    return (j + 1 < batch.lengths[:, None]) & (j + 1 >= batch.loss_start[:, None])


def unroll_mask(length: int, step: int, device) -> torch.Tensor:
    """[1, 1, length, (step + 1) * length] bool for unrolled step `step`: row i sees step-0 rows 0..i-step
    (true features of the committed prefix) and, for s = 1..step, row i - step + s of step s (its own
    predicted ancestors at depths 1..s). Step 0 is the causal mask."""
    i = torch.arange(length, device=device)[:, None]
    k = torch.arange(length, device=device)[None, :]
    blocks = [k <= i - step] + [k == i - step + s for s in range(1, step + 1)]
    return torch.cat(blocks, dim=1)[None, None]


def soft_cross_entropy(logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    # logits, target_probs: [..., vd] -> [...]
    return -(target_probs * logits.float().log_softmax(-1)).sum(-1)


@dataclass
class StepStats:
    loss: float
    accuracy: list[float]  # per unrolled step (EAGLE) or per head (Medusa): top-1 agreement with the target


def eagle_unroll(net: EagleNet | Eagle3Net, vocab: FrozenVocab, tokens: torch.Tensor, features: torch.Tensor,
                 steps: int) -> list[torch.Tensor]:
    """tokens [b, t], features [b, t, h] -> per unrolled step j, [b, t - 1, h]: row i's prediction of f_{i+1}
    from input (feature, token x_{i+1}), where the feature is f_i at step 0 and the step j - 1 output of row
    i - 1 after that (see unroll_mask). Rows i < j are padding. (EAGLE-3: features are the fused f_i.)"""
    length = tokens.shape[1] - 1
    embeds = vocab.embed(tokens[:, 1:]).to(features.dtype)  # [b, t', h] tokens x_{i+1}
    positions = torch.arange(length, device=tokens.device)[None].expand(tokens.shape[0], -1)
    cache, inputs, outputs = DynamicCache(), features[:, :-1], []
    for step in range(steps):
        if outputs:
            last = outputs[-1]
            inputs = torch.cat([torch.zeros_like(last[:, :1]), last[:, :-1]], dim=1)  # row i gets last[i - 1]
        outputs.append(net(embeds, inputs, positions, unroll_mask(length, step, tokens.device), cache))  # [b, t', h]
    return outputs


def eagle_loss(net: EagleNet, vocab: FrozenVocab, batch: Batch, steps: int = 3, reg_weight: float = 1.0,
               decay: float = 0.8) -> tuple[torch.Tensor, StepStats]:
    features = batch.features.float()
    target_features = features[:, 1:]  # [b, t', h] f_{i+1}
    with torch.no_grad():
        target_probs = vocab.logits(target_features).float().softmax(-1)  # [b, t', vd]
        target_top = target_probs.argmax(-1)
    valid = target_positions(batch, shift=1)  # [b, t']

    def per_row(out: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:  # [b, t'] soft CE + feature regression
        return soft_cross_entropy(logits, target_probs) + reg_weight * F.smooth_l1_loss(
            out.float(), target_features, reduction="none").mean(-1)

    return _score_steps(eagle_unroll(net, vocab, batch.tokens, features, steps), vocab.logits, per_row, target_top,
                        valid, decay)


def _score_steps(outputs: list[torch.Tensor], logits_of, per_row, target_top: torch.Tensor, valid: torch.Tensor,
                 decay: float) -> tuple[torch.Tensor, StepStats]:
    """The unrolled steps' loss, decayed by depth, and their top-1 agreement with the target. outputs: per step
    [b, t', h]; logits_of(out) -> [b, t', vd]; per_row(out, logits) -> [b, t'] loss; step j scores rows >= j."""
    total, accuracy = 0.0, []
    for step, out in enumerate(outputs):
        rows = valid.clone()
        rows[:, :step] = False
        logits = logits_of(out)  # [b, t', vd]
        count = rows.sum().clamp(min=1)
        total = total + decay**step * (per_row(out, logits) * rows).sum() / count
        accuracy.append(float(((logits.argmax(-1) == target_top) & rows).sum() / count))
    return total, StepStats(float(total.detach()), accuracy)


def eagle3_loss(net: Eagle3Net, vocab: FrozenVocab, batch: Batch, steps: int = 3, decay: float = 0.8
                ) -> tuple[torch.Tensor, StepStats]:
    """EAGLE-3: batch.features holds what enters the three fused layers, then the last hidden state
    ([b, t, 4h]). Step 0 starts from fc of the three; the head's own LM head is scored against the target's
    distribution (its LM head on the last state, over the draft vocabulary); no feature regression, as the
    paper drops it (the fused feature has no target to regress to)."""
    features = batch.features.float()
    width = features.shape[-1] // 4
    aux, last = features[..., : 3 * width], features[..., 3 * width :]
    with torch.no_grad():
        target_probs = vocab.logits(last[:, 1:]).float().softmax(-1)  # [b, t', vd]
        target_top = target_probs.argmax(-1)
    valid = target_positions(batch, shift=1)  # [b, t']
    fused = net.fuse(aux)  # [b, t, h]
    return _score_steps(eagle_unroll(net, vocab, batch.tokens, fused, steps), net.logits,
                        lambda out, logits: soft_cross_entropy(logits, target_probs), target_top, valid, decay)


def medusa_loss(net: MedusaHeads, vocab: FrozenVocab, batch: Batch, decay: float = 0.8
                ) -> tuple[torch.Tensor, StepStats]:
    features = batch.features.float()
    heads = net(features)  # [b, t, n, h]
    with torch.no_grad():
        all_probs = vocab.logits(features).float().softmax(-1)  # [b, t, vd] target distribution at each position
    total, accuracy = 0.0, []
    for h in range(1, net.config.num_heads + 1):
        # head h on f_t predicts x_{t+1+h}: the target's distribution at position t + h
        logits = vocab.logits(heads[:, :-h, h - 1])  # [b, t - h, vd]
        target = all_probs[:, h:]
        rows = target_positions(batch, shift=h)
        count = rows.sum().clamp(min=1)
        total = total + decay ** (h - 1) * (soft_cross_entropy(logits, target) * rows).sum() / count
        accuracy.append(float(((logits.argmax(-1) == target.argmax(-1)) & rows).sum() / count))
    return total, StepStats(float(total.detach()), accuracy)


@torch.no_grad()
def medusa_topk_accuracy(net: MedusaHeads, vocab: FrozenVocab, batch: Batch, top: int = 10) -> torch.Tensor:
    """[heads, top] counts of how often rank r of head h is the target's top token, and [heads] totals as the
    last column (for the static tree builder)."""
    features = batch.features.float()
    heads = net(features)
    target_top = vocab.logits(features).argmax(-1)  # [b, t]
    out = torch.zeros((net.config.num_heads, top + 1))
    for h in range(1, net.config.num_heads + 1):
        ranked = vocab.logits(heads[:, :-h, h - 1]).topk(top, dim=-1).indices  # [b, t - h, top]
        rows = target_positions(batch, shift=h)
        hit = (ranked == target_top[:, h:, None]) & rows[..., None]
        out[h - 1, :top] = hit.sum((0, 1)).float().cpu()
        out[h - 1, top] = rows.sum().float().cpu()
    return out
