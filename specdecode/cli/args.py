"""The flags the subcommands share (the model, the drafter and its options, speculation), mapped once onto the
library's frozen configs (model_config, drafter_config, spec_config). How the command line spells the library's
option names and errors: commands.py."""
from __future__ import annotations

import argparse

from specdecode.cli.commands import whole_number
from specdecode.config import (
    DRAFT_WEIGHTS,
    WEIGHTS,
    DrafterConfig,
    FastPathConfig,
    ModelConfig,
    SpecConfig,
    check_device,
)
from specdecode.drafters import AUTO, best_drafter_name, check_options_read, registry
from specdecode.drafters.lookahead import LookaheadConfig
from specdecode.errors import ConfigError
from specdecode.loading.packages import PACKAGED


def add_model_args(parser: argparse.ArgumentParser, drafter_default: str) -> None:
    parser.add_argument("--model", default=None,
                        help=f"packaged model ({', '.join(PACKAGED)}), HF model dir, .gguf file or hub id (default: "
                             "smollm2-135m-instruct)")
    parser.add_argument("--drafter", default=drafter_default, choices=[*registry(), AUTO],
                        help=f"drafting method ({AUTO}: with --draft-model hybrid on the CPU, else draft-model; "
                             "without, the best measured one for the device, drafters.BEST_DRAFTER)")
    parser.add_argument("--draft-model", "--draft-head", default=None,
                        help="draft model for --drafter draft-model or hybrid (a packaged name, dir, .gguf or hub "
                             "id); for eagle, eagle3, medusa a trained head's directory (eagle3: SGLang/SpecForge "
                             "or vLLM speculators layout)")
    parser.add_argument("--draft-weights", default="auto", choices=DRAFT_WEIGHTS,
                        help="draft-model, hybrid: int4 / int8 weights, int4-all (the head in 4 bits too), or the "
                             "target's dtype (same); auto: int4-all on the CPU, where measured fastest")
    parser.add_argument("--draft-vocab", type=_count, default=None, metavar="N",
                        help="draft-model, hybrid: score only the draft head's first N token ids plus the tokens seen "
                             "(default: the whole vocabulary)")
    parser.add_argument("--exit-layer", type=int, default=None, help="layer-skip: draft with the first L layers")
    parser.add_argument("--lookahead", type=_lookahead_triple, default=None, metavar="W,N,G",
                        help="lookahead: window, n-gram size, verified candidates (default 1,4,1, measured)")
    parser.add_argument("--suffix-store", type=_positive_tokens, default=None, metavar="TOKENS",
                        help="suffix, hybrid: cap of the store of earlier requests, in tokens (default 65536; "
                             "oldest evicted)")
    parser.add_argument("--k", type=int, default=5, help="tokens drafted per step (start value when --adaptive)")
    parser.add_argument("--adaptive", action="store_true", help="adapt K to recent acceptance")
    parser.add_argument("--max-k", type=int, default=None, help="upper bound for adaptive K (default: max(12, --k))")
    parser.add_argument("--confidence", type=float, default=0.0, help="stop drafting below this draft probability")
    parser.add_argument("--device", default="cpu", type=device_arg, help="cpu or cuda")
    parser.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: bfloat16 on CUDA, float32 on "
                        "the CPU)")
    parser.add_argument("--weights", default="auto", choices=WEIGHTS,
                        help="the target's linear weights: int4 / int8 (quantized blocks of 32, CPU; int4 keeps the "
                             "head in 8 bits, int4-all does not), gguf (the GGUF's "
                             "own bit widths), fp32 / bf16, same (in --dtype) or auto (the model's own on the "
                             "device: int4 for the Qwen pair on the CPU, else same)")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp16"),
                        help="the KV cache: auto keeps the model's dtype (fp32 on the CPU, as transformers' forward); "
                             "fp16 halves what a batched or long-context pass reads from it (packed models on the "
                             "CPU, whose native decoder rounds keys and values to fp16)")
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


def _positive_tokens(text: str) -> int:
    return whole_number(text, 1, "a positive number of tokens")


def _count(text: str) -> int:
    return whole_number(text, 0, "a number of tokens (0 or more)")


def device_arg(text: str) -> str:
    """argparse type for --device (config.check_device)."""
    try:
        return check_device(text)
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def check_utf8(name: str, text: str | None) -> None:
    """A text flag that reaches the tokenizer is UTF-8: argv is decoded with surrogateescape, so bytes that are not
    arrive as lone surrogates, which the tokenizer refuses with a TypeError."""
    try:
        (text or "").encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{name} is not valid UTF-8") from None


def model_config(args: argparse.Namespace) -> ModelConfig:
    """--model, --device, --dtype, --weights, --kv-cache-dtype and --compile as the library's ModelConfig."""
    fast = None if args.compile is None else FastPathConfig(enabled=args.compile)
    return ModelConfig(args.model, device=args.device, dtype=args.dtype, weights=args.weights,
                       kv_half=args.kv_cache_dtype == "fp16", fast=fast)


def drafter_config(args: argparse.Namespace, name: str | None = None) -> DrafterConfig:
    """The drafter flags as a DrafterConfig for drafter `name` (default: --drafter)."""
    return DrafterConfig(name=name or args.drafter, draft_model=args.draft_model, draft_weights=args.draft_weights,
                         draft_vocab=args.draft_vocab, exit_layer=args.exit_layer, lookahead=args.lookahead,
                         suffix_store=args.suffix_store)


def resolved_drafter(args: argparse.Namespace) -> str:
    """--drafter with `auto` resolved for the device and --draft-model (drafters.best_drafter_name)."""
    if args.drafter != AUTO:
        return args.drafter
    return best_drafter_name(args.device.partition(":")[0], args.draft_model is not None, args.confidence != 0)


def check_drafter_flags(args: argparse.Namespace, drafters: list[str], shown: str | None = None) -> None:
    """The drafter flags given on the command line, each checked against the drafters that read it: the configs'
    options, and --k and --adaptive, which no drafter but a drafting one reads (--drafter none)."""
    given = {**drafter_config(args).given(spec_config(args)), "k": args.k != SpecConfig.k, "adaptive": args.adaptive}
    check_options_read(given, drafters, shown)


def spec_config(args: argparse.Namespace) -> SpecConfig:
    if args.max_k is not None and not args.adaptive:
        raise ConfigError("--max-k has no effect without --adaptive")
    if args.max_k is not None and args.max_k < args.k:
        raise ConfigError(f"--max-k ({args.max_k}) must be >= --k ({args.k})")
    max_k = args.max_k if args.max_k is not None else max(12, args.k)
    return SpecConfig(k=args.k, adaptive=args.adaptive, max_k=max_k, confidence=args.confidence)
