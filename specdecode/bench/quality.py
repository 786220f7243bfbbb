"""`specdecode bench-quality`: how far a weight format moves a model from its full-precision self.

Speculative decoding with a quantised target is lossless with respect to that quantised model (it IS the
target); what the format costs is measured here, teacher-forced over a fixed shipped text
(`data/quality.txt`, prose and code): the share of positions where the format's next-token argmax equals the
float32 model's (greedy token agreement) and each format's perplexity on the text. One model is in memory at
a time (each format is loaded afresh from the cached conversion)."""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import torch

from ..config import ConfigError
from ..models import load_model
from ..quant.weights import QUANTIZED
from ..target import Target
from ..trees import build_block

FORMATS = ("float32", "bfloat16", "int8", "int4", "int4-all", "gguf")  # the quantized ones: linear weights (quant/weights.py)


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
        loaded = load_model(spec, dtype="float32" if quantized else name, weights=name if quantized else "same")
        ids = loaded.tokenizer(text)["input_ids"][:max_tokens]
        argmax, nll = next_token_scores(loaded.model, ids)
        reference = argmax if reference is None else reference
        rows.append(FormatQuality(name, float((argmax == reference).float().mean()), math.exp(nll)))
        del loaded
    return [row for row in rows if row.format in formats]


def register(subparsers, name: str = "bench-quality") -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, help="greedy token agreement and perplexity of weight formats vs float32",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="packaged model name, HF dir, .gguf or hub id (default: SmolLM2)")
    parser.add_argument("--formats", default=",".join(FORMATS), help=f"comma list of {', '.join(FORMATS)}")
    parser.add_argument("--text", default=None, help="UTF-8 text file (default: the shipped data/quality.txt)")
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--out", default=None, help="write the rows as JSON here too")
    parser.set_defaults(func=cmd_quality)
    return parser


def cmd_quality(args: argparse.Namespace) -> int:
    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    unknown = [f for f in formats if f not in FORMATS]
    if not formats or unknown:
        raise ConfigError(f"--formats takes a comma list of {', '.join(FORMATS)}, got {args.formats!r}")
    if args.max_tokens < 2:
        raise ConfigError(f"--max-tokens must be at least 2, got {args.max_tokens}")
    try:
        text = Path(args.text).read_text(encoding="utf-8") if args.text else shipped_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read --text {args.text!r}: {error}") from None
    rows = measure(args.model, formats, text, args.max_tokens)
    print("| format | greedy agreement with float32 | perplexity |\n|---|---|---|")
    for row in rows:
        print(f"| {row.format} | {row.agreement:.4f} | {row.perplexity:.3f} |")
    if args.out:
        Path(args.out).write_text(json.dumps([asdict(row) for row in rows], indent=2))
    return 0
