"""Training data and loss masking as pure functions (no training): answers are the target's own, cut after
their EOS (kept: drafting EOS is learned too); examples train only on answer tokens (loss_start); the loss
positions of each head/step skip the prompt and the padding."""
import torch

from specdecode.train.data import Dataset, generate_answers, self_distill
from specdecode.train.objectives import Batch, target_positions

PROMPTS = [[5, 6, 7], [8, 9]]
EOS, PAD = 2, 0


class _Model(torch.nn.Module):
    """Stands in for the target: `generate` returns the left-padded prompts + fixed answers (EOS mid-answer)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.calls = []

    def generate(self, input_ids, attention_mask, **kwargs):
        self.calls.append((input_ids.tolist(), attention_mask.tolist()))
        answers = {(5, 6, 7): [11, 12, EOS, 13], (8, 9): [14, EOS, 15, 16]}
        rows = [row + answers[tuple(t for t, m in zip(row, mask) if m)]
                for row, mask in zip(input_ids.tolist(), attention_mask.tolist())]
        return torch.tensor(rows)


class _Tokenizer:
    def apply_chat_template(self, conversation, add_generation_prompt, tokenize):
        key = tuple((m["role"], m["content"]) for m in conversation)
        return {(("user", "a"),): [5, 6, 7], (("user", "b"),): [8, 9]}[key]

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def test_answers_are_cut_after_their_eos_which_is_kept():
    model = _Model()
    answers = generate_answers(model, None, PROMPTS, max_new_tokens=4, batch_size=2, temperature=0.0,
                               eos_ids={EOS}, pad_id=PAD)
    assert answers == [[11, 12, EOS], [14, EOS]]
    (ids, mask), = model.calls
    assert ids == [[PAD, 8, 9], [5, 6, 7]] and mask == [[0, 1, 1], [1, 1, 1]]  # shortest first, left padding


def test_self_distilled_examples_train_on_the_answer_only():
    dataset = Dataset()
    chats = [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]
    self_distill(dataset, _Model(), _Tokenizer(), chats, "test", max_new_tokens=4, batch_size=2, temperature=0.0,
                 eos_ids={EOS}, pad_id=PAD, deadline=None, max_len=64)
    assert [(e.tokens, e.loss_start) for e in dataset.examples] == [((5, 6, 7, 11, 12, EOS), 3), ((8, 9, 14, EOS), 2)]


def test_an_empty_dataset_says_why():
    """Prompts whose answers do not fit --max-len are dropped, and the message says so: it said "every source was
    empty" of prompts that had been answered."""
    dataset = Dataset()
    chats = [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]
    self_distill(dataset, _Model(), _Tokenizer(), chats, "test", max_new_tokens=4, batch_size=2, temperature=0.0,
                 eos_ids={EOS}, pad_id=PAD, deadline=None, max_len=3)
    assert not dataset.examples
    assert dataset.why_empty() == "2 prompts leaving no room for two answer tokens in --max-len 3"
    assert Dataset().why_empty() == "no prompts or texts were given"


def test_loss_positions_skip_prompt_and_padding():
    # one row: 5 real tokens (1 pad), answer from index 3: targets are tokens 3 and 4
    batch = Batch(torch.zeros(1, 6, dtype=torch.long), torch.zeros(1, 6, 4), torch.tensor([5]), torch.tensor([3]))
    # shift 1 (EAGLE / head 1): row i is the distribution at j = i + 1, predicting token j + 1
    assert target_positions(batch, shift=1).tolist() == [[False, True, True, False, False]]
    # shift 2 (Medusa head 2): j = i + 2
    assert target_positions(batch, shift=2).tolist() == [[True, True, False, False]]
