"""Fill-in-the-middle prompts (core/infill.py): a format is found only where the tokenizer has all three of its
markers, its ends are those of its tokens the vocabulary has, and the layout is prefix-suffix-middle, led by what
the tokenizer puts before a text."""
from __future__ import annotations

import pytest
from tokenizers import processors

from specdecode.core.infill import FimFormat, fim_format, infill_prompt
from specdecode.errors import ConfigError
from tests.tiny import byte_tokenizer

QWEN = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|file_sep|>"]


def with_tokens(tokens: list[str], bos: bool = False):
    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": tokens})
    if bos:  # a tokenizer that puts <s> before every text it encodes, as Llama's and Gemma's do
        tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tokenizer.bos_token_id)])
    return tokenizer


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_the_format_is_read_from_the_vocabulary():
    tokenizer = with_tokens(QWEN)
    prefix, suffix, middle, pad, sep = tokenizer.convert_tokens_to_ids(QWEN)
    assert fim_format(tokenizer) == FimFormat(prefix, suffix, middle, frozenset({prefix, suffix, middle, pad, sep}))
    starcoder = with_tokens(["<fim_prefix>", "<fim_suffix>", "<fim_middle>"])
    assert fim_format(starcoder).ends == frozenset(starcoder.convert_tokens_to_ids(
        ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"]))


@pytest.mark.parametrize("tokens", [[], QWEN[:2], ["<|fim_prefix|>", "<fim_suffix>", "<|fim_middle|>"]])
def test_a_tokenizer_without_all_three_markers_of_one_format_has_none(tokens):
    tokenizer = with_tokens(tokens)
    assert fim_format(tokenizer) is None
    with pytest.raises(ConfigError, match="no fill-in-the-middle tokens"):
        infill_prompt(tokenizer, None, "def f(", "\n")


@pytest.mark.parametrize("bos", [False, True])
def test_the_layout_is_prefix_suffix_middle_led_by_the_tokenizers_own_lead(bos):
    tokenizer = with_tokens(QWEN, bos)
    fmt = fim_format(tokenizer)
    lead = [tokenizer.bos_token_id] if bos else []
    assert fmt.lead == tuple(lead)
    laid = infill_prompt(tokenizer, fmt, "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n")
    assert laid == [*lead, fmt.prefix, *ids(tokenizer, "def add(a, b):\n    "), fmt.suffix,
                    *ids(tokenizer, "\n\nprint(add(1, 2))\n"), fmt.middle]
    assert infill_prompt(tokenizer, fmt, "", "x") == [*lead, fmt.prefix, fmt.suffix, *ids(tokenizer, "x"), fmt.middle]
    assert infill_prompt(tokenizer, fmt, [5, 6], "") == [*lead, fmt.prefix, 5, 6, fmt.suffix, fmt.middle]
