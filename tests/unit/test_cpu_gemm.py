"""The CPU linear kernel (backends/cpu/skinny.py): same products as F.linear, scoped to our passes, lossless when
forced on."""
import pytest
import torch

from specdecode.backends.cpu.skinny import MAX_ROWS, SkinnyLinears, helps, padded_rows, skinny_linear
from specdecode.config import GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.core.target import Target
from tests.tiny import tiny_drafter


@pytest.mark.parametrize("rows, padded", [(1, 2), (2, 2), (3, 4), (4, 4), (5, 5), (6, 6), (7, 8), (8, 8), (9, 16),
                                          (15, 16), (16, 16), (17, 24), (25, 32), (250, 256)])
def test_padded_rows(rows, padded):
    assert padded_rows(rows) == padded


@pytest.mark.parametrize("shape", [(1, 64), (2, 64), (3, 64), (1, 5, 64), (3, 7, 64), (2, 6, 64), (MAX_ROWS + 1, 64)])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("column_major", [False, True])
def test_same_product_as_linear(shape, with_bias, column_major):
    torch.manual_seed(0)
    x, weight = torch.randn(*shape), torch.randn(48, 64)
    if column_major:  # the layout of our own outputs, which elementwise ops pass on to the next layer
        x = x.reshape(-1, 64).t().contiguous().t().reshape(shape)
    bias = torch.randn(48) if with_bias else None
    out = skinny_linear(x, weight, bias)
    assert out.shape == (*shape[:-1], 48)
    torch.testing.assert_close(out, torch.nn.functional.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_swap_is_scoped(tiny_model):
    linear = next(m for m in tiny_model.modules() if isinstance(m, torch.nn.Linear))
    swap = SkinnyLinears(tiny_model)
    with pytest.raises(ValueError):
        with swap:
            assert "forward" in linear.__dict__
            with pytest.raises(RuntimeError):
                swap.__enter__()  # not re-entrant
            raise ValueError("an error inside a pass")
    assert "forward" not in linear.__dict__  # restored even on error: transformers sees the stock module


def test_inputs_are_multiplied_row_major(monkeypatch):
    """A column-major input (what our transposed outputs become after an elementwise op) is copied to
    row-major before the product: multiplied as it is, X^T is row-major and MKL runs ~4x slower."""
    x, weight = torch.randn(64, 3).t(), torch.randn(48, 64)  # x [3, 64], column-major
    seen = []
    real = torch.Tensor.t
    monkeypatch.setattr(torch.Tensor, "t", lambda self: seen.append(self.is_contiguous()) or real(self))
    out = skinny_linear(x, weight, None)
    assert seen[0] is True  # the operand of W @ X^T
    assert not out.is_contiguous()  # (the output stays transposed: copying it would cost more)


def test_tiny_models_keep_the_stock_kernel(tiny_model):
    assert helps(tiny_model) is None  # weights in cache: nothing to gain, nothing measured


@pytest.mark.parametrize("sweeps, expected", [
    # ms per sweep {(rows, 0 = F.linear | 1 = skinny)}: measured in a fresh process on the dev VM, where the
    # sum rule (skinny < 0.9 x stock over 1 + 8 rows) refused the kernel that halves a one-token pass
    ({(1, 0): 47.0, (1, 1): 29.3, (8, 0): 60.9, (8, 1): 70.0}, 1),
    ({(1, 0): 46.0, (1, 1): 20.2, (8, 0): 58.9, (8, 1): 45.8}, 1),
    ({(1, 0): 20.0, (1, 1): 19.0, (8, 0): 40.0, (8, 1): 32.0}, None),  # no clear gain at one row nor at 8
    ({(1, 0): 47.0, (1, 1): 20.0, (8, 0): 40.0, (8, 1): 60.0}, None),  # a verify pass 1.5x slower
    # the Qwen 1.5B in fp32 on the AMD EPYC VM: one row a draw, 8 rows 2.4x apart
    ({(1, 0): 21.7, (1, 1): 22.6, (8, 0): 82.6, (8, 1): 34.8}, 2),
])
def test_kernel_choice_rule(monkeypatch, sweeps, expected):
    """helps() takes the kernel from one row on a clear one-row gain (refusing clear losses at 8 rows), else
    from two rows on a clear 8-row gain."""
    monkeypatch.setattr("specdecode.backends.cpu.skinny._sweep_ms", lambda *args, **kwargs: sweeps)
    big = torch.nn.Sequential(torch.nn.Linear(3072, 3072, bias=False))  # 36 MiB: beyond MIN_WEIGHT_BYTES
    assert helps(big) == expected


def test_from_two_rows_one_row_keeps_the_stock_kernel(monkeypatch):
    """With min_rows 2 a one-row product is F.linear's own (GEMV), a two-row one goes through W @ X^T."""
    weight = torch.randn(48, 64)
    calls = []
    real = torch.Tensor.t
    monkeypatch.setattr(torch.Tensor, "t", lambda self: calls.append(self.shape) or real(self))
    one = skinny_linear(torch.randn(1, 64), weight, None, min_rows=2)
    assert calls == []
    two = skinny_linear(torch.randn(2, 64), weight, None, min_rows=2)
    assert calls and one.shape == (1, 48) and two.shape == (2, 48)


@pytest.mark.parametrize("name", ["none", "prompt-lookup", "eagle", "layer-skip"])
def test_greedy_equals_plain_with_kernel_forced_on(name, tiny_model, tiny_tokenizer, tiny_draft_dir):
    """The same greedy equivalence as test_greedy_tiny, through the W @ X^T kernel (which the auto choice
    never picks for a tiny model)."""
    target = Target(tiny_model, tiny_tokenizer, skinny_gemm=True)
    assert target.skinny_gemm
    spec = SpecConfig(k=4)
    engine = Engine(target, tiny_drafter(target, name, spec, tiny_draft_dir, row_cost=0.0), spec)  # drafts asserted
    ids = tiny_tokenizer("the cat sat on the mat. the cat sat on the mat. the cat")["input_ids"]
    expected = tiny_model.generate(torch.tensor([ids]), max_new_tokens=40, min_new_tokens=40, do_sample=False,
                                   pad_token_id=0, eos_token_id=None)[0, len(ids):].tolist()
    result = engine.generate(ids, SamplingConfig(), GenerationConfig(max_new_tokens=40, stop_on_eos=False))
    assert result.token_ids == expected
    if name != "none":
        assert result.metrics.proposed > 0
