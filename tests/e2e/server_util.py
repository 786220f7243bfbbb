"""Helpers for the server tests: a tiny-model service, a real server running it, single-request reference
outputs, and a staggered continuous-batching driver over the Engine (sequences join and leave between steps, as
in the scheduler)."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import httpx
import openai

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine, Result
from specdecode.core.target import Target
from specdecode.drafters import build_drafter
from specdecode.server.app import create_app
from specdecode.server.background import BackgroundServer
from specdecode.server.connections import ConnectionLimits
from specdecode.server.scheduling.policy import SpecPolicy
from specdecode.server.service import ServerConfig, Service, assemble

MODEL = "tiny"
SPEC = SpecConfig(k=4)

PROMPTS = [
    "Hello there, how are you today?",
    "def f(x): return x*x\ndef g(x): return f(x)+f(x)",
    "a b c a b c a b",
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "Once upon a time",
    "1, 2, 3, 4, 5, 6, 7,",
    "Write a haiku about the sea.",
    "x",
    "List three colours: red, green,",
    "Why is the sky blue? Explain briefly and clearly to a child of five years.",
    "import numpy as np\nimport torch\n",
    "SELECT * FROM users WHERE",
    "the the the the",
    "Translate to French: good morning",
    "Q: What is 2+2? A:",
    "Dear Sir or Madam, I am writing to",
]


# fp32 passes of different widths sum in different orders, and a busy machine changes the widths (the drafters'
# chains end where measured costs say): a token's logprob is equal to ~1e-6 between two requests, its token exact
LOGPROB_TOLERANCE = 1e-4


def assert_same_logprobs(got: list[dict], expected: list[dict]) -> None:
    """Chat-shaped logprob entries ({token, bytes, logprob, top_logprobs}) equal: tokens, bytes and the order of the
    top alternatives exactly, logprobs within LOGPROB_TOLERANCE."""
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert (a["token"], a["bytes"]) == (b["token"], b["bytes"])
        assert abs(a["logprob"] - b["logprob"]) <= LOGPROB_TOLERANCE
        tops = a.get("top_logprobs") or [], b.get("top_logprobs") or []
        assert [(t["token"], t["bytes"]) for t in tops[0]] == [(t["token"], t["bytes"]) for t in tops[1]]
        assert all(abs(x["logprob"] - y["logprob"]) <= LOGPROB_TOLERANCE for x, y in zip(*tops))


def openai_client(server: BackgroundServer, api_key: str = "unused", timeout: float = 120) -> openai.OpenAI:
    """The official client for a test server's /v1 (no retries: a test sees every answer)."""
    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0, timeout=timeout)


def tiny_service(target: Target, drafters: dict | None = None, default: str = "prompt-lookup", max_batch: int = 8,
                 max_queue: int = 64, policy: SpecPolicy | None = None, **options) -> Service:
    """options: further ServerConfig fields (api_key, body_timeout_s, ...)."""
    if drafters is None:
        drafters = {name: build_drafter(target, DrafterConfig(name=name), SPEC)
                    for name in ("prompt-lookup", "layer-skip")}
    config = ServerConfig(MODEL, max_batch, max_queue, 64, **options)
    return assemble(target, drafters, default, config, SPEC, policy)


@contextlib.contextmanager
def serving(service: Service, limits: ConnectionLimits | None = None) -> Iterator[BackgroundServer]:
    """A real uvicorn server for `service` on 127.0.0.1 (its `.url`, `.app`), with `specdecode serve`'s connection
    handling (limits: its defaults), stopped on exit."""
    with BackgroundServer(create_app(service), limits=limits, on_reject=service.metrics.count_rejected) as running:
        yield running


def reference(target: Target, prompt_ids: list[int], max_new_tokens: int, drafter: str = "none",
              sampling: SamplingConfig | None = None, stop: tuple[str, ...] = (), stop_on_eos: bool = True) -> Result:
    """The request decoded alone (batch of one), with the engine's own detokenisation."""
    engine = Engine(target, build_drafter(target, DrafterConfig(name=drafter), SPEC), SPEC, max_batch=1)
    generation = GenerationConfig(max_new_tokens, stop_on_eos, stop)
    return engine.generate(prompt_ids, sampling or SamplingConfig(), generation)


def chat_ids(tokenizer, content: str) -> list[int]:
    encoded = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                            tokenize=True)
    return [int(i) for i in (encoded["input_ids"] if hasattr(encoded, "keys") else encoded)]


def staggered(engine: Engine, prompts: list[list[int]], max_new_tokens: list[int],
              sampling: SamplingConfig | None = None) -> list[list[int]]:
    """Decode all prompts in one batch; sequence i joins at step i % 3 (ragged joins), each leaves when done."""
    waiting = list(enumerate(prompts))
    active, outputs, step = [], {}, 0
    while waiting or active:
        for i, prompt in [w for w in waiting if w[0] % 3 <= step]:
            waiting.remove((i, prompt))
            active.append((i, engine.start(prompt, sampling or SamplingConfig(), GenerationConfig(max_new_tokens[i]))))
        engine.step([seq for _, seq in active])
        for i, seq in [a for a in active if a[1].finished]:
            outputs[i] = seq.output_ids
            engine.release(seq)
            active.remove((i, seq))
        step += 1
    return [outputs[i] for i in range(len(prompts))]


CODE_PROMPT = "def add(a, b):\n    return a + b\n\ndef sub("


def ask_code_twice(service: Service, target: Target, drafter: str) -> tuple[list, str, str]:
    """The same code completion asked twice of a served `drafter` (the second can draft from the first's answer in
    a store) -> (the two replies, /metrics' text, greedy plain decoding's text)."""
    expected = reference(target, target.tokenizer(CODE_PROMPT)["input_ids"], 32)
    with serving(service) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        replies = [client.completions.create(model=MODEL, prompt=CODE_PROMPT, max_tokens=32, temperature=0,
                                             extra_body={"speculation": {"drafter": drafter}}) for _ in range(2)]
        metrics = httpx.get(server.url + "/metrics").text
    return replies, metrics, expected.text


def wait_idle(server, timeout: float = 5.0) -> dict:
    """/health once no request is active or queued (an assertion error after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while (state := httpx.get(server.url + "/health").json())["active"] or state["queued"]:
        assert time.monotonic() < deadline, f"server still busy: {state}"
        time.sleep(0.02)
    return state


class ScriptedTicket:
    """A scheduler ticket that posts the given events, for testing what a writer makes of them."""

    def __init__(self, events):
        self.events = list(events)

    async def next(self):
        return self.events.pop(0)

    def cancel(self) -> None:
        pass
