"""A draft model's output head cut to a shortlist of the vocabulary: the first `size` token ids plus every token
the drafter has seen (prompts and committed tokens, across requests, the oldest forgotten past a cap).

Why: a small draft model's head is a large share of its pass. Qwen2.5-0.5B's 151,936 x 896 head is ~39 % of the
bytes an int4 pass reads (the head stays int8), about a third of a draft step on a 2-core CPU; the shortlist's
logits cost a fifth of that. FR-Spec (Zhao et al. 2025, arXiv 2502.14856) ranks the draft
vocabulary by corpus frequency; with no corpus at run time we take the byte-level BPE's id order (a merge
learned earlier is more frequent in the tokenizer's training text) and add the tokens of the running
workload, which covers the identifiers a prompt introduces. Measured on 4,599 greedy Qwen2.5-Coder-1.5B tokens
(code, math, writing, qa): the first 32,768 ids hold 94.1 % of them, 96.6 % with the tokens seen before.

Off by default (`--draft-vocab N` turns it on): on the Qwen pair it does not pay. 32,768 ids cut the draft's
time per step by ~15 %, but a target token outside the list is a sure rejection (``` is id 73,594), and tau
fell about as much (docs/drafters.md, "draft-model"). A head that is a larger share of its model would gain
more.

Exactness is untouched: the target verifies every token, and a drafted token's q is the shortlist
distribution it was drawn from (zero outside it), which rejection sampling accepts as any other q."""
from __future__ import annotations

import torch
from torch import nn

from specdecode.backends.cpu.linear import GROUP, PackedLinear

SEEN_CAP = 4096  # tokens beyond the first `size` remembered; the oldest is replaced past it


def shortlist_size(requested: int | None, head: nn.Module) -> int | None:
    """The shortlist length for `head`, or None for the whole head. requested: None or 0 = the whole head, n =
    the first n ids. Heads other than a packed or float linear layer (torch's int8 one) keep the whole
    vocabulary."""
    if type(head) not in (PackedLinear, nn.Linear) or not requested or requested >= head.out_features:
        return None
    return requested


class ShortlistHead(nn.Module):
    """Logits [..., vocab] from `head` over the shortlist, -inf elsewhere (so every caller sees the usual
    shape, and a softmax gives the shortlist distribution). `add(ids)` grows the seen set."""

    threaded = True  # forward takes a thread count, as PackedLinear does (backends/cpu/decoder.py)

    def __init__(self, head: nn.Module, size: int, cap: int = SEEN_CAP):
        super().__init__()
        self.source, self.vocab, self.cap = head, head.out_features, cap
        self.in_features, self.out_features = head.in_features, head.out_features
        self.size = size - size % GROUP if isinstance(head, PackedLinear) else size  # whole packed groups
        self.prefix = _prefix(head, self.size)
        self.slot_of: dict[int, int] = {}  # seen token id -> its slot
        self._ids = torch.empty(cap, dtype=torch.int64)  # [cap] token ids, by slot
        self._rows = torch.empty(cap, head.in_features)  # [cap, hidden] their float weights
        self._bias = torch.empty(cap)  # [cap]
        self._filled = 0  # slots in use
        self._next = 0  # the slot the next new id takes once the cap is reached (oldest first)

    @property
    def ids(self) -> torch.Tensor:
        """[seen] the token ids beyond the prefix in the shortlist, by slot."""
        return self._ids[: self._filled]

    def add(self, ids: list[int]) -> None:
        """Remember the ids beyond the prefix that are not yet in the shortlist."""
        new = sorted({i for i in ids if self.size <= i < self.vocab and i not in self.slot_of})
        if not new:
            return
        rows, bias = _columns(self.source, new)  # [n, hidden], [n]
        for token, row, b in zip(new, rows, bias):
            if self._filled < self.cap:
                slot, self._filled = self._filled, self._filled + 1
            else:
                slot, self._next = self._next, (self._next + 1) % self.cap
                del self.slot_of[int(self._ids[slot])]
            self._ids[slot], self._rows[slot], self._bias[slot] = token, row, b
            self.slot_of[token] = slot

    def forward(self, x: torch.Tensor, threads: int = 0) -> torch.Tensor:
        # x: [..., hidden] -> [..., vocab]
        out = x.new_full((*x.shape[:-1], self.vocab), float("-inf"), dtype=torch.float32)
        if isinstance(self.prefix, PackedLinear):
            out[..., : self.size] = self.prefix(x, threads)
        else:
            out[..., : self.size] = self.prefix(x).float()
        if self._filled:
            seen = slice(0, self._filled)
            out[..., self._ids[seen]] = x.float() @ self._rows[seen].T + self._bias[seen]  # [..., seen]
        return out


def _prefix(head: nn.Module, size: int) -> nn.Module:
    """The head restricted to its first `size` outputs, sharing its storage."""
    if isinstance(head, PackedLinear):
        groups = size // GROUP
        bias = None if head.bias is None else head.bias[:size]
        return PackedLinear.from_packed(head.codes[:groups], head.d[:groups],
                                        None if head.m is None else head.m[:groups], bias)
    cut = nn.Linear(head.in_features, size, bias=head.bias is not None, device="meta")
    cut.weight = nn.Parameter(head.weight[:size], requires_grad=False)
    if head.bias is not None:
        cut.bias = nn.Parameter(head.bias[:size], requires_grad=False)
    return cut


def _columns(head: nn.Module, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 weight rows [n, hidden] and biases [n] of outputs `ids` of a head."""
    index = torch.tensor(ids)
    bias = torch.zeros(len(ids)) if head.bias is None else head.bias.detach()[index].float()
    if not isinstance(head, PackedLinear):
        return head.weight.detach()[index].float(), bias
    groups = torch.unique(index // GROUP)  # only these packed groups are dequantised
    part = PackedLinear.from_packed(head.codes[groups], head.d[groups], None if head.m is None else head.m[groups],
                                    None)
    weights = part.weight.reshape(len(groups), GROUP, -1)  # [g, 8, hidden]
    where = torch.searchsorted(groups, index // GROUP)
    return weights[where, index % GROUP], bias
