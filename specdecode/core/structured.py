"""Structured outputs: a grammar (JSON schema, any JSON object, regex, choice, Lark/GBNF grammar) that the output
must match, enforced at every node of every draft tree, and used as a drafter where it admits one continuation.

Lossless under the constraint: the target's distribution at a node is its logits masked by the grammar state that
node's path reaches (and renormalised), q gets the same mask, and draft nodes the grammar rejects are cut before
the pass. The verifiers then see an ordinary draft and ordinary (masked) scores.

The grammar engine is llguidance (PyPI `llguidance`): no dependencies, the token-level forced continuations
(`compute_ff_tokens`) that grammar drafting needs, rollback for walking a tree, and Lark/GBNF/JSON schema/regex
front ends. xgrammar computes masks faster, but llguidance's mask is a small fraction of a percent of a CPU
decoding step (docs/structured.md, "Choice of grammar engine"), and xgrammar brings triton and tvm-ffi and
forces strings rather than tokens.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import llguidance
import llguidance.hf
import torch

from specdecode.config import Structure
from specdecode.core.drafting import Draft
from specdecode.core.trees import children_of
from specdecode.errors import ConfigError, StructureError

# JSON is laid out as json.dumps writes it ({"a": 1, "b": [2, 3]}): one layout, so separators are forced tokens,
# and a model cannot loop on whitespace (flexible whitespace lets it emit newlines until max_tokens). A schema's own
# "x-guidance" options override these.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_NEVER_UTF8 = frozenset({0xC0, 0xC1, *range(0xF5, 0x100)})  # bytes no UTF-8 text holds (0xFF marks llguidance's
# special tokens)
CHECK_STEPS = 24  # tokens a structure is walked for when it is checked: the grammar engine's limits show early


def grammar_text(structure: Structure) -> str:
    """The llguidance grammar for a structure; text its front end cannot read (a schema that is not JSON, a GBNF
    grammar that does not parse) is a ConfigError. Other errors surface when the grammar compiles (`Grammars`)."""
    try:
        if structure.kind in ("json_object", "json_schema"):
            schema = '{"type": "object"}' if structure.kind == "json_object" else structure.text
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)  # type: ignore[arg-type]
        return llguidance.grammar_from(structure.kind, structure.text)  # regex, choice, grammar (Lark or GBNF)
    except ValueError as error:
        raise ConfigError(f"invalid {structure.kind.replace('_', ' ')}: {_why(error)}") from None


class Grammars:
    """Compiles structures for one tokenizer. Wrapping the tokenizer costs from half a second to a few seconds on a
    2-core CPU, growing with the vocabulary (docs/structured.md, "Choice of grammar engine"), so it is built once,
    on first use, under a lock (server handlers check requests on threads)."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: list[int]):
        self._hf, self.vocab_size, self.eos_ids = tokenizer, vocab_size, eos_ids
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._unproducible: frozenset[int] | None = None
        self._lock = threading.Lock()

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            return self._tokenizer_unlocked()

    def _tokenizer_unlocked(self) -> llguidance.LLTokenizer:
        if self._tokenizer is None:
            if self._hf is None:
                raise ConfigError("structured outputs need a model with a tokenizer")
            try:
                self._tokenizer = llguidance.hf.from_tokenizer(self._hf, n_vocab=self.vocab_size,
                                                                   eos_token=self.eos_ids or None)
            except ValueError as error:
                raise ConfigError(f"structured outputs do not support this tokenizer: {_why(error)}") from None
        return self._tokenizer

    def check(self, structure: Structure) -> None:
        """An invalid schema, regex or grammar is a ConfigError naming the problem (the server's 400); one this
        model cannot follow is a StructureError. The structure is walked for its first CHECK_STEPS tokens (the
        forced ones, else the lowest allowed id): the grammar engine's limits (a choice of more than 2,000
        alternatives, a recursion that never ends) and text the tokenizer cannot produce show there, in the
        request's own checks rather than in a step."""
        constraint = self.constraint(structure, 0)
        matcher = constraint.matcher
        chose = False  # the walk took one of several tokens: what follows is one branch, not the structure
        for _ in range(CHECK_STEPS):
            try:
                mask = constraint.mask()
            except UnproducibleText:
                if chose:  # a branch a generation may never take; if it does, that request ends with the error
                    return
                raise
            if matcher.is_stopped():
                return
            chose = chose or not _single(mask)
            forced = matcher.compute_ff_tokens()
            _raise_if_error(matcher)
            allowed = allowed_tokens(mask[None], self.vocab_size)[0].nonzero().flatten().tolist()
            token = forced[0] if forced else next((t for t in allowed if t not in constraint.eos_ids), None)
            if token is None:
                return  # only the end: the walk is over
            if not matcher.consume_token(token):
                _raise_if_error(matcher)
                return

    def constraint(self, structure: Structure, grammar_draft: int) -> Constraint:
        tokenizer = self.tokenizer
        return Constraint(self._matcher(structure), self.vocab_size, tokenizer.eos_tokens or [tokenizer.eos_token],
                          grammar_draft, self.unproducible)

    @property
    def unproducible(self) -> frozenset[int]:
        """Bytes no token of this tokenizer holds: text that needs one cannot be generated. SmolLM2's vocabulary
        lacks 0xF1 and 0xF2 (the lead bytes of U+40000-U+BFFFF) and a few control characters; llguidance then
        forces the tokens of what is left of such text (its tokenizer drops those bytes), which the grammar
        rejects once committed."""
        with self._lock:
            if self._unproducible is None:
                seen: set[int] = set()
                tokenizer = self._tokenizer_unlocked()
                for token in range(tokenizer.vocab_size):
                    seen.update(tokenizer.decode_bytes([token]))
                self._unproducible = frozenset(range(256)) - seen - _NEVER_UTF8
            return self._unproducible

    def _matcher(self, structure: Structure) -> llguidance.LLMatcher:
        """A matcher at the start of the output; one that cannot start (its grammar does not compile, or it fails
        on this tokenizer) is a ConfigError."""
        what = f"invalid {structure.kind.replace('_', ' ')}"
        # the constructor compiles the grammar once and reports its errors through is_error (no separate validation)
        matcher = llguidance.LLMatcher(self.tokenizer, grammar_text(structure), log_level=0)
        if matcher.is_error():
            raise ConfigError(f"{what}: {_why(matcher.get_error())}")
        return matcher


@dataclass(frozen=True)
class Shaped:
    """A draft fitted to the grammar. draft: the drafter's nodes the grammar allows (renumbered, q masked and
    renormalised), then the forced chains. masks: [n + 1, words] int32 bitmask of allowed tokens, row 0 at the
    root, row i + 1 after node i. own: nodes 0..own-1 are the drafter's, the rest the grammar's."""

    draft: Draft
    masks: torch.Tensor  # [n + 1, ceil(vocab / 32)] int32
    own: int

    @property
    def forced(self) -> int:
        return len(self.draft) - self.own


class Constraint:
    """One sequence's grammar state: an llguidance matcher that has consumed the committed output."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int, eos_ids: list[int], grammar_draft: int,
                 unproducible: frozenset[int] = frozenset()):
        self.matcher, self.vocab_size, self.grammar_draft = matcher, vocab_size, grammar_draft
        self.eos_ids, self.eos_id = frozenset(eos_ids), eos_ids[0]
        self.words = (vocab_size + 31) // 32
        self.unproducible = unproducible  # bytes no token holds (Grammars.unproducible)

    @property
    def done(self) -> bool:
        """The grammar is complete and admits nothing more (its EOS is committed, or nothing can follow)."""
        return self.matcher.is_stopped()

    def shape(self, draft: Draft, room: int) -> Shaped:
        """Cut the drafter's tree to the grammar, hang forced chains under its leaves (at most grammar_draft tokens
        in all, no path deeper than `room`), and compute the mask at every node. The matcher is walked down each
        path and rolled back, so it ends where it began."""
        children = children_of(draft.parents)
        tokens: list[int] = []
        parents: list[int] = []
        origin: list[int] = []  # the drafter's node index of each kept node
        rows: list[torch.Tensor] = []
        leaves: list[tuple[int, int]] = []  # (kept index or -1 for the root, its consumed depth)

        def visit(node: int, index: int, depth: int) -> None:
            mask = self.mask()
            rows.append(mask)
            kept_any = False
            for child in children[node]:
                token = draft.tokens[child]
                if depth >= room or not _allowed(mask, token):
                    continue
                kept_any = True
                tokens.append(token)
                parents.append(index)
                origin.append(child)
                if token in self.eos_ids:  # the end: nothing follows it (and a matcher cannot roll back over it)
                    rows.append(self._eos_only())
                    continue
                self.matcher.consume_token(token)
                visit(child, len(tokens) - 1, depth + 1)
                self.matcher.rollback(1)
            if not kept_any:
                leaves.append((index, depth))

        visit(-1, -1, 0)
        own = len(tokens)
        budget = self.grammar_draft
        for leaf, depth in leaves:
            if budget <= 0:
                break
            path = _path(parents, leaf)
            self.matcher.consume_tokens([tokens[i] for i in path])
            forced = self.matcher.compute_ff_tokens()[: min(budget, room - depth)]
            parent, added = leaf, 0
            for token in forced:
                if token in self.eos_ids or not _allowed(rows[parent + 1], token):  # allowed: checked, not assumed
                    break
                self.matcher.consume_token(token)
                tokens.append(token)
                parents.append(parent)
                parent, added = len(tokens) - 1, added + 1
                rows.append(self.mask())
            budget -= added
            self.matcher.rollback(len(path) + added)
        # rows were appended in visiting order: root, then each kept node, then each forced node
        masks = torch.stack(rows) if rows else torch.empty(0, self.words, dtype=torch.int32)
        return Shaped(Draft(tuple(tokens), tuple(parents), self._q(draft, origin, tokens, parents, masks),
                            draft.aux), masks, own)

    def commit(self, tokens: list[int]) -> list[int]:
        """Advance over the committed tokens (masked choices, so the grammar accepts them); returns them cut after
        the one that completes the grammar, so a step that carried a token past the end (the EOS that the
        mask left as the only choice) commits what plain decoding would have."""
        for i, token in enumerate(tokens):
            if not self.matcher.consume_token(token):
                _raise_if_error(self.matcher)
                raise StructureError("the output cannot follow the structure from here")
            if self.matcher.is_stopped():
                return tokens[: i + 1]
        return tokens

    def mask(self) -> torch.Tensor:
        """[words] int32: the tokens the grammar allows next; EOS alone where it allows none (a grammar that
        cannot go on must still let the sequence end). A StructureError where the grammar engine broke a limit,
        or where the only text allowed needs a byte no token holds (the engine would force a wrong token)."""
        mask = torch.empty(self.words, dtype=torch.int32)
        self.matcher.unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * 4)
        _raise_if_error(self.matcher)
        if self.unproducible and _single(mask):
            forced = self.matcher.compute_ff_bytes()
            lacking = sorted({byte for byte in forced if byte in self.unproducible})
            if lacking:
                raise UnproducibleText(f"the structure needs {_describe(forced, lacking)}, which this model's "
                                       "tokenizer cannot produce")
        return mask if bool(mask.any()) else self._eos_only()

    def _eos_only(self) -> torch.Tensor:
        mask = torch.zeros(self.words, dtype=torch.int32)
        mask[self.eos_id // 32] = _bit(self.eos_id % 32)
        return mask

    def _q(self, draft: Draft, origin: list[int], tokens: list[int], parents: list[int],
           masks: torch.Tensor) -> torch.Tensor | None:
        """q for the kept nodes masked by their parents' states and renormalised; one-hot for forced nodes."""
        if draft.q is None:
            return None
        n = len(tokens)
        q = torch.zeros(n, draft.q.shape[-1], dtype=torch.float32)
        if origin:
            kept = draft.q[origin].float()  # [own, vocab]
            allowed = allowed_tokens(masks[[p + 1 for p in parents[: len(origin)]]], kept.shape[-1])
            kept = kept.masked_fill(~allowed, 0.0)
            q[: len(origin)] = kept / kept.sum(dim=-1, keepdim=True).clamp_min(1e-30)
        for i in range(len(origin), n):
            q[i, tokens[i]] = 1.0
        return q


def allowed_tokens(masks: torch.Tensor, vocab: int) -> torch.Tensor:
    """masks: [r, words] int32 bitmask -> [r, vocab] bool (bit j of word w allows token 32 w + j)."""
    bits = torch.arange(32, dtype=torch.int32)
    allowed = (masks.unsqueeze(-1) >> bits) & 1  # [r, words, 32]
    return allowed.reshape(masks.shape[0], -1)[:, :vocab].bool()


def mask_logits(logits: torch.Tensor, masks: torch.Tensor) -> None:
    """logits: [r, vocab], masks: [r, words]; disallowed tokens become -inf, in place (the target's outputs are
    inference tensors, written in inference mode)."""
    allowed = allowed_tokens(masks, logits.shape[-1]).to(logits.device)
    with torch.inference_mode():
        logits.masked_fill_(~allowed, float("-inf"))


def _allowed(mask: torch.Tensor, token: int) -> bool:
    word = int(mask[token // 32])
    return bool((word >> (token % 32)) & 1)


def _bit(j: int) -> int:
    """Bit j of an int32 word, as a signed value (bit 31 is negative)."""
    return (1 << j) - (1 << 32) if j == 31 else 1 << j


def _path(parents: list[int], node: int) -> list[int]:
    """Node indices from the root's child down to `node` (empty for the root, -1)."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]




def _why(error: object) -> str:
    """The grammar engine's error as one line: its first, and where that ends in a colon (a regex's "regex parse
    error:", whose lines below draw the place), the line that says what is wrong ("error: unclosed group")."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    line = lines[0] if lines else "unknown error"  # not first_line, which joins the drawing that follows a colon
    if line.endswith(":"):
        detail = next((rest.strip().removeprefix("error:").strip() for rest in str(error).splitlines()[1:]
                       if rest.strip().startswith("error:")), "")
        line = f"{line} {detail}" if detail else line.removesuffix(":")
    return line


# the grammar engine's limits (llguidance's ParserLimits), as its errors name them -> what they mean for a request
_LIMITS = (("max is 2000", "more than 2,000 alternatives at one point (properties, enum values or choices)"),
           ("Too many items", "more than 50,000 parser items in one step (a recursion that never ends, or a huge "
                              "alternation)"),
           ("fuel", "a regular expression too complex for the lexer"),
           ("lexer states", "more lexer states than the engine allows"))


class UnproducibleText(StructureError):
    """The grammar's only continuation needs a byte no token of the tokenizer holds."""


def _raise_if_error(matcher: llguidance.LLMatcher) -> None:
    """The matcher's error as a StructureError naming the limit it broke."""
    if not matcher.is_error():
        return
    reason = _why(matcher.get_error())
    limit = next((meaning for needle, meaning in _LIMITS if needle in reason), None)
    if limit is not None:
        raise StructureError(f"the structure is too large for the grammar engine: {limit} ({reason})")
    raise StructureError(f"the grammar engine cannot follow the structure: {reason}")


def _single(mask: torch.Tensor) -> bool:
    """Whether exactly one token is allowed (a forced continuation)."""
    nonzero = mask.nonzero()
    if nonzero.numel() != 1:
        return False
    word = int(mask[int(nonzero[0])]) & 0xFFFFFFFF  # bit 31 reads as a negative int32
    return word & (word - 1) == 0


def _describe(forced: bytes, lacking: list[int]) -> str:
    """The first character of the forced text that needs a lacking byte: 'U+8DE9B (bytes f2 8d ba 9b)'."""
    text = forced.decode("utf-8", errors="replace")
    for char in text:
        encoded = char.encode("utf-8", errors="surrogatepass")
        if any(byte in lacking for byte in encoded):
            if char == "\ufffd":
                break
            return f"U+{ord(char):04X} (bytes {encoded.hex(' ')})"
    return "the bytes " + " ".join(f"{byte:02x}" for byte in lacking)
