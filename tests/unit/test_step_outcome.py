"""`Engine.step` says what it did per sequence (StepOutcome), takes its speculation lengths from a hook, finishes
text at stop strings in one place, and keeps a row's commit failure to that row."""
import pytest
import torch

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.drafting import Draft
from specdecode.core.engine import Engine, _origins
from specdecode.core.structured import Shaped
from specdecode.drafters import build_drafter
from tests.fakes import Oracle

PROMPT = "abcabcabd abcabc"


def _truth(target, ids, n):
    plain = Engine(target, build_drafter(target, DrafterConfig("none")))
    return plain.generate(ids, generation=GenerationConfig(max_new_tokens=n, stop_on_eos=False))


def test_outcome_reports_the_step(tiny_target, tiny_tokenizer):
    ids = tiny_tokenizer(PROMPT)["input_ids"]
    reference = _truth(tiny_target, ids, 9)
    engine = Engine(tiny_target, Oracle(reference.token_ids, len(ids), right=2, vocab=tiny_target.vocab_size),
                    SpecConfig(k=4, pause_below=0.0, pause_on_time=False))
    seq = engine.start(ids, SamplingConfig(), GenerationConfig(max_new_tokens=9, stop_on_eos=False))
    outcomes = []
    while not seq.finished:
        (outcome,) = engine.step([seq])
        outcomes.append(outcome)
    plain, drafted = outcomes[:2]
    assert (plain.k, plain.depth, len(plain.token_ids), plain.origins) == (0, 0, 1, ("target",))  # the first token
    assert (drafted.k, drafted.depth, drafted.accepted, len(drafted.token_ids)) == (4, 4, 2, 3)  # 2 right, 1 target
    assert drafted.origins == ("draft", "draft", "correction")
    assert all(len(o.origins) == len(o.token_ids) for o in outcomes)
    assert [t for o in outcomes for t in o.token_ids] == reference.token_ids
    assert [o.finish_reason for o in outcomes] == [None, None, None, "length"]
    assert outcomes[-1].k == 1  # two tokens left: a draft of one and the target's own
    assert all(o.error is None for o in outcomes)
    assert "".join(o.text for o in outcomes) == reference.text


def test_draft_len_hook_sets_k_and_the_budget_still_caps_it(tiny_target, tiny_tokenizer):
    ids = tiny_tokenizer(PROMPT)["input_ids"]
    reference = _truth(tiny_target, ids, 4)
    engine = Engine(tiny_target, Oracle(reference.token_ids, len(ids), vocab=tiny_target.vocab_size),
                    SpecConfig(k=2, pause_below=0.0, pause_on_time=False))
    seq = engine.start(ids, SamplingConfig(), GenerationConfig(max_new_tokens=4, stop_on_eos=False))
    (plain,) = engine.step([seq], draft_len=lambda s: 0)
    assert (plain.k, plain.depth, len(plain.token_ids), plain.origins) == (0, 0, 1, ("target",))
    (wide,) = engine.step([seq], draft_len=lambda s: 9)  # more than the policy's K, cut to the 3 tokens left - 1
    assert (wide.k, wide.accepted, wide.finish_reason) == (2, 2, "length")
    assert wide.origins == ("draft", "draft", "bonus")  # the whole draft accepted: the target's token is a bonus
    assert seq.output_ids == reference.token_ids


def test_stop_string_finishes_in_the_step(tiny_target, tiny_tokenizer):
    ids = tiny_tokenizer(PROMPT)["input_ids"]
    reference = _truth(tiny_target, ids, 12)
    stop = reference.text[3:5]
    assert stop and reference.text.find(stop) == 3
    engine = Engine(tiny_target, build_drafter(tiny_target, DrafterConfig("none")))
    result = engine.generate(ids, generation=GenerationConfig(max_new_tokens=12, stop_strings=(stop,)))
    assert (result.text, result.finish_reason) == (reference.text[:3], "stop")


class _FailsForOne(Oracle):
    """Its feedback raises for one sequence only."""

    def __init__(self, *args, bad: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.bad = bad

    def observe(self, seq, accepted):
        if seq.seq_id == self.bad:
            raise RuntimeError("drafter state lost")


def test_a_rows_commit_failure_is_its_own(tiny_target, tiny_tokenizer):
    ids = tiny_tokenizer(PROMPT)["input_ids"]
    reference = _truth(tiny_target, ids, 6)
    engine = Engine(tiny_target, _FailsForOne(reference.token_ids, len(ids), vocab=tiny_target.vocab_size, bad=0),
                    SpecConfig(k=2), max_batch=2)
    generation = GenerationConfig(max_new_tokens=6, stop_on_eos=False)
    bad, good = (engine.start(ids, SamplingConfig(), generation) for _ in range(2))
    first_bad, first_good = engine.step([bad, good])
    assert isinstance(first_bad.error, RuntimeError) and first_bad.finish_reason == "error" and bad.finished
    assert first_good.error is None and first_good.token_ids == reference.token_ids[:1]  # the first step is plain
    engine.release(bad)
    while not good.finished:
        engine.step([good])
    assert good.output_ids == reference.token_ids
    with pytest.raises(RuntimeError, match="drafter state lost"):  # one sequence: the library re-raises it
        engine.drafter.bad = 2
        engine.generate(ids, generation=generation)


TREE = Draft((5, 6, 7, 8), (-1, 0, 0, 1))  # 5 -> {6 -> 8, 7}


@pytest.mark.parametrize("draft, accepted, own, expected", [
    (Draft(), (), None, ("target",)),  # plain decoding
    (Draft.chain((1, 2, 3)), (), None, ("correction",)),  # the first draft token refused
    (Draft.chain((1, 2, 3)), (0, 1, 2), None, ("draft", "draft", "draft", "bonus")),
    (TREE, (0, 2), None, ("draft", "draft", "bonus")),  # node 2 is a leaf of a tree deeper elsewhere
    (TREE, (0, 1), None, ("draft", "draft", "correction")),  # node 1's child 8 refused
    (Draft.chain((1, 2, 3, 4)), (0, 1, 2), 1, ("draft", "grammar", "grammar", "correction")),  # nodes 1.. forced
    (Draft.chain((1, 2)), (0, 1), 0, ("grammar", "grammar", "bonus")),  # no drafter: the grammar's chain alone
])
def test_origins_name_each_committed_token(draft, accepted, own, expected):
    fit = None if own is None else Shaped(draft, torch.zeros(len(draft) + 1, 1, dtype=torch.int32), own)
    assert _origins(draft, accepted, fit) == expected
