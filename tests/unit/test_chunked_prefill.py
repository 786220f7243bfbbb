"""Chunked prefill: a prompt prefilled in chunks (passes of their own, or riding in other sequences' steps)
decodes exactly what one prefill pass decodes, with every drafter (EAGLE reads the prefill's hidden states);
a prefilling sequence is not stepped, and leaving frees its row and its KV memory."""
from __future__ import annotations

import asyncio

import pytest
import torch

from specdecode.backends.cpu import native
from specdecode.config import GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.core.target import Target
from specdecode.drafters import registry
from specdecode.loading.formats import apply
from specdecode.server.scheduling.scheduler import Job, Ticket
from tests.e2e.server_util import tiny_service
from tests.tiny import tiny_drafter, tiny_gemma3, tiny_llama

SPEC = SpecConfig(k=4, pause_on_time=False)
NEW = 24


def long_prompt(tokenizer, n: int = 600) -> list[int]:
    text = "the cat sat on the mat; a dog ran to the cat and the cat ran off. "
    return tokenizer(text * (n // len(text) + 1))["input_ids"][:n]


def engine_for(target, name: str, draft_dir: str, max_batch: int = 2) -> Engine:
    return Engine(target, tiny_drafter(target, name, SPEC, draft_dir=draft_dir), SPEC, max_batch=max_batch)


def decode(engine: Engine, seq) -> list[int]:
    while not seq.finished:
        engine.step([seq])
    engine.release(seq)
    return seq.output_ids


def chunked(engine: Engine, prompt, sampling, generation, chunk: int):
    seq = engine.admit(prompt, sampling, generation)
    chunks = 0
    while not engine.prefill_chunk(seq, chunk):
        chunks += 1
    assert chunks == -(-(len(prompt) - 1) // chunk) - 1  # the last chunk reports ready
    return seq


@pytest.mark.parametrize("name", list(registry()))
@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=0.8, seed=3)],
                         ids=["greedy", "seeded"])
def test_chunks_decode_what_one_pass_decodes(tiny_target, tiny_tokenizer, tiny_draft_dir, name, sampling):
    prompt = long_prompt(tiny_tokenizer)
    generation = GenerationConfig(NEW, stop_on_eos=False)
    one_pass = engine_for(tiny_target, name, tiny_draft_dir)
    expected = decode(one_pass, one_pass.start(prompt, sampling, generation))
    for chunk in (128, 37):
        engine = engine_for(tiny_target, name, tiny_draft_dir)
        assert decode(engine, chunked(engine, prompt, sampling, generation, chunk)) == expected


@pytest.mark.parametrize("name", ["prompt-lookup", "eagle", "draft-model"])
def test_chunks_riding_in_steps_decode_what_one_pass_decodes(tiny_target, tiny_tokenizer, tiny_draft_dir, name):
    """The server's way: while one sequence decodes, another's prompt rides in its steps, a few tokens each; a
    chunk wider than the step's widest decode row is a pass of its own (both happen here)."""
    prompt, other = long_prompt(tiny_tokenizer), long_prompt(tiny_tokenizer, 40)[5:]
    generation = GenerationConfig(NEW, stop_on_eos=False)
    alone = engine_for(tiny_target, name, tiny_draft_dir)
    expected = decode(alone, alone.start(prompt, SamplingConfig(), generation))
    expected_other = decode(alone, alone.start(other, SamplingConfig(), GenerationConfig(400, stop_on_eos=False)))
    engine = engine_for(tiny_target, name, tiny_draft_dir)
    running = engine.start(other, SamplingConfig(), GenerationConfig(400, stop_on_eos=False))
    seq = engine.admit(prompt, SamplingConfig(), generation)
    alone, pass_alone = [], engine._prefill_pass
    engine._prefill_pass = lambda seq, chunk: (alone.append(len(chunk)), pass_alone(seq, chunk))
    steps = 0
    while seq.prefilling:
        with pytest.raises(ValueError, match="prefilling"):
            engine.step([running, seq])
        engine.step([running], prefill=[(seq, 1 + steps % 9)])
        steps += 1
    assert steps > 50 and 0 < len(alone) < steps and min(alone) > 1
    while not seq.finished:
        engine.step([running, seq])
    engine.release(seq)
    assert seq.output_ids == expected
    assert decode(engine, running) == expected_other


@pytest.mark.skipif(native.missing() is not None, reason=str(native.missing()))
@pytest.mark.parametrize("tiny_model", [lambda: tiny_llama(max_positions=2048), tiny_gemma3], ids=["llama", "gemma3"])
def test_on_the_native_decoder_every_chunk_rides(tiny_model):
    """The native decoder computes real rows only and scores the decode rows only (logit_rows), so a chunk wider
    than the decode rows rides in their pass, never a pass of its own, and decodes what one pass decodes (Gemma 3:
    its sliding-window layers see their window from a riding row too)."""
    model = tiny_model()
    apply(model, "int4")
    target = Target(model)
    assert target.packed_decoder
    prompt, other = [(7 * i) % 250 + 3 for i in range(300)], [(5 * i) % 250 + 3 for i in range(40)]
    generation = GenerationConfig(NEW, stop_on_eos=False)
    alone = engine_for(target, "prompt-lookup", None)
    expected = decode(alone, alone.start(prompt, SamplingConfig(), generation))
    engine = engine_for(target, "prompt-lookup", None)
    running = engine.start(other, SamplingConfig(), GenerationConfig(200, stop_on_eos=False))
    seq = engine.admit(prompt, SamplingConfig(), generation)
    passes = []
    engine._prefill_pass = lambda seq, chunk: passes.append(len(chunk))
    steps = 0
    while seq.prefilling:
        engine.step([running], prefill=[(seq, 1 + steps % 9)])
        steps += 1
    assert steps > 50 and passes == []
    while not seq.finished:
        engine.step([running, seq])
    assert seq.output_ids == expected


def test_eagle_gets_every_prefill_hidden_state(tiny_target, tiny_tokenizer, tiny_draft_dir):
    prompt = long_prompt(tiny_tokenizer, 300)
    one_pass = engine_for(tiny_target, "eagle", tiny_draft_dir)
    whole = one_pass.start(prompt, SamplingConfig(), GenerationConfig(4)).ctx.hidden
    engine = engine_for(tiny_target, "eagle", tiny_draft_dir)
    parts = chunked(engine, prompt, SamplingConfig(), GenerationConfig(4), 64).ctx.hidden
    assert whole.shape == parts.shape == (len(prompt) - 1, tiny_target.config.hidden_size)
    torch.testing.assert_close(parts, whole, rtol=1e-4, atol=1e-5)


def test_leaving_frees_the_row_and_its_kv(tiny_target, tiny_tokenizer, tiny_draft_dir):
    """A sequence's KV follows its own need and is freed when it leaves: memory goes back to its baseline after
    a long request, and a short row next to it is not resized."""
    engine = engine_for(tiny_target, "prompt-lookup", tiny_draft_dir, max_batch=3)
    short = engine.start(long_prompt(tiny_tokenizer, 20), SamplingConfig(), GenerationConfig(200))
    engine.step([short])
    baseline = engine.cache.nbytes
    short_slots = engine.cache.row_view(short.ctx.row, 10**6)[0][0].shape[1]
    prompt = long_prompt(tiny_tokenizer, 700)
    aborted = engine.admit(prompt, SamplingConfig(), GenerationConfig(NEW))
    engine.prefill_chunk(aborted, 100)
    engine.release(aborted)  # cancelled mid-prefill
    assert aborted.finish_reason == "abort" and engine.cache.nbytes == baseline
    long = engine.start(prompt, SamplingConfig(), GenerationConfig(NEW, stop_on_eos=False))
    while not long.finished:
        engine.step([short, long])
    assert engine.cache.nbytes >= baseline + (700 + NEW) * engine.kv_bytes(1, GenerationConfig(1)) // 66
    assert engine.cache.row_view(short.ctx.row, 10**6)[0][0].shape[1] == short_slots
    engine.release(long)
    assert engine.cache.nbytes == baseline
    engine.release(short)
    assert engine.cache.nbytes == 0 and engine._free_rows == [0, 1, 2]


def test_a_cancelled_request_stops_at_the_next_chunk(tiny_target, tiny_tokenizer):
    """The scheduler prefills a chunk per round; a request cancelled mid-prefill leaves before the next one."""
    service = tiny_service(tiny_target, prefill_chunk=64)
    scheduler, loop = service.scheduler, asyncio.new_event_loop()
    try:
        prompt = tuple(long_prompt(tiny_tokenizer, 700))
        ticket = Ticket(Job(prompt, SamplingConfig(), GenerationConfig(8), "prompt-lookup"), loop)
        scheduler.submit(ticket)
        scheduler._round()  # admits it and prefills its first chunk (the worker thread is not started)
        (slot,) = scheduler._active
        assert slot.seq.prefilled == 64 and slot.seq.prefilling
        ticket.cancel()
        scheduler._round()
        assert scheduler.active == 0 and scheduler.kv_reserved == 0
        assert slot.seq.prefilled == 64 and scheduler.engine.cache.nbytes == 0
    finally:
        loop.close()
