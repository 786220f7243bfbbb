"""server/heap.py: what is alive when a serving process freezes leaves the collector's walk, and the cyclic garbage
that requests make later is still collected."""
import gc
import weakref

from specdecode.server.heap import freeze_heap


class _Node:
    pass


def test_the_loaded_objects_leave_the_walk_and_later_cycles_are_still_collected():
    loaded = _Node()
    try:
        assert freeze_heap() > 0
        assert all(obj is not loaded for obj in gc.get_objects())  # a full collection no longer walks it
        later = _Node()
        later.me = later  # a cycle: only the collector frees it
        gone = weakref.ref(later)
        del later
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()
    assert any(obj is loaded for obj in gc.get_objects())  # the control: tracked until frozen
