"""The shipped EAGLE and Medusa heads on the real default model: found by default, greedy output identical to
transformers' plain greedy decoding, and drafts that the target actually accepts."""
import json

import pytest
import torch

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.core.trees import compile_paths
from specdecode.drafters import build_drafter
from specdecode.drafters.common.head_io import find_shipped_head
from specdecode.drafters.eagle import Eagle, TreeBudget

pytestmark = pytest.mark.slow

PROMPTS = ["Explain how a bicycle's gears work.", "Write a Python function that returns the squares of a list."]
NEW = 48


def chat_ids(tokenizer, text: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@pytest.fixture(scope="module")
def references(default_model):
    out = {}
    for text in PROMPTS:
        ids = chat_ids(default_model.tokenizer, text)
        with torch.no_grad():
            gen = default_model.model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False,
                                               pad_token_id=default_model.tokenizer.pad_token_id)
        out[text] = gen[0, len(ids):].tolist()
    return out


def quality_tree(drafter, target_model) -> None:
    """The heads' quality is checked on a mid-sized tree, not on the CPU's speed-tuned one (3 nodes, which
    trades tau for cheaper passes): EAGLE's former CPU tree 6/5/7, Medusa's 12 best paths."""
    if isinstance(drafter, Eagle):
        drafter.budget = TreeBudget(top_k=6, depth=5, nodes=7)
    else:
        head_dir = find_shipped_head("medusa", target_model)
        paths = json.loads((head_dir / "config.json").read_text())["trees"]["cuda"][:12]
        drafter.tree, drafter._trees = compile_paths(paths), {}


@pytest.mark.parametrize("kind, min_tau", [("eagle", 2.2), ("medusa", 1.3)])
def test_shipped_head_is_lossless_and_accepted(kind, min_tau, default_target, references):
    assert find_shipped_head(kind, default_target.model) is not None
    spec = SpecConfig(k=5, pause_on_time=False)  # tau is asserted: K must not depend on the machine's timing
    drafter = build_drafter(default_target, DrafterConfig(kind), spec)
    quality_tree(drafter, default_target.model)
    engine = Engine(default_target, drafter, spec)
    passes = tokens = 0
    for text in PROMPTS:
        result = engine.generate(chat_ids(default_target.tokenizer, text), SamplingConfig(),
                                 GenerationConfig(max_new_tokens=NEW))
        assert result.token_ids == references[text], f"{kind} diverged on {text!r}"
        passes += result.metrics.target_passes
        tokens += result.metrics.new_tokens
    assert tokens / passes > min_tau, f"the {kind} head drafts too little (tau {tokens / passes:.2f})"


def test_auto_picks_the_measured_best_on_cpu(default_target):
    drafter = build_drafter(default_target, DrafterConfig("auto"), SpecConfig())
    assert drafter.name == "prompt-lookup"
