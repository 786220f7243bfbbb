"""Shared fixtures. Tiny models are built in-process; the real default model is loaded once per session."""
from __future__ import annotations

import pytest
import torch

from specdecode.config import ModelConfig
from specdecode.core.target import Target
from tests.tiny import byte_tokenizer, save_tiny, tiny_llama


@pytest.fixture(autouse=True)
def _threads(request):
    """Tiny models: one thread (OpenMP spin-waiting makes tiny ops crawl on a busy 2-core machine); real-model
    (slow) tests: two."""
    torch.set_num_threads(2 if request.node.get_closest_marker("slow") else 1)
    yield


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return byte_tokenizer()


@pytest.fixture(scope="session")
def tiny_model():
    return tiny_llama()


@pytest.fixture(scope="session")
def tiny_target(tiny_model, tiny_tokenizer) -> Target:
    return Target(tiny_model, tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_packed_target(tiny_model, tiny_tokenizer) -> Target:
    """The tiny model in int4 on the native decoder (a packed target: its KV does not depend on the pass that
    wrote it, so finished rows' prefixes are reused)."""
    import copy

    from specdecode.backends.cpu import native
    from specdecode.loading.formats import apply
    from specdecode.loading.load import exact_attention

    if native.missing():
        pytest.skip(native.missing())
    model = copy.deepcopy(tiny_model)
    apply(model, "int4")
    exact_attention(model)
    return Target(model, tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_model, tiny_tokenizer) -> str:
    return save_tiny(tmp_path_factory.mktemp("tiny"), tiny_model, tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_draft_dir(tmp_path_factory, tiny_tokenizer) -> str:
    """A different random model with the same tokenizer: a draft model for the tiny target."""
    return save_tiny(tmp_path_factory.mktemp("tiny-draft"), tiny_llama(layers=2, seed=1), tiny_tokenizer)


@pytest.fixture(scope="session")
def default_model():
    """The real SmolLM2-135M-Instruct (slow tests only)."""
    from specdecode.loading.load import load_model

    return load_model(ModelConfig(weights="same"))


@pytest.fixture(scope="session")
def default_target(default_model) -> Target:
    return Target(default_model.model, default_model.tokenizer)
