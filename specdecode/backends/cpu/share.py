"""How many threads a pass of the native kernels should use when other processes share the CPU.

Every OpenMP region of a pass ends in a barrier. When another process takes one of the cores, the thread it
preempts holds the region, and so the whole pass, until the scheduler runs it again (milliseconds each time):
with a test run busy on a 2-core machine, SmolLM2 int4 decoded more than twice as fast on one thread as on two
(docs/design-notes.md, "Sharing the CPU"). So before a pass the decoder asks `CpuShare.threads()`: every
`every_s` seconds it reads how busy the CPUs were (/proc/stat) and how much of that was this process
(`time.process_time`), and leaves the cores the other processes used. Without /proc/stat (not Linux) it always
answers the thread budget. The kernels' results do not depend on the thread count (each output is summed by one
thread in a fixed order), so this changes speed only, never tokens."""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

BUSY_OTHERS = 0.3  # cores' worth of other processes' work below which the machine counts as ours


def read_proc_stat() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine since boot, or None where /proc/stat is unreadable."""
    try:
        with open("/proc/stat") as handle:
            fields = [int(value) for value in handle.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 4:
        return None
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest time is inside user)
    return (total - idle) / tick, total / tick


@dataclass
class CpuShare:
    """budget: the most threads to use (asked at every look: torch.get_num_threads); machine_cores: CPUs the
    machine's counters cover."""

    budget: Callable[[], int]
    machine_cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    every_s: float = 0.25
    read_stat: Callable[[], tuple[float, float] | None] = read_proc_stat
    clock: Callable[[], float] = time.monotonic
    own_cpu: Callable[[], float] = time.process_time
    _last: tuple[float, float, float, float] | None = None  # wall, own CPU s, busy s, total s
    _threads: int = 0

    def threads(self) -> int:
        """Threads for the next pass: the budget, less the cores other processes kept busy lately."""
        now = self.clock()
        if self._last is not None and now - self._last[0] < self.every_s:
            return self._threads
        budget = max(1, self.budget())
        stat = self.read_stat() if budget > 1 else None
        if stat is None:
            self._threads = budget
            return self._threads
        sample = (now, self.own_cpu(), *stat)
        if self._last is None:
            self._last, self._threads = sample, budget
            return self._threads
        wall = sample[0] - self._last[0]
        busy = (sample[2] - self._last[2]) * self.machine_cores / max(sample[3] - self._last[3], 1e-9)  # cores
        others = max(0.0, busy - (sample[1] - self._last[1]) / max(wall, 1e-9))
        self._last = sample
        free = min(budget, self.machine_cores - others)
        self._threads = budget if others < BUSY_OTHERS else max(1, int(free))
        return self._threads


class TorchThreads:
    """torch's intra-op thread count following CpuShare's answer, so the torch operations between native calls
    (the head's softmax and argmax over the vocabulary, the verifier's and drafters' tensors) stop waiting at
    their own barriers for a thread another process preempted. The budget is the count someone else set last
    (`--threads`, torch's default): a change this object did not make is taken as the new budget."""

    def __init__(self, get: Callable[[], int], put: Callable[[int], None]):
        """get / put: torch.get_num_threads / torch.set_num_threads (injected for tests)."""
        self.get, self.put = get, put
        self._budget, self._mine = get(), None

    def budget(self) -> int:
        current = self.get()
        if current != self._mine:
            self._budget = current
        return self._budget

    def follow(self, threads: int) -> None:
        """Make torch use `threads` (a CpuShare answer at most the budget) until the next call."""
        if self.get() != threads:
            self.budget()  # a count set by someone else since the last call becomes the budget first
            self.put(threads)
        self._mine = threads

