"""`specdecode bench-quality`: how far a weight format moves a model from its full-precision self.

Speculative decoding with a quantised target is lossless with respect to that quantised model (it IS the
target); what the format costs is measured here, teacher-forced over a fixed shipped text
(`data/quality.txt`, prose and code): the share of positions where the format's next-token argmax equals the
float32 model's (greedy token agreement) and each format's perplexity on the text. One model is in memory at
a time (each format is loaded afresh from the cached conversion).

The `llamacpp` row is llama.cpp (llama-cpp-python) on the model's own GGUF, fed the ids our tokenizer made for
the other rows, so every perplexity is over the same tokens; the report sets our default format's perplexity
against it. It is in the default list like any format: where llama-cpp-python is missing or the model has no
GGUF it is skipped with one line (`llamacpp_skipped`), as the bench's llamacpp method is, named or not."""
from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources

import torch

from specdecode.bench import llamacpp
from specdecode.config import ModelConfig
from specdecode.core.target import Target
from specdecode.core.trees import build_block
from specdecode.errors import ConfigError
from specdecode.loading.formats import FLOAT_DTYPES, QUANTIZED
from specdecode.loading.load import load_model, model_dtype, resolve_weights

LLAMACPP = llamacpp.NAME
# the quantized ones: linear weights (loading/formats.py); llamacpp: llama.cpp on the model's GGUF
FORMATS = ("float32", "bfloat16", "int8", "int4", "int4-all", "gguf", LLAMACPP)


@dataclass(frozen=True)
class FormatQuality:
    format: str
    agreement: float  # share of positions whose argmax equals float32's
    perplexity: float


def shipped_text() -> str:
    return resources.files("specdecode.bench.data").joinpath("quality.txt").read_text(encoding="utf-8")


def default_format(spec: str | None) -> str:
    """The row our default load of `spec` on the CPU corresponds to (packaged models: int4; loading/packages.py)."""
    fmt = resolve_weights(ModelConfig(spec))
    return model_dtype(spec) if fmt == "same" else FLOAT_DTYPES.get(fmt, fmt)


def llamacpp_skipped(spec: str | None, formats: tuple[str, ...]) -> str | None:
    """Why the asked-for llamacpp row cannot run, one line naming the install command (None: it can, or it was
    not asked for)."""
    return llamacpp.unavailable(spec) if LLAMACPP in formats else None


def scores(logits: torch.Tensor, ids: list[int]) -> tuple[torch.Tensor, float]:
    """Each position's logits [n, vocab] (row i predicts ids[i + 1]) -> (argmax of each position's next token
    [n - 1], mean NLL of ids[1:]). Every row, ours and llama.cpp's, is scored here: the same positions."""
    logits = logits[:-1].float()  # [n - 1, vocab]
    nll = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:], device=logits.device))
    return logits.argmax(-1), float(nll)


@torch.inference_mode()
def next_token_scores(model: torch.nn.Module, ids: list[int]) -> tuple[torch.Tensor, float]:
    """Teacher-forced pass over ids -> scores(). Through `Target`, so a packed model is measured in the
    arithmetic it decodes with (its native layers)."""
    target = Target(model)
    block = build_block([0], [ids], [list(range(-1, len(ids) - 1))], target.pad_id, target.block_device)
    return scores(target.forward(target.new_cache(), [0], block).logits[0], ids)  # logits [n, vocab]


def measure(spec: str | None, formats: tuple[str, ...], text: str, max_tokens: int) -> list[FormatQuality]:
    """The rows of `formats`, each against float32 (always measured first; llamacpp last). llamacpp must be
    runnable here (llamacpp_skipped)."""
    reference: torch.Tensor | None = None
    ids: list[int] = []
    rows = []
    for name in ("float32", *[f for f in formats if f not in ("float32", LLAMACPP)]):
        quantized = name in QUANTIZED
        loaded = load_model(ModelConfig(spec, dtype="float32" if quantized else name,
                                        weights=name if quantized else "same"))
        ids = loaded.tokenizer(text)["input_ids"][:max_tokens]
        if len(ids) < 2:  # a token scores the next one: with fewer, nothing is scored
            raise ConfigError(f"the text is {len(ids)} token(s) long; scoring needs at least 2")
        argmax, nll = next_token_scores(loaded.model, ids)
        reference = argmax if reference is None else reference
        rows.append(_row(name, argmax, nll, reference))
        del loaded
    if LLAMACPP in formats:  # the ids our tokenizer made: llama.cpp reads the same vocabulary from the GGUF
        argmax, nll = scores(llamacpp.teacher_forced_logits(spec, ids), ids)
        rows.append(_row(LLAMACPP, argmax, nll, reference))
    return [row for row in rows if row.format in formats]


def _row(name: str, argmax: torch.Tensor, nll: float, reference: torch.Tensor) -> FormatQuality:
    """argmax [n - 1] against float32's [n - 1]."""
    return FormatQuality(name, float((argmax == reference).float().mean()), math.exp(nll))


def llamacpp_ratio(rows: list[FormatQuality], default: str) -> str | None:
    """The line that sets our default format's perplexity against llama.cpp's on the same GGUF (None: one of
    the two rows is missing)."""
    by_name = {row.format: row for row in rows}
    if LLAMACPP not in by_name or default not in by_name:
        return None
    ratio = by_name[default].perplexity / by_name[LLAMACPP].perplexity
    return f"perplexity {default} (our default) / {LLAMACPP}: {ratio:.4f}"


