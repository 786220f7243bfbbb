"""Batches over the dynamic cache attend row by row, each over its own length: the logits equal each row's
alone and the padded batch's, and no row is padded to the longest context."""
import torch

from specdecode.core.target import Target
from specdecode.core.trees import build_block
from tests.tiny import tiny_llama

LENGTHS = (600, 5)  # cached tokens per row: very different contexts, one long enough (PER_ROW_MIN_CONTEXT)


def _chain(start: int, tokens: list[int], device) -> object:
    return build_block([start], [tokens], [list(range(-1, len(tokens) - 1))], 0, device)


def _logits(target: Target, rows: list[int], per_row: bool) -> torch.Tensor:
    target._per_row_attention = per_row
    cache = target.new_cache(rows=2, capacity=640)
    for row, length in enumerate(LENGTHS):
        target.forward(cache, [row], _chain(0, [(7 * row + i) % 50 + 3 for i in range(length)], target.device))
    steps = {0: [11, 12, 13], 1: [21, 22]}  # ragged too: 3 and 2 tokens
    block = build_block([LENGTHS[r] for r in rows], [steps[r] for r in rows],
                        [list(range(-1, len(steps[r]) - 1)) for r in rows], 0, target.device)
    out = target.forward(cache, rows, block)
    assert cache.per_row == (per_row and len(rows) > 1)
    return out.logits


def test_rows_attend_over_their_own_lengths():
    target = Target(tiny_llama(seed=3))
    assert target._per_row_attention  # a Llama under SDPA qualifies
    batched = _logits(target, [0, 1], per_row=True)  # [2, 3, vocab]
    padded = _logits(target, [0, 1], per_row=False)
    alone = [_logits(target, [row], per_row=True)[0] for row in (0, 1)]
    torch.testing.assert_close(batched, padded, rtol=1e-5, atol=1e-5)
    # alone, the linear layers see fewer rows: float32 sums in another order (the padded batch differs as much)
    torch.testing.assert_close(batched[0], alone[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(batched[1, :2], alone[1], rtol=1e-4, atol=1e-4)  # its 2 real positions


def test_rows_are_read_in_place():
    """The dynamic cache hands attention each row's buffer over that row's length (no padded gather)."""
    target = Target(tiny_llama(seed=3))
    target._per_row_attention = True
    cache = target.new_cache(rows=2, capacity=640)
    for row, length in enumerate(LENGTHS):
        target.forward(cache, [row], _chain(0, [3 + i % 200 for i in range(length)], target.device))
    target.forward(cache, [0, 1], build_block(list(LENGTHS), [[5], [6]], [[-1], [-1]], 0, target.device))
    for layer in range(target.num_layers):
        (keys0, _, n0), (keys1, _, n1) = cache.rows_written(layer)
        assert (n0, n1) == (LENGTHS[0] + 1, LENGTHS[1] + 1)
        assert keys0.data_ptr() == cache.layers[layer].buffers[0][0].data_ptr()


def test_alike_rows_keep_the_padded_batch():
    """One attention call per row costs more than the batch's one where contexts are alike."""
    target = Target(tiny_llama(seed=3))
    cache = target.new_cache(rows=2, capacity=64)
    for row in range(2):
        target.forward(cache, [row], _chain(0, list(range(3, 43)), target.device))
    target.forward(cache, [0, 1], build_block([40, 40], [[5], [6, 7]], [[-1], [-1, 0]], 0, target.device))
    assert not cache.per_row
