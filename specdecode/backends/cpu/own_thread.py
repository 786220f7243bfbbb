"""Load a model on a thread of its own that then ends, so that the thread that decodes owns the process's only
OpenMP team.

Why: libgomp gives every thread that opens a parallel region its own team of worker threads, kept until that
thread exits. Once the teams hold more threads than there are cores, libgomp stops letting idle workers spin
(its throttled spin count) and each parallel region wakes them from a futex, and a pass runs ~200 regions.
The server decodes on its scheduler thread, not on the thread that loaded the model, and so paid this on every
pass: on a second thread, once the main thread had a team, a q4 product took twice as long as on the process's
only team, and SmolLM2 int4 decoded more than three times slower than on the thread that loaded it
(docs/design-notes.md, "Quantized weights": "Decode on the only OpenMP team"). A thread that has ended has
freed its team."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def run_in_own_thread(fn: Callable[..., T], *args, **kwargs) -> T:
    """fn(*args, **kwargs) on a new thread, joined; its result, or its exception raised here."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 - re-raised in the calling thread
            outcome["error"] = error

    thread = threading.Thread(target=run, name="specdecode-load", daemon=True)  # daemon: Ctrl-C ends the process
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]
