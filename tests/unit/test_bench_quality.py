"""bench-quality on the tiny model: float32 agrees with itself, int8 is measured against it, llama.cpp's row (a
stand-in llama_cpp here: CI does not build llama.cpp) is scored like ours or skipped with one line, bad flags are
one line (exit 2)."""
from __future__ import annotations

import json
import math
import sys
import types

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdecode.bench import llamacpp
from specdecode.bench.quality import measure, shipped_text
from specdecode.cli.main import main


def test_formats_against_float32(tiny_model_dir):
    rows = {row.format: row for row in measure(tiny_model_dir, ("float32", "int8"), shipped_text(), 200)}
    assert rows["float32"].agreement == 1.0
    assert 0.5 < rows["int8"].agreement <= 1.0 and rows["int8"].perplexity > 1.0


def test_cli_writes_rows(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "quality.json"
    assert main(["bench-quality", "--model", tiny_model_dir, "--formats", "float32,int8", "--max-tokens", "64",
                 "--out", str(out)]) == 0
    assert [row["format"] for row in json.loads(out.read_text())] == ["float32", "int8"]
    assert "| int8 |" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [(["--formats", "fp8"], "--formats takes"),
                                           (["--max-tokens", "1"], "at least 2"),
                                           (["--text", "/nonexistent/file.txt"], "cannot read --text")])
def test_bad_flags(argv, message, capsys):
    assert main(["bench-quality", *argv]) == 2
    assert message in capsys.readouterr().err


def test_unwritable_out_is_refused_before_the_measurement(tmp_path, monkeypatch, capsys):
    """--out a folder, or in a folder that does not exist: one line before anything is measured, where the whole
    measurement ran and then failed with a traceback."""
    monkeypatch.setattr("specdecode.bench.quality.measure", lambda *a: pytest.fail("measured before --out was checked"))
    for out, message in ((tmp_path, "is a folder"), (tmp_path / "nodir" / "x.json", "its folder does not exist")):
        assert main(["bench-quality", "--formats", "float32", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_a_text_with_nothing_to_score_is_one_line(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """An empty --text is refused before a model loads, naming the file; a text of one token after the model's
    tokenizer read it: both ended in a RuntimeError (cannot reshape a tensor of 0 elements)."""
    empty, short = tmp_path / "empty.txt", tmp_path / "short.txt"
    empty.write_text("  \n")
    short.write_text("a")
    assert main(["bench-quality", "--model", tiny_model_dir, "--formats", "float32", "--text", str(short)]) == 2
    err = capsys.readouterr().err
    assert "the text is 1 token(s) long; scoring needs at least 2" in err and err.count("\n") == 1, err
    monkeypatch.setattr("specdecode.bench.quality.measure", lambda *a: pytest.fail("measured an empty text"))
    assert main(["bench-quality", "--formats", "float32", "--text", str(empty)]) == 2
    err = capsys.readouterr().err
    assert f"--text '{empty}' holds no text" in err and err.count("\n") == 1, err


@pytest.fixture
def fake_llama_cpp(tiny_model_dir, tmp_path, monkeypatch) -> dict:
    """A `llama_cpp` whose Llama scores every position with the tiny float32 model's own logits, as llama.cpp's
    eval fills `scores` [n_ctx, vocab] (rows 0..n-1); the tiny model's "GGUF" is a stand-in path."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    calls: dict = {"model": model}

    class FakeLlama:
        def __init__(self, model_path, n_ctx, n_threads, logits_all, verbose):
            assert logits_all and not verbose
            calls["path"], calls["n_ctx"] = model_path, n_ctx
            self.scores = np.full((n_ctx, model.config.vocab_size), np.nan, dtype=np.float32)

        def eval(self, tokens):
            assert len(tokens) <= len(self.scores)
            calls["ids"] = list(tokens)
            with torch.inference_mode():
                self.scores[: len(tokens)] = model(torch.tensor([tokens])).logits[0].numpy()  # [n, vocab]

        def close(self):
            calls["closed"] = True

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=FakeLlama))
    monkeypatch.setattr(llamacpp, "gguf_file", lambda name: gguf)
    return calls


def test_llamacpp_row_is_scored_like_ours(tiny_model_dir, fake_llama_cpp):
    """Same logits, same ids -> the same perplexity and full agreement, and both that of the NLL written out:
    fails if either side's NLL is taken over other positions."""
    rows = {row.format: row for row in measure(tiny_model_dir, ("float32", "llamacpp"), shipped_text(), 200)}
    ids = AutoTokenizer.from_pretrained(tiny_model_dir)(shipped_text())["input_ids"][:200]
    assert fake_llama_cpp["ids"] == ids  # llama.cpp is fed our tokenizer's ids
    assert fake_llama_cpp["n_ctx"] == 200 and fake_llama_cpp["closed"]
    assert rows["llamacpp"].agreement == 1.0
    assert rows["llamacpp"].perplexity == pytest.approx(rows["float32"].perplexity, rel=1e-5)
    with torch.inference_mode():  # position i's logits score token i + 1, written out here
        logits = fake_llama_cpp["model"](torch.tensor([ids])).logits[0, :-1]  # [n - 1, vocab]
        nll = -logits.log_softmax(-1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].mean()
    assert rows["float32"].perplexity == pytest.approx(math.exp(float(nll)), rel=1e-5)


def test_cli_sets_the_default_format_against_llamacpp(tiny_model_dir, fake_llama_cpp, capsys):
    assert main(["bench-quality", "--model", tiny_model_dir, "--formats", "float32,llamacpp",
                 "--max-tokens", "64"]) == 0
    out = capsys.readouterr().out
    assert "| llamacpp | 1.0000 |" in out
    assert "perplexity float32 (our default) / llamacpp: 1.0000" in out  # a model directory's default: float32


@pytest.mark.parametrize("installed, message", [(False, llamacpp.INSTALL), (True, "need a GGUF model")])
def test_llamacpp_row_skipped_with_one_line(installed, message, tiny_model_dir, monkeypatch, capsys):
    """Without llama-cpp-python, or for a model with no GGUF (the tiny one), the row is one line on stderr and
    the other rows run: exit 0, as the bench's llamacpp method."""
    if installed:
        monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=None))
    else:
        monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails, installed or not
    assert main(["bench-quality", "--model", tiny_model_dir, "--formats", "float32,llamacpp",
                 "--max-tokens", "64"]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and message in captured.err and "Traceback" not in captured.err
    assert "| float32 |" in captured.out and "| llamacpp |" not in captured.out
