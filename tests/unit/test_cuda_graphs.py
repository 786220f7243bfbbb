"""Bookkeeping of our captured CUDA graphs, on the CPU: a fake capture stands in for torch.cuda.graph (what a
graph records is tested on CUDA by tests/e2e/test_fastpath.py when a GPU is present)."""
import torch

from specdecode.backends.cuda import graphs as cuda_graphs
from specdecode.backends.cuda.graphs import StepGraphs, _Captured
from specdecode.core.kv_cache import RollbackCache


class _Replay:
    """Replays by running the step on the static inputs, as a recorded graph would."""

    def __init__(self, step, static):
        self.step, self.static, self.out = step, static, None

    def replay(self):
        self.out[0].copy_(self.step(self.static)[0])


def _fake_capture(inputs, step, pool, device):
    static = {name: tensor.clone() for name, tensor in inputs.items()}
    graph = _Replay(step, static)
    graph.out = tuple(t.clone() for t in step(static))
    return _Captured(graph, static, graph.out)


def test_replays_copy_new_inputs_and_budget_falls_back(monkeypatch):
    monkeypatch.setattr(cuda_graphs, "_capture", _fake_capture)
    monkeypatch.setattr(cuda_graphs, "MAX_GRAPHS", 1)
    graphs, calls = StepGraphs(), []

    def step(inputs):
        calls.append(1)
        return (inputs["x"] * 2,)

    first = graphs.run("a", {"x": torch.tensor([1, 2])}, step, None, torch.device("cpu"))
    assert first[0].tolist() == [2, 4]
    again = graphs.run("a", {"x": torch.tensor([5, 6])}, step, None, torch.device("cpu"))
    assert again[0].tolist() == [10, 12]  # the new inputs were copied into the static buffers
    assert graphs.run("b", {"x": torch.tensor([1])}, step, None, torch.device("cpu")) is None  # budget spent
    assert len(graphs) == 1


def test_cache_drops_graphs_when_it_reallocates(monkeypatch):
    monkeypatch.setattr(cuda_graphs, "_capture", _fake_capture)
    cache = RollbackCache(num_layers=1, rows=1, capacity=8, static=True)
    cache.graphs.run("a", {"x": torch.zeros(1)}, lambda i: (i["x"],), None, torch.device("cpu"))
    cache.ensure(1, 8)  # fits: nothing moves, graphs stay
    assert len(cache.graphs) == 1
    cache.ensure(1, 16)  # new buffers: graphs recorded the old addresses
    assert len(cache.graphs) == 0
