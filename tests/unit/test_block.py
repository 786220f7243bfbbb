"""Tree blocks: positions, slots and the 4D mask built from parent lists."""
import torch

from specdecode.core.drafting import Draft
from specdecode.core.trees import ancestor_matrix, build_block, children_of, depths_of


def test_ancestor_matrix_and_depths():
    parents = (-1, 0, -1, 2, 0)
    assert depths_of(parents) == [1, 2, 1, 2, 2]
    assert children_of(parents) == {-1: [0, 2], 0: [1, 4], 1: [], 2: [3], 3: [], 4: []}
    expected = torch.tensor([
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [1, 0, 0, 0, 1],
    ], dtype=torch.bool)
    assert torch.equal(ancestor_matrix(parents), expected)


def test_block_for_two_rows_with_padding():
    # row 0: prefix 3, root + chain of 2; row 1: prefix 5, root + two siblings + a grandchild
    block = build_block([3, 5], [[10, 11, 12], [20, 21, 22, 23]], [[-1, 0, 1], [-1, 0, 0, 1]], pad_id=0, device="cpu")
    assert block.kv_len == 5 + 4
    assert block.uniform_start is None
    assert block.input_ids.tolist() == [[10, 11, 12, 0], [20, 21, 22, 23]]
    assert block.positions.tolist() == [[3, 4, 5, 3], [5, 6, 6, 7]]
    assert block.slots.tolist() == [[3, 4, 5, 6], [5, 6, 7, 8]]
    m0 = block.mask[0, 0].int().tolist()
    assert m0[2] == [1, 1, 1, 1, 1, 1, 0, 0, 0]  # node 2 sees prefix (3) + root, node 1, itself
    assert m0[3] == [1, 1, 1, 0, 0, 0, 1, 0, 0]  # pad sees prefix + itself only
    m1 = block.mask[1, 0].int().tolist()
    assert m1[2] == [1, 1, 1, 1, 1, 1, 0, 1, 0]  # second sibling does not see the first
    assert m1[3] == [1, 1, 1, 1, 1, 1, 1, 0, 1]  # grandchild sees root, its parent (block 1), itself


def test_draft_validation_and_depth():
    assert Draft.chain([1, 2, 3]).parents == (-1, 0, 1)
    assert Draft.chain([1, 2, 3]).depth == 3
    assert Draft((1, 2, 3), (-1, -1, 1)).depth == 2
    assert Draft().depth == 0
    try:
        Draft((1, 2), (1, -1))
    except ValueError:
        pass
    else:
        raise AssertionError("a parent after its child must be rejected")
