"""bench-structured: the shipped tasks, the validity check, the summary, and a run on the tiny model."""
from __future__ import annotations

import json

import pytest

from specdecode.bench import structured as bench
from specdecode.cli.main import main
from specdecode.config import DrafterConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.core.structured import Grammars
from specdecode.drafters import build_drafter


def test_shipped_tasks_cover_three_kinds_and_compile(tiny_tokenizer):
    tasks = bench.load_tasks()
    assert len(tasks) >= 20
    assert {t.category for t in tasks} == {"extraction", "classification", "function_call"}
    grammars = Grammars(tiny_tokenizer, 259, [tiny_tokenizer.eos_token_id])
    for task in tasks:
        grammars.check(task.structure)


def test_limit_takes_the_first_tasks_of_each_category():
    chosen = bench.first_of_each(bench.load_tasks(), 2)
    assert [t.category for t in chosen] == ["extraction"] * 2 + ["classification"] * 2 + ["function_call"] * 2


def test_satisfies_validates_schema_and_choice():
    tasks = bench.load_tasks()
    call = next(t for t in tasks if t.category == "function_call")
    good = {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius", "days": 1}}
    assert bench.satisfies(call, json.dumps(good))
    assert not bench.satisfies(call, json.dumps({**good, "name": "other"}))
    assert not bench.satisfies(call, '{"name": "get_weather", "argu')
    label = next(t for t in tasks if t.choices)
    assert bench.satisfies(label, "positive") and not bench.satisfies(label, "great")


def test_summary_rates():
    runs = [bench.Run("none", 1, "a", 10, 1.0, 10, 0, 0.01, True, None),
            bench.Run("pl+grammar", 1, "a", 10, 0.5, 4, 3, 0.02, True, True)]
    rows = {(r["method"], r["category"]): r for r in bench.summarise(runs)}
    fast = rows["pl+grammar", "overall"]
    assert fast["speedup"] == 2.0 and fast["tau"] == 2.5 and fast["forced_share"] == 0.3
    assert fast["identical"] == 1 and fast["compared"] == 1 and rows["none", "a"]["compared"] == 0
    assert "| pl+grammar | a | 1 | 20.0 | 2.00x |" in bench.markdown(bench.summarise(runs))


def test_run_on_the_tiny_model(tiny_target):
    tasks = [t for t in bench.load_tasks() if t.category == "function_call"][:2]
    engines = []
    for name in ("none", "prompt-lookup"):
        for grammar in (0, bench.GRAMMAR_TOKENS):
            spec = SpecConfig(k=3, grammar_draft=grammar)
            engines.append((name + ("+grammar" if grammar else ""),
                            Engine(tiny_target, build_drafter(tiny_target, DrafterConfig(name=name), spec), spec)))
    runs = bench.run(engines, tiny_target, tasks, max_new_tokens=24, progress=False)
    assert len(runs) == 8
    assert all(r.identical for r in runs if r.identical is not None)  # greedy: the grammar drafting is lossless
    assert sum(r.forced for r in runs if r.method.endswith("+grammar")) > 0
    assert sum(r.forced for r in runs if not r.method.endswith("+grammar")) == 0


@pytest.mark.parametrize("argv, message", [
    (["--drafters", "nope"], "unknown drafter 'nope'"),
    (["--k", "0"], "--k must be a positive integer"),
    (["--tasks", "/no/such/file"], "cannot read --tasks"),
    (["--limit", "0"], "--limit must be a positive integer, got 0"),  # was an IndexError: no task to warm up on
    (["--threads", "0"], "expected a positive number of threads"),  # ran
    (["--draft-model", "nosuch"], "--draft-model has no effect with --drafters none, prompt-lookup, suffix; it is "
                                  "read by --drafters draft-model or eagle"),  # ran, the model never read
    (["--drafters", "draft-model"], "--drafters draft-model needs --draft-model"),
])
def test_bad_flags_are_one_line_and_exit_2(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(bench, "build_engines", lambda *a: pytest.fail("loaded before the flags were checked"))
    try:
        code = main(["bench-structured", *argv])
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_unwritable_out_is_refused_before_any_task_runs(tmp_path, monkeypatch, capsys):
    """--out an existing file, or a folder that cannot be made: one line before the model loads, where every task
    ran and then out.mkdir failed with a traceback."""
    monkeypatch.setattr(bench, "build_engines", lambda *a: pytest.fail("loaded before --out was checked"))
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for out, message in ((a_file, "exists and is not a directory"), ("/proc/x", "cannot create --out")):
        assert main(["bench-structured", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_a_tasks_file_with_no_task_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "build_engines", lambda *a: pytest.fail("loaded before --tasks was checked"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert main(["bench-structured", "--tasks", str(empty), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"--tasks '{empty}' holds no tasks" in err and err.count("\n") == 1, err
