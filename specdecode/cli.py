"""Command line: `specdecode generate|bench|serve|train`. Flags map onto the config dataclasses here, once.
User errors print one line and exit 2; nothing else prints a traceback for bad input."""
from __future__ import annotations

import argparse
import json
import os
import sys

from .config import ConfigError, GenerationConfig, SamplingConfig, SpecConfig, check_device
from .drafters.lookahead import LookaheadConfig

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse prints usage too)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _quiet_transformers() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def add_model_args(parser: argparse.ArgumentParser, drafter_default: str) -> None:
    from .drafters import AUTO, registry
    from .int8_draft import CHOICES
    from .models import WEIGHTS

    parser.add_argument("--model", default=None, help="packaged model (smollm2-135m-instruct, qwen2.5-coder-1.5b, qwen2.5-coder-0.5b), HF model "
                             "dir, .gguf file or hub id (default: smollm2-135m-instruct)")
    parser.add_argument("--drafter", default=drafter_default, choices=[*registry(), AUTO],
                        help=f"drafting method ({AUTO}: draft-model when --draft-model is given, else the best "
                             "measured one for the device, drafters.BEST_DRAFTER)")
    parser.add_argument("--draft-model", default=None, help="draft model for --drafter draft-model (a packaged name, dir, .gguf or hub id)")
    parser.add_argument("--draft-weights", default="auto", choices=CHOICES,
                        help="draft-model: int8 weights (auto: on the CPU, where measured faster) or the target's dtype")
    parser.add_argument("--exit-layer", type=int, default=None, help="layer-skip: draft with the first L layers")
    parser.add_argument("--lookahead", type=_lookahead_triple, default=None, metavar="W,N,G",
                        help="lookahead: window, n-gram size, verified candidates (default 1,4,1, measured)")
    parser.add_argument("--k", type=int, default=5, help="tokens drafted per step (start value when --adaptive)")
    parser.add_argument("--adaptive", action="store_true", help="adapt K to recent acceptance")
    parser.add_argument("--max-k", type=int, default=None, help="upper bound for adaptive K (default: max(12, --k))")
    parser.add_argument("--confidence", type=float, default=0.0, help="stop drafting below this draft probability")
    parser.add_argument("--device", default="cpu", type=device_arg, help="cpu or cuda")
    parser.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: bfloat16 on CUDA, float32 on "
                        "the CPU)")
    parser.add_argument("--weights", default="auto", choices=WEIGHTS,
                        help="the target's linear weights: int8 (weight-only, CPU), same (in --dtype) or auto (the "
                             "model's own on the device: int8 for the Qwen pair on the CPU, else same)")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="fast path: static cache + torch.compile (CUDA graphs); default on for cuda, off on cpu")


def _lookahead_triple(text: str) -> tuple[int, int, int]:
    try:
        window, ngram, candidates = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected three integers W,N,G (e.g. 1,4,1), got {text!r}") from None
    try:  # checked here, before the model loads (a first load prints conversion progress)
        LookaheadConfig(window, ngram, candidates)
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return window, ngram, candidates


def device_arg(text: str) -> str:
    """argparse type for --device (config.check_device)."""
    try:
        return check_device(text)
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def check_drafter_flags(args: argparse.Namespace, drafters: list[str], shown: str | None = None) -> None:
    """The drafter flags given on the command line, each checked against the drafters that read it."""
    from .drafters import check_options_read

    given = {"--exit-layer": args.exit_layer is not None, "--lookahead": args.lookahead is not None,
             "--draft-model": args.draft_model is not None, "--draft-weights": args.draft_weights != "auto",
             "--confidence": args.confidence != 0}
    check_options_read(given, drafters, shown)


def spec_config(args: argparse.Namespace) -> SpecConfig:
    if args.max_k is not None and not args.adaptive:
        raise ConfigError("--max-k has no effect without --adaptive")
    if args.max_k is not None and args.max_k < args.k:
        raise ConfigError(f"--max-k ({args.max_k}) must be >= --k ({args.k})")
    max_k = args.max_k if args.max_k is not None else max(12, args.k)
    return SpecConfig(k=args.k, adaptive=args.adaptive, max_k=max_k, confidence=args.confidence)


def fast_config(args: argparse.Namespace):
    from .fast import FastPathConfig

    enabled = args.compile if args.compile is not None else str(args.device).startswith("cuda")
    return FastPathConfig(enabled=enabled)


def default_dtype(args: argparse.Namespace) -> str:
    """--dtype, else the model's own default on the device (bf16 on CUDA; packaged models choose on the CPU)."""
    from .models import model_dtype

    return args.dtype or model_dtype(args.model, str(args.device))


def cmd_generate(args: argparse.Namespace) -> int:
    from .api import SpecDecoder

    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    generation = GenerationConfig(max_new_tokens=args.max_new_tokens)
    if not args.prompt.strip():
        raise ConfigError("the prompt is empty")
    ignored = ["--" + name.replace("_", "-") for name in sampling.unused_when_greedy()]
    if ignored:
        raise ConfigError(f"{', '.join(ignored)} has no effect with greedy decoding; set --temperature > 0")
    drafter = _resolved_drafter(args)
    check_drafter_flags(args, [drafter], drafter if drafter == args.drafter else f"{args.drafter} (here: {drafter})")
    spec_config(args)  # its errors before the model loads
    decoder = SpecDecoder.load(args.model, args.drafter, draft_model=args.draft_model, draft_weights=args.draft_weights,
                               exit_layer=args.exit_layer, lookahead=args.lookahead, spec=spec_config(args),
                               device=args.device, dtype=default_dtype(args), weights=args.weights,
                               fast=fast_config(args))
    pieces, seq = [], None
    for seq, chunk in decoder.stream(args.prompt, chat=args.chat, sampling=sampling, generation=generation):
        pieces.append(chunk.text)
        if not args.json and chunk.text:
            print(chunk.text, end="", flush=True)
    metrics = seq.metrics
    if args.json:
        print(json.dumps({"text": "".join(pieces), "new_tokens": metrics.new_tokens,
                          "target_passes": metrics.target_passes, "tau": round(metrics.tau, 4),
                          "acceptance_rate": round(metrics.acceptance_rate, 4),
                          "tokens_per_s": round(metrics.tokens_per_s, 3), "drafter": decoder.engine.drafter.name,
                          "finish_reason": seq.finish_reason, "metrics": metrics.as_dict()}))
    else:
        by_pos = " ".join(f"{x:.2f}" for x in metrics.acceptance_by_position) or "-"
        print(f"\n\n[{decoder.engine.drafter.name}] {metrics.new_tokens} tokens, {metrics.target_passes} target passes, "
              f"tau {metrics.tau:.2f}, acceptance {metrics.acceptance_rate:.2f} (by position: {by_pos}), "
              f"{metrics.tokens_per_s:.1f} tokens/s; time: prefill {metrics.prefill_s:.2f}s, "
              f"draft {metrics.draft_s:.2f}s, verify {metrics.verify_s:.2f}s; finish: {seq.finish_reason}")
    return 0


def _resolved_drafter(args: argparse.Namespace) -> str:
    from .drafters import AUTO, best_drafter_name

    if args.drafter != AUTO:
        return args.drafter
    return best_drafter_name("cuda" if str(args.device).startswith("cuda") else "cpu", args.draft_model is not None)


def build_parser() -> argparse.ArgumentParser:
    from .api import DEFAULT_DRAFTER

    parser = _Parser(prog="specdecode", description="Lossless speculative decoding for Hugging Face causal LMs")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    gen = sub.add_parser("generate", help="generate text for one prompt, streaming, then print metrics")
    gen.add_argument("prompt")
    add_model_args(gen, DEFAULT_DRAFTER)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--chat", action="store_true", help="apply the model's chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    gen.set_defaults(func=cmd_generate)

    for name, module in (("bench", "specdecode.bench.cli"), ("serve", "specdecode.server.cli"),
                         ("train", "specdecode.train.cli"), ("bench-serve", "specdecode.bench.serve"),
                         ("bench-fastpath", "specdecode.bench.fastpath"), ("bench-quality", "specdecode.bench.quality")):
        try:
            register = __import__(module, fromlist=["register"]).register
        except ImportError:
            continue
        register(sub, name)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .models import ModelError

    parser = build_parser()
    args = parser.parse_args(argv)
    _quiet_transformers()
    try:
        return args.func(args)
    except (ConfigError, ModelError) as error:
        print(f"specdecode: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
