"""Drafters and their registry. A new drafter adds its module's SPEC to _SPECS; generate, bench and serve
all take the method list from `registry()`."""
from __future__ import annotations

from ..config import ConfigError, SpecConfig
from .base import Draft, Drafter, DrafterConfig, DrafterSpec, SequenceContext
from . import draft_model, eagle, layer_skip, lookahead, medusa, none, prompt_lookup

_SPECS: tuple[DrafterSpec, ...] = (none.SPEC, prompt_lookup.SPEC, layer_skip.SPEC, draft_model.SPEC, lookahead.SPEC,
                                   eagle.SPEC, medusa.SPEC)


def registry() -> dict[str, DrafterSpec]:
    """Drafter name -> spec, in a stable order (baseline first)."""
    return {spec.name: spec for spec in _SPECS}


def get_spec(name: str) -> DrafterSpec:
    specs = registry()
    if name not in specs:
        raise ConfigError(f"unknown drafter {name!r}; choose one of: {', '.join(specs)}")
    return specs[name]


def build_drafter(target, config: DrafterConfig, spec: SpecConfig | None = None) -> Drafter:
    return get_spec(config.name).build(target, config, spec or SpecConfig())


__all__ = ["Draft", "Drafter", "DrafterConfig", "DrafterSpec", "SequenceContext", "build_drafter", "get_spec",
           "registry"]
