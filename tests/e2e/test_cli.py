"""CLI: bad input gets one line on stderr and exit code 2; --json prints one object with the metrics."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

import specdecode.cli.main as cli_main
from specdecode.api import SpecDecoder
from specdecode.cli.main import main
from specdecode.drafters.common.eagle3_format import save_eagle3
from specdecode.drafters.common.eagle3_net import Eagle3Net, Eagle3NetConfig
from specdecode.drafters.common.head_io import SHIPPED_ROOT, fingerprint
from specdecode.errors import first_line
from tests.tiny import byte_tokenizer, save_tiny, tiny_llama

HEADS = SHIPPED_ROOT / "smollm2-135m-instruct"  # the shipped EAGLE and Medusa heads


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdecode", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def short_context_dir(tmp_path_factory) -> str:
    return save_tiny(tmp_path_factory.mktemp("short"), tiny_llama(max_positions=64), byte_tokenizer())


@pytest.fixture(scope="module")
def other_tokenizer_dir(tmp_path_factory) -> str:
    """Same vocabulary size, different token ids: the tokenizers differ."""
    tokenizer = byte_tokenizer()
    vocab = tokenizer.get_vocab()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    swapped = {tok: (len(vocab) - 1 - i if i > 2 else i) for tok, i in vocab.items()}
    core = Tokenizer(models.BPE(vocab=swapped, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    other = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    return save_tiny(tmp_path_factory.mktemp("other-tok"), tiny_llama(layers=1, seed=3), other)


@pytest.mark.parametrize("args,needle", [
    (["generate", "--k", "0", "hi"], "k must be a positive integer"),
    (["generate", "--temperature", "-0.5", "hi"], "temperature must be >= 0"),
    (["generate", ""], "the prompt is empty"),
    (["generate", "   "], "the prompt is empty"),
    # bytes that are not UTF-8 arrive as lone surrogates (surrogateescape): a TypeError from the tokenizer before
    (["generate", "abc\udcff\udcfe def"], "the prompt is not valid UTF-8"),
    (["generate", "\udced\udca0\udc80"], "the prompt is not valid UTF-8"),  # an encoded surrogate
    (["generate", "--suffix", "x\udcff", "hi"], "--suffix is not valid UTF-8"),
    (["generate", "--choice", "a", "--choice", "\udcff", "hi"], "--choice is not valid UTF-8"),
    (["generate", "--regex", "[\udcff]", "hi"], "--regex is not valid UTF-8"),
    (["generate", "--model", "/no/such/model", "hi"], "model not found"),
    (["generate", "--drafter", "nope", "hi"], "invalid choice"),
    (["generate", "--top-p", "0", "hi"], "top-p"),
    (["generate", "--suffix", ")", "--chat", "hi"], "--suffix fills a middle in a text prompt"),
    (["generate", "--suffix", ")", "print("], "no fill-in-the-middle tokens"),  # the default model has none
    (["generate", "--lookahead", "1,6", "hi"], "expected three integers W,N,G"),
    (["generate", "--drafter", "lookahead", "--lookahead", "1,1,2", "--max-new-tokens", "4", "hi"], "ngram >= 2"),
    # values and flags that must be refused up front, not end in a traceback or be silently ignored
    (["generate", "--temperature", "inf", "hi"], "temperature must be >= 0 and finite"),
    (["generate", "--device", "foo", "hi"], "expected cpu, cuda or cuda:N"),
    (["generate", "--exit-layer", "3", "hi"], "--exit-layer has no effect with --drafter auto (here: prompt-lookup)"),
    (["generate", "--drafter", "prompt-lookup", "--lookahead", "1,4,1", "hi"], "--lookahead has no effect"),
    (["generate", "--drafter", "none", "--draft-model", "x", "hi"], "--draft-model has no effect"),
    (["generate", "--draft-weights", "int8", "hi"], "--draft-weights has no effect"),
    (["generate", "--draft-vocab", "4096", "hi"], "--draft-vocab has no effect"),
    (["generate", "--drafter", "draft-model", "--draft-vocab", "-1", "hi"], "expected a number of tokens (0 or more)"),
    (["bench", "--methods", "specdecode-none", "--draft-vocab", "8", "--out", "/tmp/specdecode-cli-test-unused"],
     "--draft-vocab has no effect on the chosen methods"),
    (["bench", "--draft-vocab", "-2", "--out", "/tmp/specdecode-cli-test-unused"], "--draft-vocab must be 0"),
    (["bench", "--methods", "specdecode-none", "--k", "4", "--model", "/no/such/model", "--out",
      "/tmp/specdecode-cli-test-unused"],  # was run, --k ignored, where generate's --drafter none refuses it
     "--k has no effect on the chosen methods"),  # before a model loads: the model is not found after
    (["generate", "--weights", "int3", "hi"], "invalid choice"),
    (["generate", "--weights", "fp32", "--kv-cache-dtype", "fp16", "hi"], "an fp16 KV cache needs the native decoder"),
    (["bench", "--weights", "fp8"], "invalid choice"),
    (["generate", "--drafter", "eagle", "--confidence", "0.5", "hi"], "--confidence has no effect"),
    (["generate", "--drafter", "hybrid", "--draft-model", "x", "--confidence", "0.5", "hi"],
     "--confidence has no effect with --drafter hybrid"),  # its chain is priced by the rule, not cut by a threshold
    (["generate", "--max-k", "8", "hi"], "--max-k has no effect without --adaptive"),
    (["generate", "--logprobs", "2", "hi"], "--logprobs has no effect without --json"),  # were dropped
    (["generate", "--drafter", "none", "--k", "4", "hi"],
     "--k has no effect with --drafter none; it is read by every drafter but none"),
    (["generate", "--drafter", "none", "--adaptive", "hi"], "--adaptive has no effect with --drafter none"),
    (["batch", "--drafter", "none", "--k", "4", "-i", __file__, "-o", "-"],  # any file of lines: refused before
     "--k has no effect with --drafter none"),
    (["serve", "--drafter", "none", "--adaptive"], "--adaptive has no effect with --drafter none"),
    (["generate", "--adaptive", "--k", "6", "--max-k", "3", "hi"], "--max-k (3) must be >= --k (6)"),
    (["generate", "--top-p", "0.9", "hi"], "--top-p has no effect with greedy decoding"),
    (["generate", "--seed", "1", "--top-k", "5", "hi"], "--top-k, --seed has no effect with greedy decoding"),
    (["generate", "--min-p", "0.1", "hi"], "--min-p has no effect with greedy decoding"),
    (["generate", "--presence-penalty", "3", "hi"], "presence penalty must be in [-2, 2]"),
    (["generate", "--repetition-penalty", "0", "hi"], "repetition penalty must be in [0.01, 10.0]"),
    (["generate", "--logit-bias", "5=1", "hi"], "expected ID:BIAS pairs"),
    (["generate", "--logit-bias", "5:1000", "hi"], "biases in [-100, 100]"),
    (["generate", "--logit-bias", "99999999:1", "--max-new-tokens", "2", "hi"], "outside the vocabulary"),
    (["serve", "--port", "99999"], "port must be in 0..65535"),
    (["generate", "--model", "", "hi"], "--model is empty (got ''); leave it out for the default model"),
    (["serve", "--max-queue", "0"], "--max-queue must be >= 1, got 0"),  # every request was refused
    (["batch", "--max-queue", "0", "-i", __file__, "-o", "-"], "--max-queue must be >= 1, got 0"),
    (["serve", "--drafter", "prompt-lookup", "--exit-layer", "3"], "--exit-layer has no effect"),
    (["bench", "--methods", "", "--out", "/tmp/specdecode-cli-test-unused"], "--methods is empty"),
    (["bench", "--methods", ",", "--out", "/tmp/specdecode-cli-test-unused"], "--methods is empty"),
    (["bench", "--methods", "specdecode-none", "--exit-layer", "2", "--out", "/tmp/specdecode-cli-test-unused"],
     "--exit-layer has no effect on the chosen methods"),
    (["bench", "--methods", "specdecode-none", "--head", "eagle=/nope", "--out", "/tmp/specdecode-cli-test-unused"],
     "--head eagle= has no effect"),
    (["bench", "--head", "none=/nope", "--out", "/tmp/specdecode-cli-test-unused"], "--head expects DRAFTER=DIR"),
    (["bench", "--draft-model", str(HEADS / "medusa"), "--model", "/no/such/model", "--out",
      "/tmp/specdecode-cli-test-unused"], f"--draft-model {str(HEADS / 'medusa')!r} is a Medusa head, not a draft "
     f"model: use --head medusa={HEADS / 'medusa'}"),  # before a model loads (transformers' tokenizer error after)
    (["bench", "--temperature", "inf", "--out", "/tmp/specdecode-cli-test-unused"], "temperature must be >= 0"),
    (["train", "--kind", "eagle", "--out", "/tmp/specdecode-cli-test-unused", "--max-steps", "-1", "--lr", "inf"],
     "invalid value for --lr inf (must be > 0, and finite); --max-steps -1 (must be >= 0)"),
    (["train", "--kind", "eagle", "--out", "/tmp/specdecode-cli-test-unused", "--device", "foo"], "expected cpu, cuda"),
    (["bench-fastpath", "--device", "cpu", "--qs", "a"], "--qs expects comma-separated positive integers"),
    (["bench-fastpath", "--device", "cpu", "--qs", "0"], "--qs expects comma-separated positive integers"),
    (["bench-fastpath", "--device", "cpu", "--drafters", "nope"], "unknown or unsupported drafter 'nope'"),
    (["bench-fastpath", "--device", "cpu", "--model", "x", "--random-config", "smollm2-135m"], "exclude each other"),
])
def test_bad_input_is_one_line_exit_2(args, needle, capsys):
    try:
        code = main(args)
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    stderr = capsys.readouterr().err
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], stderr


def test_an_unknown_backend_lists_the_backends_a_user_may_choose(capsys):
    assert main(["bench-fastpath", "--device", "cpu", "--backend", "bogus"]) == 2
    err = capsys.readouterr().err
    assert "unknown --backend 'bogus'; choose from: " in err and "inductor" in err and err.count("\n") == 1, err
    assert "TESTING_ONLY" not in err  # torch's internal test backends were listed


def test_bad_input_in_a_real_process():
    proc = run_cli("generate", "--k", "-3", "hi")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "specdecode: error: k must be a positive integer, got -3"
    proc = run_cli("generate", os.fsdecode(b"abc\xff\xfe def"))  # the bytes themselves in argv
    assert proc.returncode == 2
    assert proc.stderr.strip() == "specdecode: error: the prompt is not valid UTF-8"


def test_a_prompt_of_dash_is_read_from_stdin(tiny_model_dir, monkeypatch, capsys):
    """`generate -` took "-" as the prompt; it reads stdin, as Unix tools read a file named -, strictly as UTF-8."""
    argv = ["generate", "--model", tiny_model_dir, "--drafter", "none", "--json", "--max-new-tokens", "4"]
    assert main([*argv, "abc abc\n"]) == 0
    given = json.loads(capsys.readouterr().out)["text"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"abc abc\n")))
    assert main([*argv, "-"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == given
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"abc\xff")))
    assert main([*argv, "-"]) == 2
    assert capsys.readouterr().err.strip() == ("specdecode: error: the prompt (stdin) is not valid UTF-8 (invalid "
                                               "start byte at byte 3)")


def test_prompt_longer_than_context(short_context_dir, capsys):
    assert main(["generate", "--model", short_context_dir, "--max-new-tokens", "8", "x" * 80]) == 2
    stderr = capsys.readouterr().err.strip()
    assert "exceeds the model's context of 64 tokens" in stderr and len(stderr.splitlines()) == 1


def test_mismatched_tokenizers(tiny_model_dir, other_tokenizer_dir, capsys):
    code = main(["generate", "--model", tiny_model_dir, "--drafter", "draft-model", "--draft-model",
                 other_tokenizer_dir, "hello"])
    if code == 0:  # cross-tokenizer drafting handles it (the draft switched paths)
        return
    stderr = capsys.readouterr().err.strip()
    assert code == 2 and "tokenizer" in stderr and len(stderr.splitlines()) == 1


def test_json_output_on_tiny_model(tiny_model_dir):
    proc = run_cli("generate", "--model", tiny_model_dir, "--json", "--max-new-tokens", "16", "--chat",
                   "abc abc abc abc")
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(proc.stdout)
    for key in ("text", "new_tokens", "target_passes", "tau", "acceptance_rate", "tokens_per_s"):
        assert key in payload
    assert payload["new_tokens"] <= 16 and payload["target_passes"] >= 1
    assert 0 < payload["metrics"]["first_token_s"] <= payload["metrics"]["total_s"]
    assert payload["drafter"] == "prompt-lookup"  # the default `auto`, resolved: the tiny model has no head


def test_a_suffix_fills_the_middle(tmp_path, capsys):
    """--suffix on a model whose tokenizer has FIM tokens: the middle the library writes (core/infill.py), from an
    empty prompt too."""
    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]})
    directory = save_tiny(tmp_path, tiny_llama(vocab_size=len(tokenizer)), tokenizer)
    decoder = SpecDecoder.load(directory, "none")
    for prompt in ("def f(x):\n    ", ""):
        assert main(["generate", "--model", directory, "--json", "--max-new-tokens", "12", "--suffix", "\nf(2)\n",
                     prompt]) == 0
        text = json.loads(capsys.readouterr().out)["text"]
        assert text == decoder.generate(prompt, suffix="\nf(2)\n", max_new_tokens=12).text


def test_streaming_text_then_metrics(tiny_model_dir, capsys):
    assert main(["generate", "--model", tiny_model_dir, "--max-new-tokens", "12", "--drafter", "none", "abc"]) == 0
    stdout = capsys.readouterr().out
    assert "target passes" in stdout and "tau 1.00" in stdout and "first token" in stdout


def test_unusable_files_and_dirs_are_one_line_exit_2(tmp_path, capsys):
    """A file that is not a GGUF, and output directories that cannot be created, are one line, not a traceback."""
    junk = tmp_path / "junk.gguf"
    junk.write_text("not a gguf")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    cases = [
        (["generate", "--model", str(junk), "hi"], "could not convert"),
        (["bench", "--methods", "specdecode-none", "--out", str(a_file / "sub")], "cannot create --out"),
        (["train", "--kind", "eagle", "--out", str(a_file)], "exists and is not a directory"),
        (["train", "--kind", "eagle", "--out", str(a_file / "sub")], "cannot create --out"),
        (["train", "--kind", "eagle", "--out", str(tmp_path / "out"), "--data", str(a_file)],
         "exists and is not a directory"),
    ]
    for args, needle in cases:
        assert main(args) == 2, args
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], (args, lines)


def test_bench_head_given_for_a_run_method_is_not_skipped(tiny_model_dir, tmp_path, capsys):
    """--head DRAFTER=DIR that cannot be used is an error, not a silently skipped method."""
    code = main(["bench", "--model", tiny_model_dir, "--head", f"eagle={tmp_path / 'nope'}", "--limit", "1",
                 "--out", str(tmp_path / "out"), "--no-progress", "--max-new-tokens", "2"])  # all methods
    stderr = capsys.readouterr().err.strip()
    assert code == 2 and "specdecode-eagle" in stderr and len(stderr.splitlines()) == 1


# bench-serve: an unwritable --out, a flag that would silently override another, or one that would be ignored;
# all fail before a model loads
@pytest.mark.parametrize("args,needle", [
    (["bench-serve", "--out", "/no/such/dir/table.md"], "cannot write --out '/no/such/dir/table.md': directory"),
    (["bench-serve", "--out", "/"], "is a directory"),
    (["bench-serve", "--url", "notaurl", "--served-model-name", "m"], "--url must be http://HOST[:PORT]"),
    (["bench-serve", "--url", "http://127.0.0.1:1", "--served-model-name", "m", "--concurrency", "1"],
     "cannot reach the server at http://127.0.0.1:1"),
    (["bench-serve", "--url", "http://127.0.0.1:1", "--model", "x", "--k", "3"],
     "--model, --k has no effect with --url"),
    (["bench-serve", "--allow-drafters", "layer-skip"], "--allow-drafters has no effect in bench-serve"),
    (["bench-serve", "--default-max-tokens", "8"], "--default-max-tokens has no effect in bench-serve"),
    (["bench-serve", "--drafter", "none"], "--drafter none: bench-serve compares speculation on and off"),
    (["bench-serve", "--concurrency", "1,4", "--requests", "2"], "--requests (2) is below --concurrency 4"),
    (["bench-serve", "--concurrency", "4", "--max-queue", "2"], "--max-queue (2) is below --concurrency 4"),
])
def test_bench_serve_bad_input_is_one_line_exit_2(args, needle, capsys):
    test_bad_input_is_one_line_exit_2(args, needle, capsys)


def test_bench_serve_keeps_the_given_max_batch(monkeypatch, capsys):
    """A given --max-batch / --max-queue is kept, not silently raised to the largest --concurrency."""
    from specdecode.errors import ConfigError

    seen = {}

    def fake_build_service(config):
        seen.update(max_batch=config.max_batch, max_queue=config.max_queue)
        raise ConfigError("stop here")

    monkeypatch.setattr("specdecode.bench.serve.build_service", fake_build_service)
    assert main(["bench-serve", "--concurrency", "1,16", "--max-batch", "2"]) == 2
    assert seen == {"max_batch": 2, "max_queue": 64}
    assert main(["bench-serve", "--concurrency", "1,100"]) == 2  # not given: a row and a queue slot per client
    assert seen == {"max_batch": 100, "max_queue": 100}
    capsys.readouterr()


def test_bench_serve_refused_request_is_one_line(short_context_dir, tmp_path, capsys):
    """--max-tokens beyond the model's context: the server's 400 is one line, not a traceback."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["hi"]}) + "\n")
    code = main(["bench-serve", "--model", short_context_dir, "--prompts", str(prompts), "--concurrency", "1",
                 "--requests", "1", "--max-tokens", "100"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert "HTTP 400" in lines[0] and "exceeds the model's context of 64 tokens" in lines[0]


def test_bench_serve_sends_first_turns_or_whole_conversations(monkeypatch, tmp_path, capsys):
    """Each question's first turn, or with --conversations all its turns, reach the client as its conversations."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"question_id": i, "category": "qa", "turns": turns})
                                 for i, turns in enumerate([["one"], ["two", "two again"]])) + "\n")
    sent = []
    monkeypatch.setattr("specdecode.cli.bench_serve.bench_served",
                        lambda config, conversations, *rest: sent.append(conversations) or [])
    for extra in ([], ["--conversations"]):
        assert main(["bench-serve", "--prompts", str(prompts), "--concurrency", "1", *extra]) == 0
    assert sent == [[("one",), ("two",)], [("one",), ("two", "two again")]]
    capsys.readouterr()


def test_a_closed_stdout_ends_quietly(tiny_model_dir):
    """`generate ... | head -c 10`: the reader went away, and the next write was a BrokenPipeError traceback (exit 1).
    Now no message, and 141 as a shell gives a command SIGPIPE ended."""
    reader, writer = os.pipe()
    os.close(reader)  # closed before the first write, so the run cannot finish inside the pipe's buffer
    try:
        proc = subprocess.run([sys.executable, "-m", "specdecode", "generate", "--model", tiny_model_dir, "--drafter",
                               "none", "--max-new-tokens", "8", "hi"], stdout=writer, stderr=subprocess.PIPE, text=True,
                              timeout=300)
    finally:
        os.close(writer)
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr


def test_text_stdout_cannot_encode_is_escaped(tiny_model_dir):
    """PYTHONIOENCODING=ascii and an answer that is not ASCII ("café", held by --choice): a UnicodeEncodeError
    traceback before; now the character is written as Python's stderr writes it, a backslash escape."""
    proc = subprocess.run([sys.executable, "-m", "specdecode", "generate", "--model", tiny_model_dir,
                           "--choice", "café", "--max-new-tokens", "8", "hi"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("caf\\xe9\n")


def test_an_interrupt_while_a_command_loads_exits_130(monkeypatch, capsys):
    """Ctrl-C in the first seconds (a command's module importing torch) was a KeyboardInterrupt traceback."""
    def interrupted(only: str | None = None):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli_main, "build_parser", interrupted)
    assert main(["generate", "hi"]) == 130
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("drafter", ["medusa", "eagle", "eagle3"])
def test_a_head_with_corrupt_weights_is_one_line_exit_2(drafter, tiny_model_dir, tmp_path, capsys):
    """A head's model.safetensors that is not one was a SafetensorError traceback (safetensors raises neither
    OSError nor ValueError); now one line naming the file."""
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"garbage garbage garbage")
    assert main(["generate", "--model", tiny_model_dir, "--drafter", drafter, "--draft-model", str(tmp_path),
                 "--max-new-tokens", "4", "Hi"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "model.safetensors is not a safetensors file" in lines[0], lines


def test_a_head_directory_as_a_draft_model_is_one_whole_line(tiny_model_dir, tmp_path, capsys):
    """transformers' tokenizer error is a first line ending "from one of:" and a list: the first line alone was the
    message, cut off before the list. A message whose first line introduces the rest is joined into one."""
    (tmp_path / "config.json").write_text("{}")  # a directory with no tokenizer, as a head's
    assert main(["generate", "--model", tiny_model_dir, "--drafter", "draft-model", "--draft-model", str(tmp_path),
                 "--max-new-tokens", "4", "Hi"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and not lines[0].endswith(":"), lines
    listed = ValueError("from one of: \n(1) a file, \n(2) an instance.\n")
    assert first_line(listed) == "from one of: (1) a file, (2) an instance."
    assert first_line(ValueError("Not found.\nmore detail\n")) == "Not found."


def _eagle3_head(directory, layout: str, target) -> str:
    """An untrained EAGLE-3 head for `target` as `specdecode train --kind eagle3 --layout LAYOUT` writes it."""
    vocab = target.config.vocab_size
    save_eagle3(directory, Eagle3Net(Eagle3NetConfig.from_target(target.config, vocab, vocab)), layout,
                {"name_or_path": "tiny"}, {"target": fingerprint(target)})
    return str(directory)


@pytest.mark.parametrize("head, says", [
    ("eagle", "is an EAGLE head, not a draft model: use --drafter eagle --draft-model"),
    ("medusa", "is a Medusa head, not a draft model: use --drafter medusa --draft-model"),
    ("sglang", "is an EAGLE-3 head, not a draft model: use --drafter eagle3 --draft-model"),
    ("speculators", "is an EAGLE-3 head, not a draft model: use --drafter eagle3 --draft-model"),
])
def test_a_trained_head_as_a_draft_model_names_the_drafter_that_loads_it(head, says, tiny_model, tiny_model_dir,
                                                                          tmp_path, capsys):
    """A head's directory given to the draft-model drafter was transformers' long error about a tokenizer it could
    not build; its config.json says what it is, and so does the one line."""
    directory = str(HEADS / head) if head in ("eagle", "medusa") else _eagle3_head(tmp_path, head, tiny_model)
    assert main(["generate", "--model", tiny_model_dir, "--drafter", "draft-model", "--draft-model", directory,
                 "--max-new-tokens", "4", "Hi"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"specdecode: error: {directory!r} {says} {directory}"], lines


@pytest.mark.parametrize("command", [["generate", "--max-new-tokens", "4", "Hi"],
                                     ["batch", "--drafter", "hybrid", "-i", __file__, "-o", "-"]])
def test_a_trained_head_as_the_auto_or_served_draft_model_is_one_line(command, tiny_model_dir, capsys):
    """`auto` with a draft model (hybrid on the CPU) and the server's drafters (batch: serve's build_service) load
    it as the draft-model drafter does."""
    directory = str(HEADS / "eagle")
    assert main([*command, "--model", tiny_model_dir, "--draft-model", directory]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"is an EAGLE head, not a draft model: use --drafter eagle --draft-model {directory}" \
        in lines[0], lines
