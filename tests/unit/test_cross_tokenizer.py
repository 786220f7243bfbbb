"""Cross-tokenizer drafting: the text bridge by table (partial UTF-8, merges across the committed/draft
boundary), and greedy equivalence with plain decoding for two tiny models with different tokenizers."""
from __future__ import annotations

import pytest

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.core.target import Target
from specdecode.drafters import AUTO, build_drafter
from specdecode.drafters.common.text_bridge import appended_text, committed_text, continuation_ids, encode
from specdecode.drafters.cross_tokenizer import CrossTokenizerDrafter
from specdecode.drafters.draft_model import DraftModel
from specdecode.drafters.none import SPEC as NONE_SPEC
from specdecode.errors import ConfigError, OptionError
from specdecode.server.service import ServeConfig, build_drafters
from tests.tiny import byte_tokenizer, save_tiny, tiny_llama
from tests.tiny_pair import bpe_tokenizer, char_tokenizer, tiny_pair


@pytest.fixture(scope="module")
def bpe():
    return bpe_tokenizer()


@pytest.fixture(scope="module")
def chars():
    return char_tokenizer()


def test_tokenizers_really_differ(bpe, chars):
    assert bpe.tokenize("the cat sat") == ["the", "Ġc", "at", "Ġsat"]
    assert len(chars("the cat sat")["input_ids"]) == 11


def test_committed_text_waits_for_a_whole_character():
    byte = byte_tokenizer()
    ids = encode(byte, "café")  # é is two byte tokens
    assert committed_text(byte, ids) == "café"
    assert committed_text(byte, ids[:-1]) is None


@pytest.mark.parametrize("context, new, expected", [
    ("the cat", " sat on", " sat on"),
    ("the", " cat", " cat"),
    ("", "the mat", "the mat"),
])
def test_appended_text(bpe, context, new, expected):
    assert appended_text(bpe, encode(bpe, context), encode(bpe, new)) == expected


def test_appended_text_drops_a_partial_character():
    byte = byte_tokenizer()
    new = encode(byte, " é")
    assert appended_text(byte, encode(byte, "the"), new[:-1]) == " "
    assert appended_text(byte, encode(byte, "the"), new) == " é"


@pytest.mark.parametrize("committed, text", [
    ("the cat", " sat on the mat"),  # plain continuation
    ("th", "e cat"),  # "the" would merge across the boundary: the draft must not rewrite "th"
    ("the cat s", "at on"),  # " sat" straddles the boundary
    ("the", " "),
])
def test_continuation_never_rewrites_committed_ids(bpe, committed, text):
    committed_ids = [bpe.convert_tokens_to_ids(t) for t in bpe.tokenize(committed)]
    ids = continuation_ids(bpe, committed_ids, text)
    assert ids
    assert bpe.decode(committed_ids + ids) == committed + text


def test_continuation_of_a_straddling_merge_is_the_text_alone(bpe):
    committed_ids = encode(bpe, "th")
    assert continuation_ids(bpe, committed_ids, "e cat") == encode(bpe, "e cat")


def test_continuation_is_empty_when_the_target_cannot_spell_the_text(chars):
    assert continuation_ids(chars, encode(chars, "the"), " é") == []  # é is not in the character vocabulary
    assert continuation_ids(chars, encode(chars, "the"), "") == []


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


PROMPTS = ["the cat sat", "a quick", "def add(a", "she sells", "print(", "the moon", "the "]


def prompt_ids(target: Target, text: str) -> list[int]:
    return [1] + target.tokenizer(text)["input_ids"]


def test_greedy_equals_plain(pair):
    target, draft = pair
    generation = GenerationConfig(max_new_tokens=24)
    plain = Engine(target, NONE_SPEC.build(target, DrafterConfig(), SpecConfig()))
    engine = Engine(target, CrossTokenizerDrafter(draft, target), SpecConfig(k=4, pause_on_time=False))
    accepted = proposed = 0  # asserted below: K must not depend on the machine's timing
    for text in PROMPTS:
        ids = prompt_ids(target, text)
        result = engine.generate(ids, generation=generation)
        assert result.token_ids == plain.generate(ids, generation=generation).token_ids, text
        accepted, proposed = accepted + result.metrics.accepted, proposed + result.metrics.proposed
    assert proposed > 0 and 0 < accepted < proposed  # drafts were both accepted and rejected


def test_greedy_batch_with_adaptive_k_equals_plain(pair):
    target, draft = pair
    generation = GenerationConfig(max_new_tokens=20)
    plain = Engine(target, NONE_SPEC.build(target, DrafterConfig(), SpecConfig()))
    expected = [plain.generate(prompt_ids(target, t), generation=generation).token_ids for t in PROMPTS[:3]]
    spec = SpecConfig(k=2, adaptive=True, max_k=6)
    engine = Engine(target, CrossTokenizerDrafter(draft, target), spec, max_batch=3)
    seqs = [engine.start(prompt_ids(target, t), SamplingConfig(), generation) for t in PROMPTS[:3]]
    while not all(s.finished for s in seqs):
        engine.step([s for s in seqs if not s.finished])
    for seq, want in zip(seqs, expected):
        assert seq.output_ids == want
        engine.release(seq)


def test_draft_model_switches_to_text_drafting_when_tokenizers_differ(pair, tmp_path):
    target, draft = pair
    draft_dir = save_tiny(tmp_path / "draft", draft.model, draft.tokenizer)
    drafter = build_drafter(target, DrafterConfig(name="draft-model", draft_model=draft_dir), SpecConfig())
    assert isinstance(drafter, CrossTokenizerDrafter)
    with pytest.raises(ConfigError, match="draft_vocab needs a draft model with the target's tokenizer"):
        build_drafter(target, DrafterConfig(name="draft-model", draft_model=draft_dir, draft_vocab=64), SpecConfig())
    same_dir = save_tiny(tmp_path / "same", tiny_llama(vocab_size=target.vocab_size, layers=1, seed=7),
                         target.tokenizer)
    assert isinstance(build_drafter(target, DrafterConfig(name="draft-model", draft_model=same_dir)), DraftModel)


def test_auto_with_a_draft_model_of_another_tokenizer_drafts_with_it_alone(pair, tmp_path):
    """`auto` with a draft model is `hybrid` on the CPU, which needs the target's tokenizer: with another one it
    builds the draft model's text drafting instead, and refuses the suffix store it would not read."""
    target, draft = pair
    draft_dir = save_tiny(tmp_path / "draft", draft.model, draft.tokenizer)
    assert isinstance(build_drafter(target, DrafterConfig(AUTO, draft_model=draft_dir)), CrossTokenizerDrafter)
    with pytest.raises(OptionError, match="suffix_store has no effect here"):
        build_drafter(target, DrafterConfig(AUTO, draft_model=draft_dir, suffix_store=1000))
    config = ServeConfig(drafter=DrafterConfig(AUTO, draft_model=draft_dir), allowed=("draft-model",))
    assert config.resolved().drafters == ("hybrid", "draft-model")  # resolved by name, before anything loads
    drafters = build_drafters(target, config.resolved(), auto=True)  # named by what was built
    assert list(drafters) == ["draft-model"] and isinstance(drafters["draft-model"], CrossTokenizerDrafter)


def test_needs_both_tokenizers(pair):
    target, draft = pair
    with pytest.raises(ConfigError):
        CrossTokenizerDrafter(Target(draft.model), target)


@pytest.mark.parametrize("confidence, drafts", [(0.0, True), (1e-6, True), (1.0, False)])
def test_drafts_stay_within_k_and_stop_below_confidence(pair, confidence, drafts):
    """Never more than K target ids per draft; the draft stops when its top probability falls below
    `confidence` (1.0: always, so nothing is drafted; 1e-6: never)."""
    target, draft = pair
    drafter = CrossTokenizerDrafter(draft, target, confidence=confidence)
    depths = []
    propose = drafter.propose
    drafter.propose = lambda seqs: [depths.append(d.depth) or d for d in propose(seqs)]
    engine = Engine(target, drafter, SpecConfig(k=2, pause_on_time=False, pause_below=0.0))
    for text in PROMPTS[:3]:
        engine.generate(prompt_ids(target, text), generation=GenerationConfig(max_new_tokens=12))
    assert depths and max(depths) <= 2
    assert (max(depths) > 0) == drafts
