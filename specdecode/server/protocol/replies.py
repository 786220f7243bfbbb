"""Response bodies and server-sent events for one request's choices (n per prompt, over a batch of prompts).

Every choice is a ticket of its own (one row of the engine); this module waits for them and writes what OpenAI
writes: one body with the choices in order (`index` = prompt x n + choice), or one stream whose chunks each
carry one choice's `index`, ending with `[DONE]` once every choice has finished. A choice that fails ends the
whole request with its error, as one answer cannot be half an error.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel

from specdecode.server.protocol import schemas as s
from specdecode.server.protocol.errors import APIError
from specdecode.server.protocol.logprobs import chat_logprobs, completion_logprobs
from specdecode.server.protocol.tools import Call, CallReader, Reading, read_calls
from specdecode.server.scheduling.scheduler import (
    Event,
    Failed,
    Finished,
    PromptLogprobs,
    RequestStats,
    TextDelta,
    Ticket,
)


@dataclass(frozen=True)
class Choice:
    """One choice's ticket and what leads its text (`echo`: the prompt's text; else ""). lead: the prompt's first
    token where the echoed prompt's logprobs are asked for (they come as a PromptLogprobs event, which the
    echoed text then waits for); None otherwise."""

    ticket: Ticket
    echo: str = ""
    lead: int | None = None


class Reply:
    """Builds one choice's bodies (all choices of a request share its id and timestamp: see `sibling`). calls: how
    tool calls are read out of the text (a chat request offered tools), None: the text is content."""

    def __init__(self, model: str, chat: bool, token_text: Callable[[int], str], index: int = 0,
                 id: str | None = None, created: int | None = None, calls: Reading | None = None,
                 stops: frozenset[str | int] = frozenset()):
        self.model, self.chat, self.token_text, self.index = model, chat, token_text, index
        self.id = id or ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time()) if created is None else created
        self.offset = 0  # characters of this choice's token text sent so far (completions' text_offset)
        self.calls = calls
        self.stops = stops  # the request's stop strings and stop tokens: the stop reasons a choice may name
        self.reader = CallReader(calls) if calls is not None else None  # this choice's stream's calls

    def sibling(self, index: int) -> Reply:
        return Reply(self.model, self.chat, self.token_text, index, self.id, self.created, self.calls, self.stops)

    def _head(self) -> dict:
        return {"id": self.id, "created": self.created, "model": self.model}

    def choice(self, text: str, event: Finished, logprobs: list | None,
               lead: int | None = None) -> s.ChatChoice | s.CompletionChoice:
        if self.chat:
            content, calls = read_calls(self.calls, text) if self.calls is not None else (text, [])
            message = s.AssistantMessage(content=content, tool_calls=[call.reply() for call in calls] or None)
            return s.ChatChoice(index=self.index, message=message,
                                finish_reason=_finish(event.finish_reason, bool(calls)),
                                logprobs=self._chat_logprobs(logprobs), stop_reason=self._told(event.stop_reason))
        return s.CompletionChoice(index=self.index, text=text, finish_reason=event.finish_reason,
                                  logprobs=self._completion_logprobs(logprobs, lead),
                                  stop_reason=self._told(event.stop_reason))

    def whole(self, choices: Sequence[s.ChatChoice | s.CompletionChoice], usage: s.Usage) -> dict:
        if self.chat:
            return _dump(s.ChatCompletion(**self._head(), choices=list(choices), usage=usage))
        return _dump(s.Completion(**self._head(), choices=list(choices), usage=usage))

    def chunk(self, text: str, finish_reason: str | None = None, role: str | None = None,
              logprobs=None, lead: int | None = None, call: s.CallDelta | None = None,
              stop_reason: str | int | None = None) -> dict:
        if self.chat:
            delta = s.Delta(role=role, content=None if call else text if role is None else "",
                            tool_calls=[call] if call else None)
            choice = s.ChatChunkChoice(index=self.index, delta=delta, finish_reason=finish_reason,
                                       logprobs=self._chat_logprobs(logprobs), stop_reason=stop_reason)
            return _dump(s.ChatCompletionChunk(**self._head(), choices=[choice]))
        choice = s.CompletionChoice(index=self.index, text=text, finish_reason=finish_reason,
                                    logprobs=self._completion_logprobs(logprobs, lead), stop_reason=stop_reason)
        return _dump(s.Completion(**self._head(), choices=[choice]))

    def pieces(self, event: TextDelta) -> list[dict]:
        """The chunks of a step's text: its content, and with tools, each call that closed (the step's logprobs
        ride the first chunk, or a chunk of their own while the text is held)."""
        if self.reader is None:
            return [self.chunk(text=event.text, logprobs=event.logprobs)] if event.text or event.logprobs else []
        return self._read(self.reader.feed(event.text), event.logprobs)

    def finished(self, event: Finished) -> list[dict]:
        """The last chunks: what a tool-call reader held, then the finish reason."""
        held = self._read(self.reader.close(), None) if self.reader is not None else []
        made = self.reader is not None and self.reader.calls > 0
        return [*held, self.chunk(text="", finish_reason=_finish(event.finish_reason, made),
                                  stop_reason=self._told(event.stop_reason))]

    def _read(self, pieces: list[str | Call], logprobs) -> list[dict]:
        assert self.reader is not None
        chunks, index = [], self.reader.calls - sum(isinstance(piece, Call) for piece in pieces)  # the first's
        for piece in pieces:
            if isinstance(piece, str):
                chunks.append(self.chunk(text=piece, logprobs=logprobs))
            else:
                call = s.CallDelta(index=index, **piece.reply().model_dump())
                chunks.append(self.chunk(text="", logprobs=logprobs, call=call))
                index += 1
            logprobs = None
        if logprobs:
            chunks.append(self.chunk(text="", logprobs=logprobs))
        return chunks

    def traced(self, event: TextDelta) -> list[dict]:
        """The event's chunk with its `speculation` field (s.SpeculationTrace); with tools, its content's, then a
        chunk for each call that closed."""
        pieces = self.reader.feed(event.text) if self.reader is not None else [event.text]
        calls = self._read([piece for piece in pieces if isinstance(piece, Call)], None) if self.reader else []
        body = self.chunk(text="".join(piece for piece in pieces if isinstance(piece, str)), logprobs=event.logprobs)
        step = event.trace
        assert step is not None and len(step.origins) == len(event.token_ids)
        logprobs = event.logprobs or ()
        tokens = [s.TracedToken(id=token, text=self.token_text(token), origin=origin, position=i + 1,
                                logprob=logprobs[i].logprob if logprobs else None)
                  for i, (token, origin) in enumerate(zip(event.token_ids, step.origins))]
        trace = s.SpeculationTrace(k=step.k, drafted=step.depth, accepted=step.accepted, tokens=tokens)
        body["speculation"] = trace.model_dump(exclude_none=True)
        return [body, *calls]

    def _told(self, reason: str | int | None) -> str | int | None:
        """vLLM's stop_reason where it is one the request gave (not one of the server's own: a tool call's end, a
        filled middle's end tokens)."""
        return reason if reason in self.stops else None

    def _chat_logprobs(self, entries) -> s.ChatLogprobs | None:
        return None if entries is None else chat_logprobs(entries, self.token_text)

    def _completion_logprobs(self, entries, lead: int | None = None) -> s.CompletionLogprobs | None:
        if entries is None:
            return None
        out = completion_logprobs(entries, self.token_text, self.offset, lead)
        self.offset += sum(len(token) for token in out.tokens)
        return out

    def usage_chunk(self, usage: s.Usage) -> dict:
        model = s.ChatCompletionChunk if self.chat else s.Completion
        return model(**self._head(), choices=[], usage=usage).model_dump()


async def whole(choices: Sequence[Choice], reply: Reply, n: int, logprobs: bool) -> dict:
    """The request's body once every choice has finished; a failed choice raises its APIError."""
    tasks = [asyncio.create_task(collect(choice.ticket)) for choice in choices]
    try:
        results = await asyncio.gather(*tasks)
    finally:
        for task in tasks:  # a failed choice leaves the others' collectors waiting: end them
            task.cancel()
    bodies = [reply.sibling(i).choice(choice.echo + text, event, entries if logprobs else None, choice.lead)
              for i, (choice, (text, entries, event)) in enumerate(zip(choices, results))]
    return reply.whole(bodies, usage([event.stats for _, _, event in results], n))


async def collect(ticket: Ticket) -> tuple[str, list, Finished]:
    """The choice's text, its logprob entries (an echoed prompt's first) and its Finished event."""
    pieces: list[str] = []
    entries: list = []
    while True:
        event = await ticket.next()
        if isinstance(event, TextDelta):
            pieces.append(event.text)
            entries.extend(event.logprobs or ())
        elif isinstance(event, PromptLogprobs):
            entries[:0] = event.entries
        elif isinstance(event, Finished):
            return "".join(pieces), entries, event
        else:
            raise _error(event)


async def sse(choices: Sequence[Choice], reply: Reply, n: int, include_usage: bool,
              trace: bool = False) -> AsyncIterator[str]:
    """Server-sent events in OpenAI's chunk format, ending with [DONE]. On disconnect Starlette cancels this
    generator; `finally` tells the scheduler, which frees the rows before its next step. trace: every step's
    tokens get a chunk with their origins, even while their text is held back (a stop string may begin there)."""
    replies = [reply.sibling(i) for i in range(len(choices))]
    try:
        for choice, each in zip(choices, replies):
            if each.chat:
                yield data(each.chunk(role="assistant", text=""))
            elif choice.echo and choice.lead is None:
                yield data(each.chunk(text=choice.echo))
        finished: list[RequestStats | None] = [None] * len(choices)
        async for i, event in _merged([choice.ticket for choice in choices]):
            each = replies[i]
            if isinstance(event, PromptLogprobs):
                yield data(each.chunk(text=choices[i].echo, logprobs=event.entries, lead=choices[i].lead))
            elif isinstance(event, TextDelta):
                for body in each.traced(event) if trace and event.token_ids else each.pieces(event):
                    yield data(body)
            elif isinstance(event, Finished):
                for body in each.finished(event):
                    yield data(body)
                finished[i] = event.stats
                if all(stats is not None for stats in finished):
                    if include_usage:
                        yield data(reply.usage_chunk(usage(finished, n)))  # type: ignore[arg-type]
                    break
            else:
                yield data(_error(event).body())
                break
        yield "data: [DONE]\n\n"
    finally:
        for choice in choices:
            choice.ticket.cancel()


async def _merged(tickets: Sequence[Ticket]) -> AsyncIterator[tuple[int, Event]]:
    """(choice index, event) as the tickets post them; one ticket is read directly (no task per event)."""
    if len(tickets) == 1:
        while True:
            yield 0, await tickets[0].next()
    queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()

    async def forward(i: int, ticket: Ticket) -> None:
        while True:
            event = await ticket.next()
            queue.put_nowait((i, event))
            if isinstance(event, Finished | Failed):
                return

    tasks = [asyncio.create_task(forward(i, ticket)) for i, ticket in enumerate(tickets)]
    try:
        while True:
            yield await queue.get()
    finally:
        for task in tasks:
            task.cancel()


def _error(event: Failed) -> APIError:
    return APIError(event.status, event.message, event.kind, code=event.code)


def data(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def _dump(model: BaseModel) -> dict:
    """The body, less a usage or a message's tool calls that are not there (OpenAI leaves them out), and a
    stop_reason only where a stop string or token ended the text (vLLM's field; the bytes are OpenAI's otherwise)."""
    body = model.model_dump()
    if body.get("usage") is None:
        body.pop("usage", None)
    for choice in body["choices"]:
        if choice.get("stop_reason", 0) is None:
            del choice["stop_reason"]
        message = choice.get("message") or choice.get("delta") or {}
        if "tool_calls" in message and message["tool_calls"] is None:
            del message["tool_calls"]
    return body


def _finish(reason: str | None, made_calls: bool) -> str | None:
    """OpenAI's finish reason: "tool_calls" for a reply that ends having made calls."""
    return "tool_calls" if made_calls and reason == "stop" else reason


def usage(stats: Sequence[RequestStats], n: int = 1) -> s.Usage:
    """The request's usage over its choices, in order (n per prompt). As OpenAI counts it, each prompt's tokens
    once (and its cached tokens, from its first choice) and every choice's completion tokens; tau and the
    acceptance rate over all choices' passes and drafts, so they are what one choice's would be for n = 1."""
    firsts = stats[::n]
    prompt = sum(one.prompt_tokens for one in firsts)
    completion = sum(one.completion_tokens for one in stats)
    passes = sum(one.target_passes for one in stats)
    proposed = sum(one.proposed for one in stats)
    tau = sum(one.tau * one.target_passes for one in stats) / passes if passes else 0.0
    rate = sum(one.acceptance_rate * one.proposed for one in stats) / proposed if proposed else 0.0
    drafters = list(dict.fromkeys(one.drafter for one in stats))
    return s.Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                   tau=round(tau, 4), target_passes=passes, acceptance_rate=round(rate, 4),
                   drafter=",".join(drafters), forced_tokens=sum(one.forced for one in stats),
                   prompt_tokens_details=s.PromptTokensDetails(cached_tokens=sum(one.cached for one in firsts)))
