"""Trained drafter heads on disk: `model.safetensors` (weights, draft vocabulary) + `config.json` (kind, net
shape, the target it was trained for, training record). Heads shipped with the package live under
specdecode/heads/<model>/<kind>/ and are found by matching the target's fingerprint."""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from specdecode.drafters.common.nets import EagleNet, EagleNetConfig, MedusaHeads, MedusaNetConfig
from specdecode.errors import ConfigError, OptionError, first_line

FORMAT = 1
SHIPPED_ROOT = Path(str(resources.files("specdecode"))) / "heads"  # heads shipped in the package
_NETS = {"eagle": (EagleNet, EagleNetConfig), "medusa": (MedusaHeads, MedusaNetConfig)}


def fingerprint(model: nn.Module) -> dict:
    """What identifies a target for a head: shape plus a probe of its embedding values (dtype-tolerant)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    embed = model.get_input_embeddings().weight
    probe = float(embed[: min(256, embed.shape[0])].detach().float().abs().mean())
    return {"model_type": getattr(config, "model_type", ""), "hidden_size": config.hidden_size,
            "num_layers": config.num_hidden_layers, "vocab_size": int(embed.shape[0]), "embed_probe": probe}


def same_target(a: dict, b: dict) -> bool:
    keys = ("model_type", "hidden_size", "num_layers", "vocab_size")
    if any(a.get(k) != b.get(k) for k in keys):
        return False
    pa, pb = float(a.get("embed_probe", 0.0)), float(b.get("embed_probe", 0.0))
    return abs(pa - pb) <= 1e-2 * max(abs(pa), abs(pb), 1e-8)


def build_net(kind: str, net_config: dict) -> nn.Module:
    if kind not in _NETS:
        raise ConfigError(f"unknown head kind {kind!r}; choose eagle or medusa")
    net_cls, config_cls = _NETS[kind]
    return net_cls(config_cls(**net_config))


def save_head(directory: str | Path, kind: str, net: nn.Module, target_fingerprint: dict, extra: dict,
              dtype: torch.dtype = torch.bfloat16) -> Path:
    """Weights in `dtype` (bf16 keeps shipped heads small); the draft vocabulary stays int64."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: (t.detach().to("cpu", dtype) if t.is_floating_point() else t.detach().cpu()).contiguous()
               for name, t in net.state_dict().items()}
    save_file(tensors, str(directory / "model.safetensors"))
    config = {"format": FORMAT, "kind": kind, "net": net.config.to_dict(), "target": target_fingerprint, **extra}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """A head's safetensors file. One that is not (garbage, cut short) is a ValueError naming it, which the loaders
    make their one-line error: safetensors raises its own SafetensorError, neither an OSError nor a ValueError."""
    try:
        return load_file(str(path))
    except SafetensorError as error:
        raise ValueError(f"{path.name} is not a safetensors file ({first_line(error)})") from error


def load_head(directory: str | Path, kind: str, device="cpu", dtype: torch.dtype = torch.float32
              ) -> tuple[nn.Module, dict]:
    """-> (net in eval mode on device/dtype, its config dict). One-line ConfigError on a bad directory."""
    directory = Path(directory)
    try:
        config = json.loads((directory / "config.json").read_text())
        state = read_weights(directory / "model.safetensors")
    except (OSError, ValueError) as error:
        raise ConfigError(f"no usable {kind} head in {str(directory)!r}: {error}") from error
    if config.get("kind") != kind:
        raise ConfigError(f"{str(directory)!r} holds a {config.get('kind')!r} head, not {kind!r}")
    net = build_net(kind, config["net"])
    missing, unexpected = net.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ConfigError(f"{kind} head in {str(directory)!r} does not match its config "
                          f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    net.to(device=device, dtype=dtype).eval()  # floating tensors only: draft_ids stays int64
    return net, config


def find_shipped_head(kind: str, target_model: nn.Module, root: Path = SHIPPED_ROOT) -> Path | None:
    """The shipped head directory of this kind trained for this target, if any."""
    mine = fingerprint(target_model)
    for config_path in sorted(root.glob(f"*/{kind}/config.json")):
        try:
            config = json.loads(config_path.read_text())
        except (OSError, ValueError):
            continue
        if config.get("kind") == kind and same_target(config.get("target", {}), mine):
            return config_path.parent
    return None


def resolve_head(kind: str, target_model: nn.Module, directory: str | None, device, dtype
                 ) -> tuple[nn.Module, dict]:
    """An explicit head directory, else the shipped head for this target, else a one-line error."""
    if directory is None:
        found = find_shipped_head(kind, target_model)
        if found is None:
            raise OptionError(
                f"no trained {kind} head ships for this model; train one with `specdecode train --kind {kind} "
                f"--model M --out DIR` and pass its directory as {{draft_model}}", "draft_model")
        directory = str(found)
    net, config = load_head(directory, kind, device=device, dtype=dtype)
    if not same_target(config.get("target", {}), fingerprint(target_model)):
        raise ConfigError(f"the {kind} head in {directory!r} was trained for another model")
    return net, config
