"""Run every method on every prompt in one process, interleaved, then check greedy outputs against the baseline.

Order: after a warm-up call per method, each prompt (one turn of one question) is decoded by every method in
a rotating order (prompt u starts at method u mod M), so machine noise and cache effects hit all methods alike.
Each method is one object for the whole run, questions in file order: a drafter that remembers earlier requests
(`suffix`) drafts from the answers it gave to the questions before, as a server would.

Multi-turn questions: a later turn is asked after the BASELINE's answers to the earlier turns, for every
method. Every method then decodes exactly the same prompt ids at every turn (so speed and losslessness are
compared like with like); a lossless method would have produced the same history anyway, and one that is not
is flagged on the turn where it first differs instead of drifting onto different prompts afterwards.

Lossless analysis (greedy runs only): a method's output must equal the baseline's token for token. Where they
first differ, one plain forward of the prompt + the baseline's tokens before that position gives the target's
logits there; if the two competing tokens' logits are within rounding of each other and of the top logit,
the mismatch is a near-tie (legitimate in reduced precision: a multi-token pass rounds differently from a
one-token pass), otherwise a bug. In fp32 the tolerance is ~1e-5 and every real mismatch is a bug.

Memory: every run records the process's peak resident set size while that method decoded (`PeakRss`).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from specdecode.backends.cpu.int8 import ACTIVATION_DTYPE, Int8Linear
from specdecode.backends.cpu.linear import PackedLinear
from specdecode.bench.generation import Generation, RunSettings
from specdecode.bench.llamacpp import NAME as LLAMACPP
from specdecode.bench.methods import BASELINE, Method
from specdecode.bench.prompts import Question

PLAIN = "specdecode-none"
PHASES = ("prefill_s", "draft_s", "verify_s")  # Generation.phases, as results.json names them
NEAR_TIE_EPS = 4.0  # tolerance = NEAR_TIE_EPS * machine epsilon of the model dtype * max(1, |top logit|)
WARMUP_TOKENS = 16
RSS_SAMPLE_S = 0.02  # PeakRss's sampling period where the kernel's peak cannot be reset


@dataclass(frozen=True)
class BenchSettings:
    max_new_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    warmup: bool = True
    progress: bool = True


@dataclass(frozen=True)
class Mismatch:
    """Where a method's greedy output first left the baseline's, and why."""

    position: int  # index into the new tokens
    baseline_token: int | None  # None: that output had ended
    method_token: int | None
    logit_gap: float | None  # |logit(baseline token) - logit(method token)| in the plain forward
    top_gap: float | None  # top logit - the lower of the two competing logits
    tolerance: float
    kind: str  # "near-tie" | "bug"


@dataclass
class Record:
    """One method's run on one turn of one question."""

    method: str
    question_id: int | str
    category: str
    turn: int
    prompt_ids: list[int]
    generation: Generation
    identical: bool | None = None  # None: not checked (sampling, or the baseline itself)
    same_as_plain: bool | None = None  # equals our plain decoding's output exactly (None: not compared)
    mismatch: Mismatch | None = None
    peak_rss_mb: float | None = None  # the process's peak resident memory during this run (None: unknown)

    def as_dict(self) -> dict[str, Any]:
        g = self.generation
        out = {"method": self.method, "question_id": self.question_id, "category": self.category,
               "turn": self.turn, "prompt_tokens": len(self.prompt_ids), "new_tokens": len(g.ids),
               "time_s": round(g.seconds, 5), "target_passes": g.passes, "proposed": g.proposed,
               "accepted": g.accepted, "identical": self.identical, "same_as_plain": self.same_as_plain,
               "peak_rss_mb": None if self.peak_rss_mb is None else round(self.peak_rss_mb, 1)}
        if g.phases is not None:
            out.update(zip(PHASES, (round(s, 5) for s in g.phases)))
        if g.first_token_s is not None:
            out["first_token_s"] = round(g.first_token_s, 5)
        if self.mismatch is not None:
            out["mismatch"] = vars(self.mismatch)
        return out


def encode_conversation(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Chat template over the running conversation, ending with the assistant's turn to speak. A tokenizer
    without a chat template gets the turns joined by blank lines (plain text continuation)."""
    if getattr(tokenizer, "chat_template", None):
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
        return [int(i) for i in ids]
    text = "\n\n".join(m["content"] for m in messages) + "\n\n"
    return [int(i) for i in tokenizer(text, add_special_tokens=True)["input_ids"]]


def run_bench(methods: list[Method], questions: list[Question], tokenizer, model: torch.nn.Module,
              settings: BenchSettings) -> list[Record]:
    """Decode every turn of every question with every method; returns the records, lossless-checked."""
    if not methods or methods[0].name != BASELINE:
        raise ValueError(f"the first method must be the baseline {BASELINE!r}")
    torch.manual_seed(settings.seed)
    if settings.warmup:
        _warm_up(methods, tokenizer, questions[0], settings)
    total = sum(len(q.turns) for q in questions) * len(methods)
    records: list[Record] = []
    unit = 0
    with tqdm(total=total, unit="gen", disable=not settings.progress, dynamic_ncols=True) as bar:
        for index, question in enumerate(questions):
            bar.set_description(f"prompt {index + 1}/{len(questions)} {question.category}")
            history: list[dict[str, str]] = []
            for turn, text in enumerate(question.turns):
                history.append({"role": "user", "content": text})
                prompt_ids = encode_conversation(tokenizer, history)
                run = RunSettings(settings.max_new_tokens, settings.temperature, _seed(settings.seed, unit))
                shift = unit % len(methods)
                by_name: dict[str, Record] = {}
                for method in methods[shift:] + methods[:shift]:
                    bar.set_postfix_str(method.name)
                    with PeakRss() as rss:
                        generation = method.run(prompt_ids, run)
                    by_name[method.name] = Record(method.name, question.question_id, question.category, turn,
                                                  prompt_ids, generation, peak_rss_mb=rss.mb)
                    bar.update(1)
                records += [by_name[m.name] for m in methods]
                answer = tokenizer.decode(by_name[BASELINE].generation.ids, skip_special_tokens=True)
                history.append({"role": "assistant", "content": answer})
                unit += 1
    if settings.temperature == 0:
        check_lossless(records, model)
    return records


def _seed(seed: int, unit: int) -> int:
    return seed * 1_000_003 + unit


def _warm_up(methods: list[Method], tokenizer, question: Question, settings: BenchSettings) -> None:
    """One short untimed run per method: lazy allocations, kernel selection and caches happen here. A method that
    learns across runs (the suffix drafter's store, the KV a finished request leaves in its row) then forgets it:
    the warm-up answered the first question."""
    prompt_ids = encode_conversation(tokenizer, [{"role": "user", "content": question.turns[0]}])
    run = RunSettings(min(WARMUP_TOKENS, max(2, settings.max_new_tokens // 4)), settings.temperature, settings.seed)
    for method in methods:
        method.run(prompt_ids, run)
        if method.reset is not None:
            method.reset()


# -- peak resident memory -------------------------------------------------------------------------------------
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def status_kb(field: str) -> int | None:
    """One kB field of /proc/self/status (VmRSS: resident now, VmHWM: its peak); None off Linux."""
    try:
        lines = _STATUS.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


def reset_peak() -> bool:
    """Lower the kernel's high-water mark VmHWM to the current RSS (Linux >= 4.0) -> whether it could."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return status_kb("VmHWM") is not None


class PeakRss:
    """The process's peak resident set size while the block runs, in MiB (`mb`, set on exit; None off Linux).

    Exact where the process may reset its high-water mark (`reset_peak`): VmHWM on exit is then the peak of
    the block, at no cost inside it (the reset and the read fall outside a method's own timing).
    Elsewhere (or exact=False) a thread reads VmRSS every RSS_SAMPLE_S and may miss a shorter spike; the reads
    take a fraction of a percent of a core, too little to slow decoding (docs/benchmarks.md, "Reading the
    report")."""

    def __init__(self, exact: bool = True):
        self.mb: float | None = None
        self._exact = exact
        self._peak_kb = 0
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    def __enter__(self) -> PeakRss:
        self._exact = self._exact and reset_peak()
        if not self._exact and status_kb("VmRSS") is not None:
            self._sampler = threading.Thread(target=self._sample, name="peak-rss", daemon=True)
            self._sampler.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._exact:
            kb = status_kb("VmHWM")
        elif self._sampler is not None:
            self._stop.set()
            self._sampler.join()
            kb = max(self._peak_kb, status_kb("VmRSS") or 0)
        else:
            kb = None
        self.mb = None if kb is None else kb / 1024

    def _sample(self) -> None:
        while True:
            self._peak_kb = max(self._peak_kb, status_kb("VmRSS") or 0)
            if self._stop.wait(RSS_SAMPLE_S):
                return


# -- lossless analysis ----------------------------------------------------------------------------------------
def check_lossless(records: list[Record], model: torch.nn.Module) -> None:
    """Mark every non-baseline record identical or not, and classify each first difference. Where the run has
    our plain decoding, every other specdecode method is also held to it token for token, without tolerance:
    on a packed model transformers' `generate` is the same model only up to rounding, our plain decoding is
    the very arithmetic speculation must reproduce."""
    baseline = {(r.question_id, r.turn): r for r in records if r.method == BASELINE}
    plain = {(r.question_id, r.turn): r for r in records if r.method == PLAIN}
    for record in records:
        if record.method.startswith("specdecode-") and record.method != PLAIN and plain:
            record.same_as_plain = record.generation.ids == plain[(record.question_id, record.turn)].generation.ids
    for record in records:
        if record.method in (BASELINE, LLAMACPP):  # llama.cpp's arithmetic is its own: speed only
            continue
        reference = baseline[(record.question_id, record.turn)]
        record.identical = record.generation.ids == reference.generation.ids
        if not record.identical:
            record.mismatch = classify_mismatch(model, reference, record)


def first_difference(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The precision the model's logits are computed in, for near-tie classification: torch's int8 linears
    take and give bf16 activations (backends/cpu/int8.py); packed layers (backends/cpu/linear.py) round
    activations to int8 per block of 32, which moves logits by about as much as bf16 (a rounding flipped by
    another path's 1e-7 moves its output by 1/254 of the block's largest value). Against our own plain decoding
    the packed model is bit-exact (attention.row_exact_forward); against transformers' `generate` it is not."""
    if any(isinstance(module, (Int8Linear, PackedLinear)) for module in model.modules()):
        return ACTIVATION_DTYPE
    return next(model.parameters()).dtype


def near_tie_tolerance(dtype: torch.dtype, top_logit: float) -> float:
    return NEAR_TIE_EPS * torch.finfo(dtype).eps * max(1.0, abs(top_logit))


@torch.inference_mode()
def classify_mismatch(model: torch.nn.Module, reference: Record, record: Record) -> Mismatch:
    """Plain forward of prompt + baseline tokens before the first difference; compare the competing logits."""
    base, ours = reference.generation.ids, record.generation.ids
    position = first_difference(base, ours)
    base_token = base[position] if position < len(base) else None
    method_token = ours[position] if position < len(ours) else None
    device = next(model.parameters()).device
    dtype = compute_dtype(model)
    ids = torch.tensor([reference.prompt_ids + base[:position]], device=device)  # [1, prompt + position]
    logits = model(input_ids=ids, logits_to_keep=1).logits[0, -1].float()  # [vocab]
    top = float(logits.max())
    tolerance = near_tie_tolerance(dtype, top)
    if base_token is None or method_token is None:  # one output stopped early: not a rounding question
        return Mismatch(position, base_token, method_token, None, None, tolerance, "bug")
    a, b = float(logits[base_token]), float(logits[method_token])
    logit_gap, top_gap = abs(a - b), top - min(a, b)
    kind = "near-tie" if logit_gap <= tolerance and top_gap <= tolerance else "bug"
    return Mismatch(position, base_token, method_token, logit_gap, top_gap, tolerance, kind)

