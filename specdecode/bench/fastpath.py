"""Fast-path benchmark: plain and speculative decoding through the static-cache / compiled path against
transformers' eager `generate`, as fractions of the memory-bandwidth floor, plus the per-pass cost curve.

tokens/s of plain decoding is compared with 1000 / floor_ms (one pass per token); speculative decoding with
tau * 1000 / floor_ms (tau tokens per pass). Runs on the default model or a random Llama-shaped config."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specdecode.bench.passcost import copy_bandwidth, pass_costs, random_model, weight_bytes
from specdecode.config import DrafterConfig, FastPathConfig, GenerationConfig, ModelConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.core.target import Target
from specdecode.drafters import build_drafter
from specdecode.loading.load import load_model, parse_dtype


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
        loaded = load_model(ModelConfig(model_name, device=device, dtype=dtype, weights="same"))
        model, tokenizer, name = loaded.model, loaded.tokenizer, loaded.name
        text = ("Here is a function:\n\ndef fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n"
                "        a, b = b, a + b\n    return a\n\nRewrite it with type hints and a docstring, keeping the same "
                "logic.")
        enc = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True)
        ids = list(enc["input_ids"] if hasattr(enc, "keys") else enc)
    dev = torch.device(device)
    bandwidth = copy_bandwidth(dev) if dev.type == "cuda" else float("nan")
    nbytes = weight_bytes(model)
    floor_ms = nbytes / bandwidth * 1e3
    report = FastPathReport(name, torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", dtype,
                            nbytes / 1e9, bandwidth / 1e12, floor_ms)
    eager = Target(model, tokenizer)
    fast = Target(model, tokenizer, FastPathConfig(enabled=True, capacity=1024, backend=backend))
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

