"""The library API: load a model and a drafter, then generate or stream text.

    from specdecode import SpecDecoder
    print(SpecDecoder.load(drafter="prompt-lookup").generate("Say hi", chat=True).text)
"""
from __future__ import annotations

from dataclasses import dataclass
from os import PathLike, fspath
from typing import Iterator

import torch

from .config import ConfigError, GenerationConfig, OptionError, SamplingConfig, SpecConfig, Structure, check_device
from .drafters import AUTO, DrafterConfig, best_drafter_name, build_drafter, check_options_read
from .engine import Engine, Result, Sequence, StepOutcome
from .fast import FastPathConfig
from .models import check_kv_half, load_model
from .own_thread import run_in_own_thread
from .target import Target

DEFAULT_DRAFTER = AUTO  # the best measured drafter for the device and model (drafters.best_drafter_name)


@dataclass
class SpecDecoder:
    """A target model, its tokenizer and a drafter, ready to decode."""

    target: Target
    engine: Engine

    @classmethod
    def load(cls, model: str | None = None, drafter: str = DEFAULT_DRAFTER, *, draft_model: str | None = None,
             draft_weights: str = "auto", draft_vocab: int | None = None, exit_layer: int | None = None,
             lookahead: tuple[int, int, int] | None = None, suffix_store: int | None = None,
             spec: SpecConfig | None = None, device: str = "cpu", dtype: str | None = None, weights: str = "auto",
             max_batch: int = 1, fast: FastPathConfig | None = None, kv_half: bool = False) -> "SpecDecoder":
        spec = spec if spec is not None else SpecConfig()
        _check_load(model, drafter, exit_layer, lookahead, spec, device, max_batch, fast)
        if not isinstance(kv_half, bool):
            raise ConfigError(f"kv_half must be True or False, got {kv_half!r}")
        if kv_half:
            check_kv_half(weights, fspath(model) if model is not None else None, device)
        if suffix_store is not None and (isinstance(suffix_store, bool) or not isinstance(suffix_store, int)
                                         or suffix_store < 1):
            raise ConfigError(f"suffix_store must be a positive number of tokens or None, got {suffix_store!r}")
        if draft_vocab is not None and (isinstance(draft_vocab, bool) or not isinstance(draft_vocab, int)
                                        or draft_vocab < 0):
            raise ConfigError(f"draft_vocab must be a number of tokens (0: the whole vocabulary) or None, "
                              f"got {draft_vocab!r}")
        model = fspath(model) if model is not None else None  # a pathlib.Path works too
        given = {"exit_layer": exit_layer is not None, "lookahead": lookahead is not None,
                 "draft_model": draft_model is not None, "draft_weights": draft_weights != "auto",
                 "draft_vocab": draft_vocab is not None,
                 "confidence": spec.confidence != 0, "suffix_store": suffix_store is not None}
        resolved = best_drafter_name(device.partition(":")[0], draft_model is not None) if drafter == AUTO else drafter
        check_options_read(given, [resolved])
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise OptionError("{device} cuda requested but no CUDA device is available", "device")
        drafter_config = DrafterConfig(name=drafter, draft_model=draft_model, draft_weights=draft_weights,
                                       draft_vocab=draft_vocab, exit_layer=exit_layer, lookahead=lookahead,
                                       suffix_store=suffix_store)

        def build() -> Engine:
            loaded = load_model(model, device=device, dtype=dtype, weights=weights)
            target = Target(loaded.model, loaded.tokenizer, fast, kv_half=kv_half)
            engine = Engine(target, build_drafter(target, drafter_config, spec), spec, max_batch=max_batch)
            engine.warmup()
            return engine

        # on the CPU the loading thread's OpenMP team must not outlive the load (own_thread.py); CUDA graphs are
        # captured by the warm-up and stay with the thread that captured them
        engine = build() if device.startswith("cuda") else run_in_own_thread(build)
        return cls(engine.target, engine)

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def encode(self, prompt: str | list[dict], chat: bool = False) -> list[int]:
        """Text (or chat messages) -> prompt token ids; chat applies the model's chat template."""
        _check_prompt(prompt, chat)
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
               generation: GenerationConfig | None = None) -> Iterator[tuple[Sequence, StepOutcome]]:
        """Checks its arguments when called (not at the first next()), then decodes lazily."""
        for name, value, kind in (("sampling", sampling, SamplingConfig), ("generation", generation, GenerationConfig)):
            if value is not None and not isinstance(value, kind):
                raise ConfigError(f"{name} must be a {kind.__name__} or None, got {type(value).__name__}")
        _check_greedy(sampling or SamplingConfig())
        return self.engine.stream(self.encode(prompt, chat), sampling, generation)

    def generate(self, prompt: str | list[dict], *, chat: bool = False, max_new_tokens: int = 128,
                 temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
                 response_format: Structure | dict | None = None, logprobs: int | None = None, min_p: float = 0.0,
                 presence_penalty: float = 0.0, frequency_penalty: float = 0.0, repetition_penalty: float = 1.0,
                 logit_bias: dict[int, float] | None = None) -> Result:
        """response_format: a Structure (JSON schema, regex, choice, grammar) or OpenAI's response_format dict;
        logprobs: per token its logprob and the top-N alternatives (Result.logprobs); penalties and logit_bias
        ({token id: bias}) as OpenAI's and vLLM's (penalties.py), greedy decoding included."""
        sampling = SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, min_p=min_p,
                                  presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                                  repetition_penalty=repetition_penalty,
                                  logit_bias=tuple((logit_bias or {}).items()))
        structure = None if response_format is None else Structure.from_response_format(response_format)
        generation = GenerationConfig(max_new_tokens=max_new_tokens, structure=structure, logprobs=logprobs)
        _check_greedy(sampling)
        return self.engine.generate(self.encode(prompt, chat), sampling, generation)


def _check_load(model, drafter, exit_layer, lookahead, spec, device, max_batch, fast) -> None:
    """load()'s arguments, before anything loads (a wrong type would otherwise be a TypeError from deep inside torch)."""
    if model is not None and not isinstance(model, (str, PathLike)):
        raise ConfigError(f"model must be a path, hub id or None, got {model!r}")
    if not isinstance(drafter, str):
        raise ConfigError(f"drafter must be a name (str), got {drafter!r}")
    if exit_layer is not None and (isinstance(exit_layer, bool) or not isinstance(exit_layer, int)):
        raise ConfigError(f"exit_layer must be an integer or None, got {exit_layer!r}")
    if lookahead is not None and (not isinstance(lookahead, (tuple, list)) or len(lookahead) != 3
                                  or not all(isinstance(x, int) and not isinstance(x, bool) for x in lookahead)):
        raise ConfigError(f"lookahead must be three integers (window, ngram, candidates), got {lookahead!r}")
    if not isinstance(spec, SpecConfig):
        raise ConfigError(f"spec must be a SpecConfig, got {type(spec).__name__}")
    if not isinstance(device, str):
        raise ConfigError(f"device must be a string (cpu, cuda or cuda:N), got {device!r}")
    check_device(device)
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ConfigError(f"max_batch must be a positive integer, got {max_batch!r}")
    if fast is not None and not isinstance(fast, FastPathConfig):
        raise ConfigError(f"fast must be a FastPathConfig or None, got {fast!r}")


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


def _check_greedy(sampling: SamplingConfig) -> None:
    """Greedy decoding reads no top_p, top_k or seed: one given would be silently ignored."""
    ignored = sampling.unused_when_greedy()
    if ignored:
        raise ConfigError(f"{', '.join(ignored)} has no effect with greedy decoding; set temperature > 0")
