"""`specdecode bench` on a tiny random Llama (fp32, CPU): the three output files and their fields, every
specdecode method lossless, transformers handed our drafter's own draft weights, the peak RSS per method, a
deliberately broken method caught as a bug, near-tie classification, and the prompt-file and flag validation
errors (with line numbers, before any model is loaded)."""
from __future__ import annotations

import json
import statistics
import time
from types import SimpleNamespace

import pytest
import torch

from specdecode.backends.cpu import native
from specdecode.backends.cpu.int8 import available as int8_available
from specdecode.backends.cpu.linear import PackedLinear
from specdecode.bench import methods as methods_mod
from specdecode.bench.harness import BenchConfig, load_bench_model, validate
from specdecode.bench.methods import BASELINE, SAME_DRAFT, Generation, Method, same_draft
from specdecode.bench.prompts import load_prompts, parse_prompts, select
from specdecode.bench.runner import BenchSettings, PeakRss, Record, classify_mismatch, run_bench, status_kb
from specdecode.bench.summary import summarise
from specdecode.cli.main import main
from specdecode.config import DrafterConfig
from specdecode.drafters import registry
from specdecode.errors import ConfigError

PROMPTS = [
    {"question_id": 1, "category": "multi-turn",
     "turns": ["the cat sat on the mat. the cat sat on", "say it again: the cat sat"]},
    {"question_id": "q2", "category": "code", "turns": ["def add(a, b):\n    return a + b\n\ndef add("],
     "reference": ["x"]},
]
MODEL_FREE = ["hf-generate", "hf-prompt-lookup", "hf-assisted", SAME_DRAFT, "hf-early-exit", "specdecode-none",
              "specdecode-prompt-lookup", "specdecode-layer-skip", "specdecode-draft-model", "specdecode-hybrid"]
RESULT_FIELDS = {"method", "category", "tokens_per_s", "speedup", "tau", "acceptance_rate", "lossless_prompts",
                 "prompts", "peak_rss_mb"}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core machine two spinning threads make a
    tiny forward ~100x slower; restore the setting afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PROMPTS) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def bench_out(tmp_path_factory, tiny_model_dir, tiny_draft_dir, prompts_file):
    """The full CLI path, with a draft model that disagrees with the target (rejections happen)."""
    out = tmp_path_factory.mktemp("bench")
    code = main(["bench", "--model", tiny_model_dir, "--draft-model", tiny_draft_dir, "--prompts", prompts_file,
                 "--out", str(out), "--max-new-tokens", "24", "--k", "3", "--exit-layer", "2", "--hf-draft-tokens", "3",
                 "--no-progress"])
    assert code == 0
    return out


def test_bench_writes_three_files_with_stable_fields(bench_out):
    assert (bench_out / "speedup.png").stat().st_size > 1000
    assert (bench_out / "speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = json.loads((bench_out / "results.json").read_text())
    ran = [m["method"] for m in results["methods"]]
    skipped = results["meta"]["skipped"]  # drafters that cannot be built for this model (e.g. no head for it)
    assert sorted(ran + list(skipped)) == sorted(methods_mod.available(has_draft=True))
    assert {f"specdecode-{name}" for name in registry()} <= set(ran) | set(skipped)  # from the registry
    assert set(MODEL_FREE) <= set(ran) and all(reason for reason in skipped.values())
    expected = ran
    rows = {(r["method"], r["category"]): r for r in results["results"]}
    assert set(rows) == {(m, c) for m in expected for c in ("multi-turn", "code", "overall")}
    for row in results["results"]:
        assert RESULT_FIELDS <= set(row)
        assert row["tokens_per_s"] > 0 and row["speedup"] > 0
    for category in ("multi-turn", "code", "overall"):
        base = rows[(BASELINE, category)]
        assert base["speedup"] == 1.0 and base["tau"] == 1.0 and base["acceptance_rate"] is None
    assert rows[(BASELINE, "overall")]["prompts"] == 2 and rows[(BASELINE, "multi-turn")]["turns"] == 2
    assert results["meta"]["dtype"] == "float32" and results["meta"]["max_new_tokens"] == 24
    assert len(results["runs"]) == len(expected) * 3  # 3 turns in all
    report = (bench_out / "report.md").read_text()
    assert "| method | multi-turn | code | overall |" in report
    assert "| peak RSS MB |" in report
    for method in expected:
        assert f"| {method} |" in report


def test_time_split_is_recorded_for_our_methods(bench_out):
    """Our engine's methods split their seconds into prefill / draft / verify (shares within the wall time);
    peers without those timers get none."""
    results = json.loads((bench_out / "results.json").read_text())
    for row in results["results"]:
        split = row["time_split"]
        if not row["method"].startswith("specdecode-"):
            assert split is None, row
            continue
        assert set(split) == {"prefill", "draft", "verify"} and 0 < sum(split.values()) <= 1, row
        if row["method"] == "specdecode-none":
            assert split["verify"] > split["draft"], row  # plain decoding drafts nothing
    assert "| prefill / draft / verify |" in (bench_out / "report.md").read_text()


def test_time_to_first_token_is_recorded_for_our_methods(bench_out):
    """Each run of our engine records its seconds to the first token (GenerationMetrics.first_token_s), within
    the run's time; peers have no such timer and record none."""
    runs = json.loads((bench_out / "results.json").read_text())["runs"]
    ours = [run for run in runs if run["method"].startswith("specdecode-")]
    assert ours and all(0 < run["first_token_s"] <= run["time_s"] for run in ours)
    assert all("first_token_s" not in run for run in runs if not run["method"].startswith("specdecode-"))
    results = json.loads((bench_out / "results.json").read_text())["results"]
    for row in results:  # the report's column: the median of the cell's runs, in ms
        times = [1000 * run["first_token_s"] for run in ours
                 if run["method"] == row["method"] and row["category"] in (run["category"], "overall")]
        if not row["method"].startswith("specdecode-"):
            assert row["first_token_ms"] is None, row
        else:  # runs keep 10 us, the row 10 us: they agree to 0.02 ms
            assert abs(row["first_token_ms"] - statistics.median(times)) <= 0.02, (row, times)
    assert "| first token ms (median) |" in (bench_out / "report.md").read_text()


def test_peak_rss_is_recorded_per_method(bench_out):
    results = json.loads((bench_out / "results.json").read_text())
    for entry in results["runs"] + results["results"]:
        assert isinstance(entry["peak_rss_mb"], float) and entry["peak_rss_mb"] > 0, entry
    overall = {r["method"]: r["peak_rss_mb"] for r in results["results"] if r["category"] == "overall"}
    for run in results["runs"]:
        assert run["peak_rss_mb"] <= overall[run["method"]]


def test_same_draft_peer_is_lossless_with_our_drafters_weights(bench_out):
    results = json.loads((bench_out / "results.json").read_text())
    params = {m["method"]: m["params"] for m in results["methods"]}
    assert [m["method"] for m in results["methods"]].index(SAME_DRAFT) == 3  # right after hf-assisted
    assert params[SAME_DRAFT]["draft_weights"] == ("int4-all" if native.missing() is None else
                                                   "int8" if int8_available() else "float32")
    assert params[SAME_DRAFT]["draft_weights"] == params["specdecode-draft-model"]["draft_weights"]
    assert params["hf-assisted"]["draft_weights"] == "float32"
    assert params[SAME_DRAFT]["num_assistant_tokens"] == 3
    assert params[SAME_DRAFT]["num_assistant_tokens_schedule"] == "heuristic"
    row = [r for r in results["results"] if r["method"] == SAME_DRAFT and r["category"] == "overall"][0]
    assert row["lossless_prompts"] == row["prompts"] == 2 and row["mismatches"] == 0, row
    assert row["tau"] >= 1.0 and row["acceptance_rate"] is not None


def test_hybrid_records_the_options_of_both_its_parts(bench_out):
    results = json.loads((bench_out / "results.json").read_text())
    params = {m["method"]: m["params"] for m in results["methods"]}
    hybrid, model = params["specdecode-hybrid"], params["specdecode-draft-model"]
    assert hybrid["suffix_store"] == params["specdecode-suffix"]["suffix_store"]
    assert (hybrid["draft_weights"], hybrid["draft_vocab"]) == (model["draft_weights"], model["draft_vocab"])


def test_the_agentic_category_runs_with_a_draft_model(tmp_path, tiny_model_dir, tiny_draft_dir):
    """The built-in agentic category through specdecode-hybrid (its first question, two turns): functional only,
    the answers lossless; no figures are read."""
    out = tmp_path / "agentic"
    code = main(["bench", "--model", tiny_model_dir, "--draft-model", tiny_draft_dir, "--category", "agentic",
                 "--limit", "1", "--max-new-tokens", "8", "--methods", "specdecode-hybrid", "--no-progress",
                 "--no-warmup", "--out", str(out)])
    assert code == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    row = next(r for r in rows if r["method"] == "specdecode-hybrid" and r["category"] == "agentic")
    assert row["turns"] == 2 and row["lossless_prompts"] == row["prompts"] == 1, row


def test_same_draft_is_a_quantized_copy_only_where_our_drafter_drafts_quantized(tiny_model_dir):
    draft = load_bench_model(BenchConfig(out="unused", model=tiny_model_dir)).model
    model, weights = same_draft(draft, "same", torch.device("cpu"))
    assert model is draft and weights == "float32"
    if native.missing():
        pytest.skip(native.missing())
    model, weights = same_draft(draft, "auto", torch.device("cpu"))
    assert model is not draft and weights == "int4-all"
    assert any(isinstance(m, PackedLinear) for m in model.modules())
    assert not any(isinstance(m, PackedLinear) for m in draft.modules())  # hf-assisted keeps the draft as loaded


def test_assistant_schedule_and_draft_weights_reach_the_same_draft_peer(tmp_path, tiny_model_dir, tiny_draft_dir,
                                                                        prompts_file):
    out = tmp_path / "constant"
    code = main(["bench", "--model", tiny_model_dir, "--draft-model", tiny_draft_dir, "--prompts", prompts_file,
                 "--out", str(out), "--max-new-tokens", "12", "--methods", f"{SAME_DRAFT},hf-early-exit",
                 "--hf-assistant-schedule", "constant", "--draft-weights", "same", "--limit", "1",
                 "--no-progress", "--no-warmup"])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    params = {m["method"]: m["params"] for m in results["methods"]}
    assert list(params) == [BASELINE, SAME_DRAFT, "hf-early-exit"]
    assert params[SAME_DRAFT]["draft_weights"] == "float32"
    schedules = {p["num_assistant_tokens_schedule"] for p in params.values() if p.get("num_assistant_tokens")}
    assert schedules == {"constant"}
    for row in results["results"]:
        if row["method"] == SAME_DRAFT:
            assert row["lossless_prompts"] == row["prompts"] and row["bugs"] == 0, row


@pytest.mark.parametrize("exact", [True, False])
def test_peak_rss_sees_a_short_allocation(exact):
    if status_kb("VmRSS") is None:
        pytest.skip("no /proc/self/status here")
    before = status_kb("VmRSS") / 1024
    with PeakRss(exact) as rss:
        block = torch.ones(16 << 20)  # 64 MiB, written: resident
        time.sleep(5 * 0.02)  # several sampling periods
        del block
    assert rss.mb is not None and rss.mb >= before + 60


def test_every_specdecode_method_is_lossless_in_fp32(bench_out):
    results = json.loads((bench_out / "results.json").read_text())
    runs = results["runs"]
    assert any(r["new_tokens"] > 4 for r in runs if r["method"] == BASELINE)
    for row in results["results"]:
        if row["category"] != "overall":
            continue
        if row["method"].startswith("specdecode-"):
            assert row["lossless_prompts"] == row["prompts"] == 2, row
            assert row["mismatches"] == 0 and row["bugs"] == 0
        if row["method"] in ("specdecode-prompt-lookup", "hf-prompt-lookup"):
            assert row["tau"] >= 1.0 and row["acceptance_rate"] is not None
    # the multi-turn history is the baseline's answer: every method saw the same prompt at every turn
    for turn in (0, 1):
        lengths = {r["prompt_tokens"] for r in runs if r["question_id"] == 1 and r["turn"] == turn}
        assert len(lengths) == 1


def test_a_broken_method_is_caught_as_a_bug(tiny_model_dir):
    bench = load_bench_model(BenchConfig(out="unused", model=tiny_model_dir))
    base = methods_mod.build_methods(bench, [BASELINE], methods_mod.PeerOptions())[0]

    def broken(prompt_ids, settings):
        g = base.run(prompt_ids, settings)
        wrong = (g.ids[2] + 7) % 259  # a token the target did not choose at position 2
        return Generation(g.ids[:2] + [wrong] + g.ids[3:], g.seconds, g.passes, 0, 0)

    questions = parse_prompts(json.dumps(PROMPTS[1]))
    settings = BenchSettings(max_new_tokens=12, progress=False, warmup=False)
    records = run_bench([base, Method("broken", "test", broken)], questions, bench.tokenizer, bench.model, settings)
    bad = [r for r in records if r.method == "broken"][0]
    assert bad.identical is False and bad.mismatch.position == 2 and bad.mismatch.kind == "bug"
    row = [r for r in summarise(records, [BASELINE, "broken"], ["code"], greedy=True)
           if r["method"] == "broken" and r["category"] == "overall"][0]
    assert row["lossless_prompts"] == 0 and row["bugs"] == 1 and row["near_ties"] == 0


def test_specdecode_methods_are_held_to_our_plain_decoding_exactly(tiny_model_dir):
    """Against our plain decoding there is no tolerance: a speculative method that leaves it by one token is
    counted, even where transformers' output would call the difference a near-tie."""
    bench = load_bench_model(BenchConfig(out="unused", model=tiny_model_dir))
    base, plain = methods_mod.build_methods(bench, [BASELINE, "specdecode-none"], methods_mod.PeerOptions())

    def broken(prompt_ids, settings):
        g = plain.run(prompt_ids, settings)
        return Generation(g.ids[:3] + [(g.ids[3] + 1) % 259] + g.ids[4:], g.seconds, g.passes, 0, 0)

    questions = parse_prompts(json.dumps(PROMPTS[1]))
    settings = BenchSettings(max_new_tokens=12, progress=False, warmup=False)
    methods = [BASELINE, "specdecode-none", "specdecode-broken", "specdecode-copy"]
    records = run_bench([base, plain, Method("specdecode-broken", "test", broken),
                         Method("specdecode-copy", "test", plain.run)], questions, bench.tokenizer, bench.model,
                        settings)
    same = {r.method: r.same_as_plain for r in records}
    assert same == {BASELINE: None, "specdecode-none": None, "specdecode-broken": False, "specdecode-copy": True}
    rows = {r["method"]: r for r in summarise(records, methods, ["code"], greedy=True) if r["category"] == "overall"}
    assert rows["specdecode-broken"]["same_as_plain"] == 0 and rows["specdecode-copy"]["same_as_plain"] == 1
    assert rows["specdecode-none"]["same_as_plain"] is None


class _FixedLogits(torch.nn.Module):
    """Returns the same next-token logits for any input: to test the near-tie rule in isolation."""

    def __init__(self, logits: list[float], dtype: torch.dtype):
        super().__init__()
        self.logits = torch.tensor(logits)
        self.anchor = torch.nn.Parameter(torch.zeros(1, dtype=dtype))

    def forward(self, input_ids, logits_to_keep=1):
        return SimpleNamespace(logits=self.logits.expand(1, 1, -1))


def _record(method: str, ids: list[int]) -> Record:
    return Record(method, 1, "c", 0, [5, 6], Generation(ids, 1.0))


@pytest.mark.parametrize("logits, dtype, method_token, kind", [
    ([10.0, 10.0, 1.0], torch.float32, 1, "near-tie"),  # exact tie: either token is right
    ([10.0, 9.999, 1.0], torch.float32, 1, "bug"),  # 1e-3 apart: far beyond fp32 rounding
    ([10.0, 9.999, 1.0], torch.bfloat16, 1, "near-tie"),  # within bf16 rounding
    ([10.0, 9.0, 1.0], torch.bfloat16, 1, "bug"),
    ([10.0, 10.0, 10.0 - 1e-6], torch.float32, 2, "near-tie"),
    ([10.0, 3.0, 1.0], torch.float32, 2, "bug"),
])
def test_mismatch_classification(logits, dtype, method_token, kind):
    model = _FixedLogits(logits, dtype)
    mismatch = classify_mismatch(model, _record(BASELINE, [4, 0, 3]), _record("m", [4, method_token, 3]))
    assert mismatch.position == 1 and mismatch.baseline_token == 0 and mismatch.method_token == method_token
    assert mismatch.kind == kind


# -- prompt file validation -----------------------------------------------------------------------------------
GOOD = '{"question_id": 1, "category": "qa", "turns": ["hi"]}'


@pytest.mark.parametrize("text, message", [
    ("", "no prompts"),
    ("\n  \n", "no prompts"),
    (GOOD + "\n{not json", ":2: not valid JSON"),
    ('{"category": "qa", "turns": ["hi"]}', ":1: missing field 'question_id'"),
    (GOOD + '\n\n{"question_id": 2, "turns": ["hi"]}', ":3: missing field 'category'"),
    ('{"question_id": 1, "category": "qa"}', ":1: missing field 'turns'"),
    ('{"question_id": 1, "category": "qa", "turns": []}', ":1: turns must be a non-empty list"),
    ('{"question_id": 1, "category": "qa", "turns": "hi"}', ":1: turns must be a non-empty list"),
    ('{"question_id": 1, "category": "qa", "turns": ["hi", 3]}', ":1: every turn must be a non-empty string"),
    ('{"question_id": 1, "category": "", "turns": ["hi"]}', ":1: category must be a non-empty string"),
    ('{"question_id": [1], "category": "qa", "turns": ["hi"]}', ":1: question_id must be"),
    ('[1, 2]', ":1: expected a JSON object"),
    (GOOD + "\n" + GOOD, ":2: duplicate question_id 1 (first on line 1)"),
])
def test_bad_prompt_files_name_the_line(tmp_path, text, message):
    path = tmp_path / "p.jsonl"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_prompts(path)
    assert message in str(error.value) and str(path) in str(error.value)
    assert "\n" not in str(error.value)


def test_cli_rejects_bad_input_before_loading_a_model(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(GOOD + "\n{oops\n")
    out = tmp_path / "out"
    # --model points nowhere: it would fail later with a different message if loading were attempted first
    args = ["bench", "--model", str(tmp_path / "missing"), "--out", str(out), "--no-progress"]
    assert main([*args, "--prompts", str(bad)]) == 2
    assert f"{bad}:2: not valid JSON" in capsys.readouterr().err
    assert main([*args, "--prompts", str(tmp_path / "nope.jsonl")]) == 2
    assert "cannot read prompts file" in capsys.readouterr().err
    assert main([*args, "--methods", "hf-generate,nope"]) == 2
    assert "unknown method 'nope'" in capsys.readouterr().err
    assert main([*args, "--methods", "hf-assisted"]) == 2
    assert "needs --draft-model" in capsys.readouterr().err
    assert main([*args, "--methods", SAME_DRAFT]) == 2
    assert "needs --draft-model" in capsys.readouterr().err
    assert main([*args, "--methods", "hf-prompt-lookup", "--hf-assistant-schedule", "constant"]) == 2
    assert "--hf-assistant-schedule has no effect" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: not a choice
        main([*args, "--hf-assistant-schedule", "sometimes"])
    assert "invalid choice: 'sometimes'" in capsys.readouterr().err
    assert main([*args, "--limit", "0"]) == 2
    assert not out.exists()


@pytest.mark.parametrize("methods, flags, refused", [
    ("hf-prompt-lookup", {"hf_assistant_schedule": "heuristic"}, "--hf-assistant-schedule has no effect"),
    ("specdecode-draft-model", {"hf_assistant_schedule": "constant"}, "--hf-assistant-schedule has no effect"),
    ("hf-assisted", {"draft_weights": "int8"}, "--draft-weights has no effect"),
    ("hf-early-exit", {"hf_assistant_schedule": "sometimes"}, "--hf-assistant-schedule must be one of"),
    ("hf-early-exit", {"hf_assistant_schedule": "constant"}, None),
    ("hf-assisted", {"hf_assistant_schedule": "heuristic"}, None),
    (SAME_DRAFT, {"hf_assistant_schedule": "constant", "draft_weights": "same", "hf_draft_tokens": 4}, None),
    # --k: our drafting methods, and the assisted peers' draft length unless --hf-draft-tokens sets it
    ("specdecode-none", {"k": 4}, "--k has no effect on the chosen methods"),
    ("hf-prompt-lookup", {"k": 4}, "--k has no effect"),
    ("hf-early-exit", {"k": 4, "hf_draft_tokens": 3}, "--k has no effect"),
    ("hf-early-exit", {"k": 4}, None),
    ("specdecode-prompt-lookup", {"k": 4}, None),
])
def test_peer_flags_need_a_method_that_reads_them(tmp_path, methods, flags, refused):
    """Checked before any model is loaded (the model paths point nowhere)."""
    draft = "unused" if methods in (*methods_mod.DRAFT_PEERS, "specdecode-draft-model") else None
    drafter = DrafterConfig(draft_model=draft, draft_weights=flags.get("draft_weights", "auto"))
    peers = {key: value for key, value in flags.items() if key != "draft_weights"}
    config = BenchConfig(out=str(tmp_path / "out"), model="unused", drafter=drafter, methods=methods, **peers)
    if refused is None:
        assert validate(config)[1] == [BASELINE, methods]
        return
    with pytest.raises(ConfigError, match=refused):
        validate(config)


def test_builtin_prompts_and_limit():
    questions = load_prompts()
    assert len(questions) >= 80
    chosen = select(questions, 2)
    counts = {}
    for q in chosen:
        counts[q.category] = counts.get(q.category, 0) + 1
    assert len(counts) >= 8 and set(counts.values()) == {2}
    assert any(len(q.turns) > 1 for q in chosen if q.category == "multi-turn")


def test_sampling_run_reports_speed_and_tau_but_no_lossless_check(tmp_path, tiny_model_dir, prompts_file):
    out = tmp_path / "sampled"
    code = main(["bench", "--model", tiny_model_dir, "--prompts", prompts_file, "--out", str(out),
                 "--max-new-tokens", "8", "--temperature", "0.8", "--methods", "hf-prompt-lookup,specdecode-none",
                 "--no-progress", "--no-warmup"])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert [m["method"] for m in results["methods"]] == [BASELINE, "hf-prompt-lookup", "specdecode-none"]
    for row in results["results"]:
        assert row["lossless_prompts"] is None and row["bugs"] is None
        assert row["tokens_per_s"] > 0 and row["tau"] >= 1.0


def test_llamacpp_peer_is_skipped_with_one_line_when_absent(tiny_model_dir, monkeypatch):
    """Without llama-cpp-python the peer says so and is skipped; a model with no GGUF too."""
    import sys

    from specdecode.bench import llamacpp

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails, installed or not
    assert "not installed" in llamacpp.unavailable("smollm2-135m-instruct")
    bench = load_bench_model(BenchConfig(out="unused", model=tiny_model_dir))
    skipped: dict[str, str] = {}
    methods = methods_mod.build_methods(bench, [BASELINE, llamacpp.NAME], methods_mod.PeerOptions(), skipped=skipped)
    assert [m.name for m in methods] == [BASELINE] and "not installed" in skipped[llamacpp.NAME]


def test_llamacpp_peer_runs_the_gguf_and_is_not_compared(tiny_model_dir, monkeypatch, tmp_path):
    """With the package (a stand-in here: CI does not build llama.cpp), the peer decodes the model's GGUF from
    our prompt ids, stops at EOS or the budget, and its outputs are timed but not checked against the baseline."""
    import sys
    import types

    from specdecode.bench import llamacpp

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    calls = {}

    class FakeLlama:
        def __init__(self, model_path, n_ctx, n_threads, verbose):
            calls["path"] = model_path

        def token_eos(self):
            return 2

        def set_seed(self, seed):
            pass

        def generate(self, tokens, **kwargs):
            calls["prompt"], calls["kwargs"] = list(tokens), kwargs
            yield from [5, 6, 7, 2, 9]

    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=FakeLlama))
    monkeypatch.setattr(llamacpp, "gguf_file", lambda name: gguf)
    bench = load_bench_model(BenchConfig(out="unused", model=tiny_model_dir))
    methods = methods_mod.build_methods(bench, [BASELINE, llamacpp.NAME], methods_mod.PeerOptions())
    assert [m.name for m in methods] == [BASELINE, llamacpp.NAME] and calls["path"] == str(gguf)
    questions = parse_prompts(json.dumps(PROMPTS[1]))
    records = run_bench(methods, questions, bench.tokenizer, bench.model,
                        BenchSettings(max_new_tokens=12, progress=False, warmup=False))
    peer = [r for r in records if r.method == llamacpp.NAME][0]
    assert peer.generation.ids == [5, 6, 7, 2] and peer.identical is None and peer.mismatch is None
    row = [r for r in summarise(records, [BASELINE, llamacpp.NAME], ["code"], greedy=True)
           if r["method"] == llamacpp.NAME and r["category"] == "overall"][0]
    assert row["lossless_prompts"] is None and row["bugs"] is None and row["tokens_per_s"] > 0
    assert calls["kwargs"]["temp"] == 0.0 and calls["kwargs"]["top_k"] == 1


def test_confidence_reaches_the_model_drafters_only(tiny_model_dir):
    """--confidence stops a model drafter's draft early (recorded in its params); other drafters are not given it."""
    bench = load_bench_model(BenchConfig(out="unused", model=tiny_model_dir))
    names = ["specdecode-layer-skip", "specdecode-prompt-lookup"]
    skip, lookup = methods_mod.build_methods(bench, names, methods_mod.PeerOptions(confidence=0.6))
    assert skip.params["confidence"] == 0.6 and "confidence" not in lookup.params
    plain_skip = methods_mod.build_methods(bench, names[:1], methods_mod.PeerOptions())[0]
    assert "confidence" not in plain_skip.params
