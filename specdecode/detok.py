"""Incremental detokenisation for streaming: emit text only when it is final (no partial UTF-8 sequence)."""
from __future__ import annotations


class TextStream:
    """Feed token ids, get text deltas. Decodes a short window so a token that merges with the previous one
    (or completes a multi-byte character) is rendered correctly; holds back text ending in U+FFFD."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0  # start of the window that is decoded again
        self.read_offset = 0  # tokens whose text was already emitted

    def push(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        prefix_text = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=self.skip)
        full_text = self.tokenizer.decode(self.ids[self.prefix_offset :], skip_special_tokens=self.skip)
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            delta = full_text[len(prefix_text) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """Whatever is held back (at the end of generation)."""
        prefix_text = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=self.skip)
        full_text = self.tokenizer.decode(self.ids[self.prefix_offset :], skip_special_tokens=self.skip)
        self.prefix_offset = self.read_offset = len(self.ids)
        return full_text[len(prefix_text) :]
