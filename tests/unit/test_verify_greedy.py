"""Table-driven tests of greedy verification (chains and trees)."""
import pytest

from specdecode.core.verify import verify_greedy

CHAIN = (-1, 0, 1)

CASES = [
    # tokens, parents, target argmax after root/node0/node1/..., expected path, expected next token
    ((4, 9, 2), CHAIN, [4, 9, 2, 8], (0, 1, 2), 8),  # all accepted, bonus 8
    ((4, 9, 2), CHAIN, [4, 9, 7, 3], (0, 1), 7),  # third rejected, corrected to 7
    ((4, 9, 2), CHAIN, [5, 9, 2, 8], (), 5),  # first rejected: plain decoding step
    ((), (), [6], (), 6),  # empty draft
    # tree: root -> {0: 4, 1: 5}; 0 -> {2: 7}; 1 -> {3: 8}
    ((4, 5, 7, 8), (-1, -1, 0, 1), [5, 0, 8, 0, 9], (1, 3), 9),  # second branch, both accepted
    ((4, 5, 7, 8), (-1, -1, 0, 1), [4, 7, 0, 1, 0], (0, 2), 1),  # first branch to leaf, bonus after node 2
    ((4, 5, 7, 8), (-1, -1, 0, 1), [4, 6, 0, 0, 0], (0,), 6),  # first branch, child rejected
]


@pytest.mark.parametrize("tokens,parents,argmax,path,next_token", CASES)
def test_verify_greedy(tokens, parents, argmax, path, next_token):
    verdict = verify_greedy(tokens, parents, argmax)
    assert verdict.accepted == path
    assert verdict.next_token == next_token
