"""The suffix store and the suffix drafter's tree choice: table-driven, no model."""
import pytest

from specdecode.drafters.common.suffix_store import SuffixStore, TokenIndex, continuation_trie
from specdecode.drafters.suffix import kind_of, select_nodes, tree_draft


def test_index_finds_the_longest_match_and_what_followed():
    index = TokenIndex(max_match=8, candidates=8)
    index.extend([1, 2, 3, 4, 9, 2, 3, 4, 5, 6])
    match, positions = index.find([7, 9, 2, 3, 4])  # [9, 2, 3, 4] occurs once; [2, 3, 4] twice
    assert match == 4
    assert [index.continuation(p, 3) for p in positions] == [[5, 6]]
    match, positions = index.find([8, 2, 3, 4])  # only [2, 3, 4]: both occurrences, newest first
    assert match == 3 and [index.continuation(p, 1) for p in positions] == [[5], [9]]
    assert index.find([42]) == (0, [])


def test_index_caps_the_match_length_and_the_candidates():
    index = TokenIndex(max_match=3, candidates=2, keys=(1,))
    index.extend([5, 1, 2, 3, 4, 0, 1, 2, 3, 4, 7, 1, 2, 3, 4, 8])
    match, positions = index.find([1, 2, 3, 4])
    assert match == 3  # capped
    assert [index.continuation(p, 1) for p in positions] == [[8], [7]]  # the newest 2 occurrences of [4]


def test_the_context_itself_is_not_a_match():
    """The last n tokens are the lookup key: their own position has no continuation yet."""
    index = TokenIndex()
    index.extend([1, 2, 3])
    assert index.find([1, 2, 3]) == (0, [])


def test_store_keeps_sequences_apart():
    store = SuffixStore(capacity=100, max_match=8)
    store.insert([1, 2, 3])
    store.insert([4, 5, 6])
    assert store.find([9, 2, 3]) == (0, [])  # [2, 3] ends its sequence: nothing followed it
    assert store.continuation(store.find([1])[1][0], 5) == [2, 3]  # stops at the sequence's end
    assert store.find([3, 4]) == (1, [store.index.end - 3])  # [3, 4] spans the boundary: only [4] matches
    assert store.continuation(store.find([3, 4])[1][0], 5) == [5, 6]


def test_store_evicts_the_oldest_at_the_cap():
    store = SuffixStore(capacity=10, max_match=8)
    store.insert([1, 2, 3, 4])
    store.insert([5, 6, 7, 8])
    assert store.stats().tokens == 8 and store.stats().sequences == 2
    store.insert([9, 1, 2, 10])  # 12 > 10: the first sequence goes
    stats = store.stats()
    assert (stats.tokens, stats.sequences, stats.evicted, stats.capacity) == (8, 2, 1, 10)
    match, positions = store.find([1, 2])
    assert match == 2 and [store.continuation(p, 2) for p in positions] == [[10]]  # not [3, 4]
    assert store.find([6, 7])[0] == 2  # the second sequence is still there
    for _ in range(20):  # the buffer's dead prefix is cut; the chains never point into it
        store.insert([5, 6, 7, 8])
    assert store.stats().tokens == 8 and len(store.index.buf) <= 3 * 10
    match, positions = store.find([5, 6, 7])
    assert match == 3 and [store.continuation(p, 2) for p in positions] == [[8], [8]]
    assert all(positions_ok >= store.index.alive for positions_ok in positions)
    assert store.find([1, 2]) == (0, [])


def test_store_drops_evicted_chain_heads():
    store = SuffixStore(capacity=4, max_match=4)
    for start in range(0, 400, 4):
        store.insert(list(range(start, start + 4)))
    assert sum(len(chain) for chain in store.index.latest.values()) <= 4 * 4  # only the live sequence's keys


def test_store_keeps_the_tail_of_a_sequence_longer_than_the_cap():
    store = SuffixStore(capacity=3)
    store.insert([1, 2, 3, 4, 5])
    assert store.stats().tokens == 3
    assert store.find([3, 4])[0] == 2 and store.find([1])[0] == 0


def test_trie_counts_and_ranking_by_frequency():
    trie = continuation_trie([[5, 6], [5, 7], [5, 6], [8]])
    assert [(n.token, n.parent, n.depth, n.count) for n in trie] == [(5, -1, 1, 3), (6, 0, 2, 2), (7, 0, 2, 1),
                                                                     (8, -1, 1, 1)]
    taken = select_nodes(trie, 4, [1.0, 1.0], row_cost=0.0, max_nodes=10, min_prob=0.0)
    assert [trie[i].token for i in taken] == [5, 6, 8, 7]  # by frequency, then shallower first
    draft = tree_draft(trie, taken)
    assert draft.tokens == (5, 6, 8, 7) and draft.parents == (-1, 0, -1, 0)


@pytest.mark.parametrize("row_cost, max_nodes, min_prob, tokens", [
    (0.0, 10, 0.3, [5, 6]),  # 7 and 8 are seen once in four
    (0.0, 2, 0.0, [5, 6]),  # the node budget
    (0.0, 1, 0.0, [5]),
    (0.5, 10, 0.0, [5]),  # 6 (P 0.5) does not pay for its row: 0.5 * 1.75 / 1.5 > 0.5
    (0.2, 10, 0.0, [5, 6]),
    (4.0, 10, 0.0, []),  # not even the first
])
def test_node_choice_by_budget_row_cost_and_frequency(row_cost, max_nodes, min_prob, tokens):
    trie = continuation_trie([[5, 6], [5, 7], [5, 6], [8]])
    taken = select_nodes(trie, 4, [1.0, 1.0], row_cost, max_nodes, min_prob)
    assert [trie[i].token for i in taken] == tokens


def test_reach_weighs_depth():
    """A deep frequent node ranks below a shallow rarer one when deep tokens are unlikely to be reached."""
    trie = continuation_trie([[5, 6], [5, 6], [5, 6], [8]])
    taken = select_nodes(trie, 4, [0.9, 0.2], row_cost=0.0, max_nodes=2, min_prob=0.0)
    assert [trie[i].token for i in taken] == [5, 8]  # 8: 0.9 * 1/4 = 0.225 > 6: 0.2 * 3/4 = 0.15


@pytest.mark.parametrize("match, kind", [(1, 1), (2, 2), (3, 3), (4, 4), (7, 4), (8, 8), (15, 8), (16, 16), (24, 16)])
def test_kind_of(match, kind):
    assert kind_of(match) == kind
