"""`specdecode bench-fastpath`, `bench-quality` and `bench-structured`: their flags, checked before anything
loads, and the runs they start (bench/fastpath.py, bench/quality.py, bench/structured.py)."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from specdecode.bench import fastpath, quality, structured
from specdecode.bench.passcost import RANDOM_CONFIGS
from specdecode.cli.args import device_arg
from specdecode.cli.commands import COMMANDS, flag, path_arg, threads_arg
from specdecode.config import GenerationConfig
from specdecode.drafters import check_options_read, registry
from specdecode.errors import ConfigError, OptionError
from specdecode.loading.load import parse_dtype
from specdecode.paths import output_dir, output_file


def register_fastpath(subparsers, name: str = "bench-fastpath"):
    parser = subparsers.add_parser(name, help=COMMANDS[name].help)
    parser.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    parser.add_argument("--random-config", default=None, choices=sorted(RANDOM_CONFIGS),
                        help="a random-initialised Llama shape instead of a real model")
    parser.add_argument("--device", default="cuda", type=device_arg, help="cpu or cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--drafters", default="prompt-lookup", help="comma list of drafters besides none")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", type=path_arg, default="out/fastpath")
    parser.add_argument("--qs", default="1,4,16,64", help="verify-pass sizes to time")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (inductor, cudagraphs)")
    parser.set_defaults(func=cmd_fastpath)
    return parser


def cmd_fastpath(args) -> int:
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda requested but no CUDA device is available")
    # everything the user gave, checked before a model loads or compiles
    if args.model is not None and args.random_config is not None:
        raise ConfigError("--model and --random-config exclude each other")
    parse_dtype(args.dtype)
    drafters = tuple(d.strip() for d in args.drafters.split(",") if d.strip())
    unknown = [d for d in drafters if d not in registry() or registry()[d].needs_draft_model]
    if unknown:
        usable = [name for name, spec in registry().items() if not spec.needs_draft_model]
        raise ConfigError(f"--drafters: unknown or unsupported drafter {unknown[0]!r}; "
                          f"choose from: {', '.join(usable)}")
    try:
        qs = tuple(int(q) for q in args.qs.split(","))
    except ValueError:
        raise ConfigError(f"--qs expects comma-separated positive integers, got {args.qs!r}") from None
    if not qs or min(qs) <= 0:
        raise ConfigError(f"--qs expects comma-separated positive integers, got {args.qs!r}")
    GenerationConfig(max_new_tokens=args.max_new_tokens)
    backends = torch._dynamo.list_backends(exclude_tags=())
    if args.backend not in backends:  # torch's own test backends are accepted, not offered
        shown = [name for name in backends if not name.endswith("_TESTING_ONLY")]
        raise ConfigError(f"unknown --backend {args.backend!r}; choose from: {', '.join(shown)}")
    out = output_dir(args.out, "--out")
    report = fastpath.run(args.model, args.random_config, args.device, args.dtype, drafters, args.max_new_tokens,
                 qs=qs, backend=args.backend)
    stem = f"{args.random_config or 'default'}-{args.backend}"
    (out / f"{stem}.json").write_text(json.dumps(asdict(report), indent=2))
    (out / f"{stem}.md").write_text(fastpath.to_markdown(report))
    print(fastpath.to_markdown(report))
    return 0


def register_quality(subparsers, name: str = "bench-quality") -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, help=COMMANDS[name].help,
                                   description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="packaged model name, HF dir, .gguf or hub id (default: SmolLM2)")
    parser.add_argument("--formats", default=",".join(quality.FORMATS),
                        help=f"comma list of {', '.join(quality.FORMATS)} ({quality.LLAMACPP}: llama.cpp on the "
                             "model's GGUF, skipped with one line without llama-cpp-python)")
    parser.add_argument("--text", type=path_arg, default=None,
                        help="UTF-8 text file (default: the shipped data/quality.txt)")
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--out", type=path_arg, default=None, help="write the rows as JSON here too")
    parser.set_defaults(func=cmd_quality)
    return parser


def cmd_quality(args: argparse.Namespace) -> int:
    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    unknown = [f for f in formats if f not in quality.FORMATS]
    if not formats or unknown:
        raise ConfigError(f"--formats takes a comma list of {', '.join(quality.FORMATS)}, got {args.formats!r}")
    if args.max_tokens < 2:
        raise ConfigError(f"--max-tokens must be at least 2, got {args.max_tokens}")
    try:
        text = Path(args.text).read_text(encoding="utf-8") if args.text else quality.shipped_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read --text {args.text!r}: {error}") from None
    if not text.strip():  # nothing to score: the measurement ended in a reshape error
        raise ConfigError(f"--text {args.text!r} holds no text")
    if args.out is not None:  # before the measurement, not after it
        output_file(args.out, "--out")
    skipped = quality.llamacpp_skipped(args.model, formats)
    if skipped:  # as the bench's llamacpp method: one line, the other rows run, named or not
        print(f"specdecode bench-quality: {skipped}", file=sys.stderr)
        formats = tuple(f for f in formats if f != quality.LLAMACPP)
    rows = quality.measure(args.model, formats, text, args.max_tokens) if formats else []
    print("| format | greedy agreement with float32 | perplexity |\n|---|---|---|")
    for row in rows:
        print(f"| {row.format} | {row.agreement:.4f} | {row.perplexity:.3f} |")
    ratio = quality.llamacpp_ratio(rows, quality.default_format(args.model))
    if ratio:
        print(ratio)
    if args.out:
        Path(args.out).write_text(json.dumps([asdict(row) for row in rows], indent=2))
    return 0


def register_structured(subparsers, name: str = "bench-structured") -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, help=COMMANDS[name].help,
                                   description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="packaged model name, HF dir, .gguf or hub id (default: SmolLM2)")
    parser.add_argument("--drafters", default=",".join(structured.DEFAULT_DRAFTERS),
                        help="comma list of drafters, each run without and with grammar drafting (none first)")
    parser.add_argument("--draft-model", default=None, help="draft model, for the draft-model drafter")
    parser.add_argument("--tasks", type=path_arg, default=None,
                        help="JSONL of tasks (default: the shipped data/structured.jsonl)")
    parser.add_argument("--limit", type=int, default=None, help="first N tasks of each category")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=256, help="room for the longest shipped answer")
    parser.add_argument("--threads", type=threads_arg, default=None,
                        help="CPU threads for torch, at most the machine's cores (default: torch's own)")
    parser.add_argument("--out", type=path_arg, default="out/bench-structured",
                        help="results.json and report.md go here")
    parser.add_argument("--no-progress", action="store_true")
    parser.set_defaults(func=cmd_structured)
    return parser


def cmd_structured(args: argparse.Namespace) -> int:
    baseline = structured.BASELINE
    drafters = [baseline] + [d.strip() for d in args.drafters.split(",") if d.strip() and d.strip() != baseline]
    unknown = [d for d in drafters if d not in registry()]
    if unknown:
        raise ConfigError(f"unknown drafter {unknown[0]!r}; choose from: {', '.join(registry())}")
    for name, value in (("--k", args.k), ("--max-new-tokens", args.max_new_tokens), ("--limit", args.limit)):
        if value is not None and value < 1:  # --limit 0 left no task to run
            raise ConfigError(f"{name} must be a positive integer, got {value}")
    try:  # read as generate checks it: a --draft-model that no chosen drafter reads would be ignored
        check_options_read({"draft_model": args.draft_model is not None}, drafters)
    except OptionError as error:
        raise ConfigError(error.spelled(lambda name: "--drafters" if name == "drafter" else flag(name))) from None
    needing = [d for d in drafters if registry()[d].needs_draft_model]
    if needing and args.draft_model is None:  # found before the target loads, not after
        raise ConfigError(f"--drafters {needing[0]} needs --draft-model (a path, packaged name or hub id)")
    try:
        tasks = structured.first_of_each(structured.load_tasks(args.tasks), args.limit)
    except OSError as error:
        raise ConfigError(f"cannot read --tasks {args.tasks!r}: {error.strerror or error}") from None
    if not tasks:  # the run warms up on the first task
        raise ConfigError(f"--tasks {args.tasks!r} holds no tasks")
    out = output_dir(args.out, "--out")
    if args.threads:
        torch.set_num_threads(args.threads)
    target, engines = structured.build_engines(args.model, drafters, args.k, args.draft_model)
    rows = structured.summarise(structured.run(engines, target, tasks, args.max_new_tokens,
                                               progress=not args.no_progress))
    table = structured.markdown(rows)
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    (out / "report.md").write_text(table + "\n")
    print(table)
    return 0
