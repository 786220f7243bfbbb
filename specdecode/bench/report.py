"""Write a benchmark's outputs: results.json (machine-readable), report.md (a Spec-Bench-like leaderboard:
rows methods, columns categories + overall) and speedup.png (grouped bars, matplotlib Agg backend)."""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdecode.bench.summary import OVERALL, SPLIT

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Column:
    """One column of the overall table: a key of a summary row, a header and a formatter."""

    key: str
    header: str
    fmt: Callable[[dict[str, Any]], str]


def _num(key: str, spec: str, suffix: str = "") -> Callable[[dict[str, Any]], str]:
    return lambda row: "-" if row.get(key) is None else f"{row[key]:{spec}}{suffix}"


def _lossless(row: dict[str, Any]) -> str:
    if row.get("lossless_prompts") is None:
        return "-"
    return f"{row['lossless_prompts']}/{row['prompts']}"


def _split(row: dict[str, Any]) -> str:
    split = row.get("time_split")
    return "-" if split is None else " / ".join(f"{100 * split[name]:.0f}" for name in SPLIT) + " %"


# Extra per-method columns (e.g. fraction of the bandwidth floor) are appended here.
OVERALL_COLUMNS: list[Column] = [
    Column("speedup", "speedup", _num("speedup", ".2f", "x")),
    Column("tokens_per_s", "tokens/s", _num("tokens_per_s", ".1f")),
    Column("tau", "tau", _num("tau", ".2f")),
    Column("acceptance_rate", "acceptance", _num("acceptance_rate", ".2f")),
    Column("lossless_prompts", "lossless prompts", _lossless),
    Column("near_ties", "near-ties", _num("near_ties", "d")),
    Column("bugs", "bugs", _num("bugs", "d")),
    Column("same_as_plain", "= our plain", lambda row: "-" if row.get("same_as_plain") is None
           else f"{row['same_as_plain']}/{row['turns']}"),
    Column("time_split", "prefill / draft / verify", _split),
    Column("first_token_ms", "first token ms (median)", _num("first_token_ms", ".0f")),
    Column("peak_rss_mb", "peak RSS MB", _num("peak_rss_mb", ".0f")),
]


def write_all(out_dir: Path, meta: dict[str, Any], methods: list[dict[str, Any]], rows: list[dict[str, Any]],
              runs: list[dict[str, Any]]) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {"schema": SCHEMA_VERSION, "meta": meta, "methods": methods, "results": rows, "runs": runs}
    paths = [out_dir / "results.json", out_dir / "report.md", out_dir / "speedup.png"]
    paths[0].write_text(json.dumps(results, indent=1) + "\n")
    paths[1].write_text(markdown(meta, rows))
    plot(rows, meta, paths[2])
    return paths


def _order(rows: list[dict[str, Any]]) -> tuple[list[str], list[str], dict[tuple[str, str], dict[str, Any]]]:
    methods = list(dict.fromkeys(r["method"] for r in rows))
    categories = [c for c in dict.fromkeys(r["category"] for r in rows) if c != OVERALL] + [OVERALL]
    return methods, categories, {(r["method"], r["category"]): r for r in rows}


def _table(headers: list[str], lines: list[list[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out)


def _by_category(rows, fmt: Callable[[dict[str, Any]], str]) -> str:
    methods, categories, cell = _order(rows)
    lines = [[m, *(fmt(cell[(m, c)]) if (m, c) in cell else "" for c in categories)] for m in methods]
    return _table(["method", *categories], lines)


def markdown(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    methods, _, cell = _order(rows)
    overall = _table(["method", *(c.header for c in OVERALL_COLUMNS)],
                     [[m, *(c.fmt(cell[(m, OVERALL)]) for c in OVERALL_COLUMNS)] for m in methods])
    setup = (f"model `{meta.get('model')}`, {meta.get('device')} {meta.get('dtype')}, "
             f"{meta.get('max_new_tokens')} new tokens, temperature {meta.get('temperature')}, "
             f"k {meta.get('k')}, {meta.get('prompts')} prompts ({meta.get('prompt_source')}), {meta.get('date')}")
    parts = [
        "# specdecode bench",
        f"{setup}  \ncommand: `{meta.get('command') or '(library call)'}`  \nmachine: {meta.get('machine')}"
        + (f"  \nskipped: {', '.join(meta['skipped'])}" if meta.get("skipped") else ""),
        f"## Speedup over `{meta.get('baseline')}` (tokens/s ratio, same run)",
        _by_category(rows, _num("speedup", ".2f", "x")),
        "## Overall",
        overall,
        "## Tokens/s",
        _by_category(rows, _num("tokens_per_s", ".1f")),
        "## tau (mean tokens per target pass)",
        _by_category(rows, _num("tau", ".2f")),
        "## Lossless prompts (greedy output identical to the baseline's)",
        _by_category(rows, _lossless),
        "Conventions:\n" + "\n".join(f"- {line}" for line in meta.get("conventions", ())),
    ]
    return "\n\n".join(parts) + "\n"


def plot(rows: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    methods, categories, cell = _order(rows)
    width = 0.8 / max(1, len(methods))
    fig, ax = plt.subplots(figsize=(max(8.0, 1.1 * len(categories) + 4), 4.8))
    for i, method in enumerate(methods):
        xs = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(categories))]
        ys = [(cell.get((method, c)) or {}).get("speedup") or 0.0 for c in categories]
        ax.bar(xs, ys, width, label=method)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(categories)), categories, rotation=20)
    ax.set_ylabel(f"speedup over {meta.get('baseline')}")
    ax.set_title(f"{meta.get('model')} · {meta.get('device')} {meta.get('dtype')} · "
                 f"{meta.get('max_new_tokens')} new tokens", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
