"""The draft head's shortlist (drafters/common/shortlist.py): the first ids scored by the head itself, seen ids by
their own rows, everything else -inf; the seen set capped, oldest out."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from specdecode.backends.cpu import native
from specdecode.backends.cpu.int8 import Int8Linear
from specdecode.backends.cpu.linear import PackedLinear
from specdecode.drafters.common.shortlist import ShortlistHead, shortlist_size

VOCAB, HIDDEN = 96, 64


def heads() -> list[tuple[str, nn.Module]]:
    torch.manual_seed(0)
    linear = nn.Linear(HIDDEN, VOCAB, bias=True)
    found = [("float", linear)]
    if native.missing() is None:
        found += [("q4", PackedLinear(linear, "q4")), ("q8", PackedLinear(linear, "q8"))]
    return found


@pytest.mark.parametrize("kind, head", heads(), ids=[kind for kind, _ in heads()])
def test_prefix_and_seen_ids_are_the_heads_logits_and_the_rest_minus_inf(kind, head):
    shortlist = ShortlistHead(head, 40)
    x = torch.randn(3, HIDDEN)
    full = head(x)  # [3, VOCAB]
    shortlist.add([5, 70, 41, 70, 95, 200])  # a prefix id, a repeat and an id beyond the vocabulary are ignored
    out = shortlist(x)
    assert out.shape == (3, VOCAB)
    assert torch.equal(out[:, :40], full[:, :40])  # the head's own kernel: bit for bit
    seen = [41, 70, 95]
    assert sorted(shortlist.ids.tolist()) == seen
    # seen ids: float rows (a packed head's dequantised ones) against the packed kernel's int8 activations
    tolerance = 1e-5 if kind == "float" else 0.02 * full.abs().max().item()
    assert torch.allclose(out[:, seen], full[:, seen], atol=tolerance)
    rest = [i for i in range(40, VOCAB) if i not in seen]
    assert torch.isinf(out[:, rest]).all() and (out[:, rest] < 0).all()
    probs = out.softmax(-1)  # a drafter's q: zero outside the shortlist
    assert probs[:, rest].sum() == 0 and torch.allclose(probs.sum(-1), torch.ones(3))


def test_the_seen_set_is_capped_and_forgets_the_oldest_first():
    head = nn.Linear(HIDDEN, VOCAB)
    shortlist = ShortlistHead(head, 16, cap=3)
    shortlist.add([20, 21, 22])
    shortlist.add([23])  # replaces 20
    shortlist.add([24, 20])  # replaces 21, then 22 (20 is new again)
    assert sorted(shortlist.slot_of) == [20, 23, 24]
    x = torch.randn(1, HIDDEN)
    out = shortlist(x)
    for token in (20, 23, 24):
        assert torch.allclose(out[0, token], head(x)[0, token], atol=1e-5)
    assert torch.isinf(out[0, [21, 22]]).all()


def test_packed_prefix_keeps_whole_column_groups():
    if native.missing():
        pytest.skip(native.missing())
    shortlist = ShortlistHead(PackedLinear(nn.Linear(HIDDEN, VOCAB), "q8"), 45)
    assert shortlist.size == 40  # 5 groups of 8 outputs


@pytest.mark.parametrize("requested, vocab, expected", [
    (None, 151936, None), (0, 151936, None), (1000, 151936, 1000), (151936, 151936, None), (200000, 151936, None),
])
def test_shortlist_size(requested, vocab, expected):
    head = nn.Linear(8, vocab, device="meta")
    assert shortlist_size(requested, head) == expected


def test_other_heads_keep_the_whole_vocabulary():
    assert shortlist_size(1000, Int8Linear(nn.Linear(HIDDEN, 4 * VOCAB))) is None
