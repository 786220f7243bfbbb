"""Completions' `suffix` (fill in the middle) through the server, on a tiny random Llama whose byte tokenizer has
Qwen's FIM tokens: the middle is plain greedy decoding of the prefix-suffix-middle layout for every served drafter,
ends at the format's own end tokens, may start at an empty prompt, and a model without FIM tokens, or a suffix
with echo, is a 400 naming the field."""
from __future__ import annotations

import httpx
import pytest

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig
from specdecode.core.engine import Engine
from specdecode.core.infill import fim_format, infill_prompt
from specdecode.core.target import Target
from specdecode.drafters import build_drafter
from tests.e2e.server_util import MODEL, SPEC, openai_client, serving, tiny_service
from tests.tiny import byte_tokenizer, tiny_llama

FIM = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|file_sep|>"]
PREFIX, SUFFIX = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"
DRAFTERS = ("none", "prompt-lookup", "layer-skip", "suffix")


@pytest.fixture(scope="module")
def target() -> Target:
    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": FIM})
    return Target(tiny_llama(vocab_size=len(tokenizer)), tokenizer)


@pytest.fixture(scope="module")
def server(target):
    drafters = {name: build_drafter(target, DrafterConfig(name=name), SPEC) for name in DRAFTERS[1:]}
    with serving(tiny_service(target, drafters)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def plain(target: Target, prompt: str, suffix: str, max_tokens: int, bias: dict[int, float] | None = None) -> str:
    """The laid-out prompt decoded alone, greedy, without speculation, ending at the format's end tokens."""
    fmt = fim_format(target.tokenizer)
    ids = infill_prompt(target.tokenizer, fmt, prompt, suffix)
    engine = Engine(target, build_drafter(target, DrafterConfig(name="none"), SPEC), SPEC, max_batch=1)
    sampling = SamplingConfig(logit_bias=tuple((bias or {}).items()))
    return engine.generate(ids, sampling, GenerationConfig(max_tokens, stop_token_ids=tuple(fmt.ends))).text


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_the_middle_is_plain_greedy_decoding_of_the_layout(client, target, drafter):
    expected = plain(target, PREFIX, SUFFIX, 40)
    reply = client.completions.create(model=MODEL, prompt=PREFIX, suffix=SUFFIX, max_tokens=40, temperature=0,
                                      extra_body={"speculation": {"drafter": drafter}})
    assert reply.choices[0].text == expected and reply.usage.completion_tokens == 40
    streamed = client.completions.create(model=MODEL, prompt=[PREFIX, ""], suffix=SUFFIX, max_tokens=40,
                                         temperature=0, stream=True, extra_body={"speculation": {"drafter": drafter}})
    texts = ["", ""]
    for chunk in streamed:
        texts[chunk.choices[0].index] += chunk.choices[0].text
    assert texts == [expected, plain(target, "", SUFFIX, 40)]


def test_the_middle_ends_at_the_formats_end_tokens(client, target):
    """A model that writes <|fim_pad|> or <|file_sep|> (made to here by a bias) has finished the middle."""
    for token in ("<|fim_pad|>", "<|file_sep|>"):
        end = target.tokenizer.convert_tokens_to_ids(token)
        reply = client.completions.create(model=MODEL, prompt=PREFIX, suffix=SUFFIX, max_tokens=8, temperature=0,
                                          logit_bias={str(end): 100})
        assert (reply.choices[0].text, reply.choices[0].finish_reason) == ("", "stop")
        assert reply.usage.completion_tokens == 1
        assert "stop_reason" not in reply.choices[0].model_extra  # the server's own end, not one the request gave
    # without a suffix the same tokens are plain tokens of a plain completion
    end = target.tokenizer.convert_tokens_to_ids("<|fim_pad|>")
    reply = client.completions.create(model=MODEL, prompt=PREFIX, max_tokens=3, temperature=0,
                                      logit_bias={str(end): 100})
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 3
    assert plain(target, PREFIX, SUFFIX, 8, {end: 100}) == ""


def test_echo_with_a_suffix_is_a_400(server):
    reply = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": PREFIX, "suffix": SUFFIX,
                                                             "echo": True, "max_tokens": 4})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "echo"


def test_a_model_without_fim_tokens_refuses_a_suffix(tiny_target):
    """The tiny default tokenizer has no FIM markers: a suffix is a 400 (not a plain completion that ignores it),
    an empty one is no suffix, and /openapi.json says the suffix must be empty."""
    with serving(tiny_service(tiny_target)) as running:
        reply = httpx.post(running.url + "/v1/completions", json={"model": MODEL, "prompt": PREFIX, "suffix": SUFFIX,
                                                                  "max_tokens": 4})
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "suffix"
        assert "fill-in-the-middle" in reply.json()["error"]["message"]
        assert httpx.post(running.url + "/v1/completions", json={
            "model": MODEL, "prompt": PREFIX, "suffix": "", "max_tokens": 2}).status_code == 200
        schemas = httpx.get(running.url + "/openapi.json").json()["components"]["schemas"]
        assert schemas["CompletionRequest"]["properties"]["suffix"] == {"enum": [None, ""]}
