"""n-gram index used by prompt lookup: latest occurrence, longest n first."""
import pytest

from specdecode.drafters.common.ngram_index import NgramIndex

CASES = [
    # tokens, k, expected draft
    ([1, 2, 3, 4, 1, 2], 3, [3, 4, 1]),  # bigram (1, 2) seen at 0 -> continue with 3, 4, 1
    ([1, 2, 3, 9, 2, 3, 7, 2, 3], 2, [7, 2]),  # latest occurrence of (2, 3) wins
    ([5, 6, 7, 8], 3, []),  # no repeat
    ([3, 1, 2, 8, 5, 1, 2, 9, 3, 1, 2], 2, [8, 5]),  # longest n first: trigram (3, 1, 2) beats bigram (1, 2)
    ([7, 7, 7], 4, [7]),  # continuation limited by the context end
]


@pytest.mark.parametrize("tokens,k,expected", CASES)
def test_lookup(tokens, k, expected):
    index = NgramIndex(min_n=1, max_n=3)
    index.extend(tokens)
    assert index.lookup(tokens, k) == expected


def test_incremental_extension_matches_batch():
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6]
    once, grown = NgramIndex(1, 3), NgramIndex(1, 3)
    once.extend(tokens)
    for end in range(1, len(tokens) + 1):
        grown.extend(tokens[:end])
    assert once.latest == grown.latest


def _propose(drafter, tokens: list[int], k: int = 5, sampling=None):
    import torch

    from specdecode.config import SamplingConfig
    from specdecode.core.drafting import SequenceContext

    seq = SequenceContext(0, list(tokens), 0, k, sampling or SamplingConfig(), torch.Generator())
    drafter.start(seq)
    return seq, drafter.propose([seq])[0]


def test_depth_follows_the_match_length_on_a_cpu():
    """At the CPU's row cost a one-token match earns one drafted token (its first is accepted 1 time in 5,
    measured), a three-token match the whole k; with free rows (GPU) every match is drafted in full."""
    from specdecode.drafters.prompt_lookup import PromptLookup

    one = [9, 1, 2, 3, 4, 5, 6, 7, 8, 1]  # only (1,) recurs
    three = [7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1]  # (7, 8, 1) recurs
    cpu, gpu = PromptLookup(row_cost=0.13), PromptLookup(row_cost=0.0)  # the dev CPU's measured cost / CUDA
    assert len(_propose(cpu, one)[1].tokens) == 1
    assert len(_propose(cpu, three)[1].tokens) == 5 and _propose(cpu, three)[1].free  # an index lookup: no pass
    assert len(_propose(gpu, one)[1].tokens) == 5


def test_a_seeded_sequence_never_plans_with_the_measured_cost():
    """The measured row cost differs between processes; a seeded sampled sequence's drafts (so its random draws,
    so its text) must not: it plans with the configured cost, else free rows. Unseeded ones use the measure."""
    from specdecode.config import SamplingConfig
    from specdecode.drafters.common.row_budget import RowCost
    from specdecode.drafters.prompt_lookup import PromptLookup

    class Measured:
        row_cost = 0.13

    one = [9, 1, 2, 3, 4, 5, 6, 7, 8, 1]  # only (1,) recurs: one token at the CPU's cost, 5 with free rows
    seeded, unseeded = SamplingConfig(temperature=1.0, seed=3), SamplingConfig(temperature=1.0)
    drafter = PromptLookup(row_cost=RowCost(Measured()))
    assert len(_propose(drafter, one, sampling=unseeded)[1].tokens) == 1
    assert len(_propose(drafter, one, sampling=seeded)[1].tokens) == 5
    assert len(_propose(drafter, one, sampling=SamplingConfig(seed=3))[1].tokens) == 1  # greedy: not seeded
    assert len(_propose(PromptLookup(row_cost=RowCost(Measured(), 0.13)), one, sampling=seeded)[1].tokens) == 1
    assert RowCost(Measured()).planned(True) == 0.0 and RowCost(Measured()).planned(False) == 0.13


def test_depth_learns_from_results():
    """Three-token matches whose first token keeps being rejected stop being drafted (then only probed)."""
    from specdecode.drafters.prompt_lookup import PromptLookup

    drafter = PromptLookup(row_cost=0.13)
    seq, draft = _propose(drafter, [7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1])
    depths = [len(draft.tokens)]
    for _ in range(14):  # the prior (0.86 first-token acceptance) is worth 2 proposals: ~12 misses to give up
        drafter.observe(seq, 0)
        depths.append(len(drafter.propose([seq])[0].tokens))
    assert depths[0] == 5 and depths[-1] == 0 and depths == sorted(depths, reverse=True)
