"""`draft-model`: an independent smaller causal LM with the same tokenizer drafts K tokens autoregressively
(Leviathan et al. 2023). It keeps its own rollback cache; after each step it re-feeds only the committed
tokens it has not seen (the longest common prefix with what it cached is kept).

On the CPU a draft ends where one more token no longer pays (row_budget.ChainBudget): the draft's top
probabilities estimate how far it will be accepted, and this machine's measured costs of a draft pass and of each
verify row price it; k is the most it drafts. A given `confidence` threshold ends drafts instead. Off the CPU
passes are flat and a draft is k tokens long. A seeded sampled sequence drafts k tokens too: its random draws
depend on its drafts, and a seed must give the same text whatever the timings (as `suffix` keeps such a sequence
off its shared store).

A row of that cache outlives its sequence with the tokens it holds, and a new sequence takes the free row whose
tokens share the longest prefix with its prompt, so the draft prefills only the rest: a chat's next turn, or
any request under the same system prompt (on a CPU a draft's prefill costs milliseconds a token: docs/drafters.md,
"draft-model"). Reusing them changes only which tokens are drafted, never the output."""
from __future__ import annotations

import json
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdecode.config import DrafterConfig, ModelConfig, SpecConfig
from specdecode.core.drafting import Draft, SequenceContext
from specdecode.core.pass_costs import ChainCostEstimate, measure_chain_costs
from specdecode.core.prefix_rows import KeptRows, RowChoice
from specdecode.core.target import Target
from specdecode.drafters.common.base import DrafterSpec, RowStateDrafter
from specdecode.drafters.common.eagle3_format import layout_of
from specdecode.drafters.common.head_io import FORMAT as HEAD_FORMAT
from specdecode.drafters.common.model_step import choose, feed_rows
from specdecode.drafters.common.row_budget import ChainBudget, ChainWalk
from specdecode.drafters.common.shortlist import ShortlistHead, shortlist_size
from specdecode.drafters.cross_tokenizer import CrossTokenizerDrafter
from specdecode.errors import ConfigError, OptionError
from specdecode.loading.formats import draft_format
from specdecode.loading.load import load_model


@dataclass
class _State:
    row: int
    cached: list[int] = field(default_factory=list)  # tokens whose KV the draft cache row holds, in order


def same_tokenizer(a, b) -> bool:
    return a is b or (a.get_vocab() == b.get_vocab())


class DraftModel(RowStateDrafter):
    name = "draft-model"
    state_type = _State

    def __init__(self, draft: Target, target: Target, confidence: float = 0.0, budget: ChainBudget | None = None):
        if not same_tokenizer(draft.tokenizer, target.tokenizer):
            raise ConfigError(
                "the draft model's tokenizer differs from the target's; cross-tokenizer drafting is not supported"
            )
        self.draft, self.vocab, self.confidence, self.budget = draft, target.vocab_size, confidence, budget
        head = draft.model.get_output_embeddings()
        self.shortlist = head if isinstance(head, ShortlistHead) else None
        self.cache = draft.new_cache(rows=1, capacity=256)
        self._held = KeptRows(self.cache)  # free rows that hold a finished sequence's KV, left longest ago first
        super().__init__()

    def start(self, seq: SequenceContext) -> None:
        """The free row prefix_rows.choose_row picks (a new one when none is free); a row that another
        conversation's next turn continues stays its, and this one starts from a copy of the prefix they share
        (a dynamic cache; a static one's row is taken whole)."""
        self._pool.grow()
        choice = self._held.choose(self._pool.free, seq.tokens, seq.cache_salt)
        if choice.source is not None and self.cache.static:
            choice = RowChoice(choice.source, choice.shared)
        self._pool.free.remove(choice.row)
        cached = self._held.take(choice.row)  # draft_rows keeps what the prompt shares
        if choice.source is not None:
            self.cache.copy_prefix(choice.source, choice.row, choice.shared)
            cached = self._held.tokens(choice.source)[: choice.shared]
        elif choice.evict:
            cached = []
        seq.state = _State(choice.row, cached)

    def finish(self, seq: SequenceContext) -> None:
        if seq.state is not None:
            self._held.keep(seq.state.row, seq.cache_salt, seq.state.cached)
        super().finish(seq)

    def forget_prefixes(self) -> None:
        self._held.release_all()

    def kv_bytes_per_slot(self) -> int:
        return self.draft.kv_bytes_per_slot

    def parked_bytes(self) -> int:
        return self._held.nbytes()

    def evict_parked(self) -> bool:
        return self._held.release_oldest()

    def propose(self, seqs: Sequence[SequenceContext]) -> list[Draft]:
        return self.draft_rows(seqs)

    def _forward(self, states: Sequence[_State], new: Sequence[list[int]]) -> torch.Tensor:
        """Feed new[i] after states[i].cached, all rows in one pass; returns logits [rows, draft_vocab] after each
        row's last token."""
        if self.shortlist is not None:
            for ids in new:
                self.shortlist.add(ids)
        return feed_rows(self.draft, self.cache, [state.row for state in states], self._pool.rows,
                         [state.cached for state in states], list(new))

    def draft_after(self, seq: SequenceContext, seed: Sequence[int] = (), reaches: Sequence[float] = ()) -> Draft:
        """One sequence's chain led by a seed (draft_rows)."""
        return self.draft_rows([seq], [seed], [reaches])[0]

    def draft_rows(self, seqs: Sequence[SequenceContext], seeds: Sequence[Sequence[int]] | None = None,
                   reaches: Sequence[Sequence[float]] | None = None) -> list[Draft]:
        """A chain of at most seq.k tokens for each sequence: its seed first (fewer than seq.k tokens another
        drafter proposed, each with its estimated chance of being accepted, cumulative: its reaches), then the
        draft model's own, drawn after it. The rows are drafted in lockstep, one pass over every row still
        drafting per token (a pass over four rows of the Qwen 0.5B costs 1.7 one-row passes: model_step.feed_rows),
        each row ending where its own budget or k says. The seed rides in the pass that catches the draft up on
        the committed tokens, so it costs no draft pass; its q rows are one-hot (chosen, not drawn), the model's
        are its own distribution, each row drawn from its own generator in its own order."""
        seeds = seeds if seeds is not None else [()] * len(seqs)
        reaches = reaches if reaches is not None else [()] * len(seqs)
        drafts = [Draft()] * len(seqs)
        chains = []
        for index, (seq, seed, reach) in enumerate(zip(seqs, seeds, reaches, strict=True)):
            if seq.k <= 0:
                continue
            if len(seed) >= seq.k or len(seed) != len(reach):
                raise ValueError(f"a seed of {len(seed)} tokens ({len(reach)} reaches) for a draft of {seq.k}")
            walk = self.budget.walk(seq.sampling.seeded) if self.budget is not None else None
            if walk is not None:
                walk.seed(reach)
            chains.append(_Chain(index, seq, len(seed), list(seed), walk))
        if not chains:
            return drafts
        logits = self._forward([chain.seq.state for chain in chains], [self._catch_up(chain) for chain in chains])
        live = chains
        while live:
            going = [chain for chain, row in zip(live, logits) if self._next(chain, row)]
            if not going:
                break
            began = time.perf_counter()
            logits = self._forward([chain.seq.state for chain in going], [[chain.tokens[-1]] for chain in going])
            if any(chain.walk is not None for chain in going):  # a row's share of the pass (ChainCostEstimate)
                self.budget.observe_draft((time.perf_counter() - began) / len(going))
            live = going
        for chain in chains:
            drafts[chain.index] = chain.draft()
        return drafts

    @staticmethod
    def _catch_up(chain: _Chain) -> list[int]:
        """Drop what the row cached past the committed tokens' common prefix; -> what it must be fed: the
        committed tokens it lacks, then the seed."""
        state: _State = chain.seq.state
        tokens = chain.seq.tokens
        keep, limit = 0, min(len(state.cached), len(tokens) - 1)
        while keep < limit and state.cached[keep] == tokens[keep]:
            keep += 1
        del state.cached[keep:]
        return [*tokens[keep:], *chain.tokens]

    def _next(self, chain: _Chain, logits: torch.Tensor) -> bool:
        """Draw the row's next token from logits [draft_vocab] and keep it if it pays; -> whether the row drafts
        one more (it is fed in the next pass)."""
        seq, walk = chain.seq, chain.walk
        confident = bool(self.confidence) or walk is not None
        token, q, top = choose(logits, seq.sampling, seq.generator, self.vocab, confident)
        if (self.confidence and top < self.confidence) or (walk is not None and not walk.keep(top)):
            return False
        chain.tokens.append(token)
        if q is not None:
            chain.qs.append(q)
        return len(chain.tokens) < seq.k and (walk is None or walk.go_on(top))


@dataclass
class _Chain:
    """One row's draft in flight (DraftModel.draft_rows)."""

    index: int  # the sequence's place in the call
    seq: SequenceContext
    seeded: int  # the seed's tokens at the chain's head
    tokens: list[int]
    walk: ChainWalk | None
    qs: list[torch.Tensor] = field(default_factory=list)  # [vocab] each, the model's drawn tokens' distributions

    def draft(self) -> Draft:
        q = torch.stack(self.qs) if self.qs else None  # [drawn, vocab]; None: every token chosen (greedy), one-hot q
        if q is not None and self.seeded:
            seed = torch.tensor(self.tokens[: self.seeded])
            q = torch.cat([torch.nn.functional.one_hot(seed, q.shape[-1]).to(q), q])  # [len(tokens), vocab]
        return Draft.chain(self.tokens, q)


# the drafter that loads a trained head, by what its config.json says it is -> how a message names the head
HEADS = {"eagle": "an EAGLE head", "medusa": "a Medusa head", "eagle3": "an EAGLE-3 head"}


def head_drafter(spec: str) -> str | None:
    """The drafter that loads `spec` when it is a trained head's directory (head_io's eagle / medusa, or an EAGLE-3
    head in either shared layout), else None. Read from its config.json alone, before transformers is asked to load
    it as a model: that failed on the tokenizer a head lacks, in a long message that said nothing of heads."""
    try:
        config = json.loads((Path(spec).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    if layout_of(config) is not None:
        return "eagle3"
    kind = config.get("kind")
    return kind if config.get("format") == HEAD_FORMAT and kind in ("eagle", "medusa") else None


def _literal(text: str) -> str:
    """`text` as it reads in an OptionError template, whose braces name options."""
    return text.replace("{", "{{").replace("}", "}}")


def _build(target: Target, config: DrafterConfig, spec: SpecConfig) -> DraftModel:
    if not config.draft_model:
        raise OptionError("{drafter} draft-model needs {draft_model} (a path, packaged name or hub id)", "drafter",
                          "draft_model")
    head = head_drafter(config.draft_model)
    if head is not None:
        raise OptionError(f"{_literal(repr(config.draft_model))} is {HEADS[head]}, not a draft model: use {{drafter}} "
                          f"{head} {{draft_model}} {_literal(shlex.quote(config.draft_model))}", "drafter",
                          "draft_model")
    fmt = draft_format(config.draft_weights, target.device)
    dtype = str(target.dtype).removeprefix("torch.")
    loaded = load_model(ModelConfig(config.draft_model, device=str(target.device), dtype=dtype, weights=fmt))
    if target.tokenizer is not None and not same_tokenizer(loaded.tokenizer, target.tokenizer):
        if config.draft_vocab:  # its draft tokens are not target ids: a shortlist of target ids would not apply
            raise OptionError("{draft_vocab} needs a draft model with the target's tokenizer; this one drafts "
                              "across tokenizers", "draft_vocab")
        return CrossTokenizerDrafter(Target(loaded.model, loaded.tokenizer), target, spec.confidence)
    head = loaded.model.get_output_embeddings()
    size = shortlist_size(config.draft_vocab, head)
    if size is not None:  # before Target reads the head
        loaded.model.set_output_embeddings(ShortlistHead(head, size))
    draft = Target(loaded.model, loaded.tokenizer)
    budget = None
    if target.device.type == "cpu" and not spec.confidence:  # a given threshold stops drafts instead
        depth = spec.max_k if spec.adaptive else spec.k
        budget = ChainBudget(ChainCostEstimate(lambda: measure_chain_costs(draft, target, depth), target.row_costs))
    return DraftModel(draft, target, spec.confidence, budget)


SPEC = DrafterSpec("draft-model", _build, "an independent smaller LM (any tokenizer: a different one drafts via text)",
                   needs_draft_model=True)
