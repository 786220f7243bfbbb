"""The EAGLE-3 drafter on tiny random models: heads in both shared layouts load through build_drafter and decode
exactly as plain greedy decoding, drafting only tokens of their draft vocabulary; a head for another model, or
none, is one line; it cannot share an engine with a drafter that reads other target states."""
import dataclasses

import pytest
import torch

from specdecode.cli.main import main
from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.drafting import Capabilities
from specdecode.core.engine import Engine
from specdecode.core.target import Target
from specdecode.drafters import build_drafter, eagle, eagle3
from specdecode.drafters.common.eagle3_format import save_eagle3
from specdecode.drafters.common.eagle3_net import Eagle3Net, Eagle3NetConfig
from specdecode.drafters.common.head_io import fingerprint
from specdecode.drafters.none import SPEC as NONE
from specdecode.errors import ConfigError, OptionError
from specdecode.server.scheduling.router import RoutingDrafter
from tests.tiny import tiny_llama

VOCAB = 16
PROMPTS = [[3, 7, 1, 9, 4], [5], [2, 2, 2, 2, 2, 2, 2, 2, 11, 12]]


@pytest.fixture(scope="module")
def small() -> Target:
    return Target(tiny_llama(vocab_size=VOCAB, layers=4, hidden=32, seed=3, std=0.25, eos_token_id=None))


def _head(target: Target, draft_ids: list[int], seed: int = 0) -> Eagle3Net:
    config = Eagle3NetConfig.from_target(target.config, len(draft_ids), target.vocab_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = Eagle3Net(config)
        for parameter in net.parameters():
            torch.nn.init.normal_(parameter, std=0.3)
    net.set_draft_ids(torch.tensor(draft_ids))
    return net.eval()


@pytest.mark.parametrize("layout", ["sglang", "speculators"])
def test_a_head_in_either_layout_drafts_losslessly(small, tmp_path, layout):
    draft_ids = [9, 2, 4, 7, 11, 3, 1, 12]  # a draft vocabulary of half the target's, in frequency order
    save_eagle3(tmp_path, _head(small, draft_ids), layout, {"name_or_path": "tiny"},
                {"target": fingerprint(small.model)}, dtype=torch.float32)
    spec = SpecConfig(k=3)
    drafter = build_drafter(small, DrafterConfig("eagle3", draft_model=str(tmp_path)), spec)
    assert drafter.capabilities == Capabilities(needs_hidden=True, hidden_layers=(1, 2, 3))
    plain = Engine(small, NONE.build(small, DrafterConfig(), spec), spec)
    engine = Engine(small, drafter, spec)
    drafter.budget = dataclasses.replace(drafter.budget, copy_branch=False)  # the tree alone: no copied tokens
    drafted, original = set(), drafter.propose

    def spy(seqs):
        drafts = original(seqs)
        for draft in drafts:
            drafted.update(draft.tokens)
        return drafts
    drafter.propose = spy
    for prompt in PROMPTS:
        want = plain.generate(prompt, SamplingConfig(), GenerationConfig(max_new_tokens=30)).token_ids
        got = engine.generate(prompt, SamplingConfig(), GenerationConfig(max_new_tokens=30))
        assert got.token_ids == want
    assert drafted and drafted <= set(draft_ids)


def test_a_head_for_another_model_or_none_is_one_line(small, tmp_path):
    spec = SpecConfig()
    with pytest.raises(OptionError, match="no EAGLE-3 head ships"):
        build_drafter(small, DrafterConfig("eagle3"), spec)
    other = Target(tiny_llama(vocab_size=VOCAB, layers=4, hidden=32, seed=9, std=0.5, eos_token_id=None))
    save_eagle3(tmp_path / "ours", _head(small, list(range(8))), "sglang", {}, {"target": fingerprint(small.model)})
    with pytest.raises(ConfigError, match="trained for another model"):
        build_drafter(other, DrafterConfig("eagle3", draft_model=str(tmp_path / "ours")), spec)
    wider = Target(tiny_llama(vocab_size=VOCAB, layers=2, hidden=32, seed=3, std=0.25, eos_token_id=None))
    save_eagle3(tmp_path / "foreign", _head(small, list(range(8))), "speculators", {}, {})  # no fingerprint
    with pytest.raises(ConfigError, match="does not fit this model"):
        build_drafter(wider, DrafterConfig("eagle3", draft_model=str(tmp_path / "foreign")), spec)
    with pytest.raises(ConfigError, match="no usable EAGLE-3 head"):
        build_drafter(small, DrafterConfig("eagle3", draft_model=str(tmp_path / "missing")), spec)


def test_drafters_that_read_different_target_states_cannot_share_an_engine(small):
    with pytest.raises(ValueError, match="different target states"):
        Capabilities.union([Capabilities(needs_hidden=True), Capabilities(needs_hidden=True, hidden_layers=(1, 2, 3))])
    assert Capabilities.union([Capabilities(prices_rows=True), Capabilities(True, hidden_layers=(1, 2))]) == \
        Capabilities(True, (), True, (1, 2))
    with pytest.raises(ConfigError, match="serve one of them"):
        RoutingDrafter({"eagle": eagle.untrained(small), "eagle3": eagle3.untrained(small)}, "eagle")


def test_the_command_line_drafts_with_a_head_from_draft_head(tiny_model, tiny_model_dir, tmp_path, capsys):
    target = Target(tiny_model)
    save_eagle3(tmp_path, _head(target, list(range(3, 40))), "speculators", {"name_or_path": "tiny"}, {})
    code = main(["generate", "--model", tiny_model_dir, "--drafter", "eagle3", "--draft-head", str(tmp_path),
                 "--max-new-tokens", "12", "hello"])
    assert code == 0, capsys.readouterr().err
