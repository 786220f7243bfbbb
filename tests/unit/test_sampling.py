"""Temperature, top-k and top-p transforms, and adaptive K."""
import pytest
import torch

from specdecode.config import SamplingConfig, SpecConfig
from specdecode.core.sampling import probabilities
from specdecode.core.speculation import SpeculationLength
from specdecode.core.verify import verify_sampling
from specdecode.errors import ConfigError


def test_top_k_keeps_k_largest():
    logits = torch.tensor([1.0, 3.0, 2.0, 0.0])
    probs = probabilities(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert probs[0] == 0 and probs[3] == 0
    assert torch.allclose(probs[1:3], torch.tensor([3.0, 2.0]).softmax(0))


@pytest.mark.parametrize("top_k, kept", [(1, [1]), (3, [0, 1, 2]), (4, [0, 1, 2, 3]), (9, [0, 1, 2, 3])])
def test_top_k_boundaries(top_k, kept):
    """top_k = vocab - 1 still drops one token; top_k >= vocab keeps all."""
    probs = probabilities(torch.tensor([1.0, 3.0, 2.0, 0.0]), SamplingConfig(temperature=1.0, top_k=top_k))
    assert (probs > 0).nonzero().flatten().tolist() == kept


def test_top_p_keeps_smallest_prefix_reaching_p():
    probs_in = torch.tensor([0.5, 0.3, 0.15, 0.05])
    probs = probabilities(probs_in.log(), SamplingConfig(temperature=1.0, top_p=0.8))
    assert torch.allclose(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    probs = probabilities(probs_in.log(), SamplingConfig(temperature=1.0, top_p=0.81))
    assert probs[2] > 0 and probs[3] == 0


def test_top_p_on_unsorted_rows():
    """The keep/drop decision is made in sorted order and must land back on the right token ids, per row."""
    probs_in = torch.tensor([[0.05, 0.3, 0.15, 0.5], [0.3, 0.05, 0.5, 0.15]])
    probs = probabilities(probs_in.log(), SamplingConfig(temperature=1.0, top_p=0.8))
    assert torch.allclose(probs, torch.tensor([[0.0, 0.375, 0.0, 0.625], [0.375, 0.0, 0.625, 0.0]]))


def test_top_p_drops_a_token_whose_mass_before_equals_p():
    """Exact boundary (four equal logits: probabilities 0.25, sums exact in float): the third token has 0.5 of
    mass before it, which already reaches top_p = 0.5, so it is dropped; two tokens stay."""
    probs = probabilities(torch.zeros(4), SamplingConfig(temperature=1.0, top_p=0.5))
    assert sorted(probs.tolist()) == [0.0, 0.0, 0.5, 0.5]


def test_temperature_sharpens():
    logits = torch.tensor([1.0, 2.0])
    cold = probabilities(logits, SamplingConfig(temperature=0.5))
    assert torch.allclose(cold, torch.tensor([2.0, 4.0]).softmax(0))


@pytest.mark.parametrize("temperature", [1e-38, 5e-324, 1e-37, 1e-30])
def test_tiny_temperature_is_the_greedy_limit(temperature):
    """logits / temperature overflowed float32 (1e-38: inf - inf = nan), or the temperature rounded to 0 (5e-324):
    the transform is computed after subtracting the largest logit, and below float32's smallest normal number it
    is the limit itself. All mass lands on the largest logit, shared by ties, per row."""
    logits = torch.tensor([[10.0, 30.0, 30.0, -5.0], [100.0, 2.0, -100.0, float("-inf")]])
    probs = probabilities(logits, SamplingConfig(temperature=temperature))
    assert probs.tolist() == [[0.0, 0.5, 0.5, 0.0], [1.0, 0.0, 0.0, 0.0]]


def test_small_temperature_is_stable_with_large_logits():
    """1000 / 1e-36 overflows float32 without the shift; with it the top token takes (almost) all the mass."""
    probs = probabilities(torch.tensor([1000.0, 999.0, 0.0]), SamplingConfig(temperature=1e-36))
    assert probs.tolist() == [1.0, 0.0, 0.0]
    warm = probabilities(torch.tensor([1000.0, 999.0]), SamplingConfig(temperature=0.5))
    assert torch.allclose(warm, torch.tensor([2.0, 0.0]).softmax(0))


@pytest.mark.parametrize("top_p", [5e-324, 1e-46, 1e-9])
def test_top_p_always_keeps_the_most_likely_token(top_p):
    """5e-324 (and 1e-46) round to 0 in float32, where `mass before >= top_p` held for the top token too and every
    token was dropped (softmax of all -inf = nan)."""
    probs_in = torch.tensor([[0.05, 0.3, 0.15, 0.5], [0.3, 0.05, 0.5, 0.15]])
    probs = probabilities(probs_in.log(), SamplingConfig(temperature=1.0, top_p=top_p))
    assert probs.tolist() == [[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]]


def test_tiny_temperature_verification_is_greedy():
    """p and q get the same transform: at the greedy limit a draft of the argmax tokens is accepted whole and the
    bonus token is the argmax, whatever the random draws."""
    logits = torch.tensor([[0.0, 5.0, 1.0], [4.0, 0.0, 1.0], [0.0, 1.0, 3.0]])  # [n + 1, vocab], n = 2
    sampling = SamplingConfig(temperature=1e-38, top_p=5e-324, seed=0)
    p = probabilities(logits, sampling)
    q = probabilities(logits[:2], sampling)
    for seed in range(5):
        verdict = verify_sampling((1, 0), (-1, 0), q, p, torch.Generator().manual_seed(seed))
        assert (verdict.accepted, verdict.next_token) == ((0, 1), 2)


@pytest.mark.parametrize("kwargs", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-1)])
def test_bad_sampling_config(kwargs):
    with pytest.raises(ConfigError):
        SamplingConfig(**kwargs)


def test_adaptive_k_follows_acceptance():
    length = SpeculationLength(SpecConfig(k=4, adaptive=True, min_k=1, max_k=7, pause_below=0))
    length.update(drafted=4, accepted=4)
    assert length.k == 6
    length.update(drafted=6, accepted=6)
    assert length.k == 7  # capped
    length.update(drafted=7, accepted=2)
    assert length.k == 6
    for _ in range(10):
        length.update(drafted=length.k, accepted=0)
    assert length.k == 1
    fixed = SpeculationLength(SpecConfig(k=4))
    fixed.update(drafted=4, accepted=4)
    assert fixed.k == 4


def test_speculation_pauses_while_it_does_not_pay_then_retries():
    length = SpeculationLength(SpecConfig(k=5, pause_below=0.5, pause_window=4, pause_steps=3))
    for accepted in (1, 0, 0):  # 1 token in 3 steps: window not full yet
        length.update(drafted=5, accepted=accepted)
    assert length.k == 5
    length.update(drafted=0, accepted=0)  # nothing proposed (no n-gram match): neither counts nor pauses
    assert length.k == 5
    length.update(drafted=5, accepted=0)  # window full: 1 accepted in 4 steps < 0.5 per step
    assert length.k == 0
    for _ in range(3):  # paused steps draft nothing
        assert length.k == 0
        length.update(drafted=0, accepted=0)
    assert length.k == 1  # retried with a fresh window, drafting min_k tokens first
    length.update(drafted=1, accepted=1)
    assert length.k == 3  # the probe passed: back towards K by 2
    length.update(drafted=3, accepted=3)
    assert length.k == 5
    for _ in range(4):
        length.update(drafted=5, accepted=2)
    assert length.k == 5  # 2 per step pays: no pause
    never = SpeculationLength(SpecConfig(k=5, pause_below=0))
    for _ in range(50):
        never.update(drafted=5, accepted=0)
    assert never.k == 5


def test_pause_backs_off_while_retries_fail_and_resets_once_one_pays():
    length = SpeculationLength(SpecConfig(k=5, pause_below=0.5, pause_window=2, pause_steps=3))
    pauses = []
    for _ in range(4):  # a drafter that never pays: each failed window pauses twice as long as the last
        for _ in range(2):
            length.update(drafted=5, accepted=0)
        pauses.append(0)
        while length.k == 0:
            pauses[-1] += 1
            length.update(drafted=0, accepted=0)
    assert pauses == [3, 6, 12, 24]
    for _ in range(2):  # a window that pays resets the back-off
        length.update(drafted=5, accepted=3)
    for _ in range(2):
        length.update(drafted=5, accepted=0)
    assert length.paused == 3


def test_pause_config_checked():
    with pytest.raises(ConfigError):
        SpecConfig(pause_window=0)


def test_greedy_tokens_pick_as_argmax():
    """max's index (faster on the CPU) picks what argmax picks: the first of tied maxima, NaN as the largest."""
    from specdecode.core.sampling import greedy_tokens

    torch.manual_seed(0)
    cases = [torch.tensor([1.0, 3, 3, 2]), torch.tensor([1.0, float("nan"), 3, float("nan")]),
             torch.full((4,), float("-inf")), torch.randint(0, 3, (3, 9, 300)).float(), torch.randn(2, 151936)]
    for x in cases:
        assert torch.equal(greedy_tokens(x), x.argmax(dim=-1))
