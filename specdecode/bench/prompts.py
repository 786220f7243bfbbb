"""Benchmark prompts in the Spec-Bench question format, loaded and validated before anything runs.

One JSON object per line: {"question_id": 1, "category": "qa", "turns": ["...", "..."], "reference": [...]}.
`turns` are user turns; a later turn is asked after the model's answer to the earlier ones. A bad file is
reported as one line naming the file and line number (a ConfigError), so the run never starts half-way.
Any other field is ignored: `reference` takes many shapes in Spec-Bench's question.jsonl (a string, a list
of strings, lists of lists of strings in the rag rows, null) and nothing here reads it.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from specdecode.errors import ConfigError

BUILTIN_NAME = "built-in (specdecode/bench/data/prompts.jsonl)"
# built-in categories kept out of the default set (its figures stay comparable), loaded when named (--category):
# multi-turn agentic work where requests repeat earlier answers, the workload the suffix drafter is for
OPT_IN = {"agentic": "agentic.jsonl"}


@dataclass(frozen=True)
class Question:
    question_id: int | str
    category: str
    turns: tuple[str, ...]


def builtin_text(name: str = "prompts.jsonl") -> str:
    return resources.files("specdecode.bench.data").joinpath(name).read_text(encoding="utf-8")


def load_prompts(path: str | Path | None = None, only: tuple[str, ...] | None = None) -> list[Question]:
    """Questions from a JSONL file (None: the built-in set), in file order. only: these categories (None: all);
    a built-in OPT_IN category is loaded only when named here."""
    if path is None:
        questions = parse_prompts(builtin_text(), BUILTIN_NAME)
        source = BUILTIN_NAME
        for category, name in OPT_IN.items():
            if only and category in only:
                questions += parse_prompts(builtin_text(name), f"built-in (specdecode/bench/data/{name})")
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(f"cannot read prompts file {str(path)!r}: {error}") from error
        questions, source = parse_prompts(text, str(path)), str(path)
    if only is None:
        return questions
    known = list(dict.fromkeys(categories(questions) + (list(OPT_IN) if path is None else [])))
    unknown = [c for c in only if c not in known]
    if unknown:
        raise ConfigError(f"unknown category {unknown[0]!r} in {source}; choose from: {', '.join(known)}")
    return [q for q in questions if q.category in only]


def parse_prompts(text: str, source: str = "<prompts>") -> list[Question]:
    """Parse and validate JSONL text; blank lines are allowed, everything else must be a valid question."""
    questions: list[Question] = []
    seen: dict[int | str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        question = _parse_line(line, f"{source}:{number}")
        if question.question_id in seen:
            raise ConfigError(f"{source}:{number}: duplicate question_id {question.question_id!r} "
                              f"(first on line {seen[question.question_id]})")
        seen[question.question_id] = number
        questions.append(question)
    if not questions:
        raise ConfigError(f"{source}: no prompts (the file is empty)")
    return questions


def _parse_line(line: str, where: str) -> Question:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for name in ("question_id", "category", "turns"):
        if name not in record:
            raise ConfigError(f"{where}: missing field {name!r}")
    qid, category, turns = record["question_id"], record["category"], record["turns"]
    if isinstance(qid, bool) or not isinstance(qid, (int, str)) or qid == "":
        raise ConfigError(f"{where}: question_id must be an integer or a non-empty string")
    if not isinstance(category, str) or not category.strip():
        raise ConfigError(f"{where}: category must be a non-empty string")
    if not isinstance(turns, list) or not turns:
        raise ConfigError(f"{where}: turns must be a non-empty list of strings")
    if not all(isinstance(turn, str) and turn.strip() for turn in turns):
        raise ConfigError(f"{where}: every turn must be a non-empty string")
    return Question(qid, category.strip(), tuple(turns))


def select(questions: list[Question], limit: int | None = None) -> list[Question]:
    """The first `limit` questions of each category (file order kept)."""
    if limit is not None and limit <= 0:
        raise ConfigError(f"--limit must be a positive integer, got {limit}")
    taken: Counter[str] = Counter()
    chosen = []
    for question in questions:
        if limit is None or taken[question.category] < limit:
            taken[question.category] += 1
            chosen.append(question)
    return chosen


def categories(questions: list[Question]) -> list[str]:
    """Categories in order of first appearance."""
    return list(dict.fromkeys(q.category for q in questions))
