"""RoutingDrafter: each sequence gets the draft its own drafter made for IT, when sequences of several drafters
interleave in one batch (a draft verified on another row stays lossless but wastes the step, so only a direct
check catches a mix-up)."""
import torch

from specdecode.config import SamplingConfig
from specdecode.drafters.base import Draft, SequenceContext
from specdecode.server.router import RoutingDrafter


class _Echo:
    """Drafts [tag, seq_id]; records the sequences it started and finished."""

    needs_hidden = False

    def __init__(self, tag: int):
        self.tag, self.started, self.finished = tag, [], []

    def start(self, seq):
        self.started.append(seq.seq_id)

    def propose(self, seqs):
        return [Draft.chain([self.tag, seq.seq_id]) for seq in seqs]

    def observe(self, seq, accepted):
        pass

    def finish(self, seq):
        self.finished.append(seq.seq_id)


def test_drafts_go_back_to_their_own_sequences():
    a, b = _Echo(100), _Echo(200)
    router = RoutingDrafter({"a": a, "b": b}, default="a")
    seqs = [SequenceContext(i, [1, 2], i, 2, SamplingConfig(), torch.Generator()) for i in range(5)]
    for seq, name in zip(seqs, ["a", "b", "a", "a", "b"]):
        router.start(seq)
        router.choose(seq, name)
    for _ in range(2):  # drafters start lazily, once
        drafts = router.propose(seqs)
        assert [d.tokens for d in drafts] == [(100, 0), (200, 1), (100, 2), (100, 3), (200, 4)]
    assert a.started == [0, 2, 3] and b.started == [1, 4]
    for seq in seqs:
        router.finish(seq)
    assert a.finished == [0, 2, 3] and b.finished == [1, 4]
