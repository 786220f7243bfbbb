"""The draft model drafts every row of a step in lockstep (DraftModel.draft_rows): one pass over the rows still
drafting per token, rows of different lengths caught up together on the native decoder. Each row's draft is the
one it would get alone, greedy and seeded sampled alike."""
from __future__ import annotations

import copy

import pytest
import torch

from specdecode.config import DrafterConfig, SamplingConfig, SpecConfig
from specdecode.core.drafting import SequenceContext
from specdecode.core.target import Target
from specdecode.drafters import build_drafter
from specdecode.drafters.draft_model import DraftModel

K = 4
SPEC = SpecConfig(k=K)
HISTORIES = ([5, 6, 7, 8, 9, 10], [40, 41, 42], [7, 7, 7, 7, 7, 7, 7, 7, 7, 30], [100, 101, 102, 103, 104])


def _drafter(target: Target, draft_dir: str, weights: str) -> DraftModel:
    drafter = build_drafter(target, DrafterConfig("draft-model", draft_model=draft_dir, draft_weights=weights), SPEC)
    assert isinstance(drafter, DraftModel)
    drafter.budget = None  # every row drafts k tokens (its own k), whatever the machine's costs
    return drafter


def _seqs(drafter: DraftModel, sampling: SamplingConfig, k: int = K) -> list[SequenceContext]:
    seqs = []
    for i, tokens in enumerate(HISTORIES):
        seq = SequenceContext(i, list(tokens), i, k, sampling, torch.Generator().manual_seed(100 + i))
        drafter.start(seq)
        seqs.append(seq)
    return seqs


def _passes(drafter: DraftModel) -> list[tuple[int, tuple[int, ...]]]:
    """Records (rows, tokens per row) of every pass of the draft model."""
    passes: list[tuple[int, tuple[int, ...]]] = []
    forward = drafter.draft.forward

    def counting(cache, rows, block, **kwargs):
        passes.append((len(rows), block.lengths))
        return forward(cache, rows, block, **kwargs)

    drafter.draft.forward = counting
    return passes


@pytest.fixture(scope="module", params=["same", "int4-all"])
def drafters(request, tiny_model, tiny_tokenizer, tiny_draft_dir):
    """(together, alone): two draft models of one checkpoint, through transformers' forward ("same") or the
    native decoder ("int4-all")."""
    if request.param == "int4-all":
        from specdecode.backends.cpu import native

        if native.missing():
            pytest.skip(native.missing())
    target = Target(copy.deepcopy(tiny_model), tiny_tokenizer)
    return _drafter(target, tiny_draft_dir, request.param), _drafter(target, tiny_draft_dir, request.param)


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=0.9, seed=3)],
                         ids=["greedy", "seeded"])
def test_rows_drafted_together_get_the_drafts_they_get_alone(drafters, sampling):
    together, alone = drafters
    passes = _passes(together)
    seqs = _seqs(together, sampling)
    drafts = together.propose(seqs)
    solo = [alone.propose([seq])[0] for seq in _seqs(alone, sampling)]
    for draft, own in zip(drafts, solo):
        assert draft.tokens == own.tokens and len(draft) == K
        if sampling.greedy:
            assert draft.q is None and own.q is None
        else:
            torch.testing.assert_close(draft.q, own.q)
    packed = together.draft.packed_decoder
    catch_up = passes[: 1 if packed else len(HISTORIES)]  # rows of different lengths share a pass natively
    assert all(rows == (len(HISTORIES) if packed else 1) for rows, _ in catch_up)
    assert passes[len(catch_up):] == [(len(HISTORIES), (1,) * len(HISTORIES))] * (K - 1)  # one pass a token


def test_a_row_that_stops_leaves_the_pass_and_a_seed_rides_in_the_catch_up(drafters):
    together, alone = drafters
    seqs = _seqs(together, SamplingConfig())
    seqs[1].k, seqs[3].k = 2, 0  # row 1 stops after two tokens; row 3 does not draft
    seeds, reaches = [(), (9,), (), ()], [(), (0.9,), (), ()]
    passes = _passes(together)
    drafts = together.draft_rows(seqs, seeds, reaches)
    assert len(drafts[3]) == 0 and drafts[1].tokens[0] == 9 and len(drafts[1]) == 2
    assert [rows for rows, _ in passes[-(K - 1):]] == [2] * (K - 1)  # rows 0 and 2 go on alone after the seed
    solo = _seqs(alone, SamplingConfig())
    solo[1].k = 2
    assert drafts[1].tokens == alone.draft_after(solo[1], (9,), (0.9,)).tokens
    assert drafts[0].tokens == alone.propose([solo[0]])[0].tokens
