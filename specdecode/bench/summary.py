"""Aggregate run records into one row per (method, category), plus an `overall` category per method.
The conventions (ratios of sums, Spec-Bench style) are in CONVENTIONS, which report.md prints too. Rows are
plain dicts so a later column (e.g. fraction of the bandwidth floor) is one more key."""
from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from specdecode.bench.llamacpp import NAME as LLAMACPP
from specdecode.bench.methods import BASELINE
from specdecode.bench.runner import Record

OVERALL = "overall"
SPLIT = ("prefill", "draft", "verify")  # time_split's keys, in Generation.phases' order
CONVENTIONS = (
    "all figures are ratios of sums over a cell's runs, not means of per-prompt ratios",
    "tokens_per_s = new tokens / wall seconds (prefill included, after a warm-up call per method)",
    "speedup = tokens_per_s / the baseline's tokens_per_s in the same category of the same run",
    "tau = new tokens / target passes that produced them (plain decoding: 1.0; the bonus token counts)",
    "acceptance_rate = accepted / proposed draft tokens (transformers peers: derived from counted target passes)",
    "prompts = questions; lossless_prompts = questions whose every turn equals the baseline's greedy output "
    "(null when sampling); mismatches = differing turns = near_ties + bugs",
    "same_as_plain = turns whose output equals our plain decoding's (specdecode-none in the same run) token for "
    "token, with no tolerance (null when not compared)",
    "multi-turn: later turns follow the baseline's answers, for every method",
    "time_split = shares of the wall seconds spent prefilling, drafting and verifying, by the engine's own timers "
    "(the rest: committing, detokenizing, the loop; null for methods without those timers)",
    "first_token_ms = the median over the cell's turns of the engine's milliseconds to the first token (the "
    "prefill and the first step; null for methods without that timer)",
    "peak_rss_mb = the highest peak resident set size (MiB) of the whole process while the method decoded one "
    "of the cell's turns (every loaded model counts, so compare methods by their differences)",
)


def summarise(records: list[Record], methods: list[str], categories: list[str], greedy: bool) -> list[dict[str, Any]]:
    """greedy: the run was lossless-checked (sampling runs report speed and tau only)."""
    cells: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for record in records:
        cells[(record.method, record.category)].append(record)
        cells[(record.method, OVERALL)].append(record)
    rows = []
    for category in [*categories, OVERALL]:
        base = _rate(cells[(BASELINE, category)])
        for method in methods:
            cell = cells[(method, category)]
            if cell:
                rows.append(_row(method, category, cell, base, greedy))
    return rows


def _rate(records: list[Record]) -> float | None:
    seconds = sum(r.generation.seconds for r in records)
    return sum(len(r.generation.ids) for r in records) / seconds if seconds > 0 else None


def _ratio(num: int | float | None, den: int | float | None) -> float | None:
    return None if num is None or den in (None, 0) else num / den


def _sum(records: list[Record], field: str) -> int | None:
    values = [getattr(r.generation, field) for r in records]
    return None if any(v is None for v in values) else sum(values)


def _row(method: str, category: str, cell: list[Record], base_rate: float | None, greedy: bool) -> dict[str, Any]:
    tokens = sum(len(r.generation.ids) for r in cell)
    seconds = sum(r.generation.seconds for r in cell)
    rate = _rate(cell)
    questions: dict[Any, list[Record]] = defaultdict(list)
    for record in cell:
        questions[record.question_id].append(record)
    mismatched = [r for r in cell if r.identical is False]
    row = {
        "method": method,
        "category": category,
        "prompts": len(questions),
        "turns": len(cell),
        "new_tokens": tokens,
        "time_s": round(seconds, 4),
        "tokens_per_s": _round(rate, 3),
        "speedup": _round(_ratio(rate, base_rate), 4),
        "tau": _round(_ratio(tokens, _sum(cell, "passes")), 4),
        "acceptance_rate": _round(_ratio(_sum(cell, "accepted"), _sum(cell, "proposed") or None), 4),
        "time_split": _time_split(cell, seconds),
        "first_token_ms": _first_token_ms(cell),
        "peak_rss_mb": _peak_rss(cell),
        "lossless_prompts": None,
        "mismatches": None,
        "near_ties": None,
        "bugs": None,
        "same_as_plain": None,
    }
    if any(r.same_as_plain is not None for r in cell):
        row["same_as_plain"] = sum(bool(r.same_as_plain) for r in cell)
    compared = not all(r.method == LLAMACPP for r in cell)  # llama.cpp's outputs are timed, not compared
    if greedy and compared:  # the baseline's records carry identical=None: it is the reference
        row["lossless_prompts"] = sum(all(r.identical is not False for r in rs) for rs in questions.values())
        row["mismatches"] = len(mismatched)
        row["near_ties"] = sum(r.mismatch is not None and r.mismatch.kind == "near-tie" for r in mismatched)
        row["bugs"] = len(mismatched) - row["near_ties"]
    return row


def _time_split(cell: list[Record], seconds: float) -> dict[str, float] | None:
    """Shares of the cell's wall seconds in prefill, drafting and verification; None when a run was not split
    (a peer's) or took no time. Example: 10 s of which 1.5 prefill, 3 drafting, 5 verifying -> 0.15 / 0.3 / 0.5."""
    phases = [r.generation.phases for r in cell]
    if seconds <= 0 or any(p is None for p in phases):
        return None
    return {name: round(sum(p[i] for p in phases) / seconds, 4) for i, name in enumerate(SPLIT)}


def _first_token_ms(cell: list[Record]) -> float | None:
    """The median of the cell's times to the first token, in ms; None when a run has no such timer (a peer's)."""
    times = [r.generation.first_token_s for r in cell]
    if not times or any(t is None for t in times):
        return None
    return round(1000 * statistics.median(times), 2)


def _peak_rss(cell: list[Record]) -> float | None:
    """The highest peak over the cell's runs; None when no run could measure it."""
    peaks = [r.peak_rss_mb for r in cell if r.peak_rss_mb is not None]
    return round(max(peaks), 1) if peaks else None


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
