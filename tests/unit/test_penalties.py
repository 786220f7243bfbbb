"""Penalties and logit_bias (penalties.py): each position of a draft tree is scored in its own path's context,
bit for bit as plain decoding scores that context; the transforms themselves against hand-computed values."""
from __future__ import annotations

import pytest
import torch

from specdecode.config import SamplingConfig
from specdecode.core.penalties import check_bias, hold_ends, path_tokens, penalize
from specdecode.core.sampling import probabilities
from specdecode.errors import ConfigError

ALL = SamplingConfig(presence_penalty=0.7, frequency_penalty=0.45, repetition_penalty=1.3,
                     logit_bias=((2, 3.5), (7, -100.0)))


def test_paths_of_a_tree():
    assert path_tokens([5, 6, 7], [-1, 0, -1]) == [[], [5], [5, 6], [7]]
    assert path_tokens([], []) == [[]]


def test_each_transform_by_hand():
    logits = torch.tensor([[2.0, -1.0, 0.5, 1.0]])
    # token 0 in the prompt only, token 1 generated twice, token 3 once: repetition on 0, 1, 3; counts 1: 2, 3: 1
    sampling = SamplingConfig(presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=2.0,
                              logit_bias=((2, 1.0),))
    penalize(logits, sampling, prompt=[0], output=[1, 3, 1], paths=[[]])
    expected = [2.0 / 2, -1.0 * 2 - 0.25 * 2 - 0.5, 0.5 + 1.0, 1.0 / 2 - 0.25 - 0.5]
    assert logits[0].tolist() == pytest.approx(expected)


def test_tree_positions_equal_plain_decoding_of_their_paths():
    """The batched positions of a tree get the bits that a one-position pass over the same context gets, so the
    greedy choice and the verifier's p are plain decoding's."""
    torch.manual_seed(0)
    vocab, prompt, output = 11, [1, 2, 3, 2], [4, 4, 9]
    tokens, parents = [4, 5, 4, 9, 2], [-1, 0, 1, -1, 3]  # a chain 4-5-4 repeating itself, and a branch 9-2
    paths = path_tokens(tokens, parents)
    logits = torch.randn(len(paths), vocab) * 3
    batched = logits.clone()
    penalize(batched, ALL, prompt, output, paths)
    for i, path in enumerate(paths):
        alone = logits[i : i + 1].clone()
        penalize(alone, ALL, prompt, output + path, [[]])
        assert torch.equal(batched[i], alone[0]), (i, path)
    assert not torch.equal(batched[3], batched[0])  # the path's second 4 is penalized again


def test_min_tokens_masks_the_ends_where_the_position_picks_an_early_token():
    """Two tokens generated, min_tokens 4: the root (picks the 3rd) and depth-1 nodes (the 4th) hold the ends back,
    depth-2 nodes (the 5th) do not."""
    logits = torch.zeros(5, 6)
    hold_ends(logits, [2, 5], produced=2, depths=[0, 1, 2, 1, 2], least=4)
    masked = torch.isinf(logits)
    assert masked[:, [2, 5]].tolist() == [[True, True], [True, True], [False, False], [True, True], [False, False]]
    assert not masked[:, [0, 1, 3, 4]].any()
    untouched = torch.zeros(2, 6)
    hold_ends(untouched, [2], produced=4, depths=[0, 1], least=4)
    assert not torch.isinf(untouched).any()


def test_no_penalty_leaves_the_logits():
    logits = torch.randn(3, 5)
    kept = logits.clone()
    penalize(logits, SamplingConfig(temperature=0.5), [1], [2], [[], [3], [3, 4]])
    assert torch.equal(logits, kept) and not SamplingConfig().penalized and ALL.penalized


def test_min_p_drops_the_unlikely():
    probs = probabilities(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), SamplingConfig(temperature=1.0, min_p=0.2))
    assert probs.tolist() == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0])


@pytest.mark.parametrize("fields", [{"presence_penalty": 2.5}, {"frequency_penalty": -3}, {"repetition_penalty": 0},
                                    {"min_p": 1.5}, {"logit_bias": ((1, 101),)}, {"logit_bias": ((-1, 1),)},
                                    {"logit_bias": ((1, 1), (1, 2))}, {"logit_bias": (("a", 1),)},
                                    {"logit_bias": ((1,),)}, {"repetition_penalty": float("inf")},
                                    {"repetition_penalty": 5e-324}, {"repetition_penalty": 11}])
def test_bad_values_are_config_errors(fields):
    with pytest.raises(ConfigError):
        SamplingConfig(**fields)


def test_bias_outside_the_vocabulary():
    check_bias(SamplingConfig(logit_bias=((4, 1.0),)), vocab=5)
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        check_bias(SamplingConfig(logit_bias=((5, 1.0),)), vocab=5)
    assert SamplingConfig(logit_bias=[[3, 1]]).logit_bias == ((3, 1.0),)  # lists from a caller, kept hashable
