"""`specdecode bench`: flags -> BenchConfig (once, here: its ModelConfig and DrafterConfig as `generate`'s) ->
harness.benchmark."""
from __future__ import annotations

import argparse
import shlex
import sys

from specdecode.bench.harness import BenchConfig, benchmark
from specdecode.bench.methods import SCHEDULES, available
from specdecode.cli.commands import COMMANDS, path_arg, threads_arg
from specdecode.config import DRAFT_WEIGHTS, WEIGHTS, DrafterConfig, FastPathConfig, ModelConfig


def register(subparsers, name: str = "bench") -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        name, help=COMMANDS[name].help,
        description="Runs every method on the same model and prompts in one process (warm-up, interleaved order) "
                    "and writes results.json, report.md and speedup.png to --out. Methods: "
                    + ", ".join(available(has_draft=True)) + ".",
    )
    parser.add_argument("--prompts", type=path_arg, default=None,
                        help="Spec-Bench question JSONL (default: the built-in set)")
    parser.add_argument("--out", type=path_arg, default="out/bench", help="output directory (default: out/bench)")
    parser.add_argument("--limit", type=int, default=None, help="prompts per category")
    parser.add_argument("--category", default=None, metavar="NAMES",
                        help="comma list of categories to run (default: all; the built-in opt-in category "
                             "'agentic', multi-turn requests that repeat earlier answers, runs only when named)")
    parser.add_argument("--methods", default=None, help="comma list of methods (the baseline always runs)")
    parser.add_argument("--model", default=None,
                        help="HF model dir, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--draft-model", default=None,
                        help="draft model (enables hf-assisted, hf-assisted-same-draft, specdecode-draft-model, "
                             "specdecode-hybrid)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16 (CUDA default)")
    parser.add_argument("--weights", default="auto", choices=WEIGHTS,
                        help="the target's linear weights: int4 / int8 (quantized blocks of 32, CPU), gguf (the GGUF's "
                             "own bit widths), fp32 / bf16, same (in --dtype) or auto (the model's own on the "
                             "device: int4 for the Qwen pair on the CPU, else same)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (checked lossless)")
    parser.add_argument("--k", type=int, default=5, help="tokens drafted per step by specdecode drafters")
    parser.add_argument("--confidence", type=float, default=None,
                        help="specdecode-draft-model / -layer-skip: stop a draft where the draft's top probability "
                             "falls below this (default: draft all --k tokens)")
    parser.add_argument("--draft-weights", default="auto", choices=DRAFT_WEIGHTS,
                        help="specdecode-draft-model's, -hybrid's and hf-assisted-same-draft's draft: int4 / int8 "
                             "(auto: int4 on the CPU) or the target's dtype (hf-assisted always uses the draft as "
                             "loaded)")
    parser.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                        help="specdecode-draft-model / -hybrid: the draft head's shortlist (default: the whole "
                             "vocabulary)")
    parser.add_argument("--exit-layer", type=int, default=None,
                        help="layer-skip / hf-early-exit exit layer (default: a third of the layers)")
    parser.add_argument("--suffix-store", type=int, default=None, metavar="TOKENS",
                        help="specdecode-suffix / -hybrid: the store's cap in tokens (default 65536), one store per "
                             "run")
    parser.add_argument("--hf-draft-tokens", type=int, default=None,
                        help="draft length of the transformers peers (default: --k; 10 for prompt lookup)")
    parser.add_argument("--hf-assistant-schedule", default=None, choices=SCHEDULES,
                        help="num_assistant_tokens_schedule of hf-assisted, hf-assisted-same-draft and hf-early-exit: "
                             "heuristic (default, transformers' adaptive draft length) or constant")
    parser.add_argument("--head", action="append", default=[], metavar="DRAFTER=DIR",
                        help="trained head for a head drafter, e.g. eagle=DIR (repeatable; default: shipped heads)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="specdecode methods on the fast path (static cache + torch.compile); "
                             "default on for cuda, off on cpu")
    parser.add_argument("--threads", type=threads_arg, default=None,
                        help="CPU threads for torch, at most the machine's cores (default: torch's own)")
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up call per method")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.set_defaults(func=cmd_bench)
    return parser


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    fast = None if args.compile is None else FastPathConfig(enabled=args.compile)
    model = ModelConfig(args.model, device=args.device, dtype=args.dtype, weights=args.weights, fast=fast)
    drafter = DrafterConfig(draft_model=args.draft_model, exit_layer=args.exit_layer, draft_weights=args.draft_weights,
                            suffix_store=args.suffix_store, draft_vocab=args.draft_vocab)
    return BenchConfig(
        out=args.out, model=model, drafter=drafter, prompts=args.prompts, limit=args.limit,
        categories=_names(args.category), methods=args.methods, max_new_tokens=args.max_new_tokens,
        temperature=args.temperature, k=args.k, confidence=args.confidence, hf_draft_tokens=args.hf_draft_tokens,
        hf_assistant_schedule=args.hf_assistant_schedule, heads=tuple(args.head), seed=args.seed,
        threads=args.threads, warmup=not args.no_warmup, progress=not args.no_progress,
    )


def _names(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))


def cmd_bench(args: argparse.Namespace) -> int:
    command = shlex.join(["specdecode", *sys.argv[1:]]) if sys.argv[1:2] == ["bench"] else None
    paths = benchmark(config_from_args(args), command=command)
    report = paths[1].read_text()
    overall = report.split("## Overall", 1)[1].split("##", 1)[0].strip()
    print(overall)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
