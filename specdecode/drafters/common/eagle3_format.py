"""EAGLE-3 heads on disk in the two layouts the serving engines share, so a head trained here serves there and
one trained there (SpecForge, speculators) drafts here.

- `sglang`: SGLang's LlamaForCausalLMEagle3 and SpecForge. config.json is a Llama config with `architectures`
  ["LlamaForCausalLMEagle3"], `draft_vocab_size`, `target_hidden_size` and `eagle_config`
  (`eagle_aux_hidden_state_layer_ids`); weights fc, midlayer.*, norm, lm_head, d2t, t2d.
- `speculators`: vLLM's speculators format. config.json has `speculators_model_type` "eagle3", the layer's Llama
  config as `transformer_layer_config`, `draft_vocab_size`, `norm_before_residual`, `target_hidden_size`,
  `eagle_aux_hidden_state_layer_ids` and `speculators_config` (algorithm, proposal methods, the verifier's
  name); weights as above with the layer as layers.0.*.

Both keep `model.safetensors` and add a `specdecode` block (the target's fingerprint, the training record) that
the engines ignore. The draft vocabulary is written in target-id order, as SpecForge writes it (a reader that
numbers the draft tokens by counting t2d then agrees with d2t); what a loader reads is checked against the lists
read from their code in tests/unit/test_eagle3_format.py.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from specdecode.drafters.common.eagle3_net import Eagle3Net, Eagle3NetConfig, default_aux_layers
from specdecode.drafters.common.head_io import read_weights
from specdecode.errors import ConfigError

LAYOUTS = ("sglang", "speculators")
SGLANG_ARCHITECTURE = "LlamaForCausalLMEagle3"
LAYER_PREFIX = {"sglang": "midlayer.", "speculators": "layers.0."}


def _llama_fields(config: Eagle3NetConfig) -> dict:
    return {"model_type": "llama", "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
            "num_hidden_layers": 1, "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads, "head_dim": config.head_dim,
            "hidden_act": "silu", "rms_norm_eps": config.rms_norm_eps, "rope_theta": config.rope_theta,
            "max_position_embeddings": config.max_position_embeddings, "vocab_size": config.vocab_size,
            "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False}


def save_eagle3(directory: str | Path, net: Eagle3Net, layout: str, verifier: dict, specdecode: dict,
                dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write `net` in `layout`. verifier: {"name_or_path", "architectures"} of the target; specdecode: our own
    block (the target's fingerprint under "target", the training record)."""
    if layout not in LAYOUTS:
        raise ConfigError(f"unknown head layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    config = net.config
    order = torch.argsort(net.draft_ids.cpu())  # draft indices in target-id order
    ids = net.draft_ids.cpu()[order]
    tensors = {}
    for name, tensor in net.state_dict().items():
        if name in ("d2t", "t2d"):
            continue
        tensor = tensor.detach().cpu()
        if name == "lm_head.weight":
            tensor = tensor[order]
        if name.startswith("midlayer."):
            name = LAYER_PREFIX[layout] + name.removeprefix("midlayer.")
        tensors[name] = tensor.to(dtype).contiguous() if tensor.is_floating_point() else tensor.contiguous()
    tensors["d2t"] = (ids - torch.arange(ids.shape[0])).contiguous()  # [vd] int64
    t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    tensors["t2d"] = t2d  # [v] bool
    dtype_name = str(dtype).removeprefix("torch.")
    if layout == "sglang":
        body = {"architectures": [SGLANG_ARCHITECTURE], **_llama_fields(config),
                "draft_vocab_size": config.draft_vocab_size, "target_hidden_size": config.target_hidden_size,
                "torch_dtype": dtype_name,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(config.aux_layers),
                                 "use_aux_hidden_state": True}}
        if config.norm_before_residual:
            body["norm_before_residual"] = True
    else:
        body = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
                "transformer_layer_config": _llama_fields(config), "draft_vocab_size": config.draft_vocab_size,
                "norm_before_residual": config.norm_before_residual,
                "target_hidden_size": config.target_hidden_size,
                "eagle_aux_hidden_state_layer_ids": list(config.aux_layers), "torch_dtype": dtype_name,
                "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                       "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                       "verifier": {"name_or_path": verifier.get("name_or_path"),
                                                    "architectures": list(verifier.get("architectures", []))}}}
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({**body, "specdecode": specdecode}, indent=2) + "\n")
    return directory


def layout_of(config: dict) -> str | None:
    """Which shared layout a config.json is in (None: neither)."""
    if config.get("speculators_model_type") == "eagle3":
        return "speculators"
    architectures = config.get("architectures") or []
    if any(name in (SGLANG_ARCHITECTURE, "Eagle3LlamaForCausalLM") for name in architectures):
        return "sglang"
    return None


def _net_config(config: dict, layout: str, num_target_layers: int | None) -> Eagle3NetConfig:
    llama = config["transformer_layer_config"] if layout == "speculators" else config
    if layout == "speculators":
        aux = config.get("eagle_aux_hidden_state_layer_ids")
    else:
        aux = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if aux is None:
        if num_target_layers is None:
            raise ConfigError("the head names no target layers to fuse (eagle_aux_hidden_state_layer_ids)")
        aux = default_aux_layers(num_target_layers)
    hidden, heads = int(llama["hidden_size"]), int(llama["num_attention_heads"])
    rope = llama.get("rope_parameters") or llama.get("rope_scaling") or {}
    theta = llama.get("rope_theta") or (rope.get("rope_theta") if isinstance(rope, dict) else None) or 10000.0
    if isinstance(rope, dict) and rope.get("rope_type", "default") not in ("default", None):
        raise ConfigError(f"the head's rotary scaling {rope.get('rope_type')!r} is not supported")
    return Eagle3NetConfig(
        hidden_size=hidden, intermediate_size=int(llama["intermediate_size"]), num_attention_heads=heads,
        num_key_value_heads=int(llama.get("num_key_value_heads") or heads),
        head_dim=int(llama.get("head_dim") or hidden // heads), rms_norm_eps=float(llama.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta), max_position_embeddings=int(llama.get("max_position_embeddings", 8192)),
        draft_vocab_size=int(config.get("draft_vocab_size") or llama["vocab_size"]),
        vocab_size=int(llama["vocab_size"]), target_hidden_size=int(config.get("target_hidden_size") or hidden),
        aux_layers=tuple(aux), norm_before_residual=bool(config.get("norm_before_residual", False)))


def load_eagle3(directory: str | Path, device="cpu", dtype: torch.dtype = torch.float32,
                num_target_layers: int | None = None) -> tuple[Eagle3Net, dict]:
    """-> (net in eval mode, its config.json) from either layout. One-line ConfigError when the directory holds
    no EAGLE-3 head, or one whose weights do not match its config."""
    directory = Path(directory)
    try:
        config = json.loads((directory / "config.json").read_text())
        files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise OSError("no .safetensors file")
        state = {name: tensor for file in files for name, tensor in read_weights(file).items()}
    except (OSError, ValueError) as error:
        raise ConfigError(f"no usable EAGLE-3 head in {str(directory)!r}: {error}") from error
    layout = layout_of(config)
    if layout is None:
        raise ConfigError(f"{str(directory)!r} holds no EAGLE-3 head (its config.json names neither "
                          f"{SGLANG_ARCHITECTURE} nor speculators_model_type eagle3)")
    try:
        net_config = _net_config(config, layout, num_target_layers)
    except (KeyError, TypeError, ValueError) as error:
        raise ConfigError(f"the EAGLE-3 head in {str(directory)!r} has an unusable config.json: {error}") from error
    net = Eagle3Net(net_config)
    renamed = {}
    for name, tensor in state.items():
        if name.startswith("model."):  # some exports keep the LlamaForCausalLM prefix
            name = name.removeprefix("model.")
        for prefix in LAYER_PREFIX.values():
            if name.startswith(prefix):
                name = "midlayer." + name.removeprefix(prefix)
        if name.startswith("embed_tokens.") or name.startswith("verifier_"):
            continue  # the target's own embedding serves (neither engine needs the head's copy)
        renamed[name] = tensor
    if "d2t" not in renamed:  # a head over the whole target vocabulary
        renamed["d2t"] = torch.zeros(net_config.draft_vocab_size, dtype=torch.long)
    d2t = renamed.pop("d2t").long()
    renamed.pop("t2d", None)
    own = {name: tuple(t.shape) for name, t in net.state_dict().items() if name not in ("d2t", "t2d")}
    missing = [name for name in own if name not in renamed]
    unexpected = [name for name in renamed if name not in own]
    shaped = [f"{name} {tuple(renamed[name].shape)} (config: {own[name]})" for name in own
              if name in renamed and tuple(renamed[name].shape) != own[name]]
    if missing or unexpected or shaped:
        raise ConfigError(f"the EAGLE-3 head in {str(directory)!r} does not match its config "
                          f"(missing {missing[:3]}, unexpected {unexpected[:3]}, shapes {shaped[:2]})")
    net.load_state_dict(renamed, strict=False)
    try:
        net.set_draft_ids(d2t + torch.arange(d2t.shape[0]))
    except ValueError as error:
        raise ConfigError(f"the EAGLE-3 head in {str(directory)!r} has a bad d2t: {error}") from error
    net.to(device=device, dtype=dtype).eval()
    return net, config
