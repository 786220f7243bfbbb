"""Small frozen configs, one per concern. The CLI maps flags onto these in one place (cli.py, cli_args.py)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Callable


class ConfigError(ValueError):
    """A user-facing configuration error: the CLI prints it as one line and exits 2."""


class OptionError(ConfigError):
    """A wrong or useless option. The message names options as `{name}` fields holding the library's keyword
    and config field names; `spelled` renders them for a caller that names them otherwise (the command line
    spells them as flags, cli_args.flag), so the library never speaks of flags."""

    def __init__(self, template: str, *options: str):
        self.template, self.options = template, options
        super().__init__(self.spelled(lambda name: name))

    def spelled(self, spell: Callable[[str], str]) -> str:
        return self.template.format_map({name: spell(name) for name in self.options})


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
                    or not isinstance(pair[0], int) or isinstance(pair[1], bool) or not isinstance(pair[1], (int, float))):
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
        _check_types("spec", grammar_draft=(self.grammar_draft, _INT))
        if not 0 <= self.grammar_draft <= MAX_GRAMMAR_DRAFT:
            raise ConfigError(f"grammar_draft must be in 0..{MAX_GRAMMAR_DRAFT}, got {self.grammar_draft}")


@dataclass(frozen=True)
class GenerationConfig:
    """When to stop. stop_strings are matched on decoded text (server `stop`)."""

    max_new_tokens: int = 128
    stop_on_eos: bool = True
    stop_strings: tuple[str, ...] = field(default_factory=tuple)
    detokenize: bool = True  # text in each step's outcome; off: token ids only (the benchmark times decoding alone)
    structure: "Structure | None" = None  # what the output must match (structured outputs); None: free text
    logprobs: int | None = None  # per committed token, its logprob and the top-N (0: the token's alone); None: off

    def __post_init__(self) -> None:
        _check_types("generation", max_new_tokens=(self.max_new_tokens, _INT), stop_on_eos=(self.stop_on_eos, _BOOL),
                     stop_strings=(self.stop_strings, _STRINGS), detokenize=(self.detokenize, _BOOL))
        if self.stop_strings and not self.detokenize:
            raise ConfigError("stop_strings are matched on text: they need detokenize=True")
        if self.max_new_tokens <= 0:
            raise ConfigError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens}")
        if not all(isinstance(s, str) and s for s in self.stop_strings):  # "" would be dropped, not matched
            raise ConfigError(f"stop_strings must be non-empty strings, got {self.stop_strings!r}")
        if self.structure is not None and not isinstance(self.structure, Structure):
            raise ConfigError(f"structure must be a Structure or None, got {self.structure!r:.80}")
        if self.logprobs is not None:
            _check_types("generation", logprobs=(self.logprobs, _INT))
            if not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
                raise ConfigError(f"logprobs must be in 0..{MAX_TOP_LOGPROBS} or None, got {self.logprobs}")


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
    def json_object() -> "Structure":
        return Structure("json_object")

    @staticmethod
    def json_schema(schema: dict | str) -> "Structure":
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as error:
                raise ConfigError(f"the JSON schema is not valid JSON: {error}") from None
        if not isinstance(schema, (dict, bool)):
            raise ConfigError(f"a JSON schema must be an object, got {type(schema).__name__}")
        return Structure("json_schema", json.dumps(schema))

    @staticmethod
    def regex(pattern: str) -> "Structure":
        return Structure("regex", pattern)

    @staticmethod
    def choice(options: list[str] | tuple[str, ...]) -> "Structure":
        if not isinstance(options, (list, tuple)) or not options or not all(isinstance(o, str) and o for o in options):
            raise ConfigError(f"choice needs a non-empty list of non-empty strings, got {options!r:.80}")
        return Structure("choice", json.dumps(list(options)))

    @staticmethod
    def grammar(text: str) -> "Structure":
        return Structure("grammar", text)

    @staticmethod
    def from_response_format(value: "Structure | dict") -> "Structure | None":
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
