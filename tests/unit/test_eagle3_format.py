"""EAGLE-3 heads in the shared layouts: every key and shape SGLang's and vLLM's loaders read, round trips that
give the same net back, the draft vocabulary maps, and one-line errors for what is not a head.

The lists below were read from the loaders' code (2026-11-28):
- SGLang python/sglang/srt/models/llama_eagle3.py, LlamaForCausalLMEagle3: `fc` (3 x target hidden -> hidden),
  `midlayer` (q/k/v over 2 x hidden, stacked into qkv_proj; gate/up into gate_up_proj; input_layernorm,
  hidden_norm, post_attention_layernorm), `norm`, `lm_head` (draft_vocab_size rows); `d2t` becomes the hot token
  ids (d2t + arange), `t2d` is skipped; config: architectures, draft_vocab_size, tie_word_embeddings, the Llama
  fields, target_hidden_size when it differs.
- vLLM vllm/model_executor/models/llama_eagle3.py, Eagle3LlamaForCausalLM.load_weights: `midlayer.` read as
  `layers.0.`, `d2t` as draft_id_to_target_id, `t2d` skipped, fc's input 3 x target_hidden_size; and
  vllm/transformers_utils/configs/speculators (base.py, algos.py update_eagle3): speculators_model_type,
  transformer_layer_config, speculators_config.proposal_methods[0].speculative_tokens,
  speculators_config.verifier.name_or_path, draft_vocab_size, target_hidden_size, norm_before_residual (True when
  absent: ours is written out), eagle_aux_hidden_state_layer_ids.
"""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdecode.drafters.common.eagle3_format import layout_of, load_eagle3, save_eagle3
from specdecode.drafters.common.eagle3_net import Eagle3Net, Eagle3NetConfig, default_aux_layers
from specdecode.errors import ConfigError
from tests.tiny import tiny_llama

VERIFIER = {"name_or_path": "tiny-llama", "architectures": ["LlamaForCausalLM"]}


def _net(draft_vocab: int = 40, seed: int = 0) -> Eagle3Net:
    target = tiny_llama()
    config = Eagle3NetConfig.from_target(target.config, draft_vocab, target.config.vocab_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = Eagle3Net(config)
        for parameter in net.parameters():  # norms start at 1: make every weight tell
            torch.nn.init.normal_(parameter, std=0.2)
        net.set_draft_ids(torch.randperm(config.vocab_size)[:draft_vocab])  # frequency order, not id order
    return net.eval()


def _shapes(net: Eagle3Net, layer: str) -> dict[str, tuple[int, ...]]:
    c = net.config
    h, wide, q, kv = c.hidden_size, 2 * c.hidden_size, c.num_attention_heads * c.head_dim, \
        c.num_key_value_heads * c.head_dim
    return {"fc.weight": (h, 3 * c.target_hidden_size), f"{layer}self_attn.q_proj.weight": (q, wide),
            f"{layer}self_attn.k_proj.weight": (kv, wide), f"{layer}self_attn.v_proj.weight": (kv, wide),
            f"{layer}self_attn.o_proj.weight": (h, q), f"{layer}mlp.gate_proj.weight": (c.intermediate_size, h),
            f"{layer}mlp.up_proj.weight": (c.intermediate_size, h),
            f"{layer}mlp.down_proj.weight": (h, c.intermediate_size),
            f"{layer}input_layernorm.weight": (h,), f"{layer}hidden_norm.weight": (h,),
            f"{layer}post_attention_layernorm.weight": (h,), "norm.weight": (h,),
            "lm_head.weight": (c.draft_vocab_size, h), "d2t": (c.draft_vocab_size,), "t2d": (c.vocab_size,)}


@pytest.mark.parametrize("layout, layer", [("sglang", "midlayer."), ("speculators", "layers.0.")])
def test_an_export_has_every_key_and_shape_the_loaders_read(tmp_path, layout, layer):
    net = _net()
    save_eagle3(tmp_path, net, layout, VERIFIER, {"target": {}})
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert {name: tuple(t.shape) for name, t in tensors.items()} == _shapes(net, layer)
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    config = json.loads((tmp_path / "config.json").read_text())
    if layout == "sglang":
        assert config["architectures"] == ["LlamaForCausalLMEagle3"]
        assert config["tie_word_embeddings"] is False and config["num_hidden_layers"] == 1
        llama = config
        assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(net.config.aux_layers)
    else:
        assert config["speculators_model_type"] == "eagle3"
        assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] >= 1
        assert config["speculators_config"]["verifier"]["name_or_path"] == "tiny-llama"
        assert config["norm_before_residual"] is False  # vLLM assumes True when the key is absent
        assert config["eagle_aux_hidden_state_layer_ids"] == list(net.config.aux_layers)
        llama = config["transformer_layer_config"]
    assert config["draft_vocab_size"] == 40 and config["target_hidden_size"] == net.config.target_hidden_size
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "rms_norm_eps",
                "vocab_size", "hidden_act", "max_position_embeddings", "rope_theta", "model_type"):
        assert key in llama, key
    # SpecForge's order: draft indices ascend by target id, so counting t2d numbers them as d2t does
    ids = tensors["d2t"] + torch.arange(40)
    assert torch.all(ids[1:] > ids[:-1])
    assert torch.equal(torch.nonzero(tensors["t2d"]).flatten(), ids)


@pytest.mark.parametrize("layout", ["sglang", "speculators"])
def test_a_saved_head_loads_back_identically(tmp_path, layout):
    net = _net()
    save_eagle3(tmp_path, net, layout, VERIFIER, {"target": {}}, dtype=torch.float32)
    back, config = load_eagle3(tmp_path)
    assert layout_of(config) == layout and back.config == net.config
    aux = torch.randn(2, 5, 3 * net.config.target_hidden_size)
    embeds = torch.randn(2, 5, net.config.hidden_size)
    positions = torch.arange(5).expand(2, 5)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()[None, None].expand(2, 1, 5, 5)
    with torch.no_grad():
        mine, theirs = (n(embeds, n.fuse(aux), positions, mask, None) for n in (net, back))
        assert torch.equal(mine, theirs)

        def full(n: Eagle3Net) -> torch.Tensor:  # draft logits placed at their target ids (order differs)
            out = torch.full((*mine.shape[:-1], n.config.vocab_size), float("-inf"))
            out[..., n.draft_ids] = n.logits(mine)
            return out
        assert torch.equal(full(net), full(back))


def test_d2t_and_t2d_map_the_draft_vocabulary():
    net = _net()
    ids = torch.tensor([7, 3, 250, 0] + list(range(10, 46)))
    net.set_draft_ids(ids)
    assert torch.equal(net.draft_ids, ids) and torch.equal(net.d2t, ids - torch.arange(40))
    assert int(net.t2d.sum()) == 40 and bool(net.t2d[250]) and not bool(net.t2d[1])
    with pytest.raises(ValueError, match="repeat"):
        net.set_draft_ids(torch.tensor([1, 1] + list(range(10, 48))))
    with pytest.raises(ValueError, match="target tokens below"):
        net.set_draft_ids(torch.tensor([999] + list(range(10, 49))))


def test_a_head_written_by_another_trainer_loads(tmp_path):
    """A SpecForge-style export: `model.` prefixes, the head's own embed_tokens copy, no eagle_config (the
    default layers of the target are fused), bf16."""
    net = _net()
    save_eagle3(tmp_path, net, "sglang", VERIFIER, {})
    config = json.loads((tmp_path / "config.json").read_text())
    del config["eagle_config"], config["specdecode"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors = {("model." + k if k not in ("lm_head.weight", "d2t", "t2d") else k): v for k, v in tensors.items()}
    tensors["model.embed_tokens.weight"] = torch.zeros(net.config.vocab_size, net.config.hidden_size)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    back, _ = load_eagle3(tmp_path, num_target_layers=4)
    assert back.config.aux_layers == default_aux_layers(4)
    assert torch.equal(torch.sort(back.draft_ids).values, torch.sort(net.draft_ids).values)


def test_what_is_not_an_eagle3_head_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="no usable EAGLE-3 head"):
        load_eagle3(tmp_path)
    net = _net()
    save_eagle3(tmp_path, net, "sglang", VERIFIER, {})
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ConfigError, match="holds no EAGLE-3 head"):
        load_eagle3(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "intermediate_size": 7}))
    with pytest.raises(ConfigError, match="does not match its config"):
        load_eagle3(tmp_path)
    with pytest.raises(ConfigError, match="unknown head layout"):
        save_eagle3(tmp_path / "x", net, "medusa", VERIFIER, {})


def test_the_default_layers_are_low_middle_and_high():
    assert default_aux_layers(30) == (2, 15, 27)  # SmolLM2-135M
    assert default_aux_layers(28) == (2, 14, 25)  # Qwen2.5-Coder 1.5B
    assert default_aux_layers(4) == (1, 2, 3)
