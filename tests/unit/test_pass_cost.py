"""One module times target passes for the row cost, the server's cost table and the benchmark's curve."""
from specdecode.bench.passcost import pass_costs
from specdecode.core.pass_costs import time_passes
from specdecode.server.policy import calibrate


def test_every_user_times_passes_the_same_way(tiny_target):
    seconds = time_passes(tiny_target, [(1, 1), (2, 3)], context=16, rounds=2)
    assert set(seconds) == {(1, 1), (2, 3)} and all(s > 0 for s in seconds.values())
    table = calibrate(tiny_target, batches=(1, 2), qs=(1, 2), context=16, repeats=1)
    assert (table.batches, table.qs) == ((1, 2), (1, 2)) and all(ms >= 0 for row in table.ms for ms in row)
    curve = pass_costs(tiny_target, qs=(1, 4), context=16, repeats=3)
    assert [c.q for c in curve] == [1, 4] and all(c.ms > 0 for c in curve)
