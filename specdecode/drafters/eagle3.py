"""`eagle3`: EAGLE-3 drafting (Li et al. 2025): the target's low, middle and high layers fused into the feature
the one-layer draft net starts from, its own draft LM head, and EAGLE-2's dynamic tree (eagle.py) over it.

The target gives ctx.hidden as what enters its three layers, side by side (Capabilities.hidden_layers, from the
head's config; the native decoder runs its layers in stretches between them). The committed rows are fed as
(fc(h_low, h_mid, h_high)_i, x_{i+1}); deeper draft steps feed the layer's own output, as the engines do. Heads
load from either shared layout (eagle3_format.py: SGLang/SpecForge, vLLM speculators), by `--draft-model DIR`;
a head names the target it was trained for (our fingerprint when we wrote it, else its vocabulary, hidden
size and fused layers, which must fit), and a mismatch is one line.
"""
from __future__ import annotations

import torch
from torch import nn

from specdecode.config import DrafterConfig, SpecConfig
from specdecode.core.drafting import Capabilities
from specdecode.core.target import Target
from specdecode.drafters.common.base import DrafterSpec
from specdecode.drafters.common.eagle3_format import load_eagle3
from specdecode.drafters.common.eagle3_net import Eagle3Net, Eagle3NetConfig
from specdecode.drafters.common.head_io import fingerprint, same_target
from specdecode.drafters.eagle import TREE_BUDGETS, Eagle, TreeBudget
from specdecode.errors import ConfigError, OptionError


class Eagle3Vocab:
    """What the tree search reads of the vocabulary: the target's embeddings in, the head's own norm and draft LM
    head out, and each draft index's target token (d2t)."""

    def __init__(self, target_model: nn.Module, net: Eagle3Net):
        self.embed_weight = target_model.get_input_embeddings().weight.detach()  # [vocab, h]
        self.net = net
        self.draft_ids = net.draft_ids.to(self.embed_weight.device)  # [vd]

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(token_ids, self.embed_weight)  # [..., h]

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        # features: [..., h] -> [..., vd]
        return self.net.logits(features.to(self.net.lm_head.weight.dtype))


class Eagle3(Eagle):
    name = "eagle3"

    def __init__(self, target: Target, net: Eagle3Net, budget: TreeBudget):
        super().__init__(target, net, budget, vocab=Eagle3Vocab(target.model, net))
        self.capabilities = Capabilities(needs_hidden=True, hidden_layers=net.config.aux_layers)

    def _features(self, hidden: torch.Tensor) -> torch.Tensor:
        """fc over the three target layers: [m, 3 x target hidden] -> [m, h]."""
        return self.net.fuse(hidden.to(self.net.fc.weight.dtype))


def check_fits(net: Eagle3Net, config: dict, target: Target, where: str) -> None:
    """One line when the head was trained for another target: our fingerprint where we wrote the head, else what
    the head's shapes say (vocabulary, hidden size, the layers it fuses)."""
    ours = (config.get("specdecode") or {}).get("target")
    if ours and not same_target(ours, fingerprint(target.model)):
        raise ConfigError(f"the EAGLE-3 head in {where!r} was trained for another model")
    c, layers = net.config, target.num_layers
    if c.vocab_size != target.vocab_size or c.target_hidden_size != target.config.hidden_size \
            or max(c.aux_layers) >= layers:
        raise ConfigError(f"the EAGLE-3 head in {where!r} does not fit this model (head: vocabulary "
                          f"{c.vocab_size}, hidden {c.target_hidden_size}, layers {list(c.aux_layers)}; model: "
                          f"{target.vocab_size}, {target.config.hidden_size}, {layers} layers)")


def untrained(target: Target, budget: TreeBudget | None = None, seed: int = 0) -> Eagle3:
    """A randomly initialised head over the full vocabulary: for tests, since exactness must hold whatever it
    proposes."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = Eagle3Net(Eagle3NetConfig.from_target(target.config, target.vocab_size, target.vocab_size))
    return Eagle3(target, net.to(target.device, target.dtype).eval(), budget or TreeBudget())


def _build(target: Target, config: DrafterConfig, spec: SpecConfig) -> Eagle3:
    if config.draft_model is None:
        raise OptionError("no EAGLE-3 head ships for this model; pass one (SGLang/SpecForge or vLLM speculators "
                          "layout) as {draft_model}", "draft_model")
    net, head_config = load_eagle3(config.draft_model, target.device, target.dtype, target.num_layers)
    check_fits(net, head_config, target, config.draft_model)
    return Eagle3(target, net, TREE_BUDGETS["cuda" if target.device.type == "cuda" else "cpu"])


SPEC = DrafterSpec("eagle3", _build, "EAGLE-3: three target layers fused, one draft layer with its own draft "
                                     "vocabulary, dynamic tree (--draft-model DIR: a head in SGLang's or "
                                     "vLLM speculators' layout)",
                   untrained=lambda target, spec: untrained(target))
