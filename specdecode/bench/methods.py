"""The methods a benchmark compares. A method is a named callable: prompt ids -> generated ids, wall time and
(when known) target passes, proposed and accepted draft tokens. All methods share ONE model object.

- baseline `hf-generate`: transformers `model.generate`, greedy (or sampling at --temperature), no assistant.
- peers: transformers assisted generation: `hf-prompt-lookup` (prompt_lookup_num_tokens), `hf-assisted`
  (assistant_model = the draft as loaded, only with a draft model), `hf-assisted-same-draft` (assistant_model =
  the draft with the weights our draft-model drafter drafts with: an int8 copy on the CPU, see `same_draft`)
  and `hf-early-exit` (assistant_early_exit = our layer-skip's exit layer). They run with transformers'
  defaults except the knobs in PeerOptions (draft length, draft-length schedule).
- `llamacpp`: llama.cpp on the model's GGUF, when llama-cpp-python is installed (llamacpp.py); its outputs are
  not compared (its own arithmetic).
- ours: `specdecode-<name>` for every drafter in specdecode.drafters.registry() (drafters that need a draft
  model are skipped without one), each an Engine over the same model.

transformers reports neither target passes nor accepted tokens for assisted generation; `_PassCounter`
derives them with a forward pre-hook on the target (see its docstring). Timings are wall-clock around the
whole call, prefill included, after a device synchronisation, for every method alike.
"""
from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from specdecode.bench import llamacpp
from specdecode.bench.generation import Generation, RunSettings
from specdecode.config import DrafterConfig, FastPathConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.core.pass_costs import synchronize
from specdecode.core.target import Target
from specdecode.drafters import OPTION_READERS, build_drafter, registry, suffix_of
from specdecode.drafters.draft_model import DraftModel
from specdecode.drafters.hybrid import Hybrid
from specdecode.drafters.suffix import Suffix
from specdecode.errors import ConfigError, ModelError
from specdecode.loading.formats import apply as apply_weights
from specdecode.loading.formats import draft_format

BASELINE = "hf-generate"
OURS_PREFIX = "specdecode-"
SAME_DRAFT = "hf-assisted-same-draft"
DRAFT_PEERS = ("hf-assisted", SAME_DRAFT)  # transformers peers that need a draft model
ASSISTED_PEERS = (*DRAFT_PEERS, "hf-early-exit")  # the peers that read num_assistant_tokens(_schedule)
SCHEDULES = ("heuristic", "constant")  # transformers' num_assistant_tokens_schedule values offered


@dataclass(frozen=True)
class Method:
    name: str
    kind: str  # "baseline" | "transformers" | "specdecode"
    run: Callable[[list[int], RunSettings], Generation]
    params: dict[str, Any] = field(default_factory=dict)  # recorded in results.json
    # forget what earlier runs taught it (the suffix drafter's store), called after the untimed warm-up
    reset: Callable[[], None] | None = None


@dataclass(frozen=True)
class BenchModel:
    """The target every method decodes with, and an optional draft model (for hf-assisted / draft-model)."""

    model: torch.nn.Module
    tokenizer: Any
    name: str
    draft_model: torch.nn.Module | None = None
    draft_spec: str | None = None  # how specdecode's draft-model drafter loads it (a path or hub id)


@dataclass(frozen=True)
class PeerOptions:
    """Knobs for the methods. The assistant peers (ASSISTED_PEERS) start at k draft tokens per step
    like ours (transformers' default of 20 on an early exit that was not trained for it spends ~20 draft passes
    per target pass for nothing) with transformers' own adaptive "heuristic" schedule (+2 after a fully
    accepted draft, -1 otherwise, at least 1), its counterpart of our pause/adaptive K; assistant_schedule
    "constant" keeps the draft length fixed instead. The rest are transformers' defaults
    (assistant_confidence_threshold 0.4). Prompt lookup has no default and uses 10, the value in transformers'
    docs. hf_draft_tokens overrides both draft lengths. The early-exit layer is the same for ours and theirs."""

    k: int = 5
    hf_draft_tokens: int | None = None  # prompt_lookup_num_tokens and num_assistant_tokens of the peers
    heads: tuple[tuple[str, str], ...] = ()  # (drafter, path): a trained head for eagle, medusa, ...
    compile: bool = False  # specdecode methods on the fast path (static cache + torch.compile)
    assistant_schedule: str = "heuristic"  # num_assistant_tokens_schedule of the assisted peers (SCHEDULES)
    confidence: float = 0.0  # model drafters: stop a draft below this top probability (0: never)
    # our drafters' options, the same for every specdecode method (each names its own drafter): exit_layer (None:
    # a third of the layers, also hf-early-exit's), draft_weights (also hf-assisted-same-draft's; hf-assisted's
    # draft is as loaded), suffix_store, draft_vocab
    drafter: DrafterConfig = field(default_factory=DrafterConfig)

    @property
    def prompt_lookup_num_tokens(self) -> int:
        return self.hf_draft_tokens or 10

    @property
    def num_assistant_tokens(self) -> int:
        return self.hf_draft_tokens or self.k


def available(has_draft: bool) -> list[str]:
    """Every method name, in run order, without loading anything (so --methods is checked first)."""
    names = [BASELINE, "hf-prompt-lookup"]
    if has_draft:
        names += DRAFT_PEERS
    names.append("hf-early-exit")
    names += [OURS_PREFIX + name for name, spec in registry().items() if has_draft or not spec.needs_draft_model]
    names.append(llamacpp.NAME)
    return names


def parse_heads(values: list[str] | None) -> tuple[tuple[str, str], ...]:
    """--head NAME=DIR (repeatable) -> ((name, dir), ...), names checked against the drafter registry."""
    heads = []
    head_drafters = [name for name, spec in registry().items() if spec.untrained is not None]  # trained weights
    for value in values or ():
        name, sep, path = value.partition("=")
        if not sep or not path or name not in head_drafters:
            raise ConfigError(f"--head expects DRAFTER=DIR with DRAFTER one of {', '.join(head_drafters)}, "
                              f"got {value!r}")
        heads.append((name, path))
    return tuple(heads)


def explicit(requested: str | None) -> frozenset[str]:
    return frozenset(name.strip() for name in (requested or "").split(",") if name.strip())


def choose(requested: str | None, has_draft: bool) -> list[str]:
    """Validate --methods (comma list). The baseline always runs: speedup and losslessness are relative to it."""
    names = available(has_draft)
    if requested is None:
        return names
    wanted = [name.strip() for name in requested.split(",") if name.strip()]
    if not wanted:
        raise ConfigError(f"--methods is empty; name one or more of: {', '.join(names)}")
    for name in wanted:
        if name not in names:
            needs = name in DRAFT_PEERS or (
                name.startswith(OURS_PREFIX) and name[len(OURS_PREFIX):] in registry()
                and registry()[name[len(OURS_PREFIX):]].needs_draft_model
            )
            hint = " (it needs --draft-model)" if needs else ""
            raise ConfigError(f"unknown method {name!r}{hint}; choose from: {', '.join(names)}")
    return [name for name in names if name == BASELINE or name in wanted]


def build_methods(bench: BenchModel, names: list[str], options: PeerOptions, explicit: frozenset[str] = frozenset(),
                  skipped: dict[str, str] | None = None) -> list[Method]:
    """Methods in `names` order. A specdecode drafter that cannot be built for this model (say, a head drafter
    with no head for it) is left out and its one-line reason put in `skipped`, unless it is in `explicit`
    (named in --methods): then the error reaches the user."""
    skipped = {} if skipped is None else skipped
    target = Target(bench.model, bench.tokenizer, FastPathConfig(enabled=options.compile))
    given_layer = options.drafter.exit_layer
    exit_layer = given_layer if given_layer is not None else max(1, target.num_layers // 3)
    if not 1 <= exit_layer < target.num_layers:
        raise ConfigError(f"exit layer must be in 1..{target.num_layers - 1}, got {exit_layer}")
    eos = sorted(target.eos_ids)
    drafts = _peer_drafts(bench, names, options.drafter.draft_weights, target.device)
    hf = {
        BASELINE: {},
        "hf-prompt-lookup": {"prompt_lookup_num_tokens": options.prompt_lookup_num_tokens},
        **{name: {"assistant_model": model} for name, (model, _) in drafts.items()},
        "hf-early-exit": {"assistant_early_exit": exit_layer},
    }
    # transformers reads the draft length from the ASSISTANT's generation_config (for early exit: the target's)
    assistant = {**{name: model for name, (model, _) in drafts.items()}, "hf-early-exit": bench.model}
    overrides = {"num_assistant_tokens": options.num_assistant_tokens,
                 "num_assistant_tokens_schedule": options.assistant_schedule}
    methods = []
    for name in names:
        if name == llamacpp.NAME:
            reason = llamacpp.unavailable(bench.name)
            if reason:
                skipped[name] = reason
            else:
                methods.append(Method(name, "llamacpp", llamacpp.runner(bench.name, eos),
                                      {"gguf": str(llamacpp.gguf_file(bench.name))}))
        elif name in hf:
            kind = "baseline" if name == BASELINE else "transformers"
            params = {k: (bench.draft_spec if k == "assistant_model" else v) for k, v in hf[name].items()}
            if name in drafts:
                params["draft_weights"] = drafts[name][1]
            if name in assistant:
                config = assistant[name].generation_config
                params.update({key: getattr(config, key, None) for key in _ASSISTANT_KEYS}, **overrides)
            runner = _hf_runner(bench.model, eos, target.pad_id, hf[name], assistant.get(name),
                                overrides if name in assistant else {})
            methods.append(Method(name, kind, runner, params))
        else:
            drafter = name[len(OURS_PREFIX):]
            # --draft-model is a draft LM: only drafters that need one get it. Head drafters (eagle, medusa)
            # read DrafterConfig.draft_model as a head directory: --head NAME=DIR, else their shipped head.
            heads = dict(options.heads)
            draft = heads.get(drafter) or (bench.draft_spec if registry()[drafter].needs_draft_model else None)
            config = replace(options.drafter, name=drafter, draft_model=draft, exit_layer=exit_layer)
            confidence = options.confidence if drafter in OPTION_READERS["confidence"] else 0.0
            spec = SpecConfig(k=options.k, confidence=confidence)
            try:
                engine = Engine(target, build_drafter(target, config, spec), spec, max_batch=1)
                engine.warmup()  # fast path: compile every step shape before timing
            except (ConfigError, ModelError) as error:
                reason = f"{name}: {error}"
                if not registry()[drafter].needs_draft_model:  # a head drafter's --draft-model is bench's --head
                    reason += f" (in specdecode bench: --head {drafter}=DIR)"
                if name in explicit or drafter in heads:  # named in --methods or given a --head: not skipped
                    raise ConfigError(reason) from error
                skipped[name] = reason
                continue
            params = {"k": options.k, **({"confidence": spec.confidence} if spec.confidence else {}),
                      "skinny_gemm": target.skinny_gemm,  # recorded: our CPU kernel (backends/cpu/skinny.py)
                      **({"exit_layer": exit_layer} if drafter == "layer-skip" else {}),
                      **({"draft_model": draft,
                          "draft_weights": _drafter_weights(options.drafter.draft_weights, target)}
                         if draft and registry()[drafter].needs_draft_model else {})}
            model = engine.drafter.model if isinstance(engine.drafter, Hybrid) else engine.drafter
            if isinstance(model, DraftModel):  # the draft head's shortlist (0: the whole vocabulary)
                params["draft_vocab"] = model.shortlist.size if model.shortlist else 0
            store = suffix_of(engine.drafter)
            if store is not None:  # one store over the whole run, in question order
                params["suffix_store"] = store.config.store_tokens
            methods.append(Method(name, "specdecode", _engine_runner(engine), params, forgetting(engine)))
    return methods


def same_draft(draft: torch.nn.Module, choice: str, device: torch.device) -> tuple[torch.nn.Module, str]:
    """The draft with the weights specdecode-draft-model drafts with (its own rule, `draft_format`), so that
    transformers' assisted generation is compared on the same draft: a quantized copy where that rule says so
    (the loaded draft stays as it is for hf-assisted), else the draft as loaded. -> (model, its weights)"""
    fmt = draft_format(choice, device)
    if fmt == "same":
        return draft, _dtype_name(draft)
    quantized = copy.deepcopy(draft)
    return quantized, apply_weights(quantized, fmt)


def _peer_drafts(bench: BenchModel, names: list[str], choice: str,
                 device: torch.device) -> dict[str, tuple[torch.nn.Module, str]]:
    """The draft each chosen draft peer is handed, with its weights for the params; the int8 copy is built only
    when hf-assisted-same-draft runs."""
    drafts = {}
    if "hf-assisted" in names:
        drafts["hf-assisted"] = (bench.draft_model, _dtype_name(bench.draft_model))
    if SAME_DRAFT in names:
        drafts[SAME_DRAFT] = same_draft(bench.draft_model, choice, device)
    return drafts


def _drafter_weights(choice: str, target: Target) -> str:
    """What specdecode-draft-model drafts with, by the rule it loads its draft with: "int8" or the target's
    dtype (the choice itself, "auto" say, is in the run's config)."""
    fmt = draft_format(choice, target.device)
    return str(target.dtype).removeprefix("torch.") if fmt == "same" else fmt


def _dtype_name(model: torch.nn.Module) -> str:
    return str(next(model.parameters()).dtype).removeprefix("torch.")


# -- runners --------------------------------------------------------------------------------------------------
def cut_at_eos(ids: list[int], eos: set[int] | frozenset[int]) -> list[int]:
    for i, token in enumerate(ids):
        if token in eos:
            return ids[: i + 1]
    return ids


class _PassCounter:
    """Counts the target's forward passes during one `generate` call, with a forward pre-hook on the model.

    Every target pass of (assisted) generation yields tokens: the first also holds the prompt, the others hold
    the pending token plus the candidates, so proposed = sum of input lengths minus the prompt and one token per
    later pass. Early exit drafts with the same module while `config.num_hidden_layers` is lowered; those
    calls are draft passes and are skipped. accepted = new tokens - passes: the last pass may be cut by EOS or
    the length budget, which undercounts by at most that pass's surplus (ours counts it the same way).
    """

    def __init__(self, model: torch.nn.Module, prompt_len: int):
        self.model, self.prompt_len = model, prompt_len
        self.layers = model.config.get_text_config().num_hidden_layers
        self.passes = self.inputs = 0

    def __enter__(self) -> _PassCounter:
        self.handle = self.model.register_forward_pre_hook(self._count, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()

    def _count(self, module, args, kwargs) -> None:
        if module.config.get_text_config().num_hidden_layers < self.layers:
            return  # an early-exit draft pass
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            self.passes += 1
            self.inputs += int(ids.shape[-1])

    @property
    def proposed(self) -> int:
        return max(0, self.inputs - self.prompt_len - max(0, self.passes - 1))


_ASSISTANT_KEYS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


@contextlib.contextmanager
def _generation_overrides(model: torch.nn.Module | None, overrides: dict) -> Iterator[None]:
    """Set generation_config attributes for one call and restore them, even on error."""
    if model is None or not overrides:
        yield
        return
    config = model.generation_config
    saved = {key: getattr(config, key, None) for key in overrides}
    for key, value in overrides.items():
        setattr(config, key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(config, key, value)


def _hf_runner(model: torch.nn.Module, eos: list[int], pad_id: int, extra: dict,
               assistant: torch.nn.Module | None = None, overrides: dict | None = None) -> Callable:
    layers = model.config.get_text_config().num_hidden_layers

    def run(prompt_ids: list[int], settings: RunSettings) -> Generation:
        device = next(model.parameters()).device
        input_ids = torch.tensor([prompt_ids], device=device)  # [1, prompt]
        sampling = (
            {"do_sample": False}
            if settings.greedy
            else {"do_sample": True, "temperature": settings.temperature, "top_k": 0, "top_p": 1.0}
        )
        if settings.seed is not None:
            torch.manual_seed(settings.seed)
        counter = _PassCounter(model, len(prompt_ids))
        synchronize(device)
        began = time.perf_counter()
        try:
            with counter, torch.inference_mode(), _generation_overrides(assistant, overrides or {}):
                out = model.generate(
                    input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    max_new_tokens=settings.max_new_tokens,
                    min_new_tokens=0,
                    eos_token_id=eos,
                    pad_token_id=pad_id,
                    num_beams=1,
                    repetition_penalty=1.0,
                    **sampling,
                    **extra,
                )
            synchronize(device)
        finally:  # transformers' early exit lowers the layer count without a `finally` of its own
            model.config.get_text_config().num_hidden_layers = layers
        seconds = time.perf_counter() - began
        ids = cut_at_eos(out[0, len(prompt_ids):].tolist(), set(eos))
        passes = counter.passes
        accepted = max(0, len(ids) - passes) if extra else 0
        return Generation(ids, seconds, passes, counter.proposed if extra else 0, accepted)

    return run


def forgetting(engine: Engine) -> Callable[[], None]:
    """What a method forgets after the warm-up, which answered the first question: the KV its rows kept
    (Engine.prefix_reuse) and what the suffix and hybrid drafters learned from earlier requests."""
    def forget() -> None:
        engine.forget_prefixes()
        if isinstance(engine.drafter, (Suffix, Hybrid)):
            engine.drafter.clear()
    return forget


def _engine_runner(engine: Engine) -> Callable:
    def run(prompt_ids: list[int], settings: RunSettings) -> Generation:
        sampling = SamplingConfig(temperature=settings.temperature, seed=settings.seed)
        generation = GenerationConfig(max_new_tokens=settings.max_new_tokens, stop_on_eos=True, detokenize=False)
        synchronize(engine.target.device)
        began = time.perf_counter()
        seq = None
        for seq, _ in engine.stream(prompt_ids, sampling, generation):  # noqa: B007 - the last seq is read after the loop
            pass
        synchronize(engine.target.device)
        seconds = time.perf_counter() - began
        assert seq is not None
        m = seq.metrics
        ids = cut_at_eos(list(seq.output_ids), engine.target.eos_ids)
        return Generation(ids, seconds, m.target_passes, m.proposed, m.accepted,
                          (m.prefill_s, m.draft_s, m.verify_s), m.first_token_s)

    return run
