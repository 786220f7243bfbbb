"""The library API: load a model and a drafter, then generate or stream text.

    from specdecode import SpecDecoder
    print(SpecDecoder.load(drafter="prompt-lookup").generate("Say hi", chat=True).text)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from .config import ConfigError, GenerationConfig, SamplingConfig, SpecConfig
from .drafters import AUTO, DrafterConfig, build_drafter
from .engine import Engine, Result, Sequence, TextChunk
from .fast import FastPathConfig
from .models import load_model
from .target import Target

DEFAULT_DRAFTER = AUTO  # the best measured drafter for the device and model (drafters.best_drafter_name)


@dataclass
class SpecDecoder:
    """A target model, its tokenizer and a drafter, ready to decode."""

    target: Target
    engine: Engine

    @classmethod
    def load(cls, model: str | None = None, drafter: str = DEFAULT_DRAFTER, *, draft_model: str | None = None,
             draft_weights: str = "auto", exit_layer: int | None = None, lookahead: tuple[int, int, int] | None = None,
             spec: SpecConfig | None = None, device: str = "cpu",
             dtype: str = "float32", max_batch: int = 1, fast: FastPathConfig | None = None) -> "SpecDecoder":
        spec = spec or SpecConfig()
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError("--device cuda requested but no CUDA device is available")
        loaded = load_model(model, device=device, dtype=dtype)
        target = Target(loaded.model, loaded.tokenizer, fast)
        drafter_impl = build_drafter(
            target, DrafterConfig(name=drafter, draft_model=draft_model, draft_weights=draft_weights,
                                  exit_layer=exit_layer, lookahead=lookahead), spec
        )
        engine = Engine(target, drafter_impl, spec, max_batch=max_batch)
        engine.warmup()
        return cls(target, engine)

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def encode(self, prompt: str | list[dict], chat: bool = False) -> list[int]:
        """Text (or chat messages) -> prompt token ids; chat applies the model's chat template."""
        if isinstance(prompt, str) and not prompt.strip():
            raise ConfigError("the prompt is empty")
        if chat or not isinstance(prompt, str):
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
            if not getattr(self.tokenizer, "chat_template", None):
                raise ConfigError("this model has no chat template; drop --chat")
            encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
            return [int(i) for i in ids]
        return [int(i) for i in self.tokenizer(prompt, add_special_tokens=True)["input_ids"]]

    def stream(self, prompt: str | list[dict], *, chat: bool = False, sampling: SamplingConfig | None = None,
               generation: GenerationConfig | None = None) -> Iterator[tuple[Sequence, TextChunk]]:
        return self.engine.stream_text(self.encode(prompt, chat), sampling, generation)

    def generate(self, prompt: str | list[dict], *, chat: bool = False, max_new_tokens: int = 128,
                 temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = None) -> Result:
        sampling = SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
        return self.engine.generate(self.encode(prompt, chat), sampling, GenerationConfig(max_new_tokens=max_new_tokens))
