"""Whether this step's free draft (suffix decoding's: no draft pass) or a draft model's chain is worth more, in
tokens per one-token target pass, and how much of the free draft should lead the model's chain.

Both are priced with the draft model's chain costs (pass_costs.ChainCostEstimate: one draft pass, and verify[n],
a verify pass with n drafted tokens), the costs that already end the model's drafts (row_budget.ChainBudget):
    free:   (1 + P_1 + ... + P_n) / verify(n)                   n free nodes, P their own estimates
    model:  max over d of (1 + R_1 + ... + R_d) / (verify(d) + d * draft_pass)
P_i is the free drafter's estimate that node i is accepted (suffix: its match length's rates x the node's
frequency); R_j the draft model's chance of being accepted to depth j, from its own results. d = 0 is plain
decoding (1 token a pass), so the model is never priced below it. The free draft is taken when it is worth at
least as much (ties go to it: it costs no draft pass, which a busy machine slows most).

P is scaled by Hindsight first. The free drafts the rule takes are those whose estimates came out high, so on
average they run high: on the built-in `math` prompts with the Qwen pair (three runs), the free drafts taken
expected 1.51, 2.09 and 2.12 accepted tokens and got 1.27, 1.29 and 0.88, and `hybrid` ran at 0.90x
`draft-model` there. Scaling by accepted / estimated over the free drafts taken corrects it (1.01x).
"""
from __future__ import annotations

from collections.abc import Sequence

from specdecode.core.pass_costs import verify_cost


def free_value(estimates: Sequence[float], verify: Sequence[float]) -> float:
    """Tokens per pass of a free draft of len(estimates) nodes with these acceptance estimates.

    Example: estimates (0.9, 0.8), verify [1.0, 1.0, 1.1] -> (1 + 1.7) / 1.1 = 2.45."""
    return (1.0 + sum(estimates)) / verify_cost(verify, len(estimates))


def model_value(reach: Sequence[float], draft_pass: float, verify: Sequence[float]) -> float:
    """The most tokens per pass a draft model's chain is expected to buy, over depths 0..len(reach); reach[j - 1]
    is R_j, its chance of being accepted to depth j (never rising with j).

    Example: reach (0.8, 0.64), draft_pass 0.25, verify [1.0, 1.0, 1.1]: depth 1 (1.8) / 1.25 = 1.44, depth 2
    (2.44) / 1.6 = 1.525 -> 1.525."""
    best, tokens = 1.0, 1.0
    for depth, r in enumerate(reach, start=1):
        tokens += r
        best = max(best, tokens / (verify_cost(verify, depth) + depth * draft_pass))
    return best


def take_free(estimates: Sequence[float], reach: Sequence[float], draft_pass: float,
              verify: Sequence[float]) -> bool:
    """Whether the free draft (nodes with these estimates; none: no draft) beats the draft model's chain."""
    return bool(estimates) and free_value(estimates, verify) >= model_value(reach, draft_pass, verify)


def seed_length(path: Sequence[float], reach: Sequence[float], limit: int) -> int:
    """How many tokens of the free draft's likeliest chain (its estimates, cumulative, in path order) to put ahead
    of the draft model's chain: the longest prefix, at most `limit`, whose every token is at least as likely to
    be accepted as the model's own token at that depth (P_j >= R_j). Each such token saves a draft pass and
    loses nothing the model was expected to win.

    Example: path (0.9, 0.5), reach (0.8, 0.64, 0.51) -> 1 (0.5 < 0.64)."""
    n = 0
    while n < min(limit, len(path), len(reach)) and path[n] >= reach[n]:
        n += 1
    return n


HINDSIGHT_PRIOR = 8.0  # estimated tokens' weight of the starting factor
HINDSIGHT_KEEP = 0.98  # each result keeps this share of the earlier ones (a window of ~50 free drafts)


class Hindsight:
    """accepted / estimated tokens over the free drafts the rule took, the factor their estimates are scaled by
    before the next choice. It starts at `start` (1.0: estimates trusted until shown otherwise, or the
    drafter's factor over earlier sequences) worth HINDSIGHT_PRIOR estimated tokens; older results fade.

    Example: start 1.0, one draft estimated at 2.0 of which none was accepted -> (8 + 0) / (8 + 2) = 0.8."""

    def __init__(self, start: float = 1.0):
        self.start = start
        self.estimated = self.accepted = 0.0

    def add(self, estimated: float, accepted: int) -> None:
        self.estimated = self.estimated * HINDSIGHT_KEEP + estimated
        self.accepted = self.accepted * HINDSIGHT_KEEP + accepted

    def factor(self) -> float:
        """At most 1: the bias corrected runs one way, and a draft's order of nodes stays as estimated."""
        return min(1.0, (self.start * HINDSIGHT_PRIOR + self.accepted) / (HINDSIGHT_PRIOR + self.estimated))

    def scaled(self, estimates: Sequence[float]) -> tuple[float, ...]:
        factor = self.factor()
        return tuple(p * factor for p in estimates)
