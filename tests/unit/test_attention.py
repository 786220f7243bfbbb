"""Grouped attention (fast path) computes exactly what transformers' SDPA path computes with repeated heads."""
import pytest
import torch
from transformers.integrations.sdpa_attention import repeat_kv

from specdecode.backends.attention import NAME, grouped_sdpa_forward, using_grouped_attention


class _Module(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


@pytest.mark.parametrize("q", [1, 5])
def test_grouped_equals_repeated_heads(q):
    torch.manual_seed(0)
    b, kv_heads, groups, d, s = 2, 2, 3, 8, 11
    query = torch.randn(b, kv_heads * groups, q, d)
    key, value = torch.randn(b, kv_heads, s, d), torch.randn(b, kv_heads, s, d)
    mask = torch.rand(b, 1, q, s) > 0.4
    mask[..., 0] = True  # every query sees something
    expected = torch.nn.functional.scaled_dot_product_attention(
        query, repeat_kv(key, groups), repeat_kv(value, groups), attn_mask=mask).transpose(1, 2)
    out, _ = grouped_sdpa_forward(_Module(), query, key, value, mask, scaling=d ** -0.5)
    assert out.shape == (b, q, kv_heads * groups, d)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    # a wrong fold (query rows paired with the wrong mask row) must be caught by this comparison
    if q > 1:
        wrong, _ = grouped_sdpa_forward(_Module(), query, key, value, mask.flip(2), scaling=d ** -0.5)
        assert not torch.allclose(wrong, expected, atol=1e-3)


def test_switch_is_scoped():
    class Config:
        _attn_implementation = "sdpa"

    config = Config()
    with pytest.raises(RuntimeError):
        with using_grouped_attention(config):
            assert config._attn_implementation == NAME
            raise RuntimeError
    assert config._attn_implementation == "sdpa"
    config._attn_implementation = "eager"  # models on other kernels keep them
    with using_grouped_attention(config):
        assert config._attn_implementation == "eager"


def test_grouped_attention_keeps_the_models_scaling():
    """Models whose attention scale is not 1/sqrt(head_dim) (Gemma's query_pre_attn_scalar, ...) get it too:
    the default scale would pass the test above, whose scaling is the default."""
    torch.manual_seed(1)
    b, kv_heads, groups, q, d, s = 1, 2, 3, 4, 8, 9
    query = torch.randn(b, kv_heads * groups, q, d)
    key, value = torch.randn(b, kv_heads, s, d), torch.randn(b, kv_heads, s, d)
    mask = torch.ones(b, 1, q, s, dtype=torch.bool)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query, repeat_kv(key, groups), repeat_kv(value, groups), attn_mask=mask, scale=0.05).transpose(1, 2)
    out, _ = grouped_sdpa_forward(_Module(), query, key, value, mask, scaling=0.05)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
