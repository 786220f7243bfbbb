"""`prompt-lookup`: model-free n-gram drafting (Saxena 2023). Find the most recent earlier occurrence of the
context's last n tokens (n from max_ngram down to min_ngram) and propose the tokens that followed it.

An index from n-gram to its latest end position is kept per sequence and extended as tokens are committed,
so a lookup costs O(max_ngram) instead of a scan of the context."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .base import BaseDrafter, Draft, DrafterConfig, DrafterSpec, SequenceContext


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
        for n in range(self.max_n, self.min_n - 1, -1):
            if len(tokens) <= n:
                continue
            start = self.latest.get(tuple(tokens[-n:]))
            if start is not None:
                return tokens[start : start + k]
        return []


class PromptLookup(BaseDrafter):
    name = "prompt-lookup"

    def __init__(self, min_ngram: int = 1, max_ngram: int = 3):
        self.min_n, self.max_n = min_ngram, max_ngram

    def start(self, seq: SequenceContext) -> None:
        seq.state = NgramIndex(self.min_n, self.max_n)

    def propose(self, seqs: Sequence[SequenceContext]) -> list[Draft]:
        drafts = []
        for seq in seqs:
            index: NgramIndex = seq.state
            # n-grams whose continuation is known; the newest one (the lookup key) has none yet
            index.extend(seq.tokens)
            drafts.append(Draft.chain(index.lookup(seq.tokens, seq.k) if seq.k > 0 else []))
        return drafts


SPEC = DrafterSpec(
    "prompt-lookup",
    lambda target, config, spec: PromptLookup(config.min_ngram, config.max_ngram),
    "n-gram match in prompt + generated text (model-free)",
)
