"""The benchmark's opt-in `agentic` category, `--category`, `--suffix-store`, and the warm-up that must not seed a
drafter's store: all checked without a model."""
import re

import pytest

from specdecode.bench.generation import Generation
from specdecode.bench.harness import BenchConfig, validate
from specdecode.bench.methods import Method
from specdecode.bench.prompts import OPT_IN, load_prompts
from specdecode.bench.runner import BenchSettings, _warm_up
from specdecode.cli.commands import usage_error
from specdecode.config import DrafterConfig
from specdecode.errors import ConfigError
from tests.tiny import byte_tokenizer


def test_agentic_is_built_in_but_opt_in():
    default = load_prompts()
    agentic = load_prompts(only=("agentic",))
    assert "agentic" in OPT_IN and all(q.category != "agentic" for q in default)
    assert len(agentic) >= 12 and {q.category for q in agentic} == {"agentic"}
    assert sum(len(q.turns) > 1 for q in agentic) >= 5  # edit loops: later turns repeat earlier answers
    both = load_prompts(only=("agentic", "code"))
    ids = [q.question_id for q in both]
    assert len(ids) == len(set(ids)) and {q.category for q in both} == {"agentic", "code"}
    assert not {q.question_id for q in agentic} & {q.question_id for q in default}


def test_agentic_holds_multi_turn_edits_of_whole_code_files():
    """The edits a coding agent repeats (questions 115-120): a file in a code block, then later turns that ask for
    the whole file again with one change, the answers a free draft can copy from the earlier ones."""
    edits = [q for q in load_prompts(only=("agentic",)) if isinstance(q.question_id, int) and q.question_id >= 115]
    assert len(edits) >= 6 and all(len(q.turns) >= 2 and "```" in q.turns[0] for q in edits)
    assert all("Return the whole" in turn for q in edits for turn in q.turns)
    asks = " ".join(turn for q in edits for turn in q.turns)
    assert all(ask in asks for ask in ("docstring to each function", "rename the variable", "with one change"))


def test_unknown_category_names_the_choices():
    with pytest.raises(ConfigError, match="unknown category 'agentics'.*code, agentic"):
        load_prompts(only=("agentics",))


@pytest.mark.parametrize("flags, refused", [
    ({"categories": ("agentic",), "limit": 2}, None),
    ({"categories": ()}, "--category names no category"),
    ({"suffix_store": 1000, "methods": "specdecode-prompt-lookup"}, "--suffix-store has no effect"),
    ({"suffix_store": 0, "methods": "specdecode-suffix"}, "--suffix-store must be a positive number"),
    ({"suffix_store": 1000, "methods": "specdecode-suffix"}, None),
    ({"confidence": 0.6, "methods": "specdecode-suffix"}, "--confidence has no effect"),
    ({"confidence": 1.0, "methods": "specdecode-layer-skip"}, r"--confidence must be in \(0, 1\)"),
    ({"confidence": 0.6, "methods": "specdecode-layer-skip"}, None),
])
def test_bench_flags(tmp_path, flags, refused):
    def config() -> BenchConfig:
        options = {key: value for key, value in flags.items() if key != "suffix_store"}
        return BenchConfig(out=str(tmp_path / "out"), model="unused",
                           drafter=DrafterConfig(suffix_store=flags.get("suffix_store")), **options)

    if refused is None:
        questions, _ = validate(config())
        if flags.get("categories"):
            assert len(questions) == 2 and {q.category for q in questions} == {"agentic"}
        return
    with pytest.raises(ConfigError) as error:  # made (the configs check themselves) or validated
        validate(config())
    assert re.search(refused, usage_error(error.value))  # as the command line says it


def test_warm_up_resets_what_a_method_learned():
    calls = []

    def run(prompt_ids, settings):
        calls.append("run")
        return Generation([1], 0.0)

    methods = [Method("hf-generate", "baseline", run), Method("specdecode-suffix", "specdecode", run, {},
                                                              lambda: calls.append("reset"))]
    question = load_prompts(only=("agentic",))[0]
    _warm_up(methods, byte_tokenizer(), question, BenchSettings(max_new_tokens=8))
    assert calls == ["run", "run", "reset"]
