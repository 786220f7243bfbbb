"""The loop's bookkeeping with drafts whose outcome is known in advance (an oracle drafter that proposes the
true continuation, wrong from a chosen depth on): exact metrics (tau, acceptance, per position), the length
budget, and EOS inside a draft or as the target's own token. Greedy equivalence alone cannot see these."""
from __future__ import annotations

import pytest

from specdecode.config import GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine, StopText
from specdecode.core.metrics import GenerationMetrics
from specdecode.core.target import Target
from specdecode.drafters.none import SPEC as NONE_SPEC
from specdecode.errors import ConfigError
from tests.fakes import Oracle
from tests.tiny import byte_tokenizer, tiny_llama

PROMPT = [5, 9, 3, 7, 1]
SPEC = SpecConfig(k=3, pause_on_time=False, pause_below=0)  # fixed K: nothing depends on timing or acceptance


@pytest.fixture(scope="module")
def target() -> Target:
    return Target(tiny_llama(vocab_size=64, layers=2, hidden=32, seed=2, std=0.3, eos_token_id=None))


def plain(target: Target, n: int) -> list[int]:
    engine = Engine(target, NONE_SPEC.build(target, None, SPEC), SPEC)
    return engine.generate(PROMPT, SamplingConfig(), GenerationConfig(max_new_tokens=n, stop_on_eos=False)).token_ids


def test_metrics_count_exactly(target):
    """20 tokens, K = 3, the first 2 draft tokens right: the first step drafts nothing (1 token), six steps commit
    2 + 1 tokens (19 -> 1 left), the last drafts min(K, 1 - 1) = 0: 8 passes, 18 proposed, 12 accepted."""
    truth = plain(target, 20)
    drafter = Oracle(truth, len(PROMPT), right=2)
    engine = Engine(target, drafter, SPEC)
    result = engine.generate(PROMPT, SamplingConfig(), GenerationConfig(max_new_tokens=20, stop_on_eos=False))
    m = result.metrics
    assert drafter.observed == [0] + [2] * 6  # accepted DRAFT tokens per step; the finishing step is not observed
    assert result.token_ids == truth and result.finish_reason == "length"
    assert (m.new_tokens, m.target_passes, m.proposed, m.accepted) == (20, 8, 18, 12)
    assert m.tau == pytest.approx(20 / 8)
    assert m.acceptance_rate == pytest.approx(12 / 18)
    assert (m.proposed_at, m.accepted_at) == ([6, 6, 6], [6, 6, 0])
    assert m.acceptance_by_position == [1.0, 1.0, 0.0]


def test_min_tokens_masks_each_draft_position_by_its_depth(target):
    """An all-right Oracle drafts plain decoding's own tokens K = 3 deep, so steps cross the min_new_tokens boundary
    at every depth. A stop token that plain decoding first writes past the boundary ends the output there (a draft
    position past the boundary is not masked); one it writes before does not (a deeper position before it is):
    each exactly as plain decoding with the same settings."""
    truth = plain(target, 40)
    plain_engine = Engine(target, NONE_SPEC.build(target, None, SPEC), SPEC)
    for least in range(4, 12):
        past = next(j for j in range(least, 40) if truth[j] not in truth[:j])  # count j + 1 > least: allowed
        before = [i for i in range(1, least) if truth[i] not in truth[:i]]  # count i + 1 <= least: masked
        for token, ends_at in ((truth[past], past + 1), *((truth[i], None) for i in before)):
            generation = GenerationConfig(max_new_tokens=40, stop_on_eos=False, stop_token_ids=(token,),
                                          min_new_tokens=least)
            expected = plain_engine.generate(PROMPT, SamplingConfig(), generation).token_ids
            got = Engine(target, Oracle(truth, len(PROMPT)), SPEC).generate(PROMPT, SamplingConfig(), generation)
            assert got.token_ids == expected, (least, token)
            assert token not in expected[:least - 1]
            if ends_at is not None:
                assert expected == truth[:ends_at] and got.metrics.accepted > 0
    with pytest.raises(ConfigError, match="stop_token_ids must be below"):
        plain_engine.generate(PROMPT, SamplingConfig(), GenerationConfig(stop_token_ids=(64,), min_new_tokens=1))


def test_first_token_time_is_the_prefill_and_the_first_step(target):
    """GenerationMetrics.first_token_s: the prefill's seconds and the first step's, not the later steps'."""
    engine = Engine(target, Oracle(plain(target, 12), len(PROMPT), right=2), SPEC)
    steps = list(engine.stream(PROMPT, SamplingConfig(), GenerationConfig(max_new_tokens=12, stop_on_eos=False)))
    m, first = steps[-1][0].metrics, steps[0][1]
    assert len(steps) > 2 and m.first_token_s == pytest.approx(m.prefill_s + first.draft_s + first.verify_s)
    assert m.first_token_s < m.total_s and m.as_dict()["first_token_s"] == round(m.first_token_s, 4)


def test_metrics_table():
    m = GenerationMetrics()
    m.observe(depth=4, accepted=4, committed=5)  # all accepted + bonus
    m.observe(depth=2, accepted=0, committed=1)  # first rejected
    m.observe(depth=0, accepted=0, committed=1)  # plain step
    assert (m.new_tokens, m.target_passes, m.proposed, m.accepted) == (7, 3, 6, 4)
    assert m.tau == pytest.approx(7 / 3)
    assert m.acceptance_by_position == [0.5, 0.5, 1.0, 1.0]


@pytest.mark.parametrize("at", [1, 3, 5], ids=["inside-draft", "bonus-token", "second-step"])
def test_eos_cuts_the_step_where_it_appears(target, at):
    """With K = 3 all right, a step commits 4 tokens: EOS as an accepted draft token (1), as the target's own
    bonus token (3), or in the second step (5). The output ends with it, and decoding stops there."""
    truth = plain(target, 12)
    assert truth[at] not in truth[:at], "pick a prompt/model whose EOS candidate first appears at `at`"
    eos_target = Target(target.model)
    eos_target.eos_ids = frozenset({truth[at]})
    engine = Engine(eos_target, Oracle(truth, len(PROMPT), right=3), SPEC)
    result = engine.generate(PROMPT, SamplingConfig(), GenerationConfig(max_new_tokens=12, stop_on_eos=True))
    assert result.token_ids == truth[: at + 1]
    assert result.finish_reason == "eos"
    assert result.metrics.new_tokens == at + 1


def pushed(text: StopText, tokenizer, pieces: list[str]) -> tuple[str, bool]:
    """The text StopText lets out for `pieces` pushed one by one, and whether it stopped."""
    out, stopped = "", False
    for i, piece in enumerate(pieces):
        delta, stopped = text.push(tokenizer(piece)["input_ids"], final=i == len(pieces) - 1)
        out += delta
        if stopped:
            break
    return out, stopped


@pytest.mark.parametrize("pieces", [["hello ", "ST", "O", "P world"], ["hello S", "TOP"], ["hello STOP"],
                                    list("hello STOP world")])
def test_stop_string_is_cut_whatever_the_token_boundaries(pieces):
    tokenizer = byte_tokenizer()
    assert pushed(StopText(tokenizer, ("STOP",)), tokenizer, pieces) == ("hello ", True)


def test_text_pushed_unsearched_is_held_back_alike_in_any_grouping():
    """min_tokens: stop strings are not looked for in the first tokens' text, only held back, so a stop string
    that ends past the boundary still counts; the result does not depend on how the tokens are grouped."""
    tokenizer = byte_tokenizer()
    ids = tokenizer("ab STOP cd STOP ef")["input_ids"]
    for boundary in range(len(ids) + 1):
        outcomes = set()
        for size in (1, 2, 3, 7):
            text, out, stopped, at = StopText(tokenizer, ("STOP",)), "", False, 0
            while at < len(ids) and not stopped:  # groups of `size`, as steps commit them
                end = min(at + size, len(ids))
                delta, stopped = text.push_after(ids[at:end], before=at, least=boundary, final=end == len(ids))
                out, at = out + delta, end
            outcomes.add((out, stopped))
        # the first STOP ends at token 7, the second at token 15
        expected = ("ab ", True) if boundary < 7 else ("ab STOP cd ", True) if boundary < 15 else (
            "ab STOP cd STOP ef", False)
        assert outcomes == {expected}, boundary


@pytest.mark.parametrize("pieces", [["one</end> two"], ["one</e", "nd> two"], list("one</end> two")])
def test_a_kept_stop_string_ends_the_text_and_stays_in_it(pieces):
    """stop_after (the end of a tool call when a reply may make one): cut after the string, whatever the tokens."""
    tokenizer = byte_tokenizer()
    assert pushed(StopText(tokenizer, ("STOP",), after=("</end>",)), tokenizer, pieces) == ("one</end>", True)
