"""Library API (SpecDecoder): bad arguments raise ConfigError/ModelError with a clear message, never a TypeError
from deep inside torch or the tokenizer, and nothing passed is silently ignored (tiny model saved to disk)."""
from __future__ import annotations

import pytest

from specdecode import SpecDecoder
from specdecode.config import DrafterConfig, GenerationConfig, ModelConfig, SamplingConfig, SpecConfig, Structure
from specdecode.errors import ConfigError, ModelError
from tests.tiny import byte_tokenizer, save_tiny, tiny_llama


@pytest.fixture(scope="module")
def decoder(tiny_model_dir) -> SpecDecoder:
    return SpecDecoder.load(tiny_model_dir, "prompt-lookup")


@pytest.mark.parametrize("make,needle", [
    (lambda m: dict(drafter=None), "drafter must be a name"),
    (lambda m: dict(drafter=DrafterConfig("prompt-lookup", exit_layer=2)), "exit_layer has no effect with drafter "
                                                                            "prompt-lookup"),
    (lambda m: dict(drafter=DrafterConfig("prompt-lookup", draft_model="x")), "draft_model has no effect"),
    (lambda m: dict(drafter=DrafterConfig("prompt-lookup", lookahead=(1, 4, 1))), "lookahead has no effect"),
    (lambda m: dict(drafter=DrafterConfig("prompt-lookup", draft_weights="int8")), "draft_weights has no effect"),
    (lambda m: dict(drafter=DrafterConfig("prompt-lookup", draft_vocab=4096)), "draft_vocab has no effect"),
    (lambda m: dict(drafter=DrafterConfig("draft-model", draft_model="x", draft_vocab=-1)),
     "draft_vocab must be 0 (the whole vocabulary), a number of tokens"),
    (lambda m: dict(drafter="auto", spec=SpecConfig(confidence=0.5)), "confidence has no effect"),
    (lambda m: dict(drafter=DrafterConfig("layer-skip", exit_layer="2")), "exit_layer must be an integer"),
    (lambda m: dict(drafter=DrafterConfig("lookahead", lookahead=(1, 4))), "lookahead must be three integers"),
    (lambda m: dict(model=ModelConfig(m, device="foo")), "expected cpu, cuda or cuda:N"),
    (lambda m: dict(model=ModelConfig(m, device=None)), "device must be a string"),
    (lambda m: dict(model=ModelConfig(m, weights="int3")), "weights must be one of"),
    (lambda m: dict(model=ModelConfig(m, kv_half=1)), "kv_half must be True or False"),
    (lambda m: dict(drafter="none", max_batch=0), "max_batch must be a positive integer"),
    (lambda m: dict(drafter="none", spec={"k": 3}), "spec must be a SpecConfig"),
    (lambda m: dict(model=ModelConfig(m, fast=True)), "fast must be a FastPathConfig"),
])
def test_load_refuses_bad_arguments(tiny_model_dir, make, needle):
    """The configs check themselves when made (ModelConfig, DrafterConfig) and load() checks how they go together;
    either way before anything loads."""
    with pytest.raises(ConfigError) as error:
        SpecDecoder.load(**{"model": tiny_model_dir, **make(tiny_model_dir)})
    assert needle in str(error.value)
    assert "--" not in str(error.value)  # the library names its own arguments, never the command line's flags


def test_load_refuses_a_model_that_is_not_a_path():
    with pytest.raises(ConfigError, match="model must be a path"):
        SpecDecoder.load(123, "none")
    with pytest.raises(ModelError, match="model not found"):
        SpecDecoder.load("/no/such/model", "none")


@pytest.mark.parametrize("config,needle", [
    (lambda: SpecConfig(k=2.5), "k must be an integer"),
    (lambda: SpecConfig(k="3"), "k must be an integer"),
    (lambda: SpecConfig(first_step_drafts=1), "first_step_drafts must be True or False"),
    (lambda: SamplingConfig(temperature="0.5"), "temperature must be a number"),
    (lambda: SamplingConfig(temperature=1.0, top_k=2.5), "top_k must be an integer"),
    (lambda: SamplingConfig(temperature=1.0, seed=2**70), "seed must be in"),
    (lambda: SamplingConfig(temperature=1.0, seed="a"), "seed must be an integer"),
    (lambda: GenerationConfig(max_new_tokens=True), "max_new_tokens must be an integer"),
    (lambda: GenerationConfig(max_new_tokens=2.5), "max_new_tokens must be an integer"),
    (lambda: GenerationConfig(stop_strings="ab"), "stop_strings must be a tuple of strings"),  # was 'a' or 'b'
    (lambda: GenerationConfig(stop_strings=("",)), "stop_strings must be non-empty strings"),  # was dropped
    (lambda: GenerationConfig(stop_after=("",)), "stop_after must be non-empty strings"),
    (lambda: GenerationConfig(stop_token_ids=[5]), "stop_token_ids must be a tuple of token ids"),
    (lambda: GenerationConfig(stop_token_ids=(-1,)), "stop_token_ids must be a tuple of token ids"),
    (lambda: GenerationConfig(max_new_tokens=4, min_new_tokens=5), "min_new_tokens must be in 0..max_new_tokens"),
    (lambda: GenerationConfig(min_new_tokens=2, structure=Structure.regex("a+")), "cannot be combined"),
    (lambda: GenerationConfig(stop_on_eos="no"), "stop_on_eos must be True or False"),
])
def test_configs_refuse_wrong_types(config, needle):
    with pytest.raises(ConfigError) as error:
        config()
    assert needle in str(error.value)


@pytest.mark.parametrize("prompt,kwargs,needle", [
    (None, {}, "prompt must be a string or a non-empty list of chat messages"),
    (123, {}, "prompt must be a string"),
    (b"hi", {}, "prompt must be a string"),
    ([], {}, "non-empty list of chat messages"),
    (["hi"], {}, "a chat message must be a dict"),
    ([{"role": "user"}], {}, "a chat message must be a dict with string 'role' and 'content'"),
    ([{"role": "bogus", "content": "hi"}], dict(chat=True), "role must be one of"),  # the server's 400; ran here
    ("hi", dict(chat="yes"), "chat must be True or False"),
    ("hi", dict(max_new_tokens=2.5), "max_new_tokens must be an integer"),
    ("hi", dict(max_new_tokens=None), "max_new_tokens must be an integer"),
    ("hi", dict(max_new_tokens=5000), "exceeds the model's context of 1024 tokens"),
    ("hi", dict(top_p=0.9), "top_p has no effect with greedy decoding"),
    ("hi", dict(top_k=5, seed=1), "top_k, seed has no effect with greedy decoding"),
    ("hi", dict(temperature=None), "temperature must be a number"),
    ("hi", dict(temperature=1.0, top_k=2.5), "top_k must be an integer"),
    ("hi", dict(temperature=1.0, seed=2**70), "seed must be in"),
    ("hi", dict(suffix=3), "suffix must be a string"),
    ("hi", dict(logit_bias=[1, 2]), "logit_bias must be a dict"),  # an AttributeError once
    ("hi", dict(suffix=")", chat=True), "with a text prompt (not chat)"),
    ("hi", dict(suffix=")"), "no fill-in-the-middle tokens"),  # the tiny byte tokenizer has none
])
def test_generate_refuses_bad_arguments(decoder, prompt, kwargs, needle):
    with pytest.raises(ConfigError) as error:
        decoder.generate(prompt, **{"max_new_tokens": 2, **kwargs})
    assert needle in str(error.value)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(sampling={"temperature": 1.0}), "sampling must be a SamplingConfig"),
    (dict(generation={"max_new_tokens": 2}), "generation must be a GenerationConfig"),
    (dict(sampling=SamplingConfig(top_p=0.5)), "top_p has no effect with greedy decoding"),
    (dict(suffix=")"), "no fill-in-the-middle tokens"),
])
def test_stream_refuses_bad_arguments_when_called(decoder, kwargs, needle):
    with pytest.raises(ConfigError) as error:
        decoder.stream("hi", **kwargs)  # not deferred to the first next()
    assert needle in str(error.value)


def test_a_refused_call_leaves_the_decoder_usable(decoder):
    """A seed torch cannot take raised after the engine had taken its only row: every later call then failed with
    'no free batch row'."""
    with pytest.raises(ConfigError):
        decoder.generate("hi", temperature=1.0, seed=2**70, max_new_tokens=2)
    assert len(decoder.generate("hi", max_new_tokens=2).token_ids) == 2
    assert len(decoder.engine.generate([5, 6], SamplingConfig(temperature=1.0, seed=3),
                                       GenerationConfig(max_new_tokens=2)).token_ids) == 2


def test_chat_on_a_model_without_a_template(tmp_path):
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = None
    plain = SpecDecoder.load(save_tiny(tmp_path, tiny_llama(layers=1), tokenizer), "none")
    with pytest.raises(ConfigError, match="no chat template"):
        plain.generate("hi", chat=True, max_new_tokens=2)
    with pytest.raises(ConfigError, match="no chat template"):
        plain.generate([{"role": "user", "content": "hi"}], max_new_tokens=2)
    assert len(plain.generate("hi", max_new_tokens=2).token_ids) == 2
