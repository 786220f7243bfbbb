"""Quantized linear layers (backends/cpu/): the kernel against a float reference of the same integer arithmetic, row
independence (what makes speculation over a quantized target lossless), packing a model, the GGUF-derived
formats and the weight choices."""
import warnings

import pytest
import torch
from torch import nn

from specdecode.backends.cpu import native
from specdecode.backends.cpu.linear import (
    BLOCK,
    HalfEmbedding,
    PackedLinear,
    pack_model,
    packable,
    packed_matmul,
    quantize_activations,
    quantize_q4,
    quantize_q8,
)
from specdecode.config import ModelConfig
from tests.tiny import tiny_llama

pytestmark = pytest.mark.skipif(native.missing() is not None, reason=f"no native kernel: {native.missing()}")


def _linear(n: int, k: int, seed: int, bias: bool = False) -> nn.Linear:
    torch.manual_seed(seed)
    linear = nn.Linear(k, n, bias=bias)
    nn.init.normal_(linear.weight, std=0.05)
    if bias:
        nn.init.normal_(linear.bias, std=1.0)
    return linear


def _reference(layer: PackedLinear, x: torch.Tensor) -> torch.Tensor:
    """The layer's product in float64 from its dequantised weight and the dequantised int8 activations."""
    codes, scale, _ = quantize_activations(x)
    rows, k = x.shape
    xq = (codes.double().reshape(rows, k // BLOCK, BLOCK) * scale.double()[..., None]).reshape(rows, k)
    out = xq @ layer.weight.double().t()
    return out if layer.bias is None else out + layer.bias.double()


@pytest.mark.parametrize("fmt", ["q4", "q8"])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9, 21])
@torch.inference_mode()
def test_kernel_equals_its_float_reference(fmt, rows):
    """The integer dot products are exact, so the kernel differs from the float64 reference only by float32
    rounding of the per-block sums: measured max relative error ~1e-7; allowed 1e-5 of the output's scale."""
    layer = PackedLinear(_linear(136, 320, seed=rows, bias=True), fmt)
    x = torch.randn(rows, 320, generator=torch.Generator().manual_seed(rows))
    out, reference = layer(x).double(), _reference(layer, x)
    assert (out - reference).abs().max() <= 1e-5 * reference.abs().max()


@pytest.mark.parametrize("fmt, tolerance", [("q4", 0.12), ("q8", 0.01)])
@torch.inference_mode()
def test_close_to_the_float_layer(fmt, tolerance):
    """Against the unquantized layer: relative error of the output (measured q4 ~0.08, q8 ~0.006 on Gaussian
    weights and inputs; 4 bits a weight is coarse, int8 activations add ~0.4%)."""
    linear = _linear(256, 512, seed=1)
    x = torch.randn(8, 512, generator=torch.Generator().manual_seed(2))
    out, exact = PackedLinear(linear, fmt)(x), linear(x)
    assert (out - exact).norm() / exact.norm() < tolerance
    assert (out - exact).norm() / exact.norm() > 1e-4  # really quantized


@pytest.mark.parametrize("fmt", ["q4", "q8"])
@torch.inference_mode()
def test_a_row_does_not_depend_on_its_batch(fmt):
    """Bit-identical per row whatever else is in the call: a verify pass of k tokens gives each token the
    one-token logits."""
    layer = PackedLinear(_linear(64, 256, seed=3), fmt)
    x = torch.randn(7, 256, generator=torch.Generator().manual_seed(4))
    together = layer(x)
    for i in range(7):
        assert torch.equal(together[i], layer(x[i:i + 1])[0])
    assert torch.equal(layer(x[2:6]), together[2:6])


def test_packing_round_trips_the_codes():
    """The packed layout read back (PackedLinear.weight) is the quantized weight, column order included."""
    weight = _linear(48, 96, seed=5).weight
    codes, d, m = quantize_q4(weight)
    q4 = (codes.float() * d.float()[..., None] + m.float()[..., None]).reshape(48, 96)
    assert torch.equal(PackedLinear(_linear(48, 96, seed=5), "q4").weight, q4)
    codes8, d8 = quantize_q8(weight)
    assert torch.equal(PackedLinear(_linear(48, 96, seed=5), "q8").weight,
                       (codes8.float() * d8.float()[..., None]).reshape(48, 96))
    # q4's grid takes each block's min and max as its ends: a weight already on a 4-bit grid is kept exactly
    grid = torch.randint(0, 16, (8, 64)).float() * 0.25 - 1.0
    grid[:, ::BLOCK] = -1.0
    grid[:, 1::BLOCK] = 2.75
    layer = nn.Linear(64, 8, bias=False)
    layer.weight.data = grid
    assert torch.equal(PackedLinear(layer, "q4").weight, grid)


def test_shapes_that_do_not_fit_are_refused():
    assert packable(nn.Linear(64, 16)) and not packable(nn.Linear(48, 16)) and not packable(nn.Linear(64, 12))
    with pytest.raises(ValueError, match="does not fit"):
        PackedLinear(nn.Linear(48, 16), "q4")
    with pytest.raises(ValueError, match="unknown packed format"):
        PackedLinear(nn.Linear(64, 16), "q3")


@torch.inference_mode()
def test_pack_model_replaces_what_fits():
    model = tiny_llama(vocab_size=264, layers=2, seed=3)
    ids = torch.randint(3, 259, (1, 24), generator=torch.Generator().manual_seed(0))
    before = model(ids).logits
    assert pack_model(model, "q4", head_fmt="q8") == 2 * 7 + 1
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert model.get_output_embeddings().fmt == "q8" and model.model.layers[0].mlp.down_proj.fmt == "q4"
    assert isinstance(model.get_input_embeddings(), HalfEmbedding)
    after = model(ids).logits
    # a random model's logits move far under 4 bits (measured cosine 0.885; 8 bits below)
    assert torch.nn.functional.cosine_similarity(before.flatten(), after.flatten(), 0) > 0.8
    int8 = tiny_llama(vocab_size=264, layers=2, seed=3)
    pack_model(int8, "q8")
    assert torch.nn.functional.cosine_similarity(before.flatten(), int8(ids).logits.flatten(), 0) > 0.99


def test_int4_keeps_the_head_in_8_bits_and_int4_all_does_not():
    from specdecode.loading.formats import apply

    for fmt, head in (("int4", "q8"), ("int4-all", "q4")):
        model = tiny_llama(vocab_size=264, layers=1, seed=3)
        assert apply(model, fmt) == fmt
        assert model.get_output_embeddings().fmt == head and model.model.layers[0].self_attn.q_proj.fmt == "q4"


def test_default_gguf_formats_follow_its_tensor_types():
    """SmolLM2's GGUF: Q4_1 layers -> q4, its tied head follows token_embd (Q8_0) -> q8."""
    from specdecode.loading.formats import gguf_formats
    from specdecode.loading.names import default_gguf_path

    formats = gguf_formats(default_gguf_path())
    assert formats["layers.0.self_attn.q_proj"] == "q4" and formats["layers.29.mlp.down_proj"] == "q4"
    assert formats["lm_head"] == "q8"
    assert len(formats) == 30 * 7 + 1


def test_phi3_gguf_formats_name_its_fused_projections(tmp_path):
    """Phi-3's GGUF holds q/k/v in attn_qkv and gate/up in ffn_up: they name transformers' fused modules."""
    import gguf
    import numpy as np

    from specdecode.loading.formats import gguf_formats

    writer = gguf.GGUFWriter(tmp_path / "phi3.gguf", "phi3")
    writer.add_tensor("blk.0.attn_qkv.weight", np.zeros((96, 34), np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.ffn_up.weight", np.zeros((96, 18 * 2), np.uint8),
                      raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    writer.add_tensor("blk.0.ffn_down.weight", np.zeros((32, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert gguf_formats(tmp_path / "phi3.gguf") == {
        "layers.0.self_attn.qkv_proj": "q8", "layers.0.mlp.gate_up_proj": "q4", "layers.0.mlp.down_proj": None}


def test_weights_errors_are_one_line(tiny_model_dir):
    from specdecode.errors import ModelError
    from specdecode.loading.load import load_model

    with pytest.raises(ModelError, match="need a GGUF model"):
        load_model(ModelConfig(tiny_model_dir, weights="gguf"))
    with pytest.raises(ModelError, match="contradict dtype"):
        load_model(ModelConfig(tiny_model_dir, weights="fp32", dtype="bfloat16"))
    with pytest.raises(ModelError, match="float32 activations"):
        load_model(ModelConfig(tiny_model_dir, weights="int4", dtype="bfloat16"))


@pytest.mark.parametrize("weights", ["int3", "gguf4"])
def test_bad_weights_flag_exits_2(weights, capsys):
    from specdecode.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--weights", weights, "hi"])
    assert exit_info.value.code == 2
    assert "--weights" in capsys.readouterr().err


@torch.inference_mode()
def test_row_exact_attention_matches_sdpa_and_is_row_independent():
    """attention.row_exact_forward: SDPA's values (to float rounding) under a tree mask, and each row's output
    equal bit for bit to attending alone over exactly its visible keys."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from specdecode.backends.attention import row_exact_forward

    torch.manual_seed(0)
    module = nn.Module()
    module.is_causal, module.num_key_value_groups = True, 2
    query, key, value = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 10, 16), torch.randn(1, 2, 10, 16)
    mask = torch.ones(1, 1, 3, 10, dtype=torch.bool)
    mask[0, 0, 0, 8:] = False  # node 0 sees the cache (7) and itself (7)
    mask[0, 0, 1, 9] = False  # node 1: sibling of node 2
    mask[0, 0, 2, 8] = False
    mask[0, 0, :, 7] = True
    exact, _ = row_exact_forward(module, query, key, value, mask)
    reference, _ = sdpa_attention_forward(module, query, key, value, mask)
    torch.testing.assert_close(exact, reference, rtol=1e-5, atol=1e-5)
    seen = [0, 1, 2, 3, 4, 5, 6, 7, 9]  # node 2 alone over its visible keys only
    alone, _ = row_exact_forward(module, query[:, :, 2:3], key[:, :, seen], value[:, :, seen], None)
    assert torch.equal(alone[0, 0], exact[0, 2])


@pytest.mark.parametrize("variant", [v for v in native.VARIANTS if v not in ("avx2", "portable")])
@pytest.mark.parametrize("fmt", ["q4", "q8"])
@torch.inference_mode()
def test_every_kernel_build_gives_the_same_bits(variant, fmt):
    """The VNNI and AMX builds compute the same integer sums as the AVX2 one and scale them in the same order, so every
    output is bit for bit the AVX2 build's: whatever the rows (the tile path takes 16 at a time and, in products
    this small, a q8 rest of 5 or more: 10 and 21 = 16 + 5 rows on tiles, 20 = 16 + 4 on the vector path; a q4 rest
    of 8 or more: 29 = 16 + 13 on tiles), whether N is a multiple of 16 (the tile path's two column groups) or not,
    and whether the blocks along K are even or odd (its pipeline takes them in pairs: K 320 and 288). A product of 1
    MiB of codes is large: q4 takes the tiles from 8 rows there (7 on the vector path, 8, 13, 29 = 16 + 13 on
    tiles). (Rows a build left unwritten would hold whatever the buffer held: test_kernel_equals_its_float_reference
    covers 21 rows too.)"""
    reason = native.lacking(variant)
    if reason:
        pytest.skip(reason)
    small = (1, 2, 5, 10, 16, 20, 21, 29, 37)
    for n, k, row_counts in ((48, 320, small), (40, 320, small), (48, 288, small), (2048, 1024, (7, 8, 13, 29))):
        layer = PackedLinear(_linear(n, k, seed=n + k), fmt)
        for rows in row_counts:
            x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
            ours = packed_matmul(x, layer.codes, layer.d, layer.m, threads=2, variant=variant)
            plain = packed_matmul(x, layer.codes, layer.d, layer.m, threads=2, variant="avx2")
            assert torch.equal(ours, plain), (n, k, rows)


@pytest.mark.parametrize("fmt", ["q4", "q8"])
@torch.inference_mode()
def test_the_portable_build_is_the_same_product(fmt):
    """The portable build (for CPUs without AVX2) runs the same intrinsics in SIMDe's plain C: the same integer sums,
    scaled in the same order, but with a multiply and an add where AVX2 fuses them, so it agrees with the AVX2 build
    to float32 rounding rather than bit for bit; and a row's result is still its own whatever it is batched with,
    which is what keeps speculation lossless within that build."""
    reason = native.lacking("portable")
    if reason:
        pytest.skip(reason)
    layer = PackedLinear(_linear(48, 320, seed=5), fmt)
    x = torch.randn(21, 320, generator=torch.Generator().manual_seed(3))
    ours = packed_matmul(x, layer.codes, layer.d, layer.m, threads=2, variant="portable")
    torch.testing.assert_close(ours, packed_matmul(x, layer.codes, layer.d, layer.m, variant="avx2"), rtol=1e-5,
                               atol=1e-5)
    for row in (0, 7, 20):
        alone = packed_matmul(x[row : row + 1], layer.codes, layer.d, layer.m, threads=1, variant="portable")
        assert torch.equal(alone[0], ours[row])


def test_the_variant_follows_the_cpu_flags(monkeypatch):
    """AMX where the CPU has the tiles (and VNNI), else VNNI, else AVX-512 VNNI, else AVX2, else the portable
    build; a variant the CPU lacks is refused in one line rather than run and crashing, and SPECDECODE_KERNELS
    chooses one."""
    base = frozenset({"avx2", "fma", "f16c"})
    cases = [(frozenset(), "portable"), (base, "avx2"), (base | {"avx512_vnni", "avx512vl"}, "avx512_vnni"),
             (base | {"avx_vnni"}, "vnni"), (base | {"avx_vnni", "avx512f", "amx_tile", "amx_int8"}, "amx")]
    monkeypatch.setattr(native, "built", lambda: tuple(native.VARIANTS))
    for flags, expected in cases:
        monkeypatch.setattr(native, "cpu_flags", lambda flags=flags: flags)
        assert native.best_variant() == expected
    monkeypatch.setattr(native, "cpu_flags", lambda: base)
    with pytest.raises(native.KernelUnavailable, match="the amx kernels need a CPU with amx_tile"):
        native.variant_index("amx")
    monkeypatch.setenv(native.CHOICE, "portable")
    assert native.best_variant() == "portable"
    monkeypatch.setenv(native.CHOICE, "amx")
    with pytest.raises(native.KernelUnavailable, match="SPECDECODE_KERNELS=amx: the amx kernels need"):
        native.best_variant()
    monkeypatch.setenv(native.CHOICE, "sse9")
    assert "unknown kernel variant 'sse9'" in native.missing()


def test_the_operators_check_what_they_are_given():
    """Tensors cross into the kernels with their dtypes and shapes checked: a wrong layout is an error that names
    it, never a read out of bounds."""
    layer = PackedLinear(_linear(16, 64, seed=1), "q4")
    x = torch.randn(3, 64)
    with pytest.raises(RuntimeError, match="packed weights codes must have shape"):
        packed_matmul(x[:, :32], layer.codes, layer.d, layer.m)
    with pytest.raises(RuntimeError, match="packed weights d must be Half"):
        packed_matmul(x, layer.codes, layer.d.float(), layer.m)
    with pytest.raises(RuntimeError, match="no kernel variant 99"):
        native.ops().packed_matmul(x, layer.codes, layer.d, layer.m, 0, 99)


def test_packed_layers_trace_under_torch_compile():
    """The operators have Meta kernels: a packed layer's forward traces with fake tensors (torch.compile's first
    step) and gives its shape without running the kernel."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    layer = PackedLinear(_linear(16, 64, seed=2), "q8")
    with FakeTensorMode(allow_non_fake_inputs=True):
        out = layer(torch.empty(5, 64))
    assert out.shape == (5, 16) and out.dtype == torch.float32


def test_a_packed_layer_compiles_without_tracing_the_kernel_lookups():
    """torch.compile traces the operator's call alone (the variant is the layer's, chosen at load): through
    native.py's cached lookups Dynamo warned for each of them on every `generate --compile`."""
    layer = PackedLinear(_linear(16, 64, seed=2), "q8")
    x = torch.randn(3, 64)
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(layer, backend="eager", fullgraph=True)(x)
    assert not [str(w.message) for w in caught if "lru_cache" in str(w.message)]
    torch.testing.assert_close(out, layer(x), rtol=0, atol=0)


def test_pack_model_by_path_packs_only_what_the_formats_name():
    """`--weights gguf`: each layer in the format its GGUF tensor maps to; unnamed (or float) layers stay float."""
    model = tiny_llama(vocab_size=264, layers=2, seed=3)
    assert pack_model(model, by_path={"layers.0.mlp.down_proj": "q8", "layers.1.self_attn.q_proj": None,
                                      "lm_head": "q4"}) == 2
    assert model.model.layers[0].mlp.down_proj.fmt == "q8" and model.get_output_embeddings().fmt == "q4"
    assert isinstance(model.model.layers[1].self_attn.q_proj, nn.Linear)
    assert isinstance(model.model.layers[0].mlp.up_proj, nn.Linear)
