"""Not a test (run by hand): cross-tokenizer drafting on Gemma 3 270M (target) + SmolLM2-135M-Instruct (draft)
against transformers' own cross-tokenizer assisted generation (with the draft as loaded, fp32, and with the
same int8 copy of it that our int8 setting drafts with) and plain decoding (transformers' and ours, whose
Targets use the CPU kernel of specdecode/backends/cpu/skinny.py where it is faster), same prompts, one run.

    .venv/bin/python scripts/bench_cross_tokenizer.py [max_new_tokens] [threads] \
        [K:CONFIDENCE[:TIME[:INT8[:ADAPTIVE]]]] ...

Prints one JSON line per prompt and method (tokens/s, tau where known, identical output to transformers'
plain greedy `generate`). Default drafter settings: 5:0 (K=5, no confidence stop). TIME 0 turns the
time-based pause off (SpecConfig.pause_on_time; default 1, on), to compare both in one run; INT8 1 drafts with
int8 weights (backends/cpu/int8.py; default 0); ADAPTIVE 1 lets K follow acceptance from K (SpecConfig.adaptive)."""
from __future__ import annotations

import copy
import json
import sys
import time

import torch

from specdecode.backends.cpu.int8 import quantize_linears
from specdecode.config import DrafterConfig, GenerationConfig, ModelConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.core.target import Target
from specdecode.drafters import get_spec
from specdecode.drafters.cross_tokenizer import CrossTokenizerDrafter
from specdecode.loading.load import load_model

PROMPTS = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The history of the printing press begins",
    "import numpy as np\n\n\ndef normalise(rows):\n    \"\"\"Scale every row of a 2D array to unit length.\"\"\"\n",
]


def timed(fn, *args, **kwargs):
    began = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - began


def continuation(model, ids, **kwargs) -> list[int]:
    """The tokens transformers' `generate` adds after the prompt `ids`."""
    return model.generate(ids, **kwargs)[0, ids.shape[1]:].tolist()


def main() -> None:
    max_new = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
    defaults = (5.0, 0.0, 1.0, 0.0, 0.0)  # K, CONFIDENCE, TIME, INT8, ADAPTIVE
    settings = [tuple(values + list(defaults[len(values):])) for values in
                ([float(x) for x in arg.split(":")] for arg in sys.argv[3:])] or [defaults]
    gemma = load_model(ModelConfig("gemma-3-270m", weights="same"))
    smol = load_model(ModelConfig(weights="same"))
    target, draft = Target(gemma.model, gemma.tokenizer), Target(smol.model, smol.tokenizer)
    int8_model = copy.deepcopy(smol.model)
    quantize_linears(int8_model)
    drafts = {0.0: draft, 1.0: Target(int8_model, smol.tokenizer)}
    generation = GenerationConfig(max_new_tokens=max_new)
    for index, text in enumerate(PROMPTS):
        ids = gemma.tokenizer(text, return_tensors="pt")["input_ids"]
        common = dict(max_new_tokens=max_new, do_sample=False)
        plain, plain_s = timed(continuation, gemma.model, ids, **common)
        hf, hf_s = timed(continuation, gemma.model, ids, assistant_model=smol.model, tokenizer=gemma.tokenizer,
                         assistant_tokenizer=smol.tokenizer, **common)
        hf8, hf8_s = timed(continuation, gemma.model, ids, assistant_model=int8_model, tokenizer=gemma.tokenizer,
                           assistant_tokenizer=smol.tokenizer, **common)
        rows = [("hf-generate", plain, plain_s, None), ("hf-assisted-cross-tokenizer", hf, hf_s, None),
                ("hf-assisted-cross-tokenizer int8-assistant", hf8, hf8_s, None)]
        ours_plain = Engine(target, get_spec("none").build(target, DrafterConfig("none"), SpecConfig()), SpecConfig())
        result = ours_plain.generate(ids[0].tolist(), generation=generation)
        rows.append(("specdecode-none", result.token_ids, result.metrics.total_s, result.metrics))
        for k, confidence, on_time, int8, adaptive in settings:
            spec = SpecConfig(k=int(k), confidence=confidence, pause_on_time=bool(on_time), adaptive=bool(adaptive))
            engine = Engine(target, CrossTokenizerDrafter(drafts[int8], target, confidence), spec)
            result = engine.generate(ids[0].tolist(), generation=generation)
            rows.append((f"specdecode-cross-tokenizer k={int(k)} conf={confidence} time-pause={bool(on_time)}"
                         f" int8={bool(int8)} adaptive={bool(adaptive)}",
                         result.token_ids, result.metrics.total_s, result.metrics))
        for name, out, seconds, metrics in rows:
            line = {"prompt": index, "method": name, "tokens": len(out), "tokens_per_s": round(len(out) / seconds, 2),
                    "same_as_plain": out == plain}
            if metrics is not None:
                line.update(tau=round(metrics.tau, 2), acceptance=round(metrics.acceptance_rate, 2),
                            draft_s=round(metrics.draft_s, 2), verify_s=round(metrics.verify_s, 2),
                            passes=metrics.target_passes)
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
