"""What the engine hands drafters, and what model drafters propose, equal an independent computation.

Greedy equivalence cannot see these: a drafter fed the wrong features or a stale cache still decodes the
target's text (verification rejects its drafts), it only drafts worse. So each test compares against a
reference computed from scratch on the committed tokens."""
from __future__ import annotations

import copy

import torch

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.drafting import Capabilities
from specdecode.core.engine import Engine
from specdecode.core.target import Target
from specdecode.core.trees import build_block
from specdecode.drafters import build_drafter
from specdecode.drafters.draft_model import DraftModel
from specdecode.drafters.layer_skip import LayerSkip
from tests.fakes import WrongThenRightTree
from tests.tiny import tiny_llama

PROMPT = "abcabcabd abcabc"
N = 24
GREEDY = GenerationConfig(max_new_tokens=N, stop_on_eos=False)
NOISE = 0.1  # draft-model LM head perturbation (the head's init std is 0.3): 14 of 35 draft tokens accepted
SPEC = SpecConfig(k=4, pause_on_time=False, pause_below=0)  # K must not depend on timing or acceptance


def reference_hidden(target: Target, ids: list[int]) -> torch.Tensor:
    """Last hidden states [len(ids), H] of a plain causal forward over ids (fresh cache)."""
    block = build_block([0], [ids], [list(range(-1, len(ids) - 1))], target.pad_id, target.device)
    return target.forward(target.new_cache(capacity=len(ids) + 8), [0], block, hidden=True).hidden[0]


class HiddenRecorder(WrongThenRightTree):
    """Needs hidden states and records what it was handed; proposes WrongThenRightTree's trees, so the accepted
    path is not the block's first rows."""

    name = "hidden-recorder"
    capabilities = Capabilities(needs_hidden=True)

    def __init__(self, truth: list[int], prompt_len: int):
        super().__init__(truth, prompt_len)
        self.seen = []

    def propose(self, seqs):
        self.seen.extend((len(seq.tokens), seq.hidden.clone()) for seq in seqs)
        return super().propose(seqs)


def test_hidden_states_follow_the_accepted_tree_path(tiny_target, tiny_tokenizer):
    """seq.hidden after a step = the target's features of the root and the ACCEPTED path (here block rows
    0, 3, 4), i.e. of the committed tokens at their positions; after prefill, of the prompt minus its last."""
    ids = tiny_tokenizer(PROMPT)["input_ids"]
    plain = Engine(tiny_target, build_drafter(tiny_target, DrafterConfig("none")))
    truth = plain.generate(ids, SamplingConfig(), GREEDY).token_ids
    drafter = HiddenRecorder(truth, len(ids))
    result = Engine(tiny_target, drafter, SPEC).generate(ids, SamplingConfig(), GREEDY)
    assert result.token_ids == truth
    assert result.metrics.accepted > 0
    full = reference_hidden(tiny_target, ids + truth)  # [len, H]
    assert len(drafter.seen) > 3
    for length, hidden in drafter.seen:  # hidden: features of positions length - 1 - m .. length - 2
        m = hidden.shape[0]
        assert m == (len(ids) - 1 if length == len(ids) else 3)  # prefill, then root + 2 accepted nodes
        torch.testing.assert_close(hidden, full[length - 1 - m : length - 1], rtol=1e-3, atol=1e-4)


class Recording:
    """Wraps a drafter and records (committed tokens, draft) at every proposal."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, seqs):
        drafts = self.inner.propose(seqs)
        self.calls.extend((list(seq.tokens), seq.k, draft) for seq, draft in zip(seqs, drafts))
        return drafts


def greedy_continuation(model, ids: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                         pad_token_id=0, eos_token_id=None)
    return out[0, len(ids):].tolist()


def test_draft_model_proposes_its_own_greedy_continuation(tiny_target, tiny_tokenizer):
    """Every draft of a draft model (the target with a perturbed LM head: often right, sometimes rejected) is
    that model's own greedy continuation of the committed tokens: its cache is rolled back after rejections."""
    draft_model = copy.deepcopy(tiny_target.model)
    with torch.no_grad():
        head = draft_model.get_output_embeddings().weight
        head.add_(NOISE * torch.randn(head.shape, generator=torch.Generator().manual_seed(0)))
    drafter = Recording(DraftModel(Target(draft_model, tiny_tokenizer), tiny_target))
    ids = tiny_tokenizer(PROMPT)["input_ids"]
    result = Engine(tiny_target, drafter, SPEC).generate(ids, SamplingConfig(), GREEDY)
    assert 0 < result.metrics.accepted < result.metrics.proposed  # both acceptance and rejection happened
    for tokens, k, draft in drafter.calls:
        if k:
            assert list(draft.tokens) == greedy_continuation(draft_model, tokens, k), f"after {len(tokens)} tokens"


def test_layer_skip_is_always_accepted_when_the_upper_layers_are_identity():
    """A target whose layers from exit_layer on add nothing (zero output projections) predicts exactly what its
    first layers do: every layer-skip draft token must be accepted, so the draft passes use the right cache
    slots and positions."""
    model = tiny_llama(vocab_size=64, layers=4, hidden=32, seed=2, std=0.3, eos_token_id=None)
    with torch.no_grad():
        for layer in model.model.layers[2:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    target = Target(model)
    engine = Engine(target, LayerSkip(target, exit_layer=2), SPEC)
    metrics = engine.generate([5, 9, 3, 7, 1], SamplingConfig(), GREEDY).metrics
    assert metrics.proposed > 10
    assert metrics.accepted == metrics.proposed
