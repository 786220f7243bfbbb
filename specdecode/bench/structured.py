"""`specdecode bench-structured`: structured outputs under speculation, on shipped tasks (JSON extraction into a
schema, classification into labels or an enum schema, function-call shaped JSON; data/structured.jsonl).

Every drafter runs twice, without and with grammar drafting (SpecConfig.grammar_draft: the tokens the grammar
forces appended to its drafts), against the baseline `none` without grammar drafting (plain constrained
decoding). One process, a warm-up call per method, prompts in a rotating method order. Greedy: every output must
equal the baseline's token for token and satisfy its structure (JSON parsed and validated with `jsonschema`, a
choice among its labels); the grammar's own cost (walking drafts, masking scores) is reported as a share of the
decoding time.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import jsonschema

from specdecode.bench.runner import encode_conversation
from specdecode.config import DrafterConfig, GenerationConfig, ModelConfig, SamplingConfig, SpecConfig, Structure
from specdecode.core.engine import Engine
from specdecode.core.target import Target
from specdecode.drafters import build_drafter
from specdecode.errors import ConfigError
from specdecode.loading.load import load_model

BASELINE = "none"
DEFAULT_DRAFTERS = ("none", "prompt-lookup", "suffix")
GRAMMAR_TOKENS = 16  # SpecConfig.grammar_draft of the "+grammar" methods


@dataclass(frozen=True)
class Task:
    question_id: int
    category: str
    prompt: str
    structure: Structure
    schema: dict | None  # the JSON schema to validate against (None: a choice)
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Run:
    method: str
    question_id: int
    category: str
    tokens: int
    seconds: float
    passes: int
    forced: int
    grammar_s: float
    valid: bool
    identical: bool | None


def load_tasks(path: str | None = None) -> list[Task]:
    """The shipped tasks (or a JSONL of {"question_id", "category", "prompt", "structure": {"json_schema": {...}} |
    {"choice": [...]} | {"regex": "..."}})."""
    text = Path(path).read_text(encoding="utf-8") if path else \
        resources.files("specdecode.bench.data").joinpath("structured.jsonl").read_text(encoding="utf-8")
    tasks = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            (kind, value), = record["structure"].items()
            schema = value if kind == "json_schema" else None
            structure = Structure.json_schema(value) if kind == "json_schema" else getattr(Structure, kind)(value)
            tasks.append(Task(record["question_id"], record["category"], record["prompt"], structure, schema,
                              tuple(value) if kind == "choice" else ()))
        except (KeyError, ValueError, TypeError, AttributeError) as error:
            raise ConfigError(f"{path or 'structured.jsonl'}:{line_no}: not a structured task ({error})") from None
    return tasks


def first_of_each(tasks: list[Task], limit: int | None) -> list[Task]:
    """The first `limit` tasks of each category, file order kept (None: all)."""
    taken: dict[str, int] = {}
    chosen = []
    for task in tasks:
        if limit is None or taken.get(task.category, 0) < limit:
            taken[task.category] = taken.get(task.category, 0) + 1
            chosen.append(task)
    return chosen


def satisfies(task: Task, text: str) -> bool:
    if task.choices:
        return text in task.choices
    if task.schema is None:
        return True  # a regex or grammar: the matcher itself is the check
    try:
        jsonschema.validate(json.loads(text), task.schema)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def build_engines(model: str | None, drafters: list[str], k: int, draft_model: str | None):
    """(method name, Engine) pairs: each drafter without and with grammar drafting, the baseline first."""
    loaded = load_model(ModelConfig(model, weights="same"))
    target = Target(loaded.model, loaded.tokenizer)
    engines = []
    for name in drafters:
        for grammar in (0, GRAMMAR_TOKENS):
            spec = SpecConfig(k=k, grammar_draft=grammar)
            drafter = build_drafter(target, DrafterConfig(name=name, draft_model=draft_model), spec)
            engines.append((name + ("+grammar" if grammar else ""), Engine(target, drafter, spec)))
    return target, engines


def run(engines, target, tasks: list[Task], max_new_tokens: int, progress: bool = True) -> list[Run]:
    tokenizer = target.tokenizer
    prompts = [encode_conversation(tokenizer, [{"role": "user", "content": task.prompt}]) for task in tasks]
    for _, engine in engines:  # warm-up: untimed, on the first task
        engine.generate(prompts[0], SamplingConfig(), GenerationConfig(8, structure=tasks[0].structure))
    runs: list[Run] = []
    for index, (task, prompt) in enumerate(zip(tasks, prompts)):
        by_method: dict[str, tuple] = {}
        order = engines[index % len(engines):] + engines[: index % len(engines)]
        for name, engine in order:
            generation = GenerationConfig(max_new_tokens, structure=task.structure)
            began = time.perf_counter()
            result = engine.generate(prompt, SamplingConfig(), generation)
            by_method[name] = (result, time.perf_counter() - began)
        baseline = by_method[BASELINE][0].token_ids
        for name, _ in engines:
            result, seconds = by_method[name]
            m = result.metrics
            runs.append(Run(name, task.question_id, task.category, m.new_tokens, seconds, m.target_passes, m.forced,
                            m.grammar_s, satisfies(task, result.text),
                            None if name == BASELINE else result.token_ids == baseline))
        if progress:
            print(f"task {index + 1}/{len(tasks)} {task.category}: " + ", ".join(
                f"{name} {by_method[name][0].metrics.new_tokens / by_method[name][1]:.1f}" for name, _ in engines),
                flush=True)
    return runs


def summarise(runs: list[Run]) -> list[dict]:
    """One row per (method, category) and per method overall: tokens/s, speedup over the baseline, tau, forced
    tokens per token, the grammar's share of the time, valid and identical outputs."""
    rows = []
    categories = list(dict.fromkeys(r.category for r in runs)) + ["overall"]
    methods = list(dict.fromkeys(r.method for r in runs))
    for category in categories:
        base = None
        for method in methods:
            chosen = [r for r in runs if r.method == method and category in ("overall", r.category)]
            tokens, seconds = sum(r.tokens for r in chosen), sum(r.seconds for r in chosen)
            speed = tokens / seconds if seconds else 0.0
            base = speed if method == BASELINE else base
            rows.append({"method": method, "category": category, "tasks": len(chosen), "tokens": tokens,
                         "tokens_per_s": round(speed, 2), "speedup": round(speed / base, 3) if base else None,
                         "tau": round(tokens / max(1, sum(r.passes for r in chosen)), 3),
                         "forced_share": round(sum(r.forced for r in chosen) / max(1, tokens), 3),
                         "grammar_share": round(sum(r.grammar_s for r in chosen) / max(1e-9, seconds), 4),
                         "valid": sum(r.valid for r in chosen),
                         "identical": sum(bool(r.identical) for r in chosen if r.identical is not None),
                         "compared": sum(r.identical is not None for r in chosen)})
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| method | category | tasks | tokens/s | speedup vs none | tau | forced tokens | grammar time | valid | "
             "identical to none |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        identical = f"{r['identical']}/{r['compared']}" if r["compared"] else "(baseline)"
        lines.append(f"| {r['method']} | {r['category']} | {r['tasks']} | {r['tokens_per_s']:.1f} | "
                     f"{r['speedup']:.2f}x | {r['tau']:.2f} | {100 * r['forced_share']:.0f}% | "
                     f"{100 * r['grammar_share']:.1f}% | {r['valid']}/{r['tasks']} | {identical} |")
    return "\n".join(lines)


