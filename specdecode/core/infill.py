"""Fill-in-the-middle prompts: the text between a prefix and a suffix, written by a code model trained for it.

Such models (Qwen2.5-Coder, StarCoder, DeepSeek-Coder, CodeGemma) read the two laid out between marker tokens of
their own, prefix first (PSM: `<|fim_prefix|>` prefix `<|fim_suffix|>` suffix `<|fim_middle|>`), and write the
middle until a token of the format ends it. The format is read from the tokenizer's vocabulary, never guessed: a
model without the markers was not trained to fill a middle, and asking it to is an error, not a plain completion.
"""
from __future__ import annotations

from dataclasses import dataclass

from specdecode.errors import ConfigError

# (markers: prefix, suffix, middle; further tokens of the format that end a middle where the vocabulary has them)
KNOWN_FORMATS: tuple[tuple[tuple[str, str, str], tuple[str, ...]], ...] = (
    # Qwen2.5-Coder and Qwen3-Coder; CodeGemma writes the same markers and ends a file with <|file_separator|>
    (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
     ("<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<|file_separator|>")),
    # StarCoder, StarCoder2, SantaCoder
    (("<fim_prefix>", "<fim_suffix>", "<fim_middle>"), ("<fim_pad>", "<file_sep>", "<filename>", "<reponame>")),
    # DeepSeek-Coder: begin prefix hole suffix end
    (("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"), ()),
)


@dataclass(frozen=True)
class FimFormat:
    """A tokenizer's fill-in-the-middle layout, as token ids."""

    prefix: int
    suffix: int
    middle: int
    ends: frozenset[int]  # tokens after which no middle text follows: the format's pad and file tokens, its markers
    lead: tuple[int, ...] = ()  # what the tokenizer puts before any text it encodes (a BOS), which leads here too

    def layout(self, prefix: list[int], suffix: list[int]) -> list[int]:
        """The prompt whose continuation is the middle, in the prefix-suffix-middle order the formats train on."""
        return [*self.lead, self.prefix, *prefix, self.suffix, *suffix, self.middle]


def fim_format(tokenizer) -> FimFormat | None:
    """The first known format whose three markers are each one token of `tokenizer`, else None."""
    vocab = tokenizer.get_vocab()
    for markers, others in KNOWN_FORMATS:
        if all(marker in vocab for marker in markers):
            prefix, suffix, middle = (int(vocab[marker]) for marker in markers)
            ends = frozenset(int(vocab[token]) for token in (*markers, *others) if token in vocab)
            return FimFormat(prefix, suffix, middle, ends, _lead(tokenizer))
    return None


def infill_prompt(tokenizer, fmt: FimFormat | None, prefix: str | list[int], suffix: str) -> list[int]:
    """The token ids that ask for the middle between `prefix` (text, or token ids taken as given) and `suffix`."""
    if fmt is None:
        raise ConfigError("this model's tokenizer has no fill-in-the-middle tokens, so it cannot fill a middle "
                          "between a prompt and a suffix")
    head = list(prefix) if isinstance(prefix, list) else _plain(tokenizer, prefix)
    return fmt.layout(head, _plain(tokenizer, suffix))


def _plain(tokenizer, text: str) -> list[int]:
    return _ids(tokenizer, text, False) if text else []


def _lead(tokenizer) -> tuple[int, ...]:
    """The special tokens the tokenizer puts before a text: what encoding adds in front of the plain encoding."""
    full, plain = _ids(tokenizer, "x", True), _ids(tokenizer, "x", False)
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return tuple(full[:start])
    return ()


def _ids(tokenizer, text: str, special: bool) -> list[int]:
    return [int(i) for i in tokenizer(text, add_special_tokens=special)["input_ids"]]
