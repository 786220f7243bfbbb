"""`specdecode generate`: one prompt, streamed, then its metrics (or one JSON object with --json)."""
from __future__ import annotations

import argparse
import json
import sys

from specdecode.api import SpecDecoder
from specdecode.cli.args import (
    add_model_args,
    check_drafter_flags,
    check_utf8,
    drafter_config,
    model_config,
    resolved_drafter,
    spec_config,
)
from specdecode.cli.commands import COMMANDS
from specdecode.config import GenerationConfig, SamplingConfig, Structure
from specdecode.core.metrics import GenerationMetrics
from specdecode.core.sequence import Sequence
from specdecode.drafters import AUTO
from specdecode.errors import ConfigError


def register(subparsers, name: str = "generate") -> None:
    gen = subparsers.add_parser(name, help=COMMANDS[name].help)
    gen.add_argument("prompt", help="the prompt; - reads it from stdin")
    add_model_args(gen, AUTO)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--min-p", type=float, default=0.0, help="drop tokens below this fraction of the top "
                                                               "probability (sampling)")
    gen.add_argument("--presence-penalty", type=float, default=0.0,
                     help="subtract this from a token's logit once it was generated (-2..2, as OpenAI)")
    gen.add_argument("--frequency-penalty", type=float, default=0.0,
                     help="subtract this times the times a token was generated (-2..2, as OpenAI)")
    gen.add_argument("--repetition-penalty", type=float, default=1.0,
                     help="divide positive / multiply negative logits of prompt and generated tokens "
                          "(0.01..10, as vLLM)")
    gen.add_argument("--logit-bias", type=_logit_bias, default=(), metavar="ID:BIAS,...",
                     help="add BIAS (-100..100) to token ID's logit (as OpenAI's logit_bias)")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--chat", action="store_true", help="apply the model's chat template")
    gen.add_argument("--suffix", metavar="TEXT", default=None,
                     help="the text after the one to generate: fill the middle between the prompt and it (a model "
                          "with fill-in-the-middle tokens, such as the Qwen2.5-Coder pair)")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    gen.add_argument("--logprobs", type=int, default=None, metavar="N",
                     help="per token its logprob and the N most likely alternatives (in --json output)")
    shape = gen.add_mutually_exclusive_group()  # structured outputs: what the output must match
    shape.add_argument("--json-schema", metavar="FILE", help="a JSON schema the output must satisfy")
    shape.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    shape.add_argument("--regex", metavar="PATTERN", help="a regular expression the output must match")
    shape.add_argument("--choice", action="append", metavar="TEXT", help="one allowed output (repeat the flag)")
    shape.add_argument("--grammar", metavar="FILE", help="a Lark or GBNF grammar the output must match")
    gen.set_defaults(func=cmd_generate)


def _logit_bias(text: str) -> tuple[tuple[int, float], ...]:
    """"ID:BIAS,ID:BIAS" -> ((ID, BIAS), ...); the values are checked by SamplingConfig."""
    pairs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        token, sep, bias = item.partition(":")
        try:
            pairs.append((int(token), float(bias)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected ID:BIAS pairs separated by commas, got {item!r}") from None
        if not sep:
            raise argparse.ArgumentTypeError(f"expected ID:BIAS pairs separated by commas, got {item!r}")
    return tuple(pairs)


def cmd_generate(args: argparse.Namespace) -> int:
    prompt = _prompt(args.prompt)
    for name, text in (("--suffix", args.suffix), ("--regex", args.regex),
                       *(("--choice", choice) for choice in args.choice or ())):
        check_utf8(name, text)
    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                              min_p=args.min_p, presence_penalty=args.presence_penalty,
                              frequency_penalty=args.frequency_penalty, repetition_penalty=args.repetition_penalty,
                              logit_bias=args.logit_bias)
    generation = GenerationConfig(max_new_tokens=args.max_new_tokens, structure=_structure(args),
                                  logprobs=args.logprobs)
    if not prompt.strip() and not args.suffix:
        raise ConfigError("the prompt is empty")
    if args.logprobs is not None and not args.json:
        raise ConfigError("--logprobs has no effect without --json (the logprobs are in its JSON object)")
    if args.suffix is not None and args.chat:
        raise ConfigError("--suffix fills a middle in a text prompt: it cannot be combined with --chat")
    ignored = ["--" + name.replace("_", "-") for name in sampling.unused_when_greedy()]
    if ignored:
        raise ConfigError(f"{', '.join(ignored)} has no effect with greedy decoding; set --temperature > 0")
    drafter = resolved_drafter(args)
    check_drafter_flags(args, [drafter], drafter if drafter == args.drafter else f"{args.drafter} (here: {drafter})")
    decoder = SpecDecoder.load(model_config(args), drafter_config(args), spec=spec_config(args))
    pieces, logged, seq = [], [], None
    stream = decoder.stream(prompt, chat=args.chat, sampling=sampling, generation=generation, suffix=args.suffix)
    for seq, chunk in stream:  # noqa: B007 - the last seq is read after the loop
        pieces.append(chunk.text)
        logged.extend(chunk.logprobs or ())
        if not args.json and chunk.text:
            print(chunk.text, end="", flush=True)
    assert seq is not None
    name = decoder.engine.drafter.name
    if args.json:
        logprobs = None if args.logprobs is None else [
            {"token": entry.token, "logprob": entry.logprob, "top": [[t, lp] for t, lp in entry.top]}
            for entry in logged]
        print(json.dumps(_as_json("".join(pieces), logprobs, seq, name)))
    else:
        print(_summary(seq.metrics, seq, name, structured=generation.structure is not None))
    return 0


def _prompt(given: str) -> str:
    """The prompt: `-` reads it from stdin, as Unix tools read a file named -, kept as it is (a last newline too)
    and read as UTF-8 whatever the locale."""
    if given != "-":
        check_utf8("the prompt", given)
        return given
    try:
        return sys.stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"the prompt (stdin) is not valid UTF-8 ({error.reason} at byte {error.start})") from None


def _as_json(text: str, logprobs: list | None, seq: Sequence, drafter: str) -> dict:
    metrics = seq.metrics
    return {"text": text, "logprobs": logprobs, "new_tokens": metrics.new_tokens,
            "target_passes": metrics.target_passes, "tau": round(metrics.tau, 4),
            "acceptance_rate": round(metrics.acceptance_rate, 4), "tokens_per_s": round(metrics.tokens_per_s, 3),
            "drafter": drafter, "finish_reason": seq.finish_reason, "metrics": metrics.as_dict()}


def _summary(metrics: GenerationMetrics, seq: Sequence, drafter: str, structured: bool) -> str:
    by_pos = " ".join(f"{x:.2f}" for x in metrics.acceptance_by_position) or "-"
    return (f"\n\n[{drafter}] {metrics.new_tokens} tokens, {metrics.target_passes} target passes, "
            f"tau {metrics.tau:.2f}, acceptance {metrics.acceptance_rate:.2f} (by position: {by_pos}), "
            f"{metrics.tokens_per_s:.1f} tokens/s; time: first token {metrics.first_token_s or 0:.2f}s, "
            f"prefill {metrics.prefill_s:.2f}s, "
            f"draft {metrics.draft_s:.2f}s, verify {metrics.verify_s:.2f}s; finish: {seq.finish_reason}"
            + (f"; grammar-forced tokens: {metrics.forced}" if structured else "")
            + (f"; row cost {metrics.row_cost:.2f} of a pass" if metrics.row_cost is not None else "")
            + "".join(f"; {steps} steps paused by the {rule} rule" if rule != "measuring" else
                      f"; {steps} plain steps timed" for rule, steps in metrics.paused_steps.items()))


def _structure(args: argparse.Namespace) -> Structure | None:
    """The output structure the flags ask for (at most one: argparse's group), files read here (one-line errors)."""
    if args.json_object:
        return Structure.json_object()
    if args.regex is not None:
        return Structure.regex(args.regex)
    if args.choice:
        return Structure.choice(args.choice)
    for flag, path, make in (("--json-schema", args.json_schema, Structure.json_schema),
                             ("--grammar", args.grammar, Structure.grammar)):
        if path is not None:
            try:
                with open(path, encoding="utf-8") as file:
                    text = file.read()
            except (OSError, UnicodeDecodeError) as error:
                raise ConfigError(f"{flag}: cannot read {path}: {getattr(error, 'strerror', None) or error}") from None
            return make(text)
    return None
