"""The latest end position of every n-gram of a token list, extended as tokens are appended: a lookup costs
O(max n) instead of a scan of the context (prompt lookup, EAGLE's grafted chains)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class NgramIndex:
    """n-gram (tuple) -> index just after its latest occurrence that has at least one following token."""

    min_n: int
    max_n: int
    latest: dict[tuple[int, ...], int] = field(default_factory=dict)
    indexed: int = 0  # tokens[:indexed] have had their n-grams ending before `indexed` recorded

    def extend(self, tokens: list[int]) -> None:
        # record n-grams ending at position end-1 whose continuation tokens[end] exists: end < len(tokens)
        for end in range(max(self.indexed, 1), len(tokens)):
            for n in range(self.min_n, self.max_n + 1):
                if end - n >= 0:
                    self.latest[tuple(tokens[end - n : end])] = end
        self.indexed = max(self.indexed, len(tokens))

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        return self.match(tokens, k)[1]

    def match(self, tokens: list[int], k: int) -> tuple[int, list[int]]:
        """(length of the longest matching n-gram, up to k tokens that followed its latest occurrence);
        (0, []) when nothing matches."""
        for n in range(self.max_n, self.min_n - 1, -1):
            if len(tokens) <= n:
                continue
            start = self.latest.get(tuple(tokens[-n:]))
            if start is not None:
                return n, tokens[start : start + k]
        return 0, []
