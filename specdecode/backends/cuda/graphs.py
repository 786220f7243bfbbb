"""Our own CUDA graphs for fast-path steps: captured once per step shape, replayed with a few input copies.

torch.compile's mode="reduce-overhead" (CUDA graph trees) runs dynamo's guards and the trees' own checks in
Python on every call: on an H100 that host time was about twice the GPU work of a step of the 135M default
model, so decoding was bound by the host. Capturing the compiled (inductor, no graphs) step with
torch.cuda.graph and replaying it directly took little more than the GPU work per token, the input copies and
the read-back of the argmax included (docs/gpu.md, "What limits it"). This is what serving engines do (vLLM,
SGLang, gpt-fast).

A graph records the addresses of the KV-cache buffers it writes, so graphs belong to one cache: they live in
`RollbackCache.graphs` and are dropped when the cache reallocates."""
from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

Outputs = tuple[torch.Tensor, ...]
MAX_GRAPHS = 256  # per cache; beyond this a step runs compiled but not captured (each graph holds memory)


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: dict[str, torch.Tensor]  # static buffers the graph reads
    outputs: Outputs  # static buffers the graph writes (overwritten by the next replay)


class StepGraphs:
    """Captured steps of one cache, keyed by step shape (rows, block bucket, outputs asked for, layers)."""

    def __init__(self) -> None:
        self._graphs: dict[Hashable, _Captured] = {}

    def clear(self) -> None:
        self._graphs.clear()

    def __len__(self) -> int:
        return len(self._graphs)

    def run(self, key: Hashable, inputs: dict[str, torch.Tensor], step: Callable[[dict[str, torch.Tensor]], Outputs],
            pool, device: torch.device) -> Outputs | None:
        """Replay the graph of `key` on `inputs` (captured on first use); None when the graph budget is spent
        (the caller then runs `step` directly)."""
        captured = self._graphs.get(key)
        if captured is None:
            if len(self._graphs) >= MAX_GRAPHS:
                return None
            captured = self._graphs[key] = _capture(inputs, step, pool, device)
        for name, tensor in inputs.items():
            captured.inputs[name].copy_(tensor, non_blocking=True)
        captured.graph.replay()
        return captured.outputs


def _capture(inputs: dict[str, torch.Tensor], step: Callable, pool, device: torch.device) -> _Captured:
    """Warm up on a side stream (compiles, autotunes, lets the allocator settle), then record one run. The
    warm-up runs are the real step on the real inputs, so the cache slots they write get the same values."""
    static = {name: tensor.to(device, copy=True) for name, tensor in inputs.items()}  # inputs may be on the CPU
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step(static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = step(static)
    return _Captured(graph, static, outputs)
