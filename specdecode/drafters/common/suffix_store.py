"""Earlier token sequences, indexed to find the longest suffix match of a context and what followed it.

SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975) keeps a suffix tree over earlier outputs and one over the
current prompt, finds the deepest node matching the end of the context, and drafts from the counts of the
continuations below it. Here the same question is answered without a tree:

`TokenIndex` lays sequences end to end in one buffer (SEP between them) with, for each key length n in KEYS, a
hash chain as in zlib's LZ77 matcher: `latest[n][key]` is the newest position that follows those n tokens and
`prev[n][p]` the previous position that followed the same n tokens. Appending a token costs len(KEYS) dict
updates. A lookup takes the longest key length that has any occurrence, walks at most `candidates` links of its
chain (newest first), extends each candidate backwards to its exact match length (at most `max_match`
tokens, the paper's tree depth) and keeps the occurrences of the longest match. The continuations after them,
merged into a trie with counts (`continuation_trie`), are the suffix tree's subtree under the matched node,
counted over the newest `candidates` occurrences (recent text counts, old text does not crowd it out).

`SuffixStore` is a TokenIndex over finished sequences under a token cap: the oldest sequences are evicted
(their chain heads are removed, and a chain ends at the first evicted position), and the buffer's dead prefix is
cut once it is half the buffer. Memory: ~160 bytes per stored token (measured with tracemalloc on 65k tokens).

Why hand-written: vLLM's suffix decoding comes from `arctic-inference`, whose suffix tree is C++
(`csrc/suffix_decoding/`). Its current releases are sdists only (the one wheel on PyPI, 0.0.4, predates suffix
decoding); building one needs cmake, ninja, nanobind, grpcio-tools, a pinned protobuf and torch >= 2.10 in an
isolated build environment (a second torch download), and it installs vLLM plugins and a gRPC server besides
the tree. That does not fit an offline, CPU-first package whose dependencies are pinned wheels; the part we
need is ~200 lines of Python.
"""
from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

SEP = -1  # between sequences in a buffer: never equals a token, so matches and continuations stop there
KEYS = (8, 4, 2, 1)  # hash-chain key lengths, longest first: a long key finds a long match among few occurrences


def _key(tokens: Sequence[int], start: int, n: int) -> int:
    return hash(tuple(tokens[start : start + n]))


class TokenIndex:
    """Sequences in one buffer with hash chains over their last n tokens (module docstring). Positions are
    global: they keep their meaning when a prefix of the buffer is dropped (`offset` is buf[0]'s position,
    positions before `alive` are evicted)."""

    def __init__(self, max_match: int = 32, candidates: int = 32, keys: tuple[int, ...] = KEYS):
        if max_match < 1 or candidates < 1 or not keys or min(keys) < 1:
            raise ValueError(f"need max_match, candidates and key lengths >= 1, got {max_match}, {candidates}, {keys}")
        self.max_match, self.candidates = max_match, candidates
        self.keys = tuple(sorted(set(keys), reverse=True))
        self.buf = array("q")
        self.prev = {n: array("q") for n in self.keys}
        self.latest: dict[int, dict[int, int]] = {n: {} for n in self.keys}
        self.offset = 0  # global position of buf[0]
        self.alive = 0  # first position not evicted
        self.start = 0  # global position where the sequence being appended began

    @property
    def end(self) -> int:
        return self.offset + len(self.buf)

    def token(self, position: int) -> int:
        return self.buf[position - self.offset]

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens to the current sequence; each becomes the continuation of the n tokens before it."""
        for token in tokens:
            p, i = self.end, len(self.buf)
            self.buf.append(token)
            for n in self.keys:
                link = -1
                if p - n >= self.start:  # the key lies inside the current sequence
                    key = _key(self.buf, i - n, n)
                    chain = self.latest[n]
                    link = chain.get(key, -1)
                    chain[key] = p
                self.prev[n].append(link)

    def close(self) -> None:
        """End the current sequence: nothing matches or continues across the separator."""
        self.buf.append(SEP)
        for n in self.keys:
            self.prev[n].append(-1)
        self.start = self.end

    def find(self, context: Sequence[int]) -> tuple[int, list[int]]:
        """(length of the longest match of the end of `context`, at most max_match; the positions right after
        its occurrences, newest first, among the newest `candidates` of the longest key that occurs);
        (0, []) when not even the last token occurred."""
        for n in self.keys:
            if len(context) < n:
                continue
            p = self.latest[n].get(_key(context, len(context) - n, n), -1)
            best, found = 0, []
            for _ in range(self.candidates):
                if p < self.alive:
                    break
                length = self._match_length(p, context)
                if length > best:
                    best, found = length, [p]
                elif length == best and length:
                    found.append(p)
                p = self.prev[n][p - self.offset]
            if best:  # (0 only on a hash collision: try a shorter key)
                return best, found
        return 0, []

    def _match_length(self, position: int, context: Sequence[int]) -> int:
        """How many tokens before `position` equal the end of `context` (at most max_match)."""
        limit = min(self.max_match, len(context), position - self.alive)
        buf, base, length = self.buf, position - self.offset, 0
        while length < limit and buf[base - length - 1] == context[-length - 1]:  # SEP never equals a token
            length += 1
        return length

    def continuation(self, position: int, depth: int) -> list[int]:
        """Up to `depth` tokens from `position`, stopping at the end of their sequence."""
        i = position - self.offset
        out = self.buf[i : i + depth].tolist()
        return out[: out.index(SEP)] if SEP in out else out


@dataclass(frozen=True)
class StoreStats:
    """A store's size and how drafting used it (cumulative counts)."""

    tokens: int  # tokens held (separators not counted)
    sequences: int
    capacity: int  # the token cap
    evicted: int  # sequences evicted so far
    drafts: int = 0  # non-empty drafts proposed by the drafter that owns the store
    hits: int = 0  # ... of which drew on the store (its match was at least as long as the request's own)


class SuffixStore:
    """Finished sequences (prompt + output) shared by every sequence of one drafter, oldest evicted past
    `capacity` tokens. A sequence longer than the cap keeps its last `capacity` tokens."""

    def __init__(self, capacity: int, max_match: int = 32, candidates: int = 32, keys: tuple[int, ...] = KEYS):
        if capacity < 1:
            raise ValueError(f"the store needs a capacity of at least one token, got {capacity}")
        self.capacity = capacity
        self.index = TokenIndex(max_match, candidates, keys)
        self.spans: deque[tuple[int, int]] = deque()  # [start, end) of each stored sequence, oldest first
        self.tokens = 0
        self.evicted = 0

    def insert(self, tokens: Sequence[int]) -> None:
        tokens = list(tokens)[-self.capacity :]
        if not tokens:
            return
        while self.spans and self.tokens + len(tokens) > self.capacity:
            self._evict_oldest()
        start = self.index.end
        self.index.extend(tokens)
        self.index.close()
        self.spans.append((start, start + len(tokens)))
        self.tokens += len(tokens)

    def find(self, context: Sequence[int]) -> tuple[int, list[int]]:
        return self.index.find(context)

    def continuation(self, position: int, depth: int) -> list[int]:
        return self.index.continuation(position, depth)

    def stats(self) -> StoreStats:
        return StoreStats(self.tokens, len(self.spans), self.capacity, self.evicted)

    def _evict_oldest(self) -> None:
        index = self.index
        start, end = self.spans.popleft()
        for n in index.keys:  # drop the chain heads that point into it (older links end at `alive`)
            chain = index.latest[n]
            for p in range(start + n, end):
                key = _key(index.buf, p - n - index.offset, n)
                if chain.get(key) == p:
                    del chain[key]
        index.alive = end + 1  # past its separator
        self.tokens -= end - start
        self.evicted += 1
        dead = index.alive - index.offset
        if dead * 2 >= len(index.buf):  # amortised: each token is copied O(1) times
            del index.buf[:dead]
            for n in index.keys:
                del index.prev[n][:dead]
            index.offset = index.alive


@dataclass
class TrieNode:
    token: int
    parent: int  # index in the trie's node list, -1 for a child of the root
    depth: int
    count: int = 0
    children: dict[int, int] = field(default_factory=dict)  # token -> node


def continuation_trie(continuations: Sequence[Sequence[int]]) -> list[TrieNode]:
    """Merge continuations into a trie with counts (how many continuations pass through each node), nodes in
    insertion order (a parent before its children).

    Example: [[5, 6], [5, 7], [5, 6], [8]] -> 5 (count 3) -> 6 (2), 7 (1); 8 (1)."""
    nodes: list[TrieNode] = []
    roots: dict[int, int] = {}
    for chain in continuations:
        parent, children = -1, roots
        for token in chain:
            node = children.get(token)
            if node is None:
                node = len(nodes)
                children[token] = node
                nodes.append(TrieNode(token, parent, 1 if parent < 0 else nodes[parent].depth + 1))
            nodes[node].count += 1
            parent, children = node, nodes[node].children
    return nodes
