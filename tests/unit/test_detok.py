"""Streaming detokenisation (detok.TextStream): a multi-byte character split over steps is held back until
complete, and flush hands over what is held exactly once."""
from specdecode.core.detok import TextStream
from tests.tiny import byte_tokenizer


def test_split_character_is_held_back_then_emitted_once():
    tokenizer = byte_tokenizer()
    ids = tokenizer("aé")["input_ids"]  # 'a' + the two bytes of 'é'
    assert len(ids) == 3
    stream = TextStream(tokenizer)
    assert [stream.push([i]) for i in ids] == ["a", "", "é"]
    assert stream.flush() == ""


def test_flush_hands_over_a_held_tail_once():
    tokenizer = byte_tokenizer()
    ids = tokenizer("aé")["input_ids"]
    stream = TextStream(tokenizer)
    assert stream.push(ids[:2]) == ""  # ends inside 'é'
    assert stream.flush() != ""
    assert stream.flush() == ""
