"""Sliding-window models: transformers passes a ready 4D mask through unchanged, so Target must apply the
window itself (per layer type for Gemma 3). On a tiny Gemma 3 with a 4-token window, greedy output through
the engine equals transformers' greedy `generate` for contexts far longer than the window, for plain
decoding and for chain and tree drafts; without the window the outputs differ (the test can fail)."""
from __future__ import annotations

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.core.target import Target
from specdecode.drafters import build_drafter, eagle

PROMPT = [5, 9, 13, 5, 9, 13, 21, 5, 9, 13, 30, 31, 5, 9]
NEW = 24


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=4,
                              layer_types=["sliding_attention", "full_attention"] * 2, max_position_embeddings=256,
                              attn_implementation="sdpa", eos_token_id=None, bos_token_id=None, pad_token_id=0)
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


@pytest.fixture(scope="module")
def reference(model):
    with torch.no_grad():
        out = model.generate(torch.tensor([PROMPT]), max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    return out[0, len(PROMPT):].tolist()


def decode(target: Target, drafter) -> list[int]:
    engine = Engine(target, drafter, SpecConfig(k=4))
    return engine.generate(PROMPT, SamplingConfig(), GenerationConfig(max_new_tokens=NEW, stop_on_eos=False)).token_ids


@pytest.mark.parametrize("name", ["none", "prompt-lookup", "eagle"])
def test_greedy_equals_transformers_beyond_the_window(model, reference, name):
    target = Target(model)
    drafter = (eagle.untrained(target, eagle.TreeBudget(top_k=3, depth=3, nodes=6)) if name == "eagle"
               else build_drafter(target, DrafterConfig(name)))
    assert decode(target, drafter) == reference


def test_the_window_matters(model, reference, monkeypatch):
    target = Target(model)
    monkeypatch.setattr(Target, "_layer_masks", lambda self, block: block.mask)
    assert decode(target, build_drafter(target, DrafterConfig("none"))) != reference
