"""`none`: no draft at all. Plain autoregressive decoding through the same loop: the baseline."""
from __future__ import annotations

from collections.abc import Sequence

from specdecode.core.drafting import Draft, SequenceContext
from specdecode.drafters.common.base import BaseDrafter, DrafterSpec


class NoDrafter(BaseDrafter):
    name = "none"

    def propose(self, seqs: Sequence[SequenceContext]) -> list[Draft]:
        return [Draft() for _ in seqs]


SPEC = DrafterSpec("none", lambda target, config, spec: NoDrafter(), "plain decoding (baseline)")
