"""RoutingDrafter: each sequence gets the draft its own drafter made for IT, when sequences of several drafters
interleave in one batch (a draft verified on another row stays lossless but wastes the step, so only a direct
check catches a mix-up)."""
import torch

from specdecode.config import SamplingConfig, SpecConfig
from specdecode.core.drafting import Capabilities, Draft, SequenceContext, drafts_asked
from specdecode.core.engine import Engine
from specdecode.drafters.common.base import BaseDrafter
from specdecode.server.scheduling.router import RoutingDrafter


class _Echo(BaseDrafter):
    """Drafts [tag, seq_id]; records the sequences it started and finished."""

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


class _Asked(_Echo):
    """An _Echo that records the k each sequence asked it for."""

    def __init__(self, tag: int, free: bool):
        super().__init__(tag)
        self.capabilities, self.asked = Capabilities(free_drafts=free), []

    def propose(self, seqs):
        self.asked.extend(seq.k for seq in seqs)
        return [Draft.chain([self.tag][: seq.k]) for seq in seqs]


def test_a_step_allowing_free_drafts_alone_asks_other_drafters_for_none():
    """Some of the drafters have free drafts, so the router says it has them; a free_only sequence of a drafter
    without them is asked for k 0 (its drafter still sees the step), and the others as they asked."""
    free, model = _Asked(100, free=True), _Asked(200, free=False)
    router = RoutingDrafter({"free": free, "model": model}, default="free")
    assert router.capabilities.free_drafts
    seqs = [SequenceContext(i, [1, 2], i, 2, SamplingConfig(), torch.Generator()) for i in range(4)]
    for seq, name, free_only in zip(seqs, ["free", "model", "model", "free"], [True, True, False, False]):
        router.start(seq)
        router.choose(seq, name)
        seq.free_only = free_only
    drafts = router.propose(seqs)
    assert (free.asked, model.asked) == ([2, 2], [0, 2])
    assert [d.tokens for d in drafts] == [(100,), (), (200,), (100,)]


class _Declares(BaseDrafter):
    def __init__(self, capabilities: Capabilities, nodes_per_k: int = 1):
        self.capabilities, self.nodes_per_k = capabilities, nodes_per_k

    def max_nodes(self, k: int) -> int:
        return self.nodes_per_k * k


class _WarmupRecorder:
    """A target that records the step shapes it is asked to warm up."""

    packed_decoder = False

    def __init__(self):
        self.calls = []

    def new_cache(self, rows, capacity):
        return None

    def warmup(self, cache, width, hidden=False, num_layers=None, hidden_layers=()):
        self.calls.append((width, hidden, num_layers, hidden_layers))


def test_router_reports_the_union_of_its_drafters_capabilities():
    """The server drafts through a router: the engine's warm-up must still compile the widest tree, the hidden
    outputs and the layer-skip depth of the drafters behind it."""
    router = RoutingDrafter({"tree": _Declares(Capabilities(needs_hidden=True), nodes_per_k=5),
                             "skip": _Declares(Capabilities(exit_layers=(4,))),
                             "plain": _Declares(Capabilities())}, default="plain")
    assert router.capabilities == Capabilities(needs_hidden=True, exit_layers=(4,))
    assert router.max_nodes(3) == 15
    target = _WarmupRecorder()
    Engine(target, router, SpecConfig(k=3)).warmup()
    assert target.calls == [(16, True, None, ()), (1, False, 4, ())]
    fused = RoutingDrafter({"fused": _Declares(Capabilities(needs_hidden=True, hidden_layers=(1, 2, 3)), nodes_per_k=5),
                            "plain": _Declares(Capabilities())}, default="plain")  # EAGLE-3: the layers it reads
    target = _WarmupRecorder()
    Engine(target, fused, SpecConfig(k=3)).warmup()
    assert target.calls == [(16, True, None, (1, 2, 3))]


def test_a_step_allowing_no_draft_pass_asks_only_free_drafters_for_drafts():
    """drafts_asked, the one rule the engine (its first steps) and the router (each drafter) follow."""
    ctx = SequenceContext(0, [1, 2], 0, 4, SamplingConfig(), torch.Generator())
    free, paying = Capabilities(free_drafts=True), Capabilities()
    assert (drafts_asked(free, ctx), drafts_asked(paying, ctx)) == (4, 4)
    ctx.free_only = True
    assert (drafts_asked(free, ctx), drafts_asked(paying, ctx)) == (4, 0)
