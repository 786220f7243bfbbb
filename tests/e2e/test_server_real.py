"""The server on the default model (SmolLM2-135M-Instruct): two concurrent chat requests through the `openai`
client, streaming and not, each equal to its single-request greedy output."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, Structure
from specdecode.core.engine import Engine
from specdecode.drafters import build_drafter
from specdecode.server.scheduling.policy import SpecPolicy, builtin_table
from specdecode.server.service import ServerConfig, assemble
from tests.e2e.server_util import SPEC, chat_ids, reference, serving

QUESTIONS = ["List the days of the week, separated by commas.",
             "Repeat after me: the cat sat on the mat, the cat sat on the mat."]
MAX_TOKENS = 24


@pytest.mark.slow
def test_default_model_concurrent_chat(default_target):
    expected = [reference(default_target, chat_ids(default_target.tokenizer, q), MAX_TOKENS).text for q in QUESTIONS]
    drafters = {"prompt-lookup": build_drafter(default_target, DrafterConfig(name="prompt-lookup"), SPEC)}
    service = assemble(default_target, drafters, "prompt-lookup", ServerConfig("smollm2", max_batch=4), SPEC,
                            SpecPolicy(builtin_table(default_target.packed_decoder), max_k=SPEC.k))
    with serving(service) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)

        def ask(i: int) -> tuple[str, float]:
            messages = [{"role": "user", "content": QUESTIONS[i]}]
            if i == 0:
                chunks = list(client.chat.completions.create(model="smollm2", messages=messages, max_tokens=MAX_TOKENS,
                                                             temperature=0, stream=True,
                                                             stream_options={"include_usage": True}))
                return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks[-1].usage.tau
            reply = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=MAX_TOKENS,
                                                   temperature=0)
            return reply.choices[0].message.content, reply.usage.tau

        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(ask, range(2)))
    assert [text for text, _ in answers] == expected
    assert all(tau >= 1.0 for _, tau in answers)


@pytest.mark.slow
def test_default_model_refuses_text_its_tokenizer_cannot_produce(default_target):
    """SmolLM2's vocabulary holds no token with the bytes 0xF1 or 0xF2: U+40000-U+BFFFF cannot be generated. The
    choice of one is a 400 naming it (it was a 500: the grammar engine forced wrong tokens); an emoji (0xF0) and
    text in the basic plane are generated as plain constrained decoding generates them."""
    drafters = {"prompt-lookup": build_drafter(default_target, DrafterConfig(name="prompt-lookup"), SPEC)}
    service = assemble(default_target, drafters, "prompt-lookup", ServerConfig("smollm2"), SPEC)
    with serving(service) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model="smollm2", prompt="Hi", max_tokens=8, temperature=0,
                                      extra_body={"structured_outputs": {"choice": ["\U0008de9b"]}})
        assert "U+8DE9B" in refused.value.body["message"]
        for choice in (["\U0001f600", "caf\u00e9"], ["\u4e2d\u6587", "e\u0301"]):
            reply = client.completions.create(model="smollm2", prompt="Hi", max_tokens=8, temperature=0,
                                              extra_body={"structured_outputs": {"choice": choice}})
            ids = default_target.tokenizer("Hi")["input_ids"]
            expected = reference_structured(default_target, ids, 8, Structure.choice(choice))
            assert reply.choices[0].text == expected


def reference_structured(target, prompt_ids: list[int], max_new_tokens: int, structure: Structure) -> str:
    """Plain constrained greedy decoding of one request (no speculation)."""
    engine = Engine(target, build_drafter(target, DrafterConfig(name="none"), SPEC), SPEC)
    return engine.generate(prompt_ids, SamplingConfig(), GenerationConfig(max_new_tokens, structure=structure)).text
