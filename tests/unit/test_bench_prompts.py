"""Spec-Bench's own question.jsonl loads: its `reference` field takes any shape (lists of lists of strings in
the rag rows, null in most others) and is ignored; the checks on question_id, category and turns still hold."""
from __future__ import annotations

import json

import pytest

from specdecode.bench.prompts import Question, load_prompts, parse_prompts
from specdecode.errors import ConfigError

RAG = {"question_id": 81, "category": "rag", "turns": ["Passage 1: ... Question: who?"],
       "reference": [["a", "b"], ["c"]]}
NULL = {"question_id": 82, "category": "translation", "turns": ["Translate: hallo"], "reference": None}
PLAIN = {"question_id": 83, "category": "qa", "turns": ["hi", "and then?"], "reference": ["x", "y"]}


@pytest.mark.parametrize("reference", [[["a", "b"], ["c"]], None, "x", ["x"], 3, {"answer": "x"}, []])
def test_any_reference_is_accepted_and_ignored(reference):
    row = {"question_id": 1, "category": "qa", "turns": ["hi"], "reference": reference}
    assert parse_prompts(json.dumps(row)) == [Question(1, "qa", ("hi",))]


def test_spec_bench_rows_load_in_file_order(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in (RAG, NULL, PLAIN)) + "\n")
    questions = load_prompts(path)
    assert [(q.question_id, q.category, q.turns) for q in questions] == [
        (81, "rag", ("Passage 1: ... Question: who?",)),
        (82, "translation", ("Translate: hallo",)),
        (83, "qa", ("hi", "and then?")),
    ]


@pytest.mark.parametrize("row, message", [
    ({"question_id": 2, "category": "rag", "reference": [["a"]]}, ":2: missing field 'turns'"),
    ({"question_id": 2, "category": "rag", "turns": [], "reference": None}, ":2: turns must be a non-empty list"),
    ({"question_id": None, "category": "rag", "turns": ["hi"], "reference": None}, ":2: question_id must be"),
    ({"question_id": 2, "category": None, "turns": ["hi"], "reference": [["a"]]}, ":2: category must be"),
])
def test_bad_rows_still_fail_with_one_line(tmp_path, row, message):
    path = tmp_path / "question.jsonl"
    path.write_text(json.dumps(RAG) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ConfigError) as error:
        load_prompts(path)
    assert message in str(error.value) and str(path) in str(error.value)
    assert "\n" not in str(error.value)
