"""CpuShare: threads per pass, leaving the cores other processes use (fake clocks and counters)."""
import pytest

from specdecode.backends.cpu.share import CpuShare, TorchThreads


class FakeMachine:
    """A 2-core machine whose counters advance by what we and the others use per second."""

    def __init__(self, cores: int = 2):
        self.cores, self.wall, self.own, self.busy, self.total = cores, 0.0, 0.0, 0.0, 0.0

    def run(self, seconds: float, ours: float, others: float) -> None:  # ours / others: cores' worth of work
        self.wall += seconds
        self.own += ours * seconds
        self.busy += min(self.cores, ours + others) * seconds
        self.total += self.cores * seconds

    def share(self, budget: int = 2) -> CpuShare:
        return CpuShare(lambda: budget, machine_cores=self.cores, read_stat=lambda: (self.busy, self.total),
                        clock=lambda: self.wall, own_cpu=lambda: self.own)


@pytest.mark.parametrize("ours, others, expected", [
    (2.0, 0.0, 2),  # alone: every thread
    (1.8, 0.1, 2),  # a little background noise
    (1.0, 1.0, 1),  # a busy process on one core: leave it
    (1.0, 2.0, 1),  # both cores wanted by others: still one
])
def test_threads_leave_the_cores_others_use(ours, others, expected):
    machine = FakeMachine()
    share = machine.share()
    assert share.threads() == 2  # no history yet: the budget
    machine.run(0.5, ours, others)
    assert share.threads() == expected


def test_it_looks_again_only_after_a_while_and_comes_back():
    machine = FakeMachine()
    share = machine.share()
    share.threads()
    machine.run(0.5, 1.0, 1.0)
    assert share.threads() == 1
    machine.run(0.1, 1.0, 0.0)  # the other process stopped, but the last look was 0.1 s ago
    assert share.threads() == 1
    machine.run(0.5, 1.0, 0.0)
    assert share.threads() == 2


def test_a_budget_of_one_or_no_counters_needs_no_look():
    machine = FakeMachine()
    assert machine.share(budget=1).threads() == 1
    blind = CpuShare(lambda: 2, read_stat=lambda: None)
    assert blind.threads() == 2


class FakeTorch:
    def __init__(self, threads: int):
        self.threads, self.puts = threads, []

    def get(self) -> int:
        return self.threads

    def put(self, threads: int) -> None:
        self.threads = threads
        self.puts.append(threads)


def test_torch_threads_follow_the_share_and_come_back():
    """torch's count follows CpuShare's answer, the budget stays the count set before (2), and a machine that
    is quiet again gets every thread back."""
    fake = FakeTorch(2)
    machine = FakeMachine()
    threads = TorchThreads(fake.get, fake.put)
    share = CpuShare(threads.budget, machine_cores=2, read_stat=lambda: (machine.busy, machine.total),
                     clock=lambda: machine.wall, own_cpu=lambda: machine.own)
    answers = []
    for ours, others in ((2.0, 0.0), (1.0, 1.0), (1.0, 1.0), (2.0, 0.0)):
        machine.run(0.5, ours, others)
        answers.append(share.threads())
        threads.follow(answers[-1])
    assert answers == [2, 1, 1, 2] and fake.puts == [1, 2] and threads.budget() == 2


def test_a_count_set_by_someone_else_is_the_new_budget():
    """`--threads 4` (or any torch.set_num_threads this object did not make) becomes the budget; its own
    lowering does not."""
    fake = FakeTorch(2)
    threads = TorchThreads(fake.get, fake.put)
    threads.follow(1)
    assert fake.threads == 1 and threads.budget() == 2
    fake.threads = 4
    assert threads.budget() == 4
    threads.follow(4)
    assert fake.puts == [1] and threads.budget() == 4
