"""One benchmark, start to end: validate everything the user gave (prompts, methods, flags) BEFORE loading a
model, load it once, build the methods, run them interleaved, write results.json / report.md / speedup.png.

The model comes from `load_bench_model`; a later source (e.g. a random-initialised `--random-config`
shape for GPU tests) only has to return another BenchModel.
"""
from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from importlib.metadata import version
from pathlib import Path

import torch

from specdecode.bench import methods as methods_mod
from specdecode.bench.methods import BASELINE, BenchModel, PeerOptions
from specdecode.bench.prompts import BUILTIN_NAME, categories, load_prompts, select
from specdecode.bench.report import write_all
from specdecode.bench.runner import NEAR_TIE_EPS, BenchSettings, run_bench
from specdecode.bench.summary import CONVENTIONS, summarise
from specdecode.config import DrafterConfig, GenerationConfig, ModelConfig, SamplingConfig
from specdecode.drafters import OPTION_READERS
from specdecode.drafters.draft_model import HEADS, head_drafter
from specdecode.errors import ConfigError
from specdecode.loading.formats import FLOAT_DTYPES
from specdecode.loading.formats import describe as describe_weights
from specdecode.loading.load import load_model, model_dtype
from specdecode.paths import output_dir


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark run. model: what every method decodes, in one weight format for all (a name is taken as
    ModelConfig(name)); drafter: our drafters' options (draft_model, exit_layer, draft_weights, suffix_store,
    draft_vocab), the same for every specdecode method, each of which names its own drafter (drafter.name is
    not read); the draft model is also what the transformers peers assist with."""

    out: str
    model: ModelConfig | str | None = None
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    prompts: str | None = None  # None: the built-in set
    limit: int | None = None  # prompts per category
    categories: tuple[str, ...] | None = None  # only these (None: all; built-in opt-in ones such as agentic: named)
    methods: str | None = None  # comma list; None: all
    max_new_tokens: int = 128
    temperature: float = 0.0
    k: int = 5
    confidence: float | None = None  # model drafters stop a draft below this top probability (None: never)
    hf_draft_tokens: int | None = None
    hf_assistant_schedule: str | None = None  # num_assistant_tokens_schedule of the assisted peers; None: heuristic
    heads: tuple[str, ...] = ()  # --head NAME=DIR
    seed: int = 0
    threads: int | None = None  # torch intra-op CPU threads; None: torch's default
    warmup: bool = True
    progress: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.model, ModelConfig):
            object.__setattr__(self, "model", ModelConfig(self.model))

    @property
    def draft_model(self) -> str | None:
        return self.drafter.draft_model

    @property
    def resolved_dtype(self) -> str:
        """The dtype every model of the run loads in: given, else the weight format's, else the model's own."""
        model = self.model
        return model.dtype or FLOAT_DTYPES.get(model.weights) or model_dtype(model.name, model.device)


def validate(config: BenchConfig) -> tuple[list, list[str]]:
    """Everything checkable without a model; raises ConfigError (CLI exit 2) before any run starts."""
    if config.categories is not None and not config.categories:
        raise ConfigError("--category names no category")
    questions = select(load_prompts(config.prompts, config.categories), config.limit)
    names = methods_mod.choose(config.methods, has_draft=config.draft_model is not None)
    GenerationConfig(max_new_tokens=config.max_new_tokens)
    SamplingConfig(temperature=config.temperature)
    methods_mod.parse_heads(list(config.heads))
    if config.k <= 0 or (config.hf_draft_tokens is not None and config.hf_draft_tokens <= 0):
        raise ConfigError("--k and --hf-draft-tokens must be positive integers")
    if config.confidence is not None and not 0 < config.confidence < 1:
        raise ConfigError(f"--confidence must be in (0, 1), got {config.confidence}")
    if config.hf_assistant_schedule not in (None, *methods_mod.SCHEDULES):
        raise ConfigError(f"--hf-assistant-schedule must be one of {', '.join(methods_mod.SCHEDULES)}, "
                          f"got {config.hf_assistant_schedule!r}")
    if config.model.on_cuda and not torch.cuda.is_available():
        raise ConfigError("--device cuda requested but no CUDA device is available")
    if config.threads is not None and config.threads <= 0:
        raise ConfigError(f"--threads must be a positive integer, got {config.threads}")
    _check_flags_used(config, names)
    head = head_drafter(config.draft_model) if config.draft_model else None
    if head is not None:  # load_bench_model would load it as a model (transformers' error about its tokenizer)
        raise ConfigError(f"--draft-model {config.draft_model!r} is {HEADS[head]}, not a draft model: use --head "
                          f"{head}={shlex.quote(config.draft_model)}")
    output_dir(config.out, "--out")  # last: nothing is created when another check fails
    return questions, names


def _check_flags_used(config: BenchConfig, names: list[str]) -> None:
    """Refuse a method-specific flag when no chosen method reads it (it would be silently ignored)."""
    ours, same, assisted = methods_mod.OURS_PREFIX, methods_mod.SAME_DRAFT, set(methods_mod.ASSISTED_PEERS)
    used = {
        "--exit-layer": (config.drafter.exit_layer is not None, {ours + "layer-skip", "hf-early-exit"}),
        "--hf-draft-tokens": (config.hf_draft_tokens is not None, {"hf-prompt-lookup", *assisted}),
        "--hf-assistant-schedule": (config.hf_assistant_schedule is not None, assisted),
        "--draft-weights": (config.drafter.draft_weights != "auto", {ours + "draft-model", ours + "hybrid", same}),
        "--draft-model": (config.draft_model is not None, {*methods_mod.DRAFT_PEERS, ours + "draft-model",
                                                           ours + "hybrid"}),
        "--suffix-store": (config.drafter.suffix_store is not None, {ours + "suffix", ours + "hybrid"}),
        "--draft-vocab": (config.drafter.draft_vocab is not None, {ours + "draft-model", ours + "hybrid"}),
        "--confidence": (config.confidence is not None, {ours + d for d in OPTION_READERS["confidence"]}),
        # our drafting methods' K, and the assisted peers' draft length where --hf-draft-tokens does not set it
        "--k": (config.k != BenchConfig.k, {ours + d for d in OPTION_READERS["k"]}
                | (assisted if config.hf_draft_tokens is None else set())),
    }
    used.update({f"--head {drafter}=": (True, {ours + drafter})
                 for drafter, _ in methods_mod.parse_heads(list(config.heads))})
    for flag, (given, readers) in used.items():
        if given and not readers & set(names):
            raise ConfigError(f"{flag} has no effect on the chosen methods; it is read by {', '.join(sorted(readers))}")


def load_bench_model(config: BenchConfig) -> BenchModel:
    loaded = load_model(replace(config.model, dtype=config.resolved_dtype))
    draft = None
    if config.draft_model:  # as loaded: its weights for our drafter are draft_weights, applied by the method
        draft = load_model(ModelConfig(config.draft_model, device=config.model.device, dtype=config.resolved_dtype,
                                       weights="same")).model
    return BenchModel(loaded.model, loaded.tokenizer, loaded.name, draft, config.draft_model)


def benchmark(config: BenchConfig, bench_model: BenchModel | None = None, command: str | None = None) -> list[Path]:
    """Run the benchmark; returns the written paths. bench_model: a preloaded model (tests), else loaded;
    command: the command line, recorded in the outputs."""
    questions, names = validate(config)
    began = time.perf_counter()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    bench_model = bench_model or load_bench_model(config)
    heads = methods_mod.parse_heads(list(config.heads))
    options = PeerOptions(config.k, config.hf_draft_tokens, heads, config.model.fast_path.enabled,
                          config.hf_assistant_schedule or "heuristic", config.confidence or 0.0, config.drafter)
    skipped: dict[str, str] = {}
    methods = methods_mod.build_methods(bench_model, names, options, methods_mod.explicit(config.methods), skipped)
    for _name, reason in skipped.items():
        print(f"specdecode bench: skipping {reason}", file=sys.stderr)
    settings = BenchSettings(config.max_new_tokens, config.temperature, config.seed, config.warmup, config.progress)
    records = run_bench(methods, questions, bench_model.tokenizer, bench_model.model, settings)
    cats = categories(questions)
    rows = summarise(records, [m.name for m in methods], cats, greedy=config.temperature == 0)
    param = next(bench_model.model.parameters())
    meta = {
        "model": bench_model.name,
        "draft_model": config.draft_model,
        "device": str(param.device),
        "dtype": str(param.dtype).removeprefix("torch."),
        "weights": describe_weights(bench_model.model),
        "baseline": BASELINE,
        "max_new_tokens": config.max_new_tokens,
        "temperature": config.temperature,
        "k": config.k,
        "confidence": config.confidence,
        "seed": config.seed,
        "prompts": len(questions),
        "prompt_source": config.prompts or BUILTIN_NAME,
        "limit": config.limit,
        "categories": cats,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command,
        "machine": machine(),
        "versions": {"torch": torch.__version__, "transformers": _version("transformers"),
                     "python": platform.python_version()},
        "elapsed_s": round(time.perf_counter() - began, 2),
        "near_tie_tolerance": f"{NEAR_TIE_EPS} * eps(dtype the logits are computed in: bf16 with int8 weights)"
                              " * max(1, |top logit|)",
        "skipped": skipped,
        "multi_turn_history": "the baseline's answers, for every method",
        "config": asdict(config),
        "conventions": list(CONVENTIONS),
    }
    methods_info = [{"method": m.name, "kind": m.kind, "params": m.params} for m in methods]
    return write_all(Path(config.out), meta, methods_info, rows, [r.as_dict() for r in records])


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    text = f"{platform.system()} {cpu}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}"
    if torch.cuda.is_available():
        text += f", GPU {torch.cuda.get_device_name(0)}"
    return text


def _version(package: str) -> str | None:
    try:
        return version(package)
    except Exception:  # noqa: BLE001 - metadata is informative only
        return None
