"""Bounded load test on the tiny model: 32 concurrent streaming clients (16 batch rows, the rest queued), three
drafters mixed in one batch. Every response is complete and equals its single-request greedy output; afterwards
the server holds no sequence, row, queued request or live request object, and its memory (RSS, measured after a
warm-up round so one-time allocations count in the baseline) is back near its baseline."""
from __future__ import annotations

import asyncio
import gc

import openai
import psutil

from specdecode.core.engine import Sequence
from specdecode.server.scheduling.scheduler import Ticket
from tests.e2e.server_util import MODEL, PROMPTS, chat_ids, reference, serving, tiny_service

CLIENTS, MAX_TOKENS = 32, 12
DRAFTERS = (None, "none", "layer-skip")  # None: the server's default (prompt-lookup)
RSS_SLACK = 48 << 20  # bytes: one round of 32 requests allocates far less than this unless something leaks


def _requests() -> list[tuple[bool, str, str | None]]:
    """(chat?, content, drafter) for each client: 16 prompts, each as a completion and as a chat."""
    return [(i >= len(PROMPTS), PROMPTS[i % len(PROMPTS)], DRAFTERS[i % len(DRAFTERS)]) for i in range(CLIENTS)]


async def _one(client: openai.AsyncOpenAI, chat: bool, content: str, drafter: str | None) -> tuple[str, str, int]:
    extra = {"ignore_eos": True, **({"speculation": {"drafter": drafter}} if drafter else {})}
    common = dict(model=MODEL, max_tokens=MAX_TOKENS, temperature=0, stream=True,
                  stream_options={"include_usage": True}, extra_body=extra)
    if chat:
        stream = await client.chat.completions.create(messages=[{"role": "user", "content": content}], **common)
    else:
        stream = await client.completions.create(prompt=content, **common)
    text, finish, tokens = [], None, -1
    async for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            text.append((choice.delta.content or "") if chat else choice.text)
            finish = choice.finish_reason or finish
    return "".join(text), finish, tokens


async def _round(url: str) -> list[tuple[str, str, int]]:
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
        return await asyncio.gather(*(_one(client, *request) for request in _requests()))


def _rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def test_32_concurrent_streams_complete_equal_and_leak_free(tiny_target):
    tokenizer = tiny_target.tokenizer
    expected = []
    for chat, content, _ in _requests():
        ids = chat_ids(tokenizer, content) if chat else tokenizer(content)["input_ids"]
        expected.append(reference(tiny_target, ids, MAX_TOKENS, stop_on_eos=False).text)

    service = tiny_service(tiny_target, max_batch=16, max_queue=CLIENTS)
    with serving(service) as server:
        warm = asyncio.run(_round(server.url))  # first round: one-time allocations (cache growth, threads)
        baseline = _rss()
        rounds = [asyncio.run(_round(server.url))]
        after = _rss()
        scheduler = service.scheduler
        assert (scheduler.active, scheduler.queued) == (0, 0)
        assert sorted(scheduler.engine._free_rows) == list(range(16))
        gc.collect()
        alive = [type(o).__name__ for o in gc.get_objects() if type(o) in (Ticket, Sequence)]
        assert not alive, f"requests still referenced after they finished: {alive[:5]}"
        metrics = service.metrics.render().decode()

    for results in (warm, *rounds):
        assert [text for text, _, _ in results] == expected
        assert {(finish, tokens) for _, finish, tokens in results} == {("length", MAX_TOKENS)}
    assert after - baseline < RSS_SLACK, f"RSS grew by {(after - baseline) >> 20} MiB in one round"
    assert "specdecode_batch_size_bucket{le=\"16.0\"}" in metrics
    batch_sum = float(next(line.split()[-1] for line in metrics.splitlines()
                           if line.startswith("specdecode_batch_size_sum")))
    batch_count = float(next(line.split()[-1] for line in metrics.splitlines()
                             if line.startswith("specdecode_batch_size_count")))
    assert batch_sum / batch_count > 4, "requests were not decoded together"
