"""Small frozen configs, one per concern, checked when made. The command line maps its flags onto these once
(cli/args.py); the library, the server, the benchmark and training take them and never an argparse Namespace."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specdecode.errors import ConfigError, OptionError

if TYPE_CHECKING:
    import torch


SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts
MAX_GRAMMAR_DRAFT = 48  # forced tokens fit the KV slack a step's block may use (engine.KV_SLACK)
MAX_TOP_LOGPROBS = 20  # as OpenAI's top_logprobs
REPETITION_PENALTY = (0.01, 10.0)  # a logit divided by a far smaller one overflows to inf (5e-324 did)


_NUMBER, _INT, _BOOL, _STRINGS = ((int, float), "a number"), (int, "an integer"), (bool, "True or False"), \
    ((tuple, list), "a tuple of strings")
_PAIRS = ((tuple, list), "a tuple of (token id, bias) pairs")


def _check_types(owner: str, **fields: tuple[object, tuple[type | tuple[type, ...], str]]) -> None:
    """A library caller's wrong type is a ConfigError here, not a TypeError deep in torch (bool is no number)."""
    for name, (value, (kind, what)) in fields.items():
        if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
            raise ConfigError(f"{owner}: {name} must be {what}, got {value!r}")


def check_device(device: str) -> str:
    """cpu, cuda or cuda:N (torch's own error for anything else is a traceback from deep inside a load)."""
    kind, sep, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (sep and (kind != "cuda" or not index.isdigit())):
        raise ConfigError(f"expected cpu, cuda or cuda:N, got {device!r}")
    return device


@dataclass(frozen=True)
class SamplingConfig:
    """How target (p) and draft (q) logits become probabilities. temperature == 0 means greedy.

    The same transform is applied to p and q: lossless rejection sampling needs both to be the
    distributions actually sampled from.
    """

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    seed: int | None = None
    min_p: float = 0.0  # 0 = off; drop tokens below min_p x the top probability (after temperature)
    # context-dependent changes to the logits, greedy decoding included (penalties.py): OpenAI's presence and
    # frequency penalties over the generated tokens, vLLM's / transformers' repetition penalty over prompt and
    # generated tokens, OpenAI's logit_bias ((token id, bias), ...)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        _check_types("sampling", temperature=(self.temperature, _NUMBER), top_k=(self.top_k, _INT),
                     top_p=(self.top_p, _NUMBER), min_p=(self.min_p, _NUMBER),
                     presence_penalty=(self.presence_penalty, _NUMBER),
                     frequency_penalty=(self.frequency_penalty, _NUMBER),
                     repetition_penalty=(self.repetition_penalty, _NUMBER), logit_bias=(self.logit_bias, _PAIRS))
        for pair in self.logit_bias:
            if (not isinstance(pair, (tuple, list)) or len(pair) != 2 or isinstance(pair[0], bool)
                    or not isinstance(pair[0], int) or isinstance(pair[1], bool)
                    or not isinstance(pair[1], (int, float))):
                raise ConfigError(f"sampling: logit_bias must hold (token id, bias) pairs, got {pair!r}")
            if pair[0] < 0 or not -100 <= pair[1] <= 100:
                raise ConfigError(f"logit_bias needs token ids >= 0 and biases in [-100, 100], got {tuple(pair)}")
        if len({token for token, _ in self.logit_bias}) != len(self.logit_bias):
            raise ConfigError("logit_bias names a token twice")
        object.__setattr__(self, "logit_bias", tuple((token, float(bias)) for token, bias in self.logit_bias))
        if not 0 <= self.min_p <= 1:
            raise ConfigError(f"min-p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ConfigError(f"{name.replace('_', ' ')} must be in [-2, 2], got {getattr(self, name)}")
        if not REPETITION_PENALTY[0] <= self.repetition_penalty <= REPETITION_PENALTY[1]:
            raise ConfigError(f"repetition penalty must be in [{REPETITION_PENALTY[0]}, {REPETITION_PENALTY[1]}], "
                              f"got {self.repetition_penalty}")
        if self.seed is not None:
            _check_types("sampling", seed=(self.seed, _INT))
            if not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
                raise ConfigError(f"seed must be in {SEED_RANGE[0]}..{SEED_RANGE[1]}, got {self.seed}")
        if not 0 <= self.temperature < math.inf:
            raise ConfigError(f"temperature must be >= 0 and finite, got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"top-k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def seeded(self) -> bool:
        """A seeded sampled sequence: its random draws depend on its drafts, so nothing timed or shared between
        requests may shape its drafts (a seed must give the same text whatever ran before)."""
        return self.seed is not None and not self.greedy

    @property
    def penalized(self) -> bool:
        """Whether the logits depend on the context beyond the model (penalties or a bias): see penalties.py."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias)

    def unused_when_greedy(self) -> list[str]:
        """Fields set away from their defaults that greedy decoding never reads (a caller's option that would be
        silently ignored); empty when sampling. Penalties and logit_bias change the greedy choice: read."""
        if not self.greedy:
            return []
        return [name for name, unused in (("top_p", self.top_p != 1.0), ("top_k", self.top_k != 0),
                                          ("seed", self.seed is not None), ("min_p", self.min_p != 0)) if unused]


@dataclass(frozen=True)
class SpecConfig:
    """Speculation length policy: fixed K, or adaptive K in [min_k, max_k] driven by recent acceptance.

    confidence: a model drafter stops drafting early when its top probability falls below it (0 = off).
    pause_below / pause_window / pause_steps: when the last pause_window drafting steps accepted fewer than
    pause_below draft tokens per step on average, draft nothing for pause_steps steps (plain decoding), then
    try again; each failed retry doubles the pause (speculation.SpeculationLength). On a CPU every verified
    row costs time, so a drafter that keeps missing makes decoding slower than plain; on a GPU the pause
    costs at most the few tokens it would have accepted. 0 turns it off.
    pause_on_time / pause_time_margin: also pause (same window, same back-off) when the window's drafting steps
    cost more wall time per committed token than plain steps of the same sequence, by more than the margin
    (0.05: 5 %). Accepting tokens is not enough to pay: drafting plus a wider verify pass can cost more per
    committed token than a one-token pass (docs/design-notes.md, "Measured defaults"), and which drafters lose
    depends on the machine, the model and the prompt, so it is measured per sequence rather than configured.
    On by default. Greedy output does not depend on K, so the rule is lossless and changes only speed; a seeded
    sampled sequence ignores it (its random draws depend on K, and a seed must reproduce the same text).
    grammar_draft: for a sequence with a structure (GenerationConfig.structure), the most tokens per step the
    grammar adds to the draft where it admits a single continuation (JSON keys, punctuation, the rest of an enum
    value); they are appended to the drafter's leaves, or are the whole draft. 0 turns grammar drafting off.
    first_step_drafts: a sequence's first step drafts in full too. Off by default: the first step then asks for
    free drafts alone (suffix, prompt lookup, the hybrid's free path) and the first token comes about as soon as in
    plain decoding (a draft model would first read the whole prompt, and a wider pass verify its draft); on, a
    model drafter's first draft rides in the first step, where time to first token does not matter.
    """

    k: int = 5
    adaptive: bool = False
    min_k: int = 1
    max_k: int = 12
    confidence: float = 0.0
    pause_below: float = 0.3
    pause_window: int = 8
    pause_steps: int = 16
    pause_on_time: bool = True
    pause_time_margin: float = 0.05
    grammar_draft: int = 16
    first_step_drafts: bool = False

    def __post_init__(self) -> None:
        _check_types("spec", k=(self.k, _INT), min_k=(self.min_k, _INT), max_k=(self.max_k, _INT),
                     confidence=(self.confidence, _NUMBER))
        if self.k <= 0:
            raise ConfigError(f"k must be a positive integer, got {self.k}")
        if not 1 <= self.min_k <= self.max_k:
            raise ConfigError(f"need 1 <= min_k <= max_k, got {self.min_k}, {self.max_k}")
        if not 0 <= self.confidence < 1:
            raise ConfigError(f"confidence threshold must be in [0, 1), got {self.confidence}")
        if self.pause_below < 0 or self.pause_window < 1 or self.pause_steps < 1:
            raise ConfigError("pause_below must be >= 0 and pause_window, pause_steps >= 1, got "
                              f"{self.pause_below}, {self.pause_window}, {self.pause_steps}")
        if not isinstance(self.pause_on_time, bool):
            raise ConfigError(f"pause_on_time must be True or False, got {self.pause_on_time!r}")
        if not 0 <= self.pause_time_margin < 1:
            raise ConfigError(f"pause_time_margin must be in [0, 1), got {self.pause_time_margin}")
        _check_types("spec", grammar_draft=(self.grammar_draft, _INT),
                     first_step_drafts=(self.first_step_drafts, _BOOL))
        if not 0 <= self.grammar_draft <= MAX_GRAMMAR_DRAFT:
            raise ConfigError(f"grammar_draft must be in 0..{MAX_GRAMMAR_DRAFT}, got {self.grammar_draft}")


@dataclass(frozen=True)
class GenerationConfig:
    """When to stop. stop_strings are matched on decoded text (server `stop`)."""

    max_new_tokens: int = 128
    stop_on_eos: bool = True
    stop_strings: tuple[str, ...] = field(default_factory=tuple)
    # strings that end the output and stay in it (the end of a tool call, where a reply may make only one)
    stop_after: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = ()  # tokens that end the output like EOS (kept), stop_on_eos or not
    # tokens generated before the output may end (vLLM's min_tokens): until then EOS and stop_token_ids are masked
    # (penalties.hold_ends) and stop strings are not looked for (StopText)
    min_new_tokens: int = 0
    detokenize: bool = True  # text in each step's outcome; off: token ids only (the benchmark times decoding alone)
    structure: Structure | None = None  # what the output must match (structured outputs); None: free text
    logprobs: int | None = None  # per committed token, its logprob and the top-N (0: the token's alone); None: off
    # per prompt token after the first, its logprob and the top-N from the prefill's logits (completions' echo with
    # logprobs); the prompt is then prefilled in full, never taken from another row's KV
    prompt_logprobs: int | None = None
    # a prompt reuses the KV of finished sequences with the same salt only (vLLM's cache_salt): who shares a
    # salt can tell from its speed what the others' prompts began with; None is a salt too
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        if self.cache_salt is not None and not (isinstance(self.cache_salt, str) and self.cache_salt):
            raise ConfigError(f"cache_salt must be a non-empty string or None, got {self.cache_salt!r:.80}")
        _check_types("generation", max_new_tokens=(self.max_new_tokens, _INT), stop_on_eos=(self.stop_on_eos, _BOOL),
                     stop_strings=(self.stop_strings, _STRINGS), stop_after=(self.stop_after, _STRINGS),
                     detokenize=(self.detokenize, _BOOL))
        if (self.stop_strings or self.stop_after) and not self.detokenize:
            raise ConfigError("stop strings are matched on text: they need detokenize=True")
        if self.max_new_tokens <= 0:
            raise ConfigError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens}")
        _check_types("generation", min_new_tokens=(self.min_new_tokens, _INT))
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ConfigError(f"min_new_tokens must be in 0..max_new_tokens ({self.max_new_tokens}), got "
                              f"{self.min_new_tokens}")
        if self.min_new_tokens and self.structure is not None:  # a grammar may allow only the end: nothing left
            raise ConfigError("min_new_tokens cannot be combined with a structure")
        if not isinstance(self.stop_token_ids, tuple) or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids):
            raise ConfigError(f"stop_token_ids must be a tuple of token ids, got {self.stop_token_ids!r:.80}")
        for name in ("stop_strings", "stop_after"):
            if not all(isinstance(s, str) and s for s in getattr(self, name)):  # "" would be dropped, not matched
                raise ConfigError(f"{name} must be non-empty strings, got {getattr(self, name)!r}")
        if self.structure is not None and not isinstance(self.structure, Structure):
            raise ConfigError(f"structure must be a Structure or None, got {self.structure!r:.80}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                _check_types("generation", **{name: (value, _INT)})
                if not 0 <= value <= MAX_TOP_LOGPROBS:
                    raise ConfigError(f"{name} must be in 0..{MAX_TOP_LOGPROBS} or None, got {value}")


STRUCTURE_KINDS = ("json_object", "json_schema", "regex", "choice", "grammar")


@dataclass(frozen=True)
class Structure:
    """What a sequence's output must match, as data (compiled by structured.py). text: the JSON schema (JSON
    text) for json_schema, the pattern for regex, the choices as a JSON list for choice, a Lark or GBNF grammar
    for grammar; unused for json_object (any JSON object). Build with the named constructors."""

    kind: str
    text: str = ""

    def __post_init__(self) -> None:
        if self.kind not in STRUCTURE_KINDS:
            raise ConfigError(f"structure kind must be one of {', '.join(STRUCTURE_KINDS)}, got {self.kind!r}")
        if not isinstance(self.text, str):
            raise ConfigError(f"structure text must be a string, got {type(self.text).__name__}")
        if self.kind != "json_object" and not self.text.strip():
            raise ConfigError(f"a {self.kind} structure needs its text (schema, pattern, choices or grammar)")

    @staticmethod
    def json_object() -> Structure:
        return Structure("json_object")

    @staticmethod
    def json_schema(schema: dict | str) -> Structure:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as error:
                raise ConfigError(f"the JSON schema is not valid JSON: {error}") from None
        if not isinstance(schema, (dict, bool)):
            raise ConfigError(f"a JSON schema must be an object, got {type(schema).__name__}")
        return Structure("json_schema", json.dumps(schema))

    @staticmethod
    def regex(pattern: str) -> Structure:
        return Structure("regex", pattern)

    @staticmethod
    def choice(options: list[str] | tuple[str, ...]) -> Structure:
        if not isinstance(options, (list, tuple)) or not options or not all(isinstance(o, str) and o for o in options):
            raise ConfigError(f"choice needs a non-empty list of non-empty strings, got {options!r:.80}")
        return Structure("choice", json.dumps(list(options)))

    @staticmethod
    def grammar(text: str) -> Structure:
        return Structure("grammar", text)

    @staticmethod
    def from_response_format(value: Structure | dict) -> Structure | None:
        """A Structure as it is, or OpenAI's response_format: {"type": "text"} (None), {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}."""
        if isinstance(value, Structure):
            return value
        kind = value.get("type") if isinstance(value, dict) else None
        if kind == "text":
            return None
        if kind == "json_object":
            return Structure.json_object()
        if kind == "json_schema":
            inner = value.get("json_schema")
            if not isinstance(inner, dict) or "schema" not in inner:
                raise ConfigError('response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}')
            return Structure.json_schema(inner["schema"])
        raise ConfigError("response_format must be a Structure or a dict with type text, json_object or "
                          f"json_schema, got {value!r:.80}")


@dataclass(frozen=True)
class FastPathConfig:
    """enabled: static cache + padded steps; compile: torch.compile them (backend/mode below);
    capacity: static cache slots per row at first (a request that needs more doubles it, at the price of a
    recompilation); None = 2048 on CUDA, where reading unused slots is nearly free, 512 on CPU, where every
    pass reads the whole static cache (measured: docs/design-notes.md, "Measured defaults");
    grouped_attention: attention reads each cached key/value head once (backends/attention.py) instead of
    transformers' copy of the whole static cache per layer;
    capture: on CUDA, record each compiled step shape in our own CUDA graph (backends/cuda/graphs.py) instead of
    torch.compile's "reduce-overhead" graph trees, whose per-call Python checks made decoding host-bound;
    attention_kernels: SDPA kernels the compiled steps may use on CUDA, in order of preference ("flash",
    "efficient", "cudnn", "math"); empty = torch's own choice (cuDNN on an H100). There (bf16, one query over a
    1024-slot cache) the memory-efficient kernel took about three times cuDNN's time a call, a large share of a
    135M-model step, while cuDNN and math gave the same step time (docs/gpu.md, "What limits it");
    dynamic: torch.compile's `dynamic` — False compiles every bucket separately (~40 s each for the 135M model
    on an H100); None lets it make the block length symbolic once a second bucket appears."""

    enabled: bool = False
    compile: bool = True
    backend: str = "inductor"
    mode: str | None = None  # None: "default" (+ our graphs on CUDA); "reduce-overhead" when capture is off
    buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    capacity: int | None = None
    grouped_attention: bool = True
    capture: bool = True
    attention_kernels: tuple[str, ...] = ()
    dynamic: bool | None = None

    def mode_for(self, device: torch.device) -> str:
        if self.mode:
            return self.mode
        return "reduce-overhead" if device.type == "cuda" and not self.capture else "default"

    def capacity_for(self, device: torch.device) -> int:
        return self.capacity or (2048 if device.type == "cuda" else 512)

    def captures(self, device: torch.device) -> bool:
        """Whether compiled steps are recorded in our own CUDA graphs on this device."""
        return self.enabled and self.compile and self.capture and device.type == "cuda" \
            and self.backend != "cudagraphs" and self.mode_for(device) != "reduce-overhead"


# the linear layers' formats a model may decode with (loading/formats.py applies them)
WEIGHTS = ("auto", "same", "fp32", "bf16", "int8", "int4", "int4-all", "gguf")
DRAFT_WEIGHTS = ("auto", "same", "int8", "int4", "int4-all")  # a draft model's (same: the target's dtype)
DTYPES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")


@dataclass(frozen=True)
class ModelConfig:
    """Which model to decode and how it runs.

    name: a packaged model's name, a Hugging Face directory, a .gguf file or a hub id (None: the default model);
    device: cpu, cuda or cuda:N; dtype: None for the model's own on the device; weights: the linear layers'
    format (WEIGHTS; loading/formats.py); kv_half: fp16 keys and values (the native decoder on the CPU); fast:
    the fast path (None: on for CUDA, off on the CPU)."""

    name: str | None = None
    device: str = "cpu"
    dtype: str | None = None
    weights: str = "auto"
    kv_half: bool = False
    fast: FastPathConfig | None = None

    def __post_init__(self) -> None:
        if self.name is not None and not isinstance(self.name, str):
            if not hasattr(self.name, "__fspath__"):
                raise ConfigError(f"model must be a path, hub id or None, got {self.name!r}")
            object.__setattr__(self, "name", str(self.name.__fspath__()))  # a pathlib.Path works too
        if self.name is not None and not self.name.strip():  # loading reads a falsy name as the default model
            raise OptionError(f"{{model}} is empty (got {self.name!r}); leave it out for the default model", "model")
        if not isinstance(self.device, str):
            raise ConfigError(f"device must be a string (cpu, cuda or cuda:N), got {self.device!r}")
        check_device(self.device)
        if self.dtype is not None and self.dtype not in DTYPES:
            raise OptionError(f"{{dtype}} must be one of {', '.join(DTYPES)} or None, got {self.dtype!r}", "dtype")
        if self.weights not in WEIGHTS:
            raise OptionError(f"{{weights}} must be one of {', '.join(WEIGHTS)}, got {self.weights!r}", "weights")
        _check_types("model", kv_half=(self.kv_half, _BOOL))
        if self.fast is not None and not isinstance(self.fast, FastPathConfig):
            raise ConfigError(f"fast must be a FastPathConfig or None, got {self.fast!r}")

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def fast_path(self) -> FastPathConfig:
        """The fast path as configured, else on for CUDA and off on the CPU."""
        return self.fast if self.fast is not None else FastPathConfig(enabled=self.on_cuda)


@dataclass(frozen=True)
class DrafterConfig:
    """Drafter choice and its knobs; each drafter reads the fields it needs."""

    name: str = "prompt-lookup"
    draft_model: str | None = None  # path or hub id, for draft-model
    exit_layer: int | None = None  # layer-skip: draft with the first L layers (default: a third of them)
    max_ngram: int = 3  # prompt-lookup: longest n-gram matched
    min_ngram: int = 1
    lookahead: tuple[int, int, int] | None = None  # lookahead: (window W, n-gram size N, candidates G)
    # prompt-lookup, lookahead: cost of one more verify row in one-token passes; None = by device (row_budget)
    row_cost: float | None = None
    draft_weights: str = "auto"  # draft-model: one of DRAFT_WEIGHTS ("auto": int4-all on the CPU; loading/formats.py)
    # draft-model: score only its head's first N ids + those seen (drafters/common/shortlist.py)
    draft_vocab: int | None = None
    suffix_store: int | None = None  # suffix: the store's cap in tokens (None: SuffixConfig's default)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ConfigError(f"drafter must be a name (str), got {self.name!r}")
        if self.draft_model is not None and not isinstance(self.draft_model, str):
            if not hasattr(self.draft_model, "__fspath__"):
                raise ConfigError(f"draft_model must be a path, hub id or None, got {self.draft_model!r}")
            object.__setattr__(self, "draft_model", str(self.draft_model.__fspath__()))
        if self.exit_layer is not None:
            _check_types("drafter", exit_layer=(self.exit_layer, _INT))
        if self.lookahead is not None and (not isinstance(self.lookahead, (tuple, list)) or len(self.lookahead) != 3
                                           or not all(isinstance(x, int) and not isinstance(x, bool)
                                                      for x in self.lookahead)):
            raise ConfigError(f"lookahead must be three integers (window, ngram, candidates), got {self.lookahead!r}")
        if self.lookahead is not None:
            object.__setattr__(self, "lookahead", tuple(self.lookahead))
        if self.draft_weights not in DRAFT_WEIGHTS:
            raise OptionError(f"{{draft_weights}} must be one of {', '.join(DRAFT_WEIGHTS)}, got "
                              f"{self.draft_weights!r}", "draft_weights")
        if self.suffix_store is not None and (isinstance(self.suffix_store, bool)
                                              or not isinstance(self.suffix_store, int) or self.suffix_store < 1):
            raise OptionError(f"{{suffix_store}} must be a positive number of tokens or None, "
                              f"got {self.suffix_store!r}", "suffix_store")
        if self.draft_vocab is not None and (isinstance(self.draft_vocab, bool) or not isinstance(self.draft_vocab, int)
                                             or self.draft_vocab < 0):
            raise OptionError(f"{{draft_vocab}} must be 0 (the whole vocabulary), a number of tokens or None, "
                              f"got {self.draft_vocab!r}", "draft_vocab")

    def given(self, spec: SpecConfig | None = None) -> dict[str, bool]:
        """Which drafter options are set away from their defaults (each is read by some drafters only:
        drafters.OPTION_READERS); spec: the speculation config, whose `confidence` is such an option too."""
        return {"exit_layer": self.exit_layer is not None, "lookahead": self.lookahead is not None,
                "draft_model": self.draft_model is not None, "draft_weights": self.draft_weights != "auto",
                "draft_vocab": self.draft_vocab is not None, "suffix_store": self.suffix_store is not None,
                "confidence": spec is not None and spec.confidence != 0}
