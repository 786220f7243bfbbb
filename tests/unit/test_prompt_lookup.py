"""n-gram index used by prompt lookup: latest occurrence, longest n first."""
import pytest

from specdecode.drafters.prompt_lookup import NgramIndex

CASES = [
    # tokens, k, expected draft
    ([1, 2, 3, 4, 1, 2], 3, [3, 4, 1]),  # bigram (1, 2) seen at 0 -> continue with 3, 4, 1
    ([1, 2, 3, 9, 2, 3, 7, 2, 3], 2, [7, 2]),  # latest occurrence of (2, 3) wins
    ([5, 6, 7, 8], 3, []),  # no repeat
    ([3, 1, 2, 8, 5, 1, 2, 9, 3, 1, 2], 2, [8, 5]),  # longest n first: trigram (3, 1, 2) beats bigram (1, 2)
    ([7, 7, 7], 4, [7]),  # continuation limited by the context end
]


@pytest.mark.parametrize("tokens,k,expected", CASES)
def test_lookup(tokens, k, expected):
    index = NgramIndex(min_n=1, max_n=3)
    index.extend(tokens)
    assert index.lookup(tokens, k) == expected


def test_incremental_extension_matches_batch():
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6]
    once, grown = NgramIndex(1, 3), NgramIndex(1, 3)
    once.extend(tokens)
    for end in range(1, len(tokens) + 1):
        grown.extend(tokens[:end])
    assert once.latest == grown.latest
