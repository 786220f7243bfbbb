"""Incremental detokenisation for streaming: emit text only when it is final (no partial UTF-8 sequence), and
cut it at the first stop string."""
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
        prefix_text = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset],
                                            skip_special_tokens=self.skip)
        full_text = self.tokenizer.decode(self.ids[self.prefix_offset :], skip_special_tokens=self.skip)
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            delta = full_text[len(prefix_text) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """Whatever is held back (at the end of generation)."""
        prefix_text = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset],
                                            skip_special_tokens=self.skip)
        full_text = self.tokenizer.decode(self.ids[self.prefix_offset :], skip_special_tokens=self.skip)
        self.prefix_offset = self.read_offset = len(self.ids)
        return full_text[len(prefix_text) :]


class StopText:
    """Detokenise incrementally and cut at the first stop string (`after`: strings that end the text and stay in
    it); holds back text that could begin one."""

    def __init__(self, tokenizer, stop_strings: tuple[str, ...], after: tuple[str, ...] = ()):
        self.stream = TextStream(tokenizer)
        self.kept = tuple(s for s in after if s)
        self.stops = tuple(s for s in stop_strings if s) + self.kept
        self.pending = ""
        self.matched: str | None = None  # the stop string that ended the text

    def push_after(self, tokens: list[int], before: int, least: int, final: bool) -> tuple[str, bool]:
        """push() for tokens that follow `before` generated ones: those among the first `least` (vLLM's
        min_tokens) unsearched, pushed apart, so the text does not depend on which tokens come together."""
        unsearched = min(len(tokens), max(0, least - before))
        text, stopped = "", False
        if unsearched:
            text, _ = self.push(tokens[:unsearched], final=final and unsearched == len(tokens), look=False)
        if unsearched < len(tokens):
            more, stopped = self.push(tokens[unsearched:], final=final)
            text += more
        return text, stopped

    def push(self, tokens: list[int], final: bool, look: bool = True) -> tuple[str, bool]:
        """The text the tokens complete, less what is held back, and whether a stop string ended it. look: False
        for tokens a stop string may not end (vLLM's min_tokens): their text is not searched, only held back."""
        if self.stream.tokenizer is None:  # token-level use (tiny test models): no text
            return "", False
        self.pending += self.stream.push(tokens)
        if final:
            self.pending += self.stream.flush()
        found = [(self.pending.find(s), s) for s in self.stops if s in self.pending] if look else []
        if found:
            cut, stop = min(found, key=lambda at: at[0])
            out, self.pending, self.matched = self.pending[:cut + (len(stop) if stop in self.kept else 0)], "", stop
            return out, True
        hold = 0 if final else max((len(s) - 1 for s in self.stops), default=0)
        hold = min(hold, len(self.pending))
        # hold back only a tail that is a prefix of some stop string
        while hold and not any(s.startswith(self.pending[-hold:]) for s in self.stops):
            hold -= 1
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(self.pending) - hold :]
        return out, False
