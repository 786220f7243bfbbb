"""A batch's verification: each row's draft against its own slice of one target pass, greedy rows by one
argmax over all of them, sampled rows by rejection sampling against their own distribution. A pure function of
tensors, like the verifiers it calls."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from specdecode.config import SamplingConfig
from specdecode.core.drafting import Draft
from specdecode.core.sampling import greedy_tokens, probabilities
from specdecode.core.verify.greedy import verify_greedy
from specdecode.core.verify.tree import Verdict, verify_sampling


def verify_rows(logits: torch.Tensor, drafts: Sequence[Draft], sampling: Sequence[SamplingConfig],
                generators: Sequence[torch.Generator | None]) -> list[Verdict]:
    """One Verdict per row. Row b's first len(drafts[b]) + 1 positions of `logits` are real: its pending token's
    (the root's) and each draft node's, in node order.

    Example: two greedy rows, drafts (5,) and (), argmax per position [[5, 8], [3, ...]] -> row 0 accepts node 0
    and adds 8; row 1 accepts nothing and adds 3."""
    # logits: [b, q, vocab]
    greedy_rows = [b for b, config in enumerate(sampling) if config.greedy]
    rows = logits if len(greedy_rows) == len(drafts) else logits[greedy_rows]  # (no copy when all are greedy)
    argmax = greedy_tokens(rows).tolist() if greedy_rows else []
    choices = dict(zip(greedy_rows, argmax))
    verdicts = []
    for b, draft in enumerate(drafts):
        n = len(draft)
        if b in choices:
            verdicts.append(verify_greedy(draft.tokens, draft.parents, choices[b][: n + 1]))
        else:
            p = probabilities(logits[b, : n + 1], sampling[b])  # [n + 1, vocab]
            q = None if draft.q is None else draft.q.to(p.device, torch.float32)  # [n, vocab]
            verdicts.append(verify_sampling(draft.tokens, draft.parents, q, p, generators[b]))
    return verdicts
