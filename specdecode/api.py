"""The library API: load a model and a drafter, then generate or stream text.

    from specdecode import SpecDecoder
    print(SpecDecoder.load(drafter="prompt-lookup").generate("Say hi", chat=True).text)
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cached_property
from os import PathLike

import torch

from specdecode.backends.cpu.own_thread import run_in_own_thread
from specdecode.config import DrafterConfig, GenerationConfig, ModelConfig, SamplingConfig, SpecConfig, Structure
from specdecode.core.engine import Engine
from specdecode.core.infill import FimFormat, fim_format, infill_prompt
from specdecode.core.sequence import Result, Sequence, StepOutcome
from specdecode.core.target import Target
from specdecode.drafters import AUTO, best_drafter_name, build_drafter, check_options_read
from specdecode.errors import ConfigError, OptionError
from specdecode.loading.load import check_kv_half, load_model


@dataclass
class SpecDecoder:
    """A target model, its tokenizer and a drafter, ready to decode."""

    target: Target
    engine: Engine

    @classmethod
    def load(cls, model: ModelConfig | str | PathLike | None = None, drafter: DrafterConfig | str = AUTO, *,
             spec: SpecConfig | None = None, max_batch: int = 1) -> SpecDecoder:
        """model: a ModelConfig, or just its name (a packaged model, a directory, a .gguf file or a hub id; None:
        the default model); drafter: a DrafterConfig, or just its name (`auto`: the best measured drafter for
        the device, drafters.best_drafter_name); spec: the speculation length policy; max_batch: sequences
        decoded together. Everything is checked before anything loads."""
        model = model if isinstance(model, ModelConfig) else ModelConfig(model)
        drafter = drafter if isinstance(drafter, DrafterConfig) else DrafterConfig(drafter)
        spec = spec if spec is not None else SpecConfig()
        if not isinstance(spec, SpecConfig):
            raise ConfigError(f"spec must be a SpecConfig, got {type(spec).__name__}")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ConfigError(f"max_batch must be a positive integer, got {max_batch!r}")
        check_kv_half(model)
        resolved = drafter.name
        if resolved == AUTO:
            resolved = best_drafter_name(model.device.partition(":")[0], drafter.draft_model is not None,
                                         spec.confidence != 0)
        check_options_read(drafter.given(spec), [resolved])
        if model.on_cuda and not torch.cuda.is_available():
            raise OptionError("{device} cuda requested but no CUDA device is available", "device")

        def build() -> Engine:
            loaded = load_model(model)
            target = Target(loaded.model, loaded.tokenizer, model.fast_path, kv_half=model.kv_half)
            engine = Engine(target, build_drafter(target, drafter, spec), spec, max_batch=max_batch)
            engine.warmup()
            return engine

        # on the CPU the loading thread's OpenMP team must not outlive the load (backends/cpu/own_thread.py); CUDA
        # graphs are captured by the warm-up and stay with the thread that captured them
        engine = build() if model.on_cuda else run_in_own_thread(build)
        return cls(engine.target, engine)

    @property
    def tokenizer(self):
        return self.target.tokenizer

    @cached_property
    def fim(self) -> FimFormat | None:
        """The tokenizer's fill-in-the-middle markers (None: it has none), read once."""
        return fim_format(self.tokenizer)

    def encode(self, prompt: str | list[dict], chat: bool = False, suffix: str | None = None) -> list[int]:
        """Text (or chat messages) -> prompt token ids; chat applies the model's chat template; suffix: the text
        after the one to generate, which then fills the middle (core/infill.py; a prompt, not chat, may be empty)."""
        _check_prompt(prompt, chat)
        if suffix is not None:
            if not isinstance(suffix, str) or chat or not isinstance(prompt, str):
                raise ConfigError("suffix must be a string, with a text prompt (not chat)")
            return infill_prompt(self.tokenizer, self.fim, prompt, suffix)
        if isinstance(prompt, str) and not prompt.strip():
            raise ConfigError("the prompt is empty")
        if chat or not isinstance(prompt, str):
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
            if not getattr(self.tokenizer, "chat_template", None):
                raise OptionError("this model has no chat template: {chat} needs one", "chat")
            encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
            return [int(i) for i in ids]
        return [int(i) for i in self.tokenizer(prompt, add_special_tokens=True)["input_ids"]]

    def stream(self, prompt: str | list[dict], *, chat: bool = False, sampling: SamplingConfig | None = None,
               generation: GenerationConfig | None = None,
               suffix: str | None = None) -> Iterator[tuple[Sequence, StepOutcome]]:
        """Checks its arguments when called (not at the first next()), then decodes lazily."""
        for name, value, kind in (("sampling", sampling, SamplingConfig), ("generation", generation, GenerationConfig)):
            if value is not None and not isinstance(value, kind):
                raise ConfigError(f"{name} must be a {kind.__name__} or None, got {type(value).__name__}")
        _check_greedy(sampling or SamplingConfig())
        ids = self.encode(prompt, chat, suffix)
        return self.engine.stream(ids, sampling, self._middle(generation or GenerationConfig(), suffix))

    def _middle(self, generation: GenerationConfig, suffix: str | None) -> GenerationConfig:
        """A filled middle also ends at its format's end tokens (its pad and file tokens: the model is done)."""
        fmt = self.fim if suffix is not None else None
        if fmt is None:
            return generation
        ends = tuple(sorted(set(generation.stop_token_ids) | fmt.ends))
        return replace(generation, stop_token_ids=ends)

    def generate(self, prompt: str | list[dict], *, chat: bool = False, max_new_tokens: int = 128,
                 temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
                 response_format: Structure | dict | None = None, logprobs: int | None = None, min_p: float = 0.0,
                 presence_penalty: float = 0.0, frequency_penalty: float = 0.0, repetition_penalty: float = 1.0,
                 logit_bias: dict[int, float] | None = None, suffix: str | None = None) -> Result:
        """response_format: a Structure (JSON schema, regex, choice, grammar) or OpenAI's response_format dict;
        logprobs: per token its logprob and the top-N alternatives (Result.logprobs); penalties and logit_bias
        ({token id: bias}) as OpenAI's and vLLM's (penalties.py), greedy decoding included; suffix: the text after
        the generated one, which fills the middle (a model with fill-in-the-middle tokens)."""
        sampling = SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, min_p=min_p,
                                  presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                                  repetition_penalty=repetition_penalty,
                                  logit_bias=_bias_pairs(logit_bias))
        structure = None if response_format is None else Structure.from_response_format(response_format)
        generation = GenerationConfig(max_new_tokens=max_new_tokens, structure=structure, logprobs=logprobs)
        _check_greedy(sampling)
        return self.engine.generate(self.encode(prompt, chat, suffix), sampling, self._middle(generation, suffix))


def _bias_pairs(logit_bias: dict[int, float] | None) -> tuple:
    """{token id: bias} as SamplingConfig's pairs; anything but a dict is a ConfigError (a list was an
    AttributeError from inside)."""
    if logit_bias is not None and not isinstance(logit_bias, dict):
        raise ConfigError(f"logit_bias must be a dict {{token id: bias}}, got {type(logit_bias).__name__}")
    return tuple((logit_bias or {}).items())


ROLES = ("system", "developer", "user", "assistant", "tool")  # the roles the server takes (protocol/schemas.py)


def _check_prompt(prompt, chat) -> None:
    if not isinstance(chat, bool):
        raise ConfigError(f"chat must be True or False, got {chat!r}")
    if isinstance(prompt, str):
        return
    if not isinstance(prompt, list) or not prompt:
        raise ConfigError(f"prompt must be a string or a non-empty list of chat messages, got {prompt!r:.80}")
    for message in prompt:
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise ConfigError(f"a chat message must be a dict with string 'role' and 'content', got {message!r:.80}")
        if message["role"] not in ROLES:  # a template renders what it does not know as a user's turn, or drops it
            raise ConfigError(f"a chat message's role must be one of {', '.join(ROLES)}, got {message['role']!r:.40}")


def _check_greedy(sampling: SamplingConfig) -> None:
    """Greedy decoding reads no top_p, top_k or seed: one given would be silently ignored."""
    ignored = sampling.unused_when_greedy()
    if ignored:
        raise ConfigError(f"{', '.join(ignored)} has no effect with greedy decoding; set temperature > 0")
