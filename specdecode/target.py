"""Adapter over a Hugging Face causal LM: one forward over a Block, through the model's own attention, with a
cache we control (4D mask, explicit position ids). Nothing is forked from transformers' modelling files."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch

from .kv_cache import RollbackCache
from .trees import Block


@dataclass(frozen=True)
class ForwardOutput:
    logits: torch.Tensor  # [b, q_kept, vocab]
    hidden: torch.Tensor | None  # [b, q, hidden] last hidden state (after the final norm), when asked for


def _decoder(model: torch.nn.Module) -> torch.nn.Module:
    inner = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise ValueError(f"{type(model).__name__} has no decoder layer list; layer skipping is unsupported")
    return inner


class Target:
    """The model being decoded (also used by drafters that run a model: draft-model, layer-skip)."""

    def __init__(self, model: torch.nn.Module, tokenizer=None):
        self.model = model
        self.tokenizer = tokenizer
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.config = config
        self.num_layers: int = config.num_hidden_layers
        self.vocab_size: int = model.get_output_embeddings().weight.shape[0]
        self.max_positions: int = getattr(config, "max_position_embeddings", None) or 1 << 20
        first = next(model.parameters())
        self.device, self.dtype = first.device, first.dtype
        self.eos_ids = _eos_ids(model, tokenizer)
        pad = getattr(config, "pad_token_id", None)
        self.pad_id: int = pad if isinstance(pad, int) else (min(self.eos_ids) if self.eos_ids else 0)

    def new_cache(self, rows: int = 1, capacity: int = 256, num_layers: int | None = None) -> RollbackCache:
        return RollbackCache(num_layers or self.num_layers, rows=rows, capacity=capacity)

    @torch.inference_mode()
    def forward(
        self,
        cache: RollbackCache,
        rows: list[int],
        block: Block,
        keep: str = "all",  # "all" | "last": which positions get logits
        hidden: bool = False,
        num_layers: int | None = None,  # run only the first num_layers decoder layers (layer skip)
    ) -> ForwardOutput:
        cache.prepare(rows, block.uniform_start if block.uniform_start is not None else block.slots, block.kv_len)
        with self._truncated(num_layers):
            out = self.model(
                input_ids=block.input_ids,
                position_ids=block.positions,
                attention_mask=block.mask,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1 if keep == "last" else 0,
                output_hidden_states=hidden,
            )
        return ForwardOutput(out.logits, out.hidden_states[-1] if hidden else None)

    @contextlib.contextmanager
    def _truncated(self, num_layers: int | None) -> Iterator[None]:
        """Run only the first num_layers layers; always restores the model, even on error."""
        if num_layers is None or num_layers >= self.num_layers:
            yield
            return
        decoder = _decoder(self.model)
        layers, configured = decoder.layers, self.config.num_hidden_layers
        decoder.layers = torch.nn.ModuleList(list(layers)[:num_layers])
        self.config.num_hidden_layers = num_layers
        try:
            yield
        finally:
            decoder.layers = layers
            self.config.num_hidden_layers = configured


def _eos_ids(model: torch.nn.Module, tokenizer) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return frozenset(ids)
