"""`llamacpp`: llama.cpp as a peer in the benchmark, through `llama-cpp-python` (an optional extra: `pip install
llama-cpp-python==0.3.36`, which builds llama.cpp from source; CI does not). It decodes the model's own GGUF
file with its own kernels, greedy (or sampling at --temperature), on the prompt ids our tokenizer made (the
same vocabulary). Its arithmetic is its own, so its outputs are not compared with the baseline's: the report
shows its speed only. Absent package or a model without a GGUF: the method is skipped with one line.
`bench-quality` reads its teacher-forced logits (`teacher_forced_logits`) for a perplexity row."""
from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from pathlib import Path

import torch

from specdecode.bench.generation import Generation, RunSettings
from specdecode.loading.names import gguf_source

NAME = "llamacpp"
INSTALL = "pip install llama-cpp-python==0.3.36"
CONTEXT = 8192  # tokens of llama.cpp's cache: the longest multi-turn prompt plus its answer


def unavailable(model_name: str | None) -> str | None:
    """Why the peer cannot run for this model (None: it can)."""
    try:
        importlib.import_module("llama_cpp")
    except ImportError:
        return f"{NAME}: not installed ({INSTALL}), skipped"
    try:
        gguf_file(model_name)
    except ValueError as error:
        return f"{NAME}: {error}, skipped"
    return None


def gguf_file(model_name: str | None) -> Path:
    return gguf_source(model_name)


def teacher_forced_logits(model_name: str | None, ids: list[int]) -> torch.Tensor:
    """llama.cpp's logits at every position of `ids` over the model's GGUF [n, vocab]: row i scores token i + 1.
    One `eval` with logits_all (it decodes in n_batch slices, 512, and keeps every slice's rows in `scores`,
    [n_ctx, vocab]); a context of exactly n tokens, so the text is never truncated."""
    from llama_cpp import Llama  # an optional dependency: imported only when the peer runs

    llm = Llama(model_path=str(gguf_file(model_name)), n_ctx=len(ids), n_threads=torch.get_num_threads(),
                logits_all=True, verbose=False)
    try:
        llm.eval(ids)
        return torch.from_numpy(llm.scores[: len(ids)].copy())  # [n, vocab] float32
    finally:
        llm.close()


def runner(model_name: str | None, eos: list[int]) -> Callable:
    """A bench run function (prompt ids, RunSettings) -> Generation over llama.cpp, loaded once."""
    from llama_cpp import Llama  # an optional dependency: imported only when the peer runs

    llm = Llama(model_path=str(gguf_file(model_name)), n_ctx=CONTEXT, n_threads=torch.get_num_threads(),
                verbose=False)
    stops = set(eos) | {llm.token_eos()}

    def run(prompt: list[int], settings: RunSettings) -> Generation:
        sampling = ({"temp": 0.0, "top_k": 1} if settings.greedy else
                    {"temp": settings.temperature, "top_k": 0, "top_p": 1.0, "min_p": 0.0})
        if settings.seed is not None:
            llm.set_seed(settings.seed)
        ids: list[int] = []
        start = time.perf_counter()
        for token in llm.generate(prompt, reset=True, repeat_penalty=1.0, **sampling):
            ids.append(int(token))
            if token in stops or len(ids) >= settings.max_new_tokens:
                break
        return Generation(ids, time.perf_counter() - start, passes=None)

    return run
