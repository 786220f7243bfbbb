"""EAGLE and Medusa drafters on tiny random models: greedy output equals plain greedy output whatever the
heads; the incremental tree drafting and the training unroll both equal a plain sequential computation."""
import json

import pytest
import torch

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.drafting import Draft, SequenceContext
from specdecode.core.engine import Engine
from specdecode.core.sampling import make_generator
from specdecode.core.target import Target
from specdecode.core.trees import build_block
from specdecode.drafters import build_drafter, eagle, medusa
from specdecode.drafters.common.head_io import fingerprint, load_head, save_head
from specdecode.drafters.common.nets import FrozenVocab
from specdecode.errors import ConfigError
from specdecode.train.objectives import eagle_unroll
from tests.tiny import tiny_llama

VOCAB = 16  # small: random trees hit the target's choice often, so acceptance and compaction are exercised
NEW = 40
PROMPTS = [[3, 7, 1, 9, 4], [5], [2, 2, 2, 2, 2, 2, 2, 2, 11, 12]]


@pytest.fixture(scope="module")
def small() -> Target:
    return Target(tiny_llama(vocab_size=VOCAB, layers=2, hidden=32, seed=3, std=0.25, eos_token_id=None))


def plain(target: Target, prompt: list[int]) -> list[int]:
    out = target.model.generate(torch.tensor([prompt]), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                                pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


DRAFTERS = {
    "eagle-default": lambda t: eagle.untrained(t),
    "eagle-narrow": lambda t: eagle.untrained(t, eagle.TreeBudget(top_k=2, depth=5, nodes=6), seed=1),
    "eagle-chain": lambda t: eagle.untrained(t, eagle.TreeBudget(top_k=1, depth=4, nodes=4), seed=2),
    "medusa": lambda t: medusa.untrained(t),
}


@pytest.mark.parametrize("spec", [SpecConfig(k=5, pause_on_time=False), SpecConfig(k=1, pause_on_time=False),
                                  SpecConfig(k=3, adaptive=True, max_k=8, pause_on_time=False)],
                         ids=["k5", "k1", "adaptive"])  # acceptance is asserted: K must not depend on timing
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_greedy_equals_plain(name, spec, small):
    engine = Engine(small, DRAFTERS[name](small), spec)
    accepted = 0
    for prompt in PROMPTS:
        result = engine.generate(prompt, SamplingConfig(), GenerationConfig(max_new_tokens=NEW, stop_on_eos=False))
        assert result.token_ids == plain(small, prompt), f"{name} diverged on {prompt}"
        accepted += result.metrics.accepted
    assert accepted > 0, "no draft token was ever accepted: verification of trees was not exercised"


def test_batched_steps_equal_plain(small):
    """Two sequences in one batch (separate draft-cache rows) decode exactly like plain greedy."""
    engine = Engine(small, eagle.untrained(small), SpecConfig(k=4), max_batch=2)
    seqs = [engine.start(p, SamplingConfig(), GenerationConfig(max_new_tokens=NEW, stop_on_eos=False))
            for p in PROMPTS[:2]]
    while not all(s.finished for s in seqs):
        engine.step([s for s in seqs if not s.finished])
    for seq, prompt in zip(seqs, PROMPTS[:2]):
        assert seq.output_ids == plain(small, prompt)
        engine.release(seq)


# -- the tree drafting and the training unroll against a plain sequential computation ------------------------
def sequential(net, vocab, features, tokens, path):
    """Feed committed rows (f_i, x_{i+1}) then the path's rows one at a time, each seeing everything before.
    Returns [root output, output after each path token] (each [h])."""
    from transformers import DynamicCache

    cache, outs = DynamicCache(), []
    rows = [(features[i], tokens[i + 1]) for i in range(features.shape[0])]
    feature = None
    for position in range(len(rows) + len(path)):
        if position < len(rows):
            feature_in, token = rows[position]
        else:
            feature_in, token = feature, path[position - len(rows)]
        mask = torch.ones((1, 1, 1, position + 1), dtype=torch.bool)
        out = net(vocab.embed(torch.tensor([[token]])), feature_in[None, None], torch.tensor([[position]]), mask,
                  cache)[0, 0]
        feature = out
        if position >= len(rows) - 1:
            outs.append(out)
    return outs


@torch.no_grad()
def test_tree_scores_equal_sequential_paths(small):
    drafter = eagle.untrained(small, eagle.TreeBudget(top_k=3, depth=4, nodes=12))
    tokens = [3, 7, 1, 9, 4, 4, 2]
    block = build_block([0], [tokens[:-1]], [list(range(-1, len(tokens) - 2))], 0, "cpu")
    hidden = small.forward(small.new_cache(), [0], block, hidden=True).hidden[0]  # [t - 1, h]
    seq = SequenceContext(0, tokens, 0, 4, SamplingConfig(), make_generator(0, "cpu"), hidden=hidden)
    drafter.start(seq)
    drafter._feed_committed(seq, seq.state)
    draft, scores = drafter._expand(seq.state, 4)
    assert 0 < len(draft) <= 12 and draft.depth <= 4
    for node in range(len(draft)):
        path = path_to(draft, node)
        outs = sequential(drafter.net, drafter.vocab, hidden, tokens, path)
        expected = sum(float(drafter.vocab.logits(outs[d]).log_softmax(-1)[path[d]]) for d in range(len(path)))
        assert abs(expected - float(scores[node])) < 1e-4
    siblings = {}
    for node, parent in enumerate(draft.parents):
        siblings.setdefault(parent, []).append(draft.tokens[node])
    assert all(len(group) == len(set(group)) for group in siblings.values())


@torch.no_grad()
def test_training_unroll_equals_sequential_drafting(small):
    net = eagle.untrained(small).net
    vocab = FrozenVocab(small.model, net.draft_ids)
    tokens = torch.tensor([[3, 7, 1, 9, 4, 4, 2, 8, 5]])
    features = small.model.get_decoder()(tokens).last_hidden_state  # [1, t, h]
    outs = eagle_unroll(net, vocab, tokens, features, steps=3)
    for step, out in enumerate(outs):
        for i in range(step, tokens.shape[1] - 1):
            committed = i - step + 1  # rows 0..i-step hold true features
            path = tokens[0, committed + 1 : committed + 1 + step].tolist()
            reference = sequential(net, vocab, features[0, :committed], tokens[0].tolist(), path)[-1]
            assert torch.allclose(out[0, i], reference, atol=1e-4), (step, i)


def test_medusa_tokens_follow_the_static_tree(small):
    drafter = medusa.untrained(small, paths=[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    hidden = torch.randn(3, 32)
    seq = SequenceContext(0, [1, 2, 3, 4], 0, 5, SamplingConfig(), make_generator(0, "cpu"), hidden=hidden)
    (draft,) = drafter.propose([seq])
    heads = drafter.net(hidden[-1])  # [n, h]
    ranked = drafter.vocab.logits(heads).topk(2, dim=-1).indices
    tree = drafter.tree
    assert draft.parents == tree.parents
    assert draft.tokens == tuple(int(ranked[d - 1, r]) for d, r in zip(tree.depths, tree.ranks))
    seq.k = 2
    assert drafter.propose([seq])[0].depth == 2


def test_head_roundtrip_and_errors(small, tmp_path):
    drafter = eagle.untrained(small)
    save_head(tmp_path / "h", "eagle", drafter.net, fingerprint(small.model), {"training": {}}, dtype=torch.float32)
    net, config = load_head(tmp_path / "h", "eagle")
    for (name, a), b in zip(drafter.net.state_dict().items(), net.state_dict().values()):
        assert torch.equal(a, b), name
    spec = SpecConfig()
    built = build_drafter(small, DrafterConfig("eagle", draft_model=str(tmp_path / "h")), spec)
    assert built.capabilities.needs_hidden
    with pytest.raises(ConfigError, match="no trained eagle head"):
        build_drafter(small, DrafterConfig("eagle"), spec)
    with pytest.raises(ConfigError, match="not 'medusa'"):
        build_drafter(small, DrafterConfig("medusa", draft_model=str(tmp_path / "h")), spec)
    with pytest.raises(ConfigError, match="no usable"):
        build_drafter(small, DrafterConfig("eagle", draft_model=str(tmp_path / "missing")), spec)
    other = Target(tiny_llama(vocab_size=VOCAB, layers=2, hidden=32, seed=4, std=0.25, eos_token_id=None))
    with pytest.raises(ConfigError, match="another model"):
        build_drafter(other, DrafterConfig("eagle", draft_model=str(tmp_path / "h")), spec)


@pytest.mark.parametrize("tokens, parents, chain, out_tokens, out_parents", [
    ((5, 7), (-1, 0), [5, 9], (5, 7, 9), (-1, 0, 0)),
    ((5, 7), (-1, 0), [5, 7, 3], (5, 7, 3), (-1, 0, 1)),
    ((5, 7), (-1, 0), [8], (5, 7, 8), (-1, 0, -1)),
    ((), (), [1, 2], (1, 2), (-1, 0)),
    ((5, 6, 7), (-1, -1, 1), [], (5, 6, 7), (-1, -1, 1)),
])
def test_graft_chain_shares_existing_prefix(tokens, parents, chain, out_tokens, out_parents):
    grafted = eagle.graft_chain(Draft(tokens, parents), chain)
    assert (grafted.tokens, grafted.parents) == (out_tokens, out_parents)


@torch.no_grad()
def test_every_tree_candidate_scores_its_own_path(small):
    """With a node budget above the candidate count every candidate of every depth is kept, so each expanded
    frontier row (which parent's output feeds which child) is checked against the sequential computation."""
    drafter = eagle.untrained(small, eagle.TreeBudget(top_k=2, depth=4, nodes=64, copy_branch=False), seed=1)
    tokens = [5, 2, 9, 9, 1, 7]
    block = build_block([0], [tokens[:-1]], [list(range(-1, len(tokens) - 2))], 0, "cpu")
    hidden = small.forward(small.new_cache(), [0], block, hidden=True).hidden[0]  # [t - 1, h]
    seq = SequenceContext(0, tokens, 0, 4, SamplingConfig(), make_generator(0, "cpu"), hidden=hidden)
    drafter.start(seq)
    drafter._feed_committed(seq, seq.state)
    draft, scores = drafter._expand(seq.state, 4)
    assert len(draft) == 2 + 4 + 4 + 4 and draft.depth == 4  # per depth: top_k children of the top_k best
    for node in range(len(draft)):
        path = path_to(draft, node)
        outs = sequential(drafter.net, drafter.vocab, hidden, tokens, path)
        expected = sum(float(drafter.vocab.logits(outs[d]).log_softmax(-1)[path[d]]) for d in range(len(path)))
        assert abs(expected - float(scores[node])) < 1e-4, path


def path_to(draft: Draft, node: int) -> list[int]:
    """Tokens from the root's first child down to `node`."""
    path = []
    while node >= 0:
        path.insert(0, draft.tokens[node])
        node = draft.parents[node]
    return path


def test_the_shipped_heads_are_where_drafters_look():
    """The default model's EAGLE and Medusa heads ship inside the package; the lookup finds them wherever the
    module that reads them lives."""
    from specdecode.drafters.common.head_io import SHIPPED_ROOT

    kinds = {json.loads(path.read_text())["kind"] for path in SHIPPED_ROOT.glob("*/*/config.json")}
    assert {"eagle", "medusa"} <= kinds
