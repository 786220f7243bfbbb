"""`specdecode bench-quality`: how far a weight format moves a model from its full-precision self.

Speculative decoding with a quantised target is lossless with respect to that quantised model (it IS the
target); what the format costs is measured here, teacher-forced over a fixed shipped text
(`data/quality.txt`, prose and code): the share of positions where the format's next-token argmax equals the
float32 model's (greedy token agreement) and each format's perplexity on the text. One model is in memory at
a time (each format is loaded afresh from the cached conversion)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources

import torch

from specdecode.config import ModelConfig
from specdecode.core.target import Target
from specdecode.core.trees import build_block
from specdecode.loading.formats import QUANTIZED
from specdecode.loading.load import load_model

# the quantized ones: linear weights (loading/formats.py)
FORMATS = ("float32", "bfloat16", "int8", "int4", "int4-all", "gguf")


@dataclass(frozen=True)
class FormatQuality:
    format: str
    agreement: float  # share of positions whose argmax equals float32's
    perplexity: float


def shipped_text() -> str:
    return resources.files("specdecode.bench.data").joinpath("quality.txt").read_text(encoding="utf-8")


@torch.inference_mode()
def next_token_scores(model: torch.nn.Module, ids: list[int]) -> tuple[torch.Tensor, float]:
    """Teacher-forced pass over ids -> (argmax of each position's next token [n - 1], mean NLL of the text).
    Through `Target`, so a packed model is measured in the arithmetic it decodes with (its native layers)."""
    target = Target(model)
    block = build_block([0], [ids], [list(range(-1, len(ids) - 1))], target.pad_id, target.block_device)
    logits = target.forward(target.new_cache(), [0], block).logits[0, :-1].float()  # [n - 1, vocab]
    nll = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:], device=logits.device))
    return logits.argmax(-1), float(nll)


def measure(spec: str | None, formats: tuple[str, ...], text: str, max_tokens: int) -> list[FormatQuality]:
    reference: torch.Tensor | None = None
    rows = []
    for name in ("float32", *[f for f in formats if f != "float32"]):
        quantized = name in QUANTIZED
        loaded = load_model(ModelConfig(spec, dtype="float32" if quantized else name,
                                        weights=name if quantized else "same"))
        ids = loaded.tokenizer(text)["input_ids"][:max_tokens]
        argmax, nll = next_token_scores(loaded.model, ids)
        reference = argmax if reference is None else reference
        rows.append(FormatQuality(name, float((argmax == reference).float().mean()), math.exp(nll)))
        del loaded
    return [row for row in rows if row.format in formats]


