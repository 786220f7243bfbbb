"""The packed layout of backends/cpu/linear.py is the one kernels.c reads: byte by byte against its description,
and a row's output independent of its batch across several of the kernel's row tiles."""
import pytest
import torch
from torch import nn

from specdecode.backends.cpu import native
from specdecode.backends.cpu.linear import GROUP, PackedLinear, quantize_q4, quantize_q8

pytestmark = pytest.mark.skipif(native.missing() is not None, reason=f"no native kernel: {native.missing()}")


def _linear(n: int, k: int, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    linear = nn.Linear(k, n, bias=False)
    nn.init.normal_(linear.weight, std=0.05)
    return linear


def test_q4_bytes_hold_two_inputs_16_apart_column_by_column():
    """codes[g, b, 32 p + 4 c + i] = code(8 g + c, 4 p + i) | code(8 g + c, 4 p + 16 + i) << 4; d and m in
    column order."""
    linear = _linear(16, 64, seed=0)
    layer = PackedLinear(linear, "q4")
    codes, d, m = quantize_q4(linear.weight)  # [N, K/32, 32], [N, K/32]
    for g, b, p, c, i in [(0, 0, 0, 0, 0), (0, 1, 3, 7, 3), (1, 0, 2, 5, 1), (1, 1, 1, 2, 2)]:
        column = GROUP * g + c
        expected = int(codes[column, b, 4 * p + i]) | int(codes[column, b, 4 * p + 16 + i]) << 4
        assert int(layer.codes[g, b, 32 * p + 4 * c + i]) == expected
        assert layer.d[g, b, c] == d[column, b] and layer.m[g, b, c] == m[column, b]


def test_q8_bytes_interleave_the_columns_four_inputs_at_a_time():
    """codes[g, b, 32 t + 4 c + i] = code(8 g + c, 4 t + i); d in column order."""
    linear = _linear(16, 64, seed=1)
    layer = PackedLinear(linear, "q8")
    codes, d = quantize_q8(linear.weight)
    expected = codes.reshape(2, GROUP, 2, 8, 4).permute(0, 2, 3, 1, 4).reshape(2, 2, 256)
    assert torch.equal(layer.codes, expected)
    assert int(layer.codes[1, 0, 32 * 6 + 4 * 3 + 2]) == int(codes[GROUP + 3, 0, 4 * 6 + 2])
    assert torch.equal(layer.d, d.reshape(2, GROUP, 2).transpose(1, 2))


@pytest.mark.parametrize("fmt", ["q4", "q8"])
@torch.inference_mode()
def test_rows_beyond_one_tile_do_not_depend_on_their_batch(fmt):
    """17 rows span three of the kernel's row tiles; each row is bit for bit its one-row result."""
    layer = PackedLinear(_linear(40, 96, seed=2), fmt)
    x = torch.randn(17, 96, generator=torch.Generator().manual_seed(3))
    together = layer(x)
    for i in range(17):
        assert torch.equal(together[i], layer(x[i:i + 1])[0])
