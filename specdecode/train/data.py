"""Self-distillation data: the target answers a prompt set (batched generation), and plain texts are cut into
windows; both become token sequences whose target hidden states are cached next (features.py).

An Example is prompt + answer token ids exactly as the engine sees them (chat template, then generated ids);
loss_start marks the first answer token: drafting is trained where it is used, on the target's answers.
"""
from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from specdecode.train.corpus import TextSource
from specdecode.train.prompts import Conversation, stage1_prompts, stage2_prompts


@dataclass(frozen=True)
class Example:
    tokens: tuple[int, ...]
    loss_start: int  # index of the first token that is a training target (answer start; 1 for plain text)
    source: int  # index into Dataset.sources


@dataclass
class Dataset:
    examples: list[Example] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    conversations: list[Conversation] = field(default_factory=list)  # generated chats, for inspection
    dropped: Counter = field(default_factory=Counter)  # why prompts and texts added no example: reason -> how many

    def add_source(self, description: str) -> int:
        self.sources.append(description)
        return len(self.sources) - 1

    def why_empty(self) -> str:
        """What became of the sources when no example came of them, for the user: each reason a prompt or text was
        dropped, with its count (it said "every source was empty" where the sources held prompts)."""
        if not self.dropped:
            return "no prompts or texts were given" if not self.sources else "the sources held no prompt or text"
        return "; ".join(f"{count} {reason}" for reason, count in self.dropped.items())

    @property
    def num_tokens(self) -> int:
        return sum(len(e.tokens) for e in self.examples)


def chat_ids(tokenizer, conversation: Conversation) -> list[int]:
    encoded = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    return [int(i) for i in ids]


@torch.no_grad()
def generate_answers(model, tokenizer, prompts: list[list[int]], *, max_new_tokens: int, batch_size: int,
                     temperature: float, eos_ids: set[int], pad_id: int, deadline: float | None = None,
                     desc: str = "generate") -> list[list[int] | None]:
    """Batched generation (transformers' generate, left padding). Returns each prompt's answer ids (cut after
    the first EOS, which is kept), or None for prompts not reached before `deadline` (time.monotonic())."""
    device = next(model.parameters()).device
    answers: list[list[int] | None] = [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths: less padding
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    random.Random(0).shuffle(batches)  # a deadline then cuts a random share, not the longest prompts
    for batch in tqdm(batches, desc=desc, unit="batch"):
        if deadline is not None and time.monotonic() > deadline:
            break
        width = max(len(prompts[i]) for i in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, i in enumerate(batch):
            ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]) :] = 1
        sampling = (dict(do_sample=True, temperature=temperature, top_p=0.95) if temperature > 0
                    else dict(do_sample=False))
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new_tokens,
                             pad_token_id=pad_id, eos_token_id=sorted(eos_ids) or None, **sampling)
        for row, i in enumerate(batch):
            answer = out[row, width:].tolist()
            for position, token in enumerate(answer):
                if token in eos_ids:
                    answer = answer[: position + 1]
                    break
            answers[i] = answer
    return answers


def self_distill(dataset: Dataset, model, tokenizer, conversations: list[Conversation], description: str, *,
                 max_new_tokens: int, batch_size: int, temperature: float, eos_ids: set[int], pad_id: int,
                 deadline: float | None, max_len: int) -> list[Conversation]:
    """Let the target answer `conversations`; add prompt + answer examples. Returns the answered chats."""
    prompts = [chat_ids(tokenizer, c) for c in conversations]
    answers = generate_answers(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                               temperature=temperature, eos_ids=eos_ids, pad_id=pad_id, deadline=deadline,
                               desc=description)
    source = dataset.add_source(f"{description}: target answers ({'greedy' if temperature == 0 else f'T={temperature}'}"
                                f", <= {max_new_tokens} new tokens)")
    answered: list[Conversation] = []
    for conversation, prompt, answer in zip(conversations, prompts, answers):
        if answer is None:
            dataset.dropped["prompts not answered within --gen-minutes"] += 1
            continue
        if not answer:
            dataset.dropped["prompts answered with no token"] += 1
            continue
        tokens = (prompt + answer)[:max_len]
        if len(prompt) + 2 > len(tokens):
            dataset.dropped[f"prompts leaving no room for two answer tokens in --max-len {max_len}"] += 1
            continue
        dataset.examples.append(Example(tuple(tokens), len(prompt), source))
        chat = conversation + [{"role": "assistant",
                                "content": tokenizer.decode(answer, skip_special_tokens=True)}]
        answered.append(chat)
        dataset.conversations.append(chat)
    return answered


def add_texts(dataset: Dataset, tokenizer, source: TextSource, window: int, max_tokens: int) -> int:
    """Concatenate the texts (blank line between) and cut them into windows of `window` tokens."""
    index = dataset.add_source(source.description)
    added, buffer = 0, []
    separator = tokenizer("\n\n", add_special_tokens=False)["input_ids"]
    for text in source.texts:
        buffer.extend(tokenizer(text, add_special_tokens=False)["input_ids"] + separator)
        while len(buffer) >= window and added < max_tokens:
            dataset.examples.append(Example(tuple(buffer[:window]), 1, index))
            buffer, added = buffer[window:], added + window
        if added >= max_tokens:
            break
    if not added and source.texts:
        dataset.dropped[f"text sources shorter than one window of {window} tokens"] += 1
    return added


@dataclass(frozen=True)
class DataConfig:
    """How to build the training data (see the train CLI for each flag)."""

    num_prompts: int = 2000
    num_followups: int = 1000
    max_new_tokens: int = 256
    gen_batch: int = 64
    temperature: float = 0.0
    gen_minutes: float = 0.0  # 0 = no time limit for generation
    max_len: int = 1024
    seed: int = 0
    text_tokens: int = 200_000  # cap on plain-text tokens


def build_dataset(model, tokenizer, config: DataConfig, user_prompts: list[Conversation], texts: list[TextSource],
                  eos_ids: set[int], pad_id: int, gen_model=None) -> Dataset:
    """Stage 1 (built-in + user prompts), stage 2 (prompts built from stage-1 answers), then plain texts.
    gen_model: the model to generate with (e.g. a bf16 copy on a GPU); hidden states come from `model`."""
    dataset = Dataset()
    gen_model = gen_model or model
    deadline = time.monotonic() + 60 * config.gen_minutes if config.gen_minutes > 0 else None
    stage1_deadline = None if deadline is None else time.monotonic() + 0.65 * 60 * config.gen_minutes
    common = dict(max_new_tokens=config.max_new_tokens, batch_size=config.gen_batch, temperature=config.temperature,
                  eos_ids=eos_ids, pad_id=pad_id, max_len=config.max_len)
    answered: list[Conversation] = []
    if config.num_prompts:
        answered += self_distill(dataset, gen_model, tokenizer, stage1_prompts(config.num_prompts, config.seed),
                                 "built-in training prompts (specdecode/train/prompts.py)", deadline=stage1_deadline,
                                 **common)
    if user_prompts:
        answered += self_distill(dataset, gen_model, tokenizer, user_prompts, "user prompt files",
                                 deadline=stage1_deadline, **common)
    if config.num_followups and answered:
        self_distill(dataset, gen_model, tokenizer, stage2_prompts(answered, config.num_followups, config.seed),
                     "follow-up prompts built from stage-1 answers", deadline=deadline, **common)
    for source in texts:
        add_texts(dataset, tokenizer, source, window=min(512, config.max_len), max_tokens=config.text_tokens)
    return dataset
