"""`--drafter auto` (the default): the best measured drafter for the device, falling back to model-free
prompt lookup when the model has no trained head; with a draft model, `hybrid` on the CPU (`draft-model` with a
confidence threshold, on CUDA, and with a draft model of another tokenizer: tests/unit/test_cross_tokenizer.py)."""
from specdecode.config import DrafterConfig, SpecConfig
from specdecode.core.target import Target
from specdecode.drafters import AUTO, best_drafter_name, build_drafter
from specdecode.drafters.draft_model import DraftModel
from specdecode.drafters.hybrid import Hybrid
from specdecode.server.service import ServeConfig, build_drafters
from tests.tiny import tiny_llama


def test_auto_falls_back_to_prompt_lookup_without_a_head():
    target = Target(tiny_llama())
    drafter = build_drafter(target, DrafterConfig(AUTO), SpecConfig())
    assert drafter.name == "prompt-lookup"


def test_best_drafter_per_device():
    assert best_drafter_name("cpu") == "prompt-lookup"
    assert best_drafter_name("cuda") == "prompt-lookup"


def test_with_a_draft_model():
    assert best_drafter_name("cpu", has_draft_model=True) == "hybrid"
    assert best_drafter_name("cpu", has_draft_model=True, confidence=True) == "draft-model"  # hybrid reads none
    assert best_drafter_name("cuda", has_draft_model=True) == "draft-model"  # hybrid not measured there


def test_auto_builds_the_hybrid_around_a_draft_model_of_the_same_tokenizer(tiny_target, tiny_draft_dir):
    drafter = build_drafter(tiny_target, DrafterConfig(AUTO, draft_model=tiny_draft_dir), SpecConfig(k=3))
    assert isinstance(drafter, Hybrid) and isinstance(drafter.model, DraftModel) and drafter.depth == 3
    assert drafter.model.budget is not None  # its chain priced by measured costs, as the registry's hybrid
    drafter = build_drafter(tiny_target, DrafterConfig(AUTO, draft_model=tiny_draft_dir), SpecConfig(confidence=0.5))
    assert isinstance(drafter, DraftModel) and drafter.budget is None  # the threshold ends its drafts


def test_a_server_names_its_auto_drafter_by_what_it_built(tiny_target, tiny_draft_dir):
    config = ServeConfig(drafter=DrafterConfig(AUTO, draft_model=tiny_draft_dir), allowed=("draft-model", "hybrid"))
    drafters = build_drafters(tiny_target, config.resolved(), auto=True)
    assert list(drafters) == ["hybrid", "draft-model"] and isinstance(drafters["hybrid"], Hybrid)
