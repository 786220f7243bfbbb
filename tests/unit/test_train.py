"""Training smoke tests on a tiny model: data -> cached features -> a few steps (loss decreases) -> checkpoint
reloads and resumes -> the exported head loads and drafts losslessly; the CLI end to end and its bad input."""
import json
from pathlib import Path

import pytest
import torch

from specdecode.cli.main import main
from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.core.target import Target
from specdecode.drafters import build_drafter
from specdecode.drafters.common.eagle3_format import load_eagle3
from specdecode.drafters.common.head_io import load_head
from specdecode.errors import ConfigError
from specdecode.train.corpus import TextSource
from specdecode.train.data import DataConfig, build_dataset
from specdecode.train.features import FeatureData, choose_draft_vocab, compute_features, target_token_counts
from specdecode.train.prompts import stage1_prompts
from specdecode.train.trainer import TrainConfig, Trainer

TEXT = TextSource(("The quick brown fox jumps over the lazy dog. " * 20,), "test text")
AUX = (1, 2, 3)  # EAGLE-3's layers of the 4-layer tiny model (default_aux_layers)


@pytest.fixture(scope="module")
def features(tiny_model, tiny_tokenizer, tmp_path_factory) -> FeatureData:
    config = DataConfig(num_prompts=3, num_followups=0, max_new_tokens=12, gen_batch=4, max_len=160, text_tokens=256)
    dataset = build_dataset(tiny_model, tiny_tokenizer, config, [], [TEXT], eos_ids={2}, pad_id=0)
    assert len(dataset.sources) == 2 and dataset.examples
    data = compute_features(tiny_model, dataset, batch_tokens=4096, aux_layers=AUX)
    directory = tmp_path_factory.mktemp("data")
    data.save(directory)
    loaded = FeatureData.load(directory)
    assert torch.equal(loaded.tokens, data.tokens) and torch.equal(loaded.features, data.features)
    return loaded


def test_cached_features_are_the_targets_hidden_states(tiny_model, features):
    """What enters each EAGLE-3 layer, then the last hidden state; EAGLE-2 and Medusa read the last alone."""
    start, end = int(features.offsets[0]), int(features.offsets[1])
    tokens = features.tokens[start:end][None]
    states = tiny_model(tokens, output_hidden_states=True).hidden_states
    expected = torch.cat([*(states[layer][0] for layer in AUX), states[-1][0]], dim=-1)
    assert features.aux_layers == AUX and features.features.shape[1] == 4 * tiny_model.config.hidden_size
    assert torch.allclose(features.features[start:end].float(), expected, atol=2e-2, rtol=2e-2)  # stored in bf16
    last = features.last_only()
    assert torch.equal(last.features[start:end], features.features[start:end, -tiny_model.config.hidden_size:])


def _trainer(kind, tiny_model, features, out: Path, steps: int) -> Trainer:
    counts = target_token_counts(features, 259)
    draft_ids, coverage = choose_draft_vocab(counts, 128, {2})
    assert 0 < coverage <= 1 and draft_ids[0] == 2
    config = TrainConfig(kind=kind, max_steps=steps, batch_tokens=100_000, lr=3e-3, warmup=1, val_fraction=0.0,
                         checkpoint_every=1000, aux_layers=AUX if kind == "eagle3" else (), layout="speculators")
    data = features if kind == "eagle3" else features.last_only()
    return Trainer(config, tiny_model, data, draft_ids, out, torch.device("cpu"), max_len=160)


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "medusa"])
def test_loss_decreases_checkpoint_reloads_and_head_exports(kind, tiny_model, tiny_tokenizer, features, tmp_path):
    trainer = _trainer(kind, tiny_model, features, tmp_path, steps=12)
    assert len(trainer.batches) == 1  # every step sees the same batch: the loss must fall
    history = trainer.train()
    assert history[-1]["loss"] < 0.95 * history[0]["loss"]
    reloaded = _trainer(kind, tiny_model, features, tmp_path, steps=14)
    assert reloaded.resume() and reloaded.step == 12
    for a, b in zip(trainer.net.state_dict().values(), reloaded.net.state_dict().values()):
        assert torch.equal(a, b)
    reloaded.train()
    assert reloaded.step == 14
    record = {"evaluation": {"val_topk_hit_rate": [[0.5, 0.2]] * 4}}
    reloaded.export(record)
    net, config = load_eagle3(tmp_path) if kind == "eagle3" else load_head(tmp_path, kind)
    ours, theirs = reloaded.net.state_dict(), net.state_dict()
    if kind == "eagle3":  # written in target-id order: the draft vocabulary's rows move with their ids
        for state, module in ((ours, reloaded.net), (theirs, net)):
            order = torch.argsort(module.draft_ids.cpu())
            state["lm_head.weight"], state["d2t"] = state["lm_head.weight"][order], module.draft_ids.cpu()[order]
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.allclose(ours[name].float(), theirs[name].float(), atol=1e-2, rtol=1e-2), name  # bf16
    if kind == "medusa":
        assert config["trees"]["cpu"][0] == [0]
    target = Target(tiny_model, tiny_tokenizer)
    spec = SpecConfig(k=4)
    engine = Engine(target, build_drafter(target, DrafterConfig(kind, draft_model=str(tmp_path)), spec), spec)
    prompt = tiny_tokenizer("the cat sat on the mat")["input_ids"]
    out = engine.generate(prompt, SamplingConfig(), GenerationConfig(max_new_tokens=12, stop_on_eos=False))
    plain = tiny_model.generate(torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12, do_sample=False,
                                pad_token_id=0, eos_token_id=None)[0, len(prompt):].tolist()
    assert out.token_ids == plain


@pytest.mark.parametrize("native", [True, False])
def test_a_cpu_trains_in_bf16_where_it_multiplies_bf16_natively(native, tiny_model, features, tmp_path, monkeypatch):
    """Autocast to bf16 where the CPU has AMX or AVX512-BF16 (faster there); plain fp32 where bf16 is emulated."""
    monkeypatch.setattr("specdecode.drafters.common.nets.fast_bf16_cpu", lambda: native)
    trainer = _trainer("eagle3", tiny_model, features, tmp_path, steps=1)
    with trainer._autocast():
        assert torch.is_autocast_enabled("cpu") == native
        assert (torch.get_autocast_dtype("cpu") == torch.bfloat16) or not native


def test_prompt_set_is_disjoint_from_the_benchmark():
    from specdecode.bench.prompts import load_prompts

    bench = {turn for question in load_prompts() for turn in question.turns}
    prompts = stage1_prompts(3000)
    assert len({p[0]["content"] for p in prompts}) == 3000
    assert not bench & {p[0]["content"] for p in prompts}


def test_cli_trains_end_to_end(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "head"
    code = main(["train", "--kind", "medusa", "--model", tiny_model_dir, "--out", str(out), "--num-prompts", "2",
                 "--num-followups", "0", "--max-new-tokens", "8", "--max-steps", "2", "--draft-vocab", "64",
                 "--max-len", "128"])
    assert code == 0
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert FeatureData.exists(out / "data")
    assert "reusing cached data" not in capsys.readouterr().out
    code = main(["train", "--kind", "eagle", "--model", tiny_model_dir, "--out", str(out / "e"), "--data",
                 str(out / "data"), "--max-steps", "1", "--draft-vocab", "64", "--max-len", "128", "--resume"])
    assert code == 0 and "reusing cached data" in capsys.readouterr().out
    # EAGLE-3 needs the states of its three layers, which that cache lacks: one line, then its own cache
    eagle3 = ["train", "--kind", "eagle3", "--model", tiny_model_dir, "--out", str(out / "e3"), "--max-steps", "1",
              "--draft-vocab", "64", "--max-len", "128", "--layout", "speculators"]
    assert main([*eagle3, "--data", str(out / "data")]) == 2
    err = capsys.readouterr().err
    assert "not the EAGLE-3 layers [1, 2, 3]" in err and len(err.strip().splitlines()) == 1
    assert main([*eagle3, "--num-prompts", "2", "--num-followups", "0", "--max-new-tokens", "8"]) == 0
    config = json.loads((out / "e3" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert main(["generate", "--model", tiny_model_dir, "--drafter", "eagle3", "--draft-head", str(out / "e3"),
                 "--max-new-tokens", "8", "hello"]) == 0


@pytest.mark.parametrize("argv, message", [
    (["--epochs", "0"], "--epochs"),
    (["--docstrings", "no_such_package_xyz"], "not installed"),
    (["--prompts", "/nonexistent.jsonl"], "cannot read prompts"),
    (["--kind", "medusa", "--heads", "0"], "invalid value for --heads 0 (must be >= 1)"),  # named the flag alone
    # flags another kind of head reads: they were accepted and did nothing
    (["--heads", "3"], "--heads has no effect with --kind eagle; it is read by --kind medusa"),
    (["--layout", "speculators"], "--layout has no effect with --kind eagle; it is read by --kind eagle3"),
    (["--aux-layers", "1,2,3"], "--aux-layers has no effect with --kind eagle; it is read by --kind eagle3"),
    (["--kind", "medusa", "--ttt-steps", "2"], "--ttt-steps has no effect with --kind medusa; it is read by --kind "
                                               "eagle or eagle3"),
])
def test_cli_bad_input_is_one_line(argv, message, tiny_model_dir, tmp_path, capsys):
    code = main(["train", "--kind", "eagle", "--model", tiny_model_dir, "--out", str(tmp_path / "o"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def _checkpoint(path: Path, kind: str, heads: int = 4) -> None:
    torch.save({"net": {}, "optimizer": {}, "step": 1, "elapsed": 0.0, "history": [],
                "config": {"kind": kind, "num_heads": heads}}, path)


@pytest.mark.parametrize("make, argv, message", [
    (lambda p: p.write_text("garbage\n"), ["--resume"], "not a checkpoint"),  # was a ValueError
    (lambda p: p.write_bytes(b""), ["--resume"], "not a checkpoint"),  # was an EOFError
    (lambda p: _checkpoint(p, "medusa"), ["--resume"], "it holds a medusa head, not eagle (--kind)"),
    (lambda p: _checkpoint(p, "medusa", heads=4), ["--resume", "--kind", "medusa", "--heads", "2"],
     "it holds 4 Medusa heads, not 2 (--heads)"),  # these two were RuntimeErrors loading the state_dict
    (lambda p: p.mkdir(), [], "is not a checkpoint file"),  # trained, then an IsADirectoryError at the save
])
def test_an_unusable_checkpoint_is_one_line_before_the_model_loads(make, argv, message, tmp_path, monkeypatch,
                                                                   capsys):
    monkeypatch.setattr("specdecode.train.run.load_model", lambda *a: pytest.fail("loaded before the checkpoint"))
    out = tmp_path / "o"
    out.mkdir()
    make(out / "checkpoint.pt")
    assert main(["train", "--kind", "eagle", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and str(out / "checkpoint.pt") in err and len(err.strip().splitlines()) == 1, err


def test_a_checkpoint_that_does_not_fit_the_head_is_one_line(tiny_model, features, tmp_path):
    trainer = _trainer("medusa", tiny_model, features, tmp_path, steps=1)
    state = {"net": {"bogus": torch.zeros(1)}, "optimizer": {}, "step": 1, "elapsed": 0.0, "history": [],
             "config": {"kind": "medusa", "num_heads": 4}}
    with pytest.raises(ConfigError, match="it does not fit this head"):
        trainer.resume(state)


@pytest.mark.parametrize("broken, message", [("features.safetensors", "header too large"),
                                             ("meta.json", "Expecting value")])
def test_a_corrupt_data_cache_is_one_line_naming_it(broken, message, tmp_path, monkeypatch, capsys):
    """A data cache whose files cannot be read was a SafetensorError or JSONDecodeError traceback."""
    monkeypatch.setattr("specdecode.train.run.load_model", lambda *a: pytest.fail("loaded before the data cache"))
    data = tmp_path / "data"
    FeatureData(torch.zeros(4, dtype=torch.long), torch.tensor([0, 4]), torch.tensor([1]), torch.zeros(4, 8),
                {}).save(data)
    (data / broken).write_text("garbage" * 3)
    assert main(["train", "--kind", "eagle", "--out", str(tmp_path / "o"), "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert f"the data cache in '{data}' cannot be read" in err and message in err and "another --data" in err
    assert len(err.strip().splitlines()) == 1, err
