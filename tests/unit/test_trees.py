"""Static trees compiled from Medusa-style paths: parents, depths, ranks, mask and positions (table-driven)."""
import pytest
import torch

from specdecode.core.trees import build_block, compile_paths

CASES = [
    # paths, parents, depths, ranks, top_k per depth
    ([[0]], (-1,), (1,), (0,), (1,)),
    ([[0], [0, 0], [0, 0, 0]], (-1, 0, 1), (1, 2, 3), (0, 0, 0), (1, 1, 1)),
    ([[0], [1], [2]], (-1, -1, -1), (1, 1, 1), (0, 1, 2), (3,)),
    ([[1], [0], [0, 1], [0, 0], [1, 0]], (-1, -1, 0, 0, 1), (1, 1, 2, 2, 2), (0, 1, 0, 1, 0), (2, 2)),
    ([[0, 0, 0], [0], [0, 0], [1], [0, 1]], (-1, -1, 0, 0, 2), (1, 1, 2, 2, 3), (0, 1, 0, 1, 0), (2, 2, 1)),
]


@pytest.mark.parametrize("paths, parents, depths, ranks, top_k", CASES)
def test_compile_paths(paths, parents, depths, ranks, top_k):
    tree = compile_paths(paths)
    assert tree.parents == parents
    assert tree.depths == depths
    assert tree.ranks == ranks
    assert tree.top_k == top_k
    assert sorted(tree.paths) == sorted(tuple(p) for p in paths)


MASKS = [
    # paths -> [n + 1, n + 1] mask with the root at index 0, and positions relative to the root
    ([[0], [1]], [[1, 0, 0], [1, 1, 0], [1, 0, 1]], [0, 1, 1]),
    ([[0], [0, 0]], [[1, 0, 0], [1, 1, 0], [1, 1, 1]], [0, 1, 2]),
    ([[0], [1], [0, 0], [1, 0]],
     [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]], [0, 1, 1, 2, 2]),
]


@pytest.mark.parametrize("paths, mask, positions", MASKS)
def test_mask_and_positions(paths, mask, positions):
    tree = compile_paths(paths)
    assert tree.mask().int().tolist() == mask
    assert tree.position_offsets().tolist() == positions


@pytest.mark.parametrize("paths, mask, positions", MASKS)
def test_block_from_static_tree_matches(paths, mask, positions):
    """The engine's block for a static tree (root + nodes after a prefix of 3) has the compiled mask/positions."""
    tree = compile_paths(paths)
    n = len(tree)
    block = build_block([3], [list(range(10, 11 + n))], [[-1, *(p + 1 for p in tree.parents)]], pad_id=0, device="cpu")
    assert block.positions[0].tolist() == [3 + p for p in positions]
    assert block.mask[0, 0, :, 3:].int().tolist() == mask
    assert block.mask[0, 0, :, :3].all()


@pytest.mark.parametrize("bad", [[[0, 0]], [[0], [0]], [[]], [[-1]], [[0], [1, 2]]])
def test_invalid_paths_are_rejected(bad):
    with pytest.raises(ValueError):
        compile_paths(bad)


def test_truncated_keeps_shallow_nodes():
    tree = compile_paths([[0], [1], [0, 0], [0, 0, 0]])
    assert tree.truncated(2).paths == ((0,), (1,), (0, 0))
    assert tree.truncated(9) is tree
    assert len(tree.truncated(0)) == 0


def test_medusa_tree_builder_prefers_likely_paths():
    from specdecode.drafters.medusa import medusa_paths

    accuracy = [[0.6, 0.2, 0.1], [0.5, 0.25, 0.1], [0.3, 0.1, 0.05]]
    paths = medusa_paths(accuracy, 4)
    assert paths == [[0], [0, 0], [1], [0, 1]]  # 0.6, 0.3, 0.2, 0.15 (then [0, 0, 0] at 0.09)
    tree = compile_paths(paths)
    assert tree.parents == (-1, -1, 0, 0)
    assert torch.equal(tree.position_offsets(), torch.tensor([0, 1, 1, 2, 2]))
