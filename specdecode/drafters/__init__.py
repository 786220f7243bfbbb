"""Drafters and their registry. A new drafter adds its module's SPEC to _SPECS; generate, bench and serve
all take the method list from `registry()`."""
from __future__ import annotations

from dataclasses import replace

from specdecode.config import DrafterConfig, SpecConfig
from specdecode.core.drafting import Drafter
from specdecode.core.target import Target
from specdecode.drafters import (
    draft_model,
    eagle,
    eagle3,
    hybrid,
    layer_skip,
    lookahead,
    medusa,
    none,
    prompt_lookup,
    suffix,
)
from specdecode.drafters.common.base import DrafterSpec
from specdecode.drafters.draft_model import DraftModel
from specdecode.drafters.hybrid import Hybrid
from specdecode.drafters.suffix import Suffix
from specdecode.errors import ConfigError, ModelError, OptionError

_SPECS: tuple[DrafterSpec, ...] = (none.SPEC, prompt_lookup.SPEC, layer_skip.SPEC, draft_model.SPEC, lookahead.SPEC,
                                   eagle.SPEC, eagle3.SPEC, medusa.SPEC, suffix.SPEC, hybrid.SPEC)


def registry() -> dict[str, DrafterSpec]:
    """Drafter name -> spec, in a stable order (baseline first)."""
    return {spec.name: spec for spec in _SPECS}


def get_spec(name: str) -> DrafterSpec:
    specs = registry()
    if name not in specs:
        raise ConfigError(f"unknown drafter {name!r}; choose one of: {', '.join(specs)}")
    return specs[name]


AUTO = "auto"

# drafter options (DrafterConfig / SpecConfig field names) -> the drafters that read them; given for another
# drafter, one would be ignored
OPTION_READERS = {"exit_layer": ("layer-skip",), "lookahead": ("lookahead",),
                  "draft_model": ("draft-model", "eagle", "eagle3", "medusa", "hybrid"),
                  "draft_weights": ("draft-model", "hybrid"), "draft_vocab": ("draft-model", "hybrid"),
                  "confidence": ("layer-skip", "draft-model"), "suffix_store": ("suffix", "hybrid")}
# the speculation length is read by every drafter that drafts. Checked where a user gives it (the command line's
# --k, --adaptive: cli/args.py), not on a library's SpecConfig, which a baseline shares with the drafters it runs with
DRAFTING = tuple(spec.name for spec in _SPECS if spec is not none.SPEC)
OPTION_READERS.update(k=DRAFTING, adaptive=DRAFTING)


def check_options_read(given: dict[str, bool], drafters: list[str], shown: str | None = None) -> None:
    """Refuse an option (given[name] True) that none of `drafters` (names, `auto` resolved) reads: it would be
    silently ignored. shown: how the drafters are named in the message (default: the names)."""
    for option, readers in OPTION_READERS.items():
        if given.get(option) and not set(readers) & set(drafters):
            named = "every drafter but none" if readers == DRAFTING else f"{{drafter}} {' or '.join(readers)}"
            raise OptionError(f"{{{option}}} has no effect with {{drafter}} {shown or ', '.join(drafters)}; "
                              f"it is read by {named}", option, "drafter")


def build_drafter(target: Target, config: DrafterConfig, spec: SpecConfig | None = None) -> Drafter:
    """`auto`: the best measured drafter for the device (see best_drafter_name)."""
    spec = spec or SpecConfig()
    if config.name == AUTO:
        return _build_best(target, config, spec)
    return get_spec(config.name).build(target, config, spec)


def suffix_of(drafter: Drafter) -> Suffix | None:
    """The suffix drafter whose store `drafter` drafts from (itself, or a hybrid's free drafter), else None: the
    server exports its store, a benchmark clears it after the warm-up."""
    if isinstance(drafter, Hybrid):
        return drafter.free
    return drafter if isinstance(drafter, Suffix) else None


BEST_DRAFTER = {"cpu": "prompt-lookup", "cuda": "prompt-lookup"}
# with a draft model: the hybrid where it was measured not to lose to the draft model alone
BEST_WITH_DRAFT_MODEL = {"cpu": "hybrid"}


def best_drafter_name(device_type: str, has_draft_model: bool = False, confidence: bool = False) -> str:
    """A draft model, when one is given (the user chose it: a same-family draft is what speculation is for): on
    the CPU `hybrid`, which drafts with it where suffix decoding's free draft is worth less (BEST_WITH_DRAFT_MODEL;
    `draft-model` with a --confidence threshold, which the hybrid does not read, and, at build time, with a draft
    model of another tokenizer). Otherwise the fastest drafter measured by `specdecode bench` on the default model,
    per device (BEST_DRAFTER): on the CPU EAGLE's higher tau does not pay for its draft steps and wider passes, and
    on CUDA its tree drafting is bound by host work. Kept per device so a new measurement changes one entry.
    Re-measure with `specdecode bench` on the whole built-in set (command and figures: docs/benchmarks.md)."""
    if has_draft_model:
        return "draft-model" if confidence else BEST_WITH_DRAFT_MODEL.get(device_type, "draft-model")
    return BEST_DRAFTER.get(device_type, "prompt-lookup")


def _build_best(target: Target, config: DrafterConfig, spec: SpecConfig) -> Drafter:
    name = best_drafter_name(target.device.type, config.draft_model is not None, spec.confidence != 0)
    if name == "hybrid":  # the draft model first: one of another tokenizer drafts across them, and no hybrid can
        model = get_spec("draft-model").build(target, replace(config, name="draft-model"), spec)
        if isinstance(model, DraftModel):
            return hybrid.around(target, model, config, spec)
        if config.suffix_store is not None:
            raise OptionError("{suffix_store} has no effect here: {drafter} auto drafts with this draft model alone, "
                              "which has another tokenizer than the target", "suffix_store", "drafter")
        return model
    if name == "draft-model":  # the user's draft model: its errors are theirs to see
        return get_spec(name).build(target, replace(config, name=name), spec)
    try:
        return get_spec(name).build(target, replace(config, name=name), spec)
    except (ConfigError, ModelError):  # no trained head for this model: model-free drafting
        return get_spec("prompt-lookup").build(target, replace(config, name="prompt-lookup"), spec)


__all__ = ["AUTO", "OPTION_READERS", "DrafterSpec", "best_drafter_name", "build_drafter", "check_options_read",
           "get_spec", "registry", "suffix_of"]
