"""The packed-model cache (loading/packed_cache.py): a second load reads the packed tensors, not the float
weights, and gives the very same model; a damaged file is rebuilt."""
import pytest
import torch
import transformers

from specdecode.backends.cpu import native
from specdecode.config import ModelConfig
from specdecode.core.target import Target
from specdecode.core.trees import build_block
from specdecode.loading.load import load_model

pytestmark = pytest.mark.skipif(native.missing() is not None, reason=str(native.missing()))
PROMPT = [5, 17, 99, 3, 42, 42, 7, 120, 64, 9, 33]


def logits(model) -> torch.Tensor:
    target = Target(model)
    block = build_block([0], [PROMPT], [list(range(-1, len(PROMPT) - 1))], target.pad_id, "cpu")
    return target.forward(target.new_cache(), [0], block).logits


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("weights", ["int4", "int8"])
def test_a_second_load_reads_the_packed_copy_and_is_the_same_model(weights, tiny_model_dir, cache_dir, monkeypatch):
    first = load_model(ModelConfig(tiny_model_dir, weights=weights)).model
    files = list((cache_dir / "packed").glob(f"*-{weights}-*.pt"))
    assert len(files) == 1

    def no_float_weights(*args, **kwargs):
        raise AssertionError("the float weights were read again")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_float_weights)
    second = load_model(ModelConfig(tiny_model_dir, weights=weights)).model
    assert Target(second).packed_decoder
    assert torch.equal(logits(first), logits(second))
    for (name, a), (_, b) in zip(sorted(first.state_dict().items()), sorted(second.state_dict().items())):
        assert torch.equal(a, b), name
    assert second.generation_config.eos_token_id == first.generation_config.eos_token_id


def test_a_damaged_copy_is_packed_again(tiny_model_dir, cache_dir):
    reference = logits(load_model(ModelConfig(tiny_model_dir, weights="int4")).model)
    [path] = (cache_dir / "packed").glob("*.pt")
    path.write_bytes(b"not a checkpoint")
    assert torch.equal(logits(load_model(ModelConfig(tiny_model_dir, weights="int4")).model), reference)
    assert path.stat().st_size > 1000  # rewritten


def test_a_changed_packing_replaces_the_older_copy(tiny_model_dir, cache_dir, monkeypatch, tmp_path):
    """A new version of the packing code (another digest) writes a new copy and deletes the old one; copies of
    other formats stay."""
    from specdecode.loading import packed_cache

    load_model(ModelConfig(tiny_model_dir, weights="int8"))
    load_model(ModelConfig(tiny_model_dir, weights="int4"))
    [old] = (cache_dir / "packed").glob("*-int4-*.pt")
    earlier = old.with_name(old.stem.split("-int4-")[0] + "-int4-0123456789abcdef.pt")  # an earlier version's name
    earlier.write_bytes(b"an older packed copy")
    changed = tmp_path / "linear.py"
    changed.write_text(packed_cache._CODE[0].read_text() + "\n# a newer packing\n")
    monkeypatch.setattr(packed_cache, "_CODE", (changed,))
    load_model(ModelConfig(tiny_model_dir, weights="int4"))
    [new] = (cache_dir / "packed").glob("*-int4-*.pt")
    assert new != old and not old.exists() and not earlier.exists()
    assert len(list((cache_dir / "packed").glob("*-int8-*.pt"))) == 1


def test_float_weights_are_not_cached(tiny_model_dir, cache_dir):
    load_model(ModelConfig(tiny_model_dir, weights="fp32"))
    assert not (cache_dir / "packed").exists()


@pytest.mark.slow
def test_a_gguf_loaded_packed_never_writes_its_float_weights(cache_dir, monkeypatch):
    """The default GGUF loaded in int4 with an empty cache: the converted copy holds no weights (the Qwen 1.5B's
    would be 6.2 GB), and the second load converts nothing."""
    from specdecode.loading import gguf

    first = load_model(ModelConfig(None, weights="int4")).model
    [directory] = [p for p in cache_dir.iterdir() if p.name.startswith("SmolLM2")]
    assert (directory / "config.json").is_file() and not list(directory.glob("*.safetensors"))
    assert len(list((cache_dir / "packed").glob("*-int4-*.pt"))) == 1

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf, "_convert_gguf", no_conversion)
    assert torch.equal(logits(first), logits(load_model(ModelConfig(None, weights="int4")).model))


def test_writing_the_weights_later_keeps_the_packed_copy_name(tmp_path):
    """A float load writes a converted copy's weights after a packed load built it without them: its manifest
    gains their entries, and the packed copy's name must not change (it would be packed again)."""
    import json

    from specdecode.loading import packed_cache

    directory = tmp_path / "model"
    directory.mkdir()
    files = {"config.json": "1" * 64, "tokenizer.json": "2" * 64}
    manifest = directory / "specdecode-manifest.json"
    manifest.write_text(json.dumps({"format": 1, "source": "m.gguf", "files": files}))
    before = packed_cache.path_for(str(directory), "int4", tmp_path)
    manifest.write_text(json.dumps({"format": 1, "source": "m.gguf",
                                    "files": {**files, "model.safetensors": "3" * 64}}))
    assert packed_cache.path_for(str(directory), "int4", tmp_path) == before
    manifest.write_text(json.dumps({"format": 1, "source": "m.gguf", "files": {**files, "config.json": "4" * 64}}))
    assert packed_cache.path_for(str(directory), "int4", tmp_path) != before  # another model: another copy


def test_a_packed_gemma_keeps_its_embedding_scale(tmp_path, cache_dir, tiny_tokenizer, monkeypatch):
    """Gemma's embedding module scales what it looks up by sqrt(hidden): the half-precision table that replaces
    it scales too, in the packed model and in its cached copy (without it the model's output is noise)."""
    from tests.tiny import save_tiny, tiny_gemma3

    model = tiny_gemma3()
    directory = save_tiny(tmp_path / "gemma", model, tiny_tokenizer)
    ids = torch.tensor([PROMPT])
    want = model.model.embed_tokens(ids)  # [1, n, hidden], scaled
    first = load_model(ModelConfig(directory, weights="int4")).model
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: 1 / 0)
    second = load_model(ModelConfig(directory, weights="int4")).model
    for packed in (first, second):
        embedding = packed.get_input_embeddings()
        assert type(embedding).__name__ == "HalfEmbedding"
        assert torch.allclose(embedding(ids), want, rtol=1e-3, atol=0)  # the table's fp16 rounding only
    assert torch.equal(logits(first), logits(second))
