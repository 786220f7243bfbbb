"""`--drafter auto` (the default): the best measured drafter for the device, falling back to model-free
prompt lookup when the model has no trained head."""
from specdecode.config import DrafterConfig, SpecConfig
from specdecode.core.target import Target
from specdecode.drafters import AUTO, best_drafter_name, build_drafter
from tests.tiny import tiny_llama


def test_auto_falls_back_to_prompt_lookup_without_a_head():
    target = Target(tiny_llama())
    drafter = build_drafter(target, DrafterConfig(AUTO), SpecConfig())
    assert drafter.name == "prompt-lookup"


def test_best_drafter_per_device():
    assert best_drafter_name("cpu") == "prompt-lookup"
    assert best_drafter_name("cuda") == "prompt-lookup"
