"""Moving a draft between tokenizers through text: target ids -> text -> draft ids, and draft ids -> new text
-> target ids that continue the committed target ids exactly. Pure functions of tokenizers and ids.

Two hazards are handled here:
- partial UTF-8: a byte-level token sequence can stop inside a character; its decoded text ends in U+FFFD.
  Such a tail is never handed over (the committed side waits a step, the draft side drops it);
- merges across the boundary: tokenising committed text + draft text can merge the last committed token with
  the first draft characters ("hel" + "lo" -> "hello"). The committed ids are fixed, so the draft must be
  tokens that come *after* them: we tokenise a short window of committed text plus the draft text, keep the
  tokens that start at or after the boundary, and check that the result decodes to exactly the draft text.
"""
from __future__ import annotations

REPLACEMENT = "\ufffd"


def decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def encode(tokenizer, text: str, special: bool = False) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def committed_text(tokenizer, ids: list[int]) -> str | None:
    """The text of committed ids, or None when it ends inside a character (partial UTF-8)."""
    text = decode(tokenizer, ids)
    return None if text.endswith(REPLACEMENT) else text


def appended_text(tokenizer, context: list[int], new: list[int], window: int = 8) -> str:
    """The text that `new` adds after `context` (decoded over a short window, so merges of the first new token
    with the context, e.g. SentencePiece's leading space, come out right). A trailing partial character is
    dropped; "" when the window's text is not a prefix of the longer one."""
    tail = context[-window:]
    before, after = decode(tokenizer, tail), decode(tokenizer, tail + new)
    if not after.startswith(before):
        return ""
    return after[len(before) :].rstrip(REPLACEMENT)


def continuation_ids(tokenizer, committed: list[int], text: str, window: int = 4) -> list[int]:
    """Target ids that follow `committed` and spell exactly `text`; [] when no such split is found.

    Example (char-level committed "ab", BPE-like target where "bc" is one token): text "cd" gives the ids of
    "c", "d" (never "bc", which would rewrite a committed token).
    """
    if not text:
        return []
    tail = committed[-window:]
    head = decode(tokenizer, tail)
    encoded = tokenizer(head + text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(encoded["input_ids"]), list(encoded["offset_mapping"])
    start = next((i for i, (begin, _) in enumerate(offsets) if begin >= len(head)), len(ids))
    straddles = start > 0 and offsets[start - 1][1] > len(head)
    candidates = [] if straddles else [ids[start:]]
    candidates.append(encode(tokenizer, text))  # the draft text tokenised on its own
    for draft in candidates:
        if draft and decode(tokenizer, tail + draft) == decode(tokenizer, tail) + text:
            return draft
    return []
