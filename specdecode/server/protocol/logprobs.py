"""The engine's per-token logprobs in OpenAI's two response shapes (completions' parallel lists, chat's content
entries). A token's text is its own decoding; chat entries also carry its UTF-8 bytes."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from specdecode.core.logprobs import TokenLogprob
from specdecode.server.protocol import schemas as s

TokenText = Callable[[int], str]


def completion_logprobs(entries: Sequence[TokenLogprob], token_text: TokenText, offset: int = 0,
                        lead: int | None = None) -> s.CompletionLogprobs:
    """offset: characters of the completion before these tokens (a stream's earlier chunks); lead: a token before
    them that has no logprob (an echoed prompt's first: nothing before it scores it), listed with nulls as
    OpenAI lists it."""
    leading = [] if lead is None else [lead]
    tokens = [token_text(token) for token in leading] + [token_text(entry.token) for entry in entries]
    offsets = []
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    tops: list[dict[str, float] | None] = [None] * len(leading)
    tops += [_by_text(entry.top, token_text) for entry in entries]
    logprobs: list[float | None] = [None] * len(leading)
    logprobs += [entry.logprob for entry in entries]
    return s.CompletionLogprobs(tokens=tokens, token_logprobs=logprobs,
                                top_logprobs=tops if any(entry.top for entry in entries) else None, text_offset=offsets)


def _by_text(top: Sequence[tuple[int, float]], token_text: TokenText) -> dict[str, float]:
    """Completions' top-N as {text: logprob}: tokens whose texts are alike (byte pieces that each show as "\ufffd")
    share one key, which keeps the likeliest's logprob (top is most likely first)."""
    out: dict[str, float] = {}
    for token, logprob in top:
        out.setdefault(token_text(token), logprob)
    return out


def chat_logprobs(entries: Sequence[TokenLogprob], token_text: TokenText) -> s.ChatLogprobs:
    def top(token: int, logprob: float) -> s.TopLogprob:
        text = token_text(token)
        return s.TopLogprob(token=text, logprob=logprob, bytes=list(text.encode("utf-8")))

    content = [s.TokenLogprob(**top(entry.token, entry.logprob).model_dump(),
                              top_logprobs=[top(t, lp) for t, lp in entry.top]) for entry in entries]
    return s.ChatLogprobs(content=content)
