"""Fast-path benchmark: plain and speculative decoding through the static-cache / compiled path against
transformers' eager `generate`, as fractions of the memory-bandwidth floor, plus the per-pass cost curve.

tokens/s of plain decoding is compared with 1000 / floor_ms (one pass per token); speculative decoding with
tau * 1000 / floor_ms (tau tokens per pass). Runs on the default model or a random Llama-shaped config."""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..config import GenerationConfig, SamplingConfig, SpecConfig
from ..drafters import DrafterConfig, build_drafter
from ..engine import Engine
from ..fast import FastPathConfig
from ..models import load_model, parse_dtype
from ..target import Target
from .passcost import RANDOM_CONFIGS, copy_bandwidth, pass_costs, random_model, weight_bytes


@dataclass
class FastPathReport:
    model: str
    device: str
    dtype: str
    weight_gb: float
    copy_bandwidth_tb_s: float
    floor_ms: float
    rows: list[dict] = field(default_factory=list)  # method, tokens_per_s, tau, floor_fraction, same_as_plain
    pass_ms: dict = field(default_factory=dict)  # path -> {q: ms}


def _decode(engine: Engine, ids: list[int], n: int) -> tuple[list[int], float, float]:
    engine.warmup()  # every step shape the drafter can ask for (trees, hidden outputs, layer skip)
    engine.generate(ids, SamplingConfig(), GenerationConfig(max_new_tokens=8, stop_on_eos=False))  # warm-up
    result = engine.generate(ids, SamplingConfig(), GenerationConfig(max_new_tokens=n, stop_on_eos=False))
    m = result.metrics
    return result.token_ids, m.new_tokens / (m.draft_s + m.verify_s), m.tau


def _hf_generate(model, ids: list[int], n: int) -> float:
    x = torch.tensor([ids], device=model.device)
    model.generate(x, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    if x.is_cuda:
        torch.cuda.synchronize()
    began = time.perf_counter()
    model.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    if x.is_cuda:
        torch.cuda.synchronize()
    return n / (time.perf_counter() - began)


def run(model_name: str | None, random_config: str | None, device: str, dtype: str, drafters: tuple[str, ...],
        new_tokens: int = 128, k: int = 5, qs: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64),
        backend: str = "inductor") -> FastPathReport:
    torch_dtype = parse_dtype(dtype)
    if random_config:
        model, tokenizer, name = random_model(random_config, device, torch_dtype), None, random_config
        ids = list(range(100, 164))
    else:
        loaded = load_model(model_name, device=device, dtype=torch_dtype)
        model, tokenizer, name = loaded.model, loaded.tokenizer, loaded.name
        text = ("Here is a function:\n\ndef fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
                "    return a\n\nRewrite it with type hints and a docstring, keeping the same logic.")
        enc = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        ids = list(enc["input_ids"] if hasattr(enc, "keys") else enc)
    dev = torch.device(device)
    bandwidth = copy_bandwidth(dev) if dev.type == "cuda" else float("nan")
    nbytes = weight_bytes(model)
    floor_ms = nbytes / bandwidth * 1e3
    report = FastPathReport(name, torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", dtype,
                            nbytes / 1e9, bandwidth / 1e12, floor_ms)
    eager, fast = Target(model, tokenizer), Target(model, tokenizer, FastPathConfig(enabled=True, capacity=1024, backend=backend))
    report.pass_ms["eager"] = {c.q: round(c.ms, 3) for c in pass_costs(eager, qs)}
    report.pass_ms["fast"] = {c.q: round(c.ms, 3) for c in pass_costs(fast, qs)}
    hf = _hf_generate(model, ids, new_tokens)
    report.rows.append(dict(method="hf-generate (eager)", tokens_per_s=round(hf, 1), tau=1.0,
                            floor_fraction=round(hf * floor_ms / 1e3, 4)))
    plain = {}
    for path, target in (("eager", eager), ("fast", fast)):
        for drafter in ("none", *drafters):
            spec = SpecConfig(k=k)
            engine = Engine(target, build_drafter(target, DrafterConfig(name=drafter), spec), spec)
            tokens, tps, tau = _decode(engine, ids, new_tokens)
            if drafter == "none":
                plain[path] = tokens
            report.rows.append(dict(method=f"specdecode-{drafter} ({path})", tokens_per_s=round(tps, 1),
                                    tau=round(tau, 3), floor_fraction=round(tps * floor_ms / 1e3 / tau, 4),
                                    same_as_plain=tokens == plain[path]))
    return report


def to_markdown(report: FastPathReport) -> str:
    lines = [f"### {report.model} on {report.device}, {report.dtype}",
             f"weights {report.weight_gb:.2f} GB, copy bandwidth {report.copy_bandwidth_tb_s:.2f} TB/s, "
             f"floor {report.floor_ms:.3f} ms/pass", "",
             "| method | tokens/s | tau | fraction of floor | greedy == plain (same path) |", "|---|---|---|---|---|"]
    for row in report.rows:
        lines.append(f"| {row['method']} | {row['tokens_per_s']} | {row['tau']} | {row['floor_fraction']} | "
                     f"{row.get('same_as_plain', '')} |")
    qs = list(report.pass_ms["eager"])
    lines += ["", "| pass of q tokens (ms) | " + " | ".join(str(q) for q in qs) + " |", "|---" * (len(qs) + 1) + "|"]
    for path, costs in report.pass_ms.items():
        lines.append(f"| {path} | " + " | ".join(str(costs[q]) for q in qs) + " |")
    return "\n".join(lines)


def register(subparsers, name: str = "bench-fastpath"):
    from ..cli_args import device_arg

    parser = subparsers.add_parser(name, help="fast path vs eager: tokens/s as a fraction of the bandwidth floor, "
                                             "and the per-pass cost curve (default model or a random Llama shape)")
    parser.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    parser.add_argument("--random-config", default=None, choices=sorted(RANDOM_CONFIGS),
                        help="a random-initialised Llama shape instead of a real model")
    parser.add_argument("--device", default="cuda", type=device_arg, help="cpu or cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--drafters", default="prompt-lookup", help="comma list of drafters besides none")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", default="out/fastpath")
    parser.add_argument("--qs", default="1,4,16,64", help="verify-pass sizes to time")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (inductor, cudagraphs)")
    parser.set_defaults(func=cmd_fastpath)
    return parser


def cmd_fastpath(args) -> int:
    from ..config import ConfigError
    from ..drafters import registry

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
        raise ConfigError(f"--drafters: unknown or unsupported drafter {unknown[0]!r}; choose from: {', '.join(usable)}")
    try:
        qs = tuple(int(q) for q in args.qs.split(","))
    except ValueError:
        raise ConfigError(f"--qs expects comma-separated positive integers, got {args.qs!r}") from None
    if not qs or min(qs) <= 0:
        raise ConfigError(f"--qs expects comma-separated positive integers, got {args.qs!r}")
    GenerationConfig(max_new_tokens=args.max_new_tokens)
    if args.backend not in torch._dynamo.list_backends(exclude_tags=()):
        raise ConfigError(f"unknown --backend {args.backend!r}; choose from: "
                          f"{', '.join(torch._dynamo.list_backends(exclude_tags=()))}")
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"cannot create --out {args.out!r}: {error.strerror or error}") from None
    report = run(args.model, args.random_config, args.device, args.dtype, drafters, args.max_new_tokens,
                 qs=qs, backend=args.backend)
    stem = f"{args.random_config or 'default'}-{args.backend}"
    (out / f"{stem}.json").write_text(json.dumps(asdict(report), indent=2))
    (out / f"{stem}.md").write_text(to_markdown(report))
    print(to_markdown(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m specdecode.bench.fastpath")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub, "run")
    args = parser.parse_args(["run", *(argv if argv is not None else __import__("sys").argv[1:])])
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
