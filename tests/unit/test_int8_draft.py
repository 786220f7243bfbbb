"""Int8 draft weights (backends/cpu/int8.py): what is replaced, that the draft still predicts like its fp32 self, and
the errors for a choice that cannot be honoured."""
import pytest
import torch
from torch import nn

from specdecode.backends.cpu import native
from specdecode.backends.cpu.int8 import Int8Linear, available, quantize_linears
from specdecode.config import ModelConfig
from specdecode.core.target import Target
from specdecode.errors import ConfigError
from specdecode.loading.formats import draft_format
from tests.tiny import tiny_llama

pytestmark = pytest.mark.skipif(not available(), reason="this torch build lacks the int8-weight CPU kernel")


def test_every_linear_is_replaced_and_the_target_still_reads_its_vocabulary():
    model = tiny_llama(vocab_size=300, layers=2, seed=3)
    assert quantize_linears(model)
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert sum(isinstance(m, Int8Linear) for m in model.modules()) == 2 * 7 + 1
    assert isinstance(model.get_input_embeddings(), nn.Embedding)  # embeddings stay full precision
    assert Target(model).vocab_size == 300


@torch.inference_mode()
def test_int8_logits_stay_close_to_full_precision():
    full = tiny_llama(layers=2, seed=4)
    int8 = tiny_llama(layers=2, seed=4)
    quantize_linears(int8)
    ids = torch.randint(3, 259, (1, 40), generator=torch.Generator().manual_seed(0))
    a, b = full(ids).logits[0], int8(ids).logits[0]  # [40, vocab]
    assert not torch.equal(a, b)  # really quantized
    assert torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), 0) > 0.995  # measured 0.9989
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.8  # measured 0.9 (a random model: near ties)


def test_draft_weights_choice():
    cpu = torch.device("cpu")
    best = "int4-all" if native.missing() is None else "int8"
    assert draft_format("auto", cpu) == best and draft_format("int8", cpu) == "int8"
    assert draft_format("same", cpu) == "same"
    assert draft_format("auto", torch.device("cuda")) == "same" and draft_format("same", torch.device("cuda")) == "same"
    with pytest.raises(ConfigError, match="not on cuda"):
        draft_format("int8", torch.device("cuda"))
    with pytest.raises(ConfigError, match="must be one of"):
        draft_format("int3", cpu)


@torch.inference_mode()
def test_bias_is_kept():
    """Draft models with biased projections (Qwen's q/k/v) keep their bias under int8 weights."""
    torch.manual_seed(0)
    linear = nn.Linear(32, 16, bias=True)
    torch.nn.init.normal_(linear.bias, std=1.0)
    x = torch.randn(3, 32)
    torch.testing.assert_close(Int8Linear(linear)(x), linear(x), rtol=0.05, atol=0.05)


def test_target_weights_choice():
    """--weights / ModelConfig.weights: the packaged models default to int4 on the CPU (where the native kernel
    cannot run: the Qwen pair to torch's int8, SmolLM2 to its float weights), anything else to its dtype's own
    weights; quantized weights off the CPU are one line, bad values too."""
    from specdecode.errors import ModelError
    from specdecode.loading.load import resolve_weights

    packed = native.missing() is None
    assert resolve_weights(ModelConfig("qwen2.5-coder-1.5b", device="cpu", weights="auto")) == (
        "int4" if packed else "int8")
    assert resolve_weights(ModelConfig("qwen2.5-coder-1.5b", device="cuda", weights="auto")) == "same"
    assert resolve_weights(ModelConfig(None, device="cpu", weights="auto")) == ("int4" if packed else "same")
    assert resolve_weights(ModelConfig("some/dir", device="cpu", weights="auto")) == "same"
    assert resolve_weights(ModelConfig("some/dir", device="cpu", weights="int8")) == "int8"
    assert resolve_weights(ModelConfig("qwen2.5-coder-1.5b", device="cpu", weights="same")) == "same"
    assert resolve_weights(ModelConfig(None, device="cpu", weights="bf16")) == "bf16"
    with pytest.raises(ModelError, match="not on cuda"):
        resolve_weights(ModelConfig(None, device="cuda", weights="int8"))
    with pytest.raises(ConfigError, match="weights must be one of"):
        resolve_weights(ModelConfig(None, device="cpu", weights="int3"))


def test_auto_weights_fall_back_per_model_where_the_native_kernel_cannot_run(monkeypatch):
    from specdecode.loading import formats as weights
    from specdecode.loading.load import resolve_weights

    monkeypatch.setattr(weights, "unavailable", lambda fmt, device: None if fmt == "int8" else "no kernel here")
    assert resolve_weights(ModelConfig("qwen2.5-coder-1.5b", device="cpu", weights="auto")) == "int8"
    assert resolve_weights(ModelConfig("smollm2-135m-instruct", device="cpu", weights="auto")) == "same"


def test_load_model_with_int8_weights(tiny_model_dir):
    """`--weights int8` packs q8 layers with the native kernel (backends/cpu/), torch's int8 kernel where it cannot run;
    a layer whose shape does not fit the packed layout (the tiny head's 259 outputs) keeps its float weights."""
    from specdecode.backends.cpu.linear import PackedLinear
    from specdecode.loading.load import load_model

    model = load_model(ModelConfig(tiny_model_dir, weights="int8")).model
    kind = PackedLinear if native.missing() is None else Int8Linear
    layers = [m for name, m in model.named_modules() if name.endswith("_proj")]
    assert layers and all(isinstance(m, kind) for m in layers)
    head = model.get_output_embeddings()
    assert isinstance(head, nn.Linear if kind is PackedLinear else Int8Linear)
