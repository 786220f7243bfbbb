"""One Drafter over several: each sequence names its drafter, so requests that chose different drafters (or
"none") still share one Engine, one KV cache and one verification pass per step.

The choice lives in `seq.extra["drafter"]`, set by the scheduler right after `Engine.start`. Because the engine
calls `start` before that, the chosen drafter's own `start` runs lazily, just before the sequence's first
`propose` (nothing has changed in between: the sequence's tokens and hidden states are still those of prefill).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from specdecode.core.drafting import Capabilities, Draft, Drafter, SequenceContext, drafts_asked
from specdecode.errors import ConfigError

_KEY, _STARTED = "drafter", "drafter_started"


class RoutingDrafter:
    name = "router"

    def __init__(self, drafters: Mapping[str, Drafter], default: str):
        if default not in drafters:
            raise ValueError(f"default drafter {default!r} is not among {list(drafters)}")
        self.drafters, self.default = dict(drafters), default
        try:
            self.capabilities = Capabilities.union([d.capabilities for d in self.drafters.values()])
        except ValueError as error:
            raise ConfigError(f"{', '.join(self.drafters)}: {error}") from error

    def max_nodes(self, k: int) -> int:
        return max(d.max_nodes(k) for d in self.drafters.values())

    def choose(self, seq: SequenceContext, name: str | None) -> None:
        if name is not None and name not in self.drafters:
            raise ValueError(f"drafter {name!r} is not served here")
        seq.extra[_KEY] = name or self.default

    def _of(self, seq: SequenceContext) -> Drafter:
        return self.drafters[seq.extra.setdefault(_KEY, self.default)]

    def start(self, seq: SequenceContext) -> None:
        seq.extra[_STARTED] = False

    def propose(self, seqs: Sequence[SequenceContext]) -> list[Draft]:
        groups: dict[str, list[int]] = {}
        for i, seq in enumerate(seqs):
            if not seq.extra.get(_STARTED):
                self._of(seq).start(seq)
                seq.extra[_STARTED] = True
            groups.setdefault(seq.extra[_KEY], []).append(i)
        drafts: list[Draft] = [Draft()] * len(seqs)
        for name, members in groups.items():
            for i in members:
                seqs[i].k = drafts_asked(self.drafters[name].capabilities, seqs[i])
            for i, draft in zip(members, self.drafters[name].propose([seqs[i] for i in members])):
                drafts[i] = draft
        return drafts

    def observe_aux(self, seq: SequenceContext, logits) -> None:
        self._of(seq).observe_aux(seq, logits)

    def observe(self, seq: SequenceContext, accepted: int) -> None:
        self._of(seq).observe(seq, accepted)

    def forget_prefixes(self) -> None:
        for drafter in self.drafters.values():
            drafter.forget_prefixes()

    def kv_bytes_per_slot(self) -> int:
        """The most any of its drafters keeps (a request's own: the scheduler asks its chosen drafter)."""
        return max(d.kv_bytes_per_slot() for d in self.drafters.values())

    def parked_bytes(self) -> int:
        return sum(d.parked_bytes() for d in self.drafters.values())

    def evict_parked(self) -> bool:
        return any(d.evict_parked() for d in self.drafters.values())

    def finish(self, seq: SequenceContext) -> None:
        if seq.extra.get(_STARTED):
            self._of(seq).finish(seq)
        seq.extra[_STARTED] = False
