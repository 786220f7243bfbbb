"""Lookahead (Jacobi) drafting: pure helpers by table, the engine's aux branch against sequential decoding,
and greedy equivalence with plain decoding on a tiny random model."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.drafting import AuxBranch, Draft
from specdecode.core.engine import Engine
from specdecode.core.target import Target
from specdecode.core.trees import ancestor_matrix
from specdecode.drafters import build_drafter, registry
from specdecode.drafters.common.base import BaseDrafter
from specdecode.drafters.lookahead import Lookahead, LookaheadConfig, NgramPool, candidate_tree, window_parents
from specdecode.drafters.none import SPEC as NONE_SPEC
from specdecode.errors import ConfigError


def tiny_target(vocab: int = 48, seed: int = 0) -> Target:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         eos_token_id=None, pad_token_id=0)
    return Target(LlamaForCausalLM(config).eval())


@pytest.mark.parametrize("chains, depth, tokens, parents", [
    ([], 4, (), ()),
    ([(5, 6), (5, 7), (8,)], 4, (5, 6, 7, 8), (-1, 0, 0, -1)),
    ([(1, 2, 3), (1, 2, 4), (1, 2, 3)], 4, (1, 2, 3, 4), (-1, 0, 1, 1)),
    ([(1, 2, 3), (4, 5, 6)], 2, (1, 2, 4, 5), (-1, 0, -1, 2)),
])
def test_candidate_tree(chains, depth, tokens, parents):
    assert candidate_tree(chains, depth) == (tokens, parents)


@pytest.mark.parametrize("window, levels, parents", [
    (1, 1, (-1,)),
    (3, 1, (-1, 0, 1)),
    (2, 2, (-1, 0, 0, 1)),
    (2, 3, (-1, 0, 0, 1, 2, 3)),
])
def test_window_parents(window, levels, parents):
    assert window_parents(window, levels) == parents


def test_window_mask_is_the_lookahead_mask():
    """Level j of column i sees level 0 up to column i and levels 1..j of column i (Fu et al. fig. 3)."""
    w, levels = 3, 3
    visible = ancestor_matrix(window_parents(w, levels))
    node = lambda level, col: level * w + col  # noqa: E731
    for level in range(levels):
        for col in range(w):
            seen = {int(j) for j in visible[node(level, col)].nonzero()}
            assert seen == {node(0, c) for c in range(col + 1)} | {node(j, col) for j in range(1, level + 1)}


def test_pool_keeps_recent_unique_continuations():
    pool = NgramPool(per_key=2)
    pool.add_text([1, 2, 3, 1, 2, 4, 1, 2, 3], 3)
    assert pool.get(1, 5) == [(2, 3), (2, 4)]  # newest first, the duplicate moved to the front
    pool.add(1, (9, 9))
    assert pool.get(1, 5) == [(9, 9), (2, 3)]  # capped per key
    assert pool.get(7, 5) == []


def test_config_rejects_bad_values():
    with pytest.raises(ConfigError):
        LookaheadConfig(window=-1)
    with pytest.raises(ConfigError):
        LookaheadConfig(ngram=1)


def test_registered():
    assert "lookahead" in registry()
    assert isinstance(build_drafter(tiny_target(), DrafterConfig(name="lookahead")), Lookahead)


class _FixedAux(BaseDrafter):
    """Proposes a fixed draft + aux branch once and records the aux logits the engine hands back."""

    def __init__(self, draft: Draft):
        self.draft, self.seen = draft, []

    def propose(self, seqs):
        return [self.draft if not self.seen else Draft() for _ in seqs]

    def observe_aux(self, seq, logits):
        self.seen.append(logits.clone())


def test_engine_aux_branch_matches_sequential_decoding_and_is_never_committed():
    target = tiny_target()
    prompt = [3, 9, 4, 11, 7]
    plain = Engine(target, NONE_SPEC.build(target, DrafterConfig(), SpecConfig())).generate(
        prompt, generation=GenerationConfig(max_new_tokens=6, stop_on_eos=False)).token_ids
    draft_tokens = (plain[0], plain[1], 5)  # a chain whose first two nodes the target accepts
    aux = AuxBranch((20, 21, 22, 23, 24, 25), window_parents(3, 2))
    drafter = _FixedAux(Draft(Draft.chain(draft_tokens).tokens, Draft.chain(draft_tokens).parents, None, aux))
    engine = Engine(target, drafter, SpecConfig(k=3))
    out = engine.generate(prompt, generation=GenerationConfig(max_new_tokens=6, stop_on_eos=False))
    assert out.token_ids == plain  # the aux branch changes nothing that is verified or committed
    assert out.metrics.target_passes < 6  # the draft was accepted
    (logits,) = drafter.seen  # [6, vocab]
    root = prompt[-1]
    paths = [[20], [20, 21], [20, 21, 22], [20, 23], [20, 21, 24], [20, 21, 22, 25]]  # root-to-node token paths
    with torch.inference_mode():
        for node, path in enumerate(paths):
            ids = torch.tensor([prompt[:-1] + [root] + path])
            expected = target.model(input_ids=ids).logits[0, -1]
            torch.testing.assert_close(logits[node], expected, atol=1e-4, rtol=1e-4)


PROMPTS = [
    [5, 6, 7, 8, 5, 6, 7, 9, 5, 6, 7],
    [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 1, 2, 3],
    [30, 31, 30, 31, 30, 31, 40],
]


@pytest.mark.parametrize("config", [LookaheadConfig(), LookaheadConfig(row_cost=0.0),
                                    LookaheadConfig(window=2, ngram=2, candidates=1, row_cost=0.0),
                                    LookaheadConfig(window=5, ngram=5, candidates=7, row_cost=0.0)])
def test_greedy_equals_plain(config):
    target = tiny_target()
    generation = GenerationConfig(max_new_tokens=40, stop_on_eos=False)
    plain = Engine(target, NONE_SPEC.build(target, DrafterConfig(), SpecConfig()))
    engine = Engine(target, Lookahead(config), SpecConfig(k=5, pause_on_time=False))  # acceptance asserted
    accepted = 0
    for prompt in PROMPTS:
        expected = plain.generate(prompt, generation=generation).token_ids
        result = engine.generate(prompt, generation=generation)
        assert result.token_ids == expected
        accepted += result.metrics.accepted
    assert accepted > 0  # drafts were accepted, so the comparison exercised verification


def test_greedy_batch_equals_plain():
    target = tiny_target()
    generation = GenerationConfig(max_new_tokens=24, stop_on_eos=False)
    plain = Engine(target, NONE_SPEC.build(target, DrafterConfig(), SpecConfig()))
    expected = [plain.generate(p, generation=generation).token_ids for p in PROMPTS]
    engine = Engine(target, Lookahead(), SpecConfig(k=5), max_batch=len(PROMPTS))
    seqs = [engine.start(p, SamplingConfig(), generation) for p in PROMPTS]
    while not all(s.finished for s in seqs):
        live = [s for s in seqs if not s.finished]
        engine.step(live)
    for seq, want in zip(seqs, expected):
        assert seq.output_ids == want
        engine.release(seq)


def _ctx(tokens: list[int], k: int = 4):
    from specdecode.core.drafting import SequenceContext

    return SequenceContext(0, list(tokens), 0, k, SamplingConfig(), torch.Generator())


def test_pass_without_candidates_is_plain_unless_every_step():
    seq = _ctx([1, 2, 3, 9])  # 9 never occurred before: no pool n-gram starts with it
    drafter = Lookahead(LookaheadConfig(window=3, ngram=3))
    drafter.start(seq)
    assert drafter.propose([seq])[0] == Draft()
    paper = Lookahead(LookaheadConfig(window=3, ngram=3, every_step=True))
    paper.start(seq)
    (draft,) = paper.propose([seq])
    assert len(draft) == 0 and len(draft.aux) == 6


def test_prompt_seeds_the_pool_and_the_window_rides_along():
    seq = _ctx([1, 2, 3, 1, 2, 4, 1], k=2)
    drafter = Lookahead(LookaheadConfig(window=2, ngram=3, candidates=4, row_cost=0.0))  # rows are free
    drafter.start(seq)
    (draft,) = drafter.propose([seq])
    assert (draft.tokens, draft.parents) == ((2, 4, 3), (-1, 0, 0))  # newest continuation first, depth k
    assert draft.aux is not None and draft.aux.parents == window_parents(2, 2)


def test_pool_ranks_continuations_with_matching_left_context_first():
    pool = NgramPool(per_key=4)
    pool.add_text([7, 1, 2, 8, 1, 3], 2)  # 1 is followed by 2 after 7, by 3 after 8 (newest)
    assert pool.get(1, 4) == [(3,), (2,)]
    assert pool.get(1, 4, context=7) == [(2,), (3,)]
    assert pool.get(1, 1, context=7) == [(2,)]


def test_window_ngram_candidates_from_the_drafter_config():
    target = Target(LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                                 num_hidden_layers=1, num_attention_heads=2)).eval())
    built = build_drafter(target, DrafterConfig("lookahead", lookahead=(2, 4, 3)))
    assert built.config == LookaheadConfig(window=2, ngram=4, candidates=3)  # row cost: the target's, on first use
    assert built.row_cost == target.row_cost >= 0
    default = build_drafter(target, DrafterConfig("lookahead", row_cost=0.25)).config
    assert default == LookaheadConfig(row_cost=0.25)
    assert built.max_nodes(5) == 3 * 3 + 2 * 3


def _drafted(drafter: Lookahead, seq, steps: int, accepted: int = 0) -> list[Draft]:
    drafts = []
    for _ in range(steps):
        (draft,) = drafter.propose([seq])
        drafts.append(draft)
        drafter.observe(seq, accepted if draft.tokens else 0)
    return drafts


def test_candidates_must_earn_their_rows():
    """A last-token match (prior rates 0.22, 0.64, ...) is not worth a row at 0.3 per row: only probes of one
    token (4th chance, then 8 later); a context-matched one (0.68, 0.78, 0.84) is drafted to its full depth
    until its misses pull its first rate under what a row costs."""
    config = LookaheadConfig(window=0, ngram=4, candidates=1, row_cost=0.3, probe_every=4)
    unmatched = _ctx([5, 6, 7, 8, 9, 1, 5], k=3)  # 5 was seen after nothing: context differs from 1
    drafter = Lookahead(config)
    drafter.start(unmatched)
    assert [len(d.tokens) for d in _drafted(drafter, unmatched, 12)] == [0] * 3 + [1] + [0] * 7 + [1]
    matched = _ctx([1, 5, 6, 7, 8, 1, 5], k=3)  # 5 seen after 1 before: a two-token match
    drafter.start(matched)
    # every proposal missed: the first token's rate falls (2 x 0.68 + 0) / (2 + n), so the depth shrinks
    # 3, 2, 1, then no draft but a one-token probe on the 4th skipped chance
    assert [len(d.tokens) for d in _drafted(drafter, matched, 12)] == [3, 2, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0]
    free = Lookahead(LookaheadConfig(window=0, ngram=4, candidates=1, row_cost=0.0))
    free.start(unmatched)
    assert all(len(d.tokens) == 3 for d in _drafted(free, unmatched, 8))


def test_window_runs_while_its_ngrams_pay():
    """The Jacobi window (3 rows here) starts with no credit: on the CPU it rides along as a probe (3rd drafting
    pass, then 6 later); an accepted n-gram that the window harvested earns it its rows back."""
    config = LookaheadConfig(window=1, ngram=4, candidates=1, row_cost=0.1, probe_every=3)
    seq = _ctx([1, 5, 6, 7, 8, 1, 5], k=3)
    drafter = Lookahead(config)
    drafter.start(seq)
    drafts = _drafted(drafter, seq, 6, accepted=1)
    assert [d.aux is not None for d in drafts] == [False, False, True, False, False, False]
    state = seq.state
    state.pool.add(5, (6, 7, 9), context=1, from_window=True)  # the window's n-gram now ranks first
    drafts = _drafted(drafter, seq, 6, accepted=3)  # ... and is accepted, on a pass without the window
    assert [d.aux is not None for d in drafts] == [False, True, True, True, True, True]  # credited: it pays
    assert state.window.mean >= 0.3


def test_row_cost_from_the_config_or_the_target():
    assert Lookahead().row_cost == 0.0  # a bare drafter: rows are free
    assert Lookahead(LookaheadConfig(row_cost=0.5)).row_cost == 0.5
    target = tiny_target()
    target.row_costs.measure = lambda: 0.13  # (the measurement, set by hand)
    assert build_drafter(target, DrafterConfig("lookahead")).row_cost == 0.13
    assert build_drafter(target, DrafterConfig("lookahead", row_cost=0.5)).row_cost == 0.5
    with pytest.raises(ConfigError):
        LookaheadConfig(row_cost=-1.0)


def test_jacobi_update_takes_the_last_level_and_harvests_whole_columns():
    """W = 2, N = 3 (two levels). Each update's new level is the argmax at the LAST level's rows; from the second
    update on, each column (level0, level1, new) is an n-gram for the pool, with its left context."""
    seq = _ctx([40, 41], k=2)
    drafter = Lookahead(LookaheadConfig(window=2, ngram=3, candidates=1, row_cost=0.0))
    drafter.start(seq)
    state = seq.state
    state.root, state.levels = 41, [[20, 21], [22, 23]]

    def logits(level0: list[int], level1: list[int]) -> torch.Tensor:  # [levels * W, vocab], level-major
        out = torch.zeros(4, 48)
        for row, token in enumerate(level0 + level1):
            out[row, token] = 1.0
        return out

    def harvested() -> dict[int, list[tuple[int, ...]]]:
        return {t: [c.tokens for c in state.pool.lookup(t, 4) if c.from_window] for t in range(48)
                if any(c.from_window for c in state.pool.lookup(t, 4))}

    drafter.observe_aux(seq, logits([1, 2], [3, 4]))
    assert state.levels == [[22, 23], [3, 4]] and harvested() == {}
    drafter.observe_aux(seq, logits([5, 6], [7, 8]))
    assert state.levels == [[3, 4], [7, 8]]
    assert harvested() == {22: [(3, 7)], 23: [(4, 8)]}
    assert state.pool.lookup(22, 1, context=41)[0].matched and state.pool.lookup(23, 1, context=22)[0].matched
