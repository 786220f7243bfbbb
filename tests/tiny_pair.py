"""Two tiny models with *different* tokenizers, built offline, for cross-tokenizer drafting tests:
the target reads characters (a WordLevel vocabulary of the corpus' characters), the draft reads a small
byte-level BPE trained on the same sentences. Both are trained for a few seconds on those sentences so that the
draft's text often matches the target's (acceptance is exercised, not only rejection)."""
from __future__ import annotations

import functools

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from specdecode.core.target import Target
from tests.tiny import tiny_llama

CORPUS = [
    "the cat sat on the mat and the dog sat on the log.",
    "a quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "the sun is hot and the moon is cold.",
    "she sells sea shells on the sea shore.",
    "print(add(2, 3)) prints 5 on the screen.",
]
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character of the corpus; decoding concatenates (no spaces added)."""
    chars = sorted(set("".join(CORPUS)))
    vocab = {token: i for i, token in enumerate(SPECIALS + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")


def bpe_tokenizer(vocab_size: int = 300) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on the corpus (merges like "the", " sat", "on the"): tokens span characters."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS[:3],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(CORPUS * 4, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def _train(model: torch.nn.Module, sequences: list[list[int]], steps: int, seed: int) -> torch.nn.Module:
    """Teacher-forced next-token training on the corpus sentences (padded batch, loss on real tokens only)."""
    torch.manual_seed(seed)
    width = max(len(s) for s in sequences)
    ids = torch.zeros((len(sequences), width), dtype=torch.long)
    labels = torch.full((len(sequences), width), -100, dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq)
        labels[row, : len(seq)] = torch.tensor(seq)
    model.train()
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return model.eval()


@functools.lru_cache(maxsize=1)
def tiny_pair() -> tuple[Target, Target]:
    """(target, draft): trained once per test session (a few seconds, one thread: on a busy 2-core machine
    OpenMP spin-waiting makes tiny ops crawl)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode(False), torch.enable_grad():
            char, bpe = char_tokenizer(), bpe_tokenizer()
            target_model = tiny_llama(vocab_size=len(char), layers=2, hidden=64, seed=3, std=0.02, eos_token_id=2)
            draft_model = tiny_llama(vocab_size=len(bpe), layers=1, hidden=64, seed=4, std=0.02, eos_token_id=2)
            _train(target_model, [[1] + char(s)["input_ids"] for s in CORPUS], steps=120, seed=0)
            _train(draft_model, [[1] + bpe(s)["input_ids"] for s in CORPUS], steps=120, seed=1)
    finally:
        torch.set_num_threads(threads)
    return Target(target_model, char), Target(draft_model, bpe)
