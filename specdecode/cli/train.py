"""`specdecode train --kind eagle|eagle3|medusa --model M --out DIR`: build (or reuse) self-distillation data and
cached target hidden states, train a drafter head, and save it as OUT/model.safetensors + OUT/config.json (eagle3:
in the layout --layout names, which SGLang or vLLM load as it is).

Data is cached in --data (default OUT/data) and reused by later runs (e.g. --kind medusa after --kind eagle);
--resume continues from OUT/checkpoint.pt. Runs on CPU for small budgets, on CUDA when --device cuda.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from specdecode.cli.args import device_arg
from specdecode.cli.commands import COMMANDS, flag, path_arg
from specdecode.drafters.common.eagle3_format import LAYOUTS
from specdecode.errors import ConfigError
from specdecode.paths import output_dir
from specdecode.train.data import DataConfig
from specdecode.train.run import TrainJob, run_job
from specdecode.train.trainer import TrainConfig


def register(subparsers, name: str) -> None:
    parser = subparsers.add_parser(name, help=COMMANDS[name].help)
    parser.add_argument("--kind", required=True, choices=["eagle", "eagle3", "medusa"])
    parser.add_argument("--model", default=None,
                        help="target: HF dir, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--out", type=path_arg, required=True, help="output directory (head, checkpoint, data cache)")
    parser.add_argument("--data", type=path_arg, default=None,
                        help="data cache directory (default OUT/data); reused when present")
    parser.add_argument("--device", default="cpu", type=device_arg, help="cpu or cuda")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    data = parser.add_argument_group("data (used when the data cache is built)")
    data.add_argument("--num-prompts", type=int, default=2000, help="built-in training prompts answered by the target")
    data.add_argument("--num-followups", type=int, default=1000, help="stage-2 prompts built from those answers")
    data.add_argument("--prompts", type=path_arg, nargs="*", default=[],
                      help="extra prompt files (.jsonl with turns/prompt, or text)")
    data.add_argument("--text", type=path_arg, nargs="*", default=[], help="extra plain-text files for hidden states")
    data.add_argument("--docstrings", default="", help="comma-separated installed packages (permissive licence) "
                                                       "whose docstrings add plain text")
    data.add_argument("--text-tokens", type=int, default=200_000, help="cap on plain-text tokens per source")
    data.add_argument("--max-new-tokens", type=int, default=256, help="answer length cap when generating")
    data.add_argument("--gen-batch", type=int, default=32, help="generation batch size")
    data.add_argument("--gen-minutes", type=float, default=0.0, help="time budget for generation (0 = none)")
    data.add_argument("--temperature", type=float, default=0.0, help="answer sampling temperature (0 = greedy)")
    data.add_argument("--max-len", type=int, default=1024, help="tokens per training sequence")
    data.add_argument("--draft-vocab", type=int, default=16384, help="draft vocabulary size (most frequent tokens)")
    train = parser.add_argument_group("training")
    train.add_argument("--epochs", type=float, default=4.0)
    train.add_argument("--max-steps", type=int, default=0, help="0 = from --epochs")
    train.add_argument("--max-minutes", type=float, default=0.0, help="training time budget (0 = none)")
    train.add_argument("--batch-tokens", type=int, default=8192, help="padded tokens per batch")
    train.add_argument("--lr", type=float, default=5e-4)
    train.add_argument("--ttt-steps", type=int, default=None,
                       help="eagle, eagle3: unrolled training-time-test steps (default 3)")
    train.add_argument("--heads", type=int, default=None, help="medusa: number of heads (default 4)")
    train.add_argument("--layout", default=None, choices=LAYOUTS,
                       help="eagle3: the head's layout on disk (SGLang/SpecForge, or vLLM speculators; default "
                            "sglang)")
    train.add_argument("--aux-layers", type=_layers, default=(), metavar="L,M,H",
                       help="eagle3: the three target layers fused (default: 2, n/2, n-3 as vLLM and SGLang)")
    train.add_argument("--checkpoint-every", type=int, default=200)
    train.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=cmd_train)


def _layers(text: str) -> tuple[int, ...]:
    try:
        layers = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected three layer numbers L,M,H, got {text!r}") from None
    if len(layers) != 3 or min(layers) < 0:
        raise argparse.ArgumentTypeError(f"expected three layer numbers L,M,H (>= 0), got {text!r}")
    return layers


# (option, the smallest value, whether it must be above it rather than at least it); each also finite: inf epochs
# or lr would train forever or to NaN, an inf budget is no budget
RANGES = (("num_prompts", 0, False), ("num_followups", 0, False), ("max_new_tokens", 0, True), ("gen_batch", 0, True),
          ("max_len", 8, False), ("draft_vocab", 0, True), ("epochs", 0, True), ("batch_tokens", 0, True),
          ("lr", 0, True), ("ttt_steps", 1, False), ("heads", 1, False), ("checkpoint_every", 1, False),
          ("max_steps", 0, False), ("max_minutes", 0, False), ("gen_minutes", 0, False), ("text_tokens", 0, False),
          ("temperature", 0, False))
# the flags one kind of head reads, and the kinds that read them: given for another kind, they would do nothing
KIND_FLAGS = (("heads", ("medusa",)), ("ttt_steps", ("eagle", "eagle3")), ("layout", ("eagle3",)),
              ("aux_layers", ("eagle3",)))


def _validate(args: argparse.Namespace) -> None:
    bad = []
    for name, low, above in RANGES:
        value = getattr(args, name)
        if value is not None and not ((value > low if above else value >= low) and math.isfinite(value)):
            bad.append(f"{flag(name)} {value:g} (must be {'>' if above else '>='} {low}"
                       + (", and finite)" if isinstance(value, float) else ")"))
    if bad:
        raise ConfigError(f"invalid value for {'; '.join(bad)}")
    for name, kinds in KIND_FLAGS:
        if getattr(args, name) not in (None, ()) and args.kind not in kinds:
            raise ConfigError(f"{flag(name)} has no effect with --kind {args.kind}; it is read by --kind "
                              f"{' or '.join(kinds)}")
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda requested but no CUDA device is available")
    if args.data is not None and Path(args.data).exists() and not Path(args.data).is_dir():
        raise ConfigError(f"--data {args.data!r} exists and is not a directory")
    output_dir(args.out, "--out")  # before the model loads and data is generated, not after


def cmd_train(args: argparse.Namespace) -> int:
    _validate(args)
    data = DataConfig(num_prompts=args.num_prompts, num_followups=args.num_followups,
                      max_new_tokens=args.max_new_tokens, gen_batch=args.gen_batch, temperature=args.temperature,
                      gen_minutes=args.gen_minutes, max_len=args.max_len, seed=args.seed, text_tokens=args.text_tokens)
    given = {field: value for field, value in (("ttt_steps", args.ttt_steps), ("num_heads", args.heads),
                                               ("layout", args.layout)) if value is not None}  # else TrainConfig's
    train = TrainConfig(kind=args.kind, epochs=args.epochs, max_steps=args.max_steps, max_minutes=args.max_minutes,
                        batch_tokens=args.batch_tokens, lr=args.lr, checkpoint_every=args.checkpoint_every,
                        seed=args.seed, aux_layers=args.aux_layers, **given)
    packages = tuple(p.strip() for p in args.docstrings.split(",") if p.strip())
    run_job(TrainJob(train, args.out, args.model, args.data, args.device, args.resume, tuple(args.prompts),
                     tuple(args.text), packages, args.draft_vocab, data))
    return 0
