"""Scheduler admission without a worker thread: a burst into an idle server fills the free rows AND the queue
(max_queue counts requests waiting while every row is busy); one more is answered 429 (QueueFull)."""
import asyncio

import pytest

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.drafters import build_drafter
from specdecode.server.scheduling.metrics import ServerMetrics
from specdecode.server.scheduling.router import RoutingDrafter
from specdecode.server.scheduling.scheduler import Job, QueueFull, Scheduler, SchedulerConfig, Ticket


def test_burst_fills_free_rows_and_queue_then_429(tiny_target):
    spec = SpecConfig(k=2)
    router = RoutingDrafter({"none": build_drafter(tiny_target, DrafterConfig(name="none"), spec)}, "none")
    engine = Engine(tiny_target, router, spec, max_batch=2)
    scheduler = Scheduler(engine, router, SchedulerConfig(max_batch=2, max_queue=1), ServerMetrics())
    loop = asyncio.new_event_loop()
    try:
        job = Job((5, 6, 7), SamplingConfig(), GenerationConfig(max_new_tokens=2), "none")
        for _ in range(3):  # 2 free rows + 1 queued: all accepted (the worker is not running)
            scheduler.submit(Ticket(job, loop))
        with pytest.raises(QueueFull):
            scheduler.submit(Ticket(job, loop))
        assert scheduler.queued == 3
    finally:
        loop.close()


def test_the_worker_measures_the_row_cost_on_its_own_thread(tiny_model, tiny_tokenizer, monkeypatch):
    """A drafter that prices rows plans with a row cost timed on the thread that decodes (row_budget.RowCost),
    before the first request: not on the thread that built the server."""
    import threading

    from specdecode.core.target import Target

    target = Target(tiny_model, tiny_tokenizer)  # its own: a Target measures once
    threads = []
    monkeypatch.setattr("specdecode.core.target.measure_row_cost",
                        lambda target: threads.append(threading.current_thread().name) or 0.2)
    spec = SpecConfig(k=2)
    router = RoutingDrafter({"prompt-lookup": build_drafter(target, DrafterConfig(name="prompt-lookup"), spec)},
                            "prompt-lookup")
    scheduler = Scheduler(Engine(target, router, spec), router, SchedulerConfig(max_batch=1), ServerMetrics())
    assert threads == []
    scheduler.start()
    scheduler.stop()
    assert threads == ["specdecode-scheduler"] and router.drafters["prompt-lookup"].row_cost == 0.2
