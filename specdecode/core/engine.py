"""The decoding loop: draft -> verify (one target pass) -> commit. Plain decoding is the same loop with an
empty draft. `Engine.step` is the loop body over a batch, in named phases (plan, lay out, run the target,
verify, commit); `stream` runs it for one sequence, and the server's scheduler runs it for many (sequences join
and leave between steps, prompts are prefilled in chunks that may ride in a step's pass)."""
from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Sequence_
from dataclasses import dataclass, field

import torch

from specdecode.config import GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.detok import StopText
from specdecode.core.drafting import AuxBranch, Draft, Drafter, SequenceContext, drafts_asked
from specdecode.core.logprobs import token_logprobs
from specdecode.core.metrics import GenerationMetrics
from specdecode.core.penalties import check_bias, hold_ends, path_tokens, penalize
from specdecode.core.prefix_rows import KeptRows
from specdecode.core.sampling import make_generator
from specdecode.core.sequence import Committed, Origin, Result, Sequence, StepOutcome
from specdecode.core.speculation import SpeculationLength
from specdecode.core.structured import Grammars, Shaped, mask_logits
from specdecode.core.target import ForwardOutput, Target
from specdecode.core.trees import Block, build_block, depths_of
from specdecode.core.verify import Verdict, verify_rows
from specdecode.errors import ConfigError

KV_SLACK = 64  # cache slots past prompt + new tokens: room for the last step's draft block


@dataclass
class Engine:
    target: Target
    drafter: Drafter
    spec: SpecConfig = field(default_factory=SpecConfig)
    max_batch: int = 1
    # held while the tokenizer decodes: a server encodes prompts on other threads, and a fast tokenizer must
    # not be used from two threads at once
    tokenizer_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # keep a finished request's KV in its row and skip prefilling the prefix the next prompt shares with it;
    # None: where that is exact and bounded (see _reuses_prefixes)
    prefix_reuse: bool | None = None

    def __post_init__(self) -> None:
        self.cache = self.target.new_cache(rows=self.max_batch, capacity=256)
        self._free_rows = list(range(self.max_batch))
        self._next_id = 0
        self._parked = KeptRows(self.cache)  # free rows that hold a finished sequence's KV, parked longest ago first
        # the time rule's plain-step costs (seconds per token) of the last sequence that timed some: a new
        # sequence starts from them instead of decoding plainly for a few steps to measure its own
        self._plain_costs: list[float] = []
        if self.prefix_reuse is None:
            self.prefix_reuse = self._reuses_prefixes()

    def _reuses_prefixes(self) -> bool:
        """Reusing a row's KV is exact only where a token's KV does not depend on the pass that wrote it (the
        packed decoder: a verify pass, a prefill and a batched pass write the same bits, each row on its own), and
        needs no hidden states the prefill would have given the drafter. Parked rows are free rows, so they hold
        at most what a full batch holds; a server's KV budget counts them and evicts them (`evict_parked`)."""
        return (self.target.packed_decoder and not self.cache.static
                and not self.drafter.capabilities.needs_hidden)

    @functools.cached_property
    def grammars(self) -> Grammars:
        """Compiles the structures of requests for this target's tokenizer (structured.py)."""
        return Grammars(self.target.tokenizer, self.target.vocab_size, sorted(self.target.eos_ids))

    def warmup(self) -> None:
        """Fast path: compile every fixed-shape step the drafter can ask for before anything is timed."""
        k = self.spec.max_k if self.spec.adaptive else self.spec.k
        capabilities = self.drafter.capabilities
        self.target.warmup(self.cache, self.drafter.max_nodes(k) + 1, hidden=capabilities.needs_hidden,
                           hidden_layers=capabilities.hidden_layers)
        for exit_layer in capabilities.exit_layers:
            self.target.warmup(self.cache, 1, num_layers=exit_layer)

    # -- admission --------------------------------------------------------------------------------------------
    def validate(self, prompt_ids: list[int], generation: GenerationConfig) -> None:
        if not prompt_ids:
            raise ConfigError("the prompt is empty")
        limit = self.target.max_positions
        if len(prompt_ids) + generation.max_new_tokens > limit:
            raise ConfigError(
                f"prompt ({len(prompt_ids)} tokens) + max new tokens ({generation.max_new_tokens}) exceeds the "
                f"model's context of {limit} tokens"
            )
        if any(token >= self.target.vocab_size for token in generation.stop_token_ids):
            raise ConfigError(f"stop_token_ids must be below the vocabulary's {self.target.vocab_size} tokens")

    def kv_slots(self, prompt_len: int, generation: GenerationConfig) -> int:
        """Cache slots a sequence may use: its prompt and new tokens, plus room for a step's block."""
        return prompt_len + generation.max_new_tokens + KV_SLACK

    def kv_bytes(self, prompt_len: int, generation: GenerationConfig, drafter: Drafter | None = None) -> int:
        """Bytes of KV cache a sequence may use, the target's and `drafter`'s own (a draft model's): what a server
        budgets at admission."""
        per_slot = self.target.kv_bytes_per_slot + (drafter.kv_bytes_per_slot() if drafter is not None else 0)
        return self.kv_slots(prompt_len, generation) * per_slot

    def start(self, prompt_ids: list[int], sampling: SamplingConfig, generation: GenerationConfig) -> Sequence:
        """Admit a sequence and prefill its whole prompt in one pass: ready to `step`."""
        seq = self.admit(prompt_ids, sampling, generation)
        try:
            self.prefill_chunk(seq)
        except BaseException:  # a failed admission must not leak its row (the server keeps serving)
            self.release(seq)
            raise
        return seq

    def admit(self, prompt_ids: list[int], sampling: SamplingConfig, generation: GenerationConfig,
              like: Sequence | None = None) -> Sequence:
        """Take a cache row and reserve its slots; the sequence is `prefilling` until `prefill_chunk` says done.
        like: a running sequence of the same prompt (another choice of one request) whose prefilled KV the new row
        may copy instead of prefilling it again (where prefixes are reused)."""
        self.validate(prompt_ids, generation)
        if not self._free_rows:
            raise RuntimeError("no free batch row")
        check_bias(sampling, self.target.vocab_size)
        generator = make_generator(sampling.seed, self.target.device)  # before taking a row: it may raise
        constraint = None if generation.structure is None else \
            self.grammars.constraint(generation.structure, self.spec.grammar_draft)
        scored = generation.prompt_logprobs is not None  # every prompt token's logits: none comes from a copy
        row, shared, source = self._take_row([] if scored else prompt_ids, generation.cache_salt,
                                             None if scored else like)
        ctx = SequenceContext(self._next_id, list(prompt_ids), row, self.spec.k, sampling, generator, cache=self.cache,
                              cache_salt=generation.cache_salt)
        self._next_id += 1
        length = SpeculationLength(self.spec, plain=deque(self._plain_costs))
        seq = Sequence(ctx, generation, length, GenerationMetrics(), len(prompt_ids))
        if generation.detokenize and self.target.tokenizer is not None:
            seq.text = StopText(self.target.tokenizer, generation.stop_strings, generation.stop_after)
        seq.constraint = constraint
        seq.ends = frozenset(generation.stop_token_ids) | (self.target.eos_ids if generation.stop_on_eos else set())
        seq.metrics.prompt_tokens = len(prompt_ids)
        seq.metrics.cached_prompt_tokens = seq.prefilled = shared
        try:
            self.cache.reserve(row, self.kv_slots(len(prompt_ids), generation))
            if source is not None:
                self.cache.copy_prefix(source, row, shared)
        except BaseException:
            self._free_row(row)
            raise
        return seq

    def forget_prefixes(self) -> None:
        """Empty the rows that hold a finished request's KV, the target's and the drafter's (the benchmark, after
        its untimed warm-up)."""
        self._parked.release_all()
        self.drafter.forget_prefixes()

    def _take_row(self, prompt_ids: list[int], salt: str | None,
                  like: Sequence | None = None) -> tuple[int, int, int | None]:
        """A free row -> (row, prompt tokens whose KV it holds once `source`'s first ones are copied in, source):
        prefix_rows.choose_row over the parked rows and `like`'s row, for all but the prompt's last token (the
        first step's root). A row parked under another cache salt holds nothing this prompt may use."""
        sources = None
        if self.prefix_reuse and like is not None and like.ctx.cache_salt == salt and not like.finished:
            sources = {like.ctx.row: like.ctx.tokens[:like.prefilled]}  # KV a prefill wrote: no step rewrites it
        choice = self._parked.choose(self._free_rows, prompt_ids[:-1], salt, sources)
        self._free_rows.remove(choice.row)
        self._parked.take(choice.row)
        if choice.evict:
            self.cache.release(choice.row)  # its old KV is of no use: free it now
        return choice.row, choice.shared, choice.source

    @property
    def parked_bytes(self) -> int:
        """KV bytes held by finished requests' rows for the next prompts' prefixes, the target's and the
        drafter's."""
        return self._parked.nbytes() + self.drafter.parked_bytes()

    def evict_parked(self) -> bool:
        """Free the KV of the row parked longest ago, the target's and the drafter's (a server's KV budget needs
        the room); False if neither holds one."""
        drafter = self.drafter.evict_parked()
        return self._parked.release_oldest() or drafter

    def prefill_chunk(self, seq: Sequence, tokens: int | None = None) -> bool:
        """Prefill the next `tokens` prompt tokens (None: all that are left) of a prefilling sequence in a pass of
        its own; after the last chunk the drafter starts and the sequence is ready. Returns whether it is.
        Chunks write the same KV as one pass (each attends to the slots before it), and drafters that read the
        prefill's hidden states get all of them, joined. `step(..., prefill=...)` carries chunks in a step."""
        if seq.ready:
            return True
        began = time.perf_counter()
        chunk = self._next_chunk(seq, tokens)
        if chunk:
            self._prefill_pass(seq, chunk)
        else:
            self._prefilled(seq, 0, None)
        elapsed = time.perf_counter() - began
        seq.metrics.prefill_s += elapsed
        seq.metrics.total_s += elapsed
        return seq.ready

    def _prefill_pass(self, seq: Sequence, chunk: list[int]) -> None:
        """One target pass over a chunk of seq's prompt alone (its last row's logits only, or every row's where
        the prompt's logprobs are asked for: row j scores the prompt token after chunk[j])."""
        block = build_block([seq.prefilled], [chunk], [list(range(-1, len(chunk) - 1))], self.target.pad_id,
                            self.target.device)
        capabilities = self.drafter.capabilities
        scored = seq.generation.prompt_logprobs
        out = self.target.forward(self.cache, [seq.ctx.row], block, keep="last" if scored is None else "all",
                                  hidden=capabilities.needs_hidden, hidden_layers=capabilities.hidden_layers)
        if scored is not None:
            following = seq.ctx.tokens[seq.prefilled + 1 : seq.prefilled + 1 + len(chunk)]
            seq.prompt_logprobs += token_logprobs(out.logits[0], following, scored)  # logits [len(chunk), vocab]
        self._prefilled(seq, len(chunk), None if out.hidden is None else out.hidden[0])

    def _next_chunk(self, seq: Sequence, tokens: int | None) -> list[int]:
        if tokens is not None and tokens < 1:
            raise ValueError(f"a prefill chunk needs at least one token, got {tokens}")
        prefix_len = seq.prompt_len - 1  # the last prompt token is the root of the first step
        end = prefix_len if tokens is None else min(prefix_len, seq.prefilled + tokens)
        return seq.ctx.tokens[seq.prefilled : end]

    def _prefilled(self, seq: Sequence, count: int, hidden: torch.Tensor | None) -> None:
        """`count` more prompt tokens are cached (hidden: their [count, hidden] states); start the drafter after
        the last of them."""
        if hidden is not None and count:
            seq.prefill_hidden.append(hidden[:count])
        seq.prefilled += count
        if seq.prefilled == seq.prompt_len - 1:
            parts, seq.prefill_hidden = seq.prefill_hidden, []
            seq.ctx.hidden = None if not parts else parts[0] if len(parts) == 1 else torch.cat(parts)
            self.drafter.start(seq.ctx)
            seq.ready = True

    def release(self, seq: Sequence) -> None:
        """The sequence leaves the batch (finished or aborted): free its row and drafter state; its metrics get
        the row cost the drafters plan with now, where one was asked for (the CPU)."""
        if self.drafter.capabilities.prices_rows and self.target.device.type == "cpu":
            seq.metrics.row_cost = self.target.row_cost
        if seq.length.plain:
            self._plain_costs = list(seq.length.plain)
        try:
            if seq.ready:
                self.drafter.finish(seq.ctx)
        finally:  # the row is freed even when the drafter's cleanup raises
            if seq.finish_reason is None:
                seq.finish_reason = "abort"
            row = seq.ctx.row
            if self.prefix_reuse and seq.finish_reason != "error":  # its KV stays for the next prompt's prefix
                self._parked.keep(row, seq.generation.cache_salt,
                                  seq.ctx.tokens[: seq.ctx.cache_len if seq.ready else seq.prefilled])
            else:
                self.cache.release(row)
            self._free_row(row)

    def _free_row(self, row: int) -> None:
        if row not in self._free_rows:
            self._free_rows.append(row)
            self._free_rows.sort()

    # -- the loop body ------------------------------------------------------------------------------------------
    def step(self, seqs: list[Sequence], prefill: Sequence_[tuple[Sequence, int]] = (),
             draft_len: Callable[[Sequence], int] | None = None) -> list[StepOutcome]:
        """One draft -> verify -> commit over a batch; one outcome per sequence of `seqs`, in its order.
        prefill: (prefilling sequence, tokens) pairs whose next chunks ride in the same target pass, a row each,
        where the target says a chunk rides (Target.rides); a chunk that does not is a pass of its own first.
        draft_len: the speculation length to ask for, per sequence (default: its own policy's, `seq.length.k`);
        a server caps it by load. Either way it is cut to the tokens the sequence may still add.
        A row whose commit fails gets an outcome with `error` and leaves; a failure before any commit (drafting,
        the pass) raises, and no row has changed."""
        if any(seq.prefilling for seq in seqs):
            raise ValueError("a sequence is still prefilling: finish prefill_chunk first")
        chunks = self._riders(prefill)
        if not seqs and not chunks:
            return []
        clock = StepClock(time.perf_counter())
        plan = self._plan(seqs, draft_len, clock)
        chunks = self._prefill_wide_chunks(plan, chunks, clock)
        block = self._lay_out(plan, chunks)
        out = self._run_target(plan, chunks, block, clock)
        verdicts = self._verify(plan, out.logits)
        committed = [self._commit_row(plan, b, verdict, out) for b, verdict in enumerate(verdicts)]
        clock.finished = time.perf_counter()
        return [self._outcome(plan, b, verdicts[b], committed[b], clock) for b in range(len(seqs))]

    # -- the step's phases ---------------------------------------------------------------------------------------
    def _riders(self, prefill: Sequence_[tuple[Sequence, int]]) -> list[tuple[Sequence, list[int]]]:
        """The next prompt chunk of each prefilling sequence that asks to ride in this step's pass. A one-token
        prompt has nothing to cache: its drafter starts now and it rides with nothing."""
        if any(seq.generation.prompt_logprobs is not None for seq, _ in prefill):
            raise ValueError("a prompt whose logprobs are asked for is prefilled in passes of its own (prefill_chunk)")
        chunks = [(seq, self._next_chunk(seq, tokens)) for seq, tokens in prefill if seq.prefilling]
        for seq, chunk in chunks:
            if not chunk:
                self._prefilled(seq, 0, None)
        return [(seq, chunk) for seq, chunk in chunks if chunk]  # rows after the batch's; logits not read

    def _plan(self, seqs: list[Sequence], draft_len: Callable[[Sequence], int] | None, clock: StepClock) -> StepPlan:
        """Plan: each sequence's speculation length, the drafter's proposals, each fitted to its grammar."""
        asked = [seq.ctx.free_only for seq in seqs]  # the caller's (a server's) choice, back after proposing
        try:
            for seq in seqs:
                remaining = seq.generation.max_new_tokens - seq.metrics.new_tokens
                wanted = seq.length.k if draft_len is None else draft_len(seq)
                seq.ctx.k = max(0, min(wanted, remaining - 1))
                # the first step drafts only what costs no draft pass (ctx.free_only) unless asked
                # (SpecConfig.first_step_drafts), so the first token comes about as soon as in plain decoding: a
                # draft model would read the whole prompt first
                seq.ctx.free_only = seq.ctx.free_only or (
                    seq.metrics.new_tokens == 0 and not self.spec.first_step_drafts)
                seq.ctx.k = drafts_asked(self.drafter.capabilities, seq.ctx)
                if seq.length.paused:  # visible: why this step drafts nothing (GenerationMetrics.paused_steps)
                    paused = seq.metrics.paused_steps
                    paused[seq.length.reason] = paused.get(seq.length.reason, 0) + 1
            # the drafter reads the prompt at its first draft that may pay passes
            paying = [seq.ctx.k > 0 and not seq.ctx.free_only for seq in seqs]
            first = [pays and not seq.drafted for seq, pays in zip(seqs, paying)]
            for seq, pays in zip(seqs, paying):
                seq.drafted = seq.drafted or pays
            proposed = self.drafter.propose([seq.ctx for seq in seqs])
        finally:
            for seq, free_only in zip(seqs, asked):
                seq.ctx.free_only = free_only
        shaped = [self._shape(seq, draft) for seq, draft in zip(seqs, proposed)]
        drafts = [draft if fit is None else fit.draft for draft, fit in zip(proposed, shaped)]
        clock.drafted = time.perf_counter()
        return StepPlan(seqs, proposed, shaped, drafts, first)

    def _prefill_wide_chunks(self, plan: StepPlan, chunks: list[tuple[Sequence, list[int]]],
                             clock: StepClock) -> list[tuple[Sequence, list[int]]]:
        """Prefill, each in a pass of its own, the chunks the target says do not ride beside this step's decode
        rows (Target.rides); their time is neither the decode rows' nor a rider's. Returns the chunks that ride."""
        if not plan.seqs:
            return chunks
        width = max(1 + len(draft) + len(_aux(draft)) for draft in plan.drafts)
        riding = []
        for seq, chunk in chunks:
            if self.target.rides(len(chunk), width):
                riding.append((seq, chunk))
                continue
            self._prefill_pass(seq, chunk)
            aside = time.perf_counter() - clock.drafted
            seq.metrics.prefill_s += aside
            clock.shift(aside)
        return riding

    def _lay_out(self, plan: StepPlan, chunks: list[tuple[Sequence, list[int]]]) -> Block:
        """Lay out: one block of the pass, a row per sequence (its pending token, draft and aux nodes) and per
        riding chunk, with the cache grown to hold it."""
        seqs, drafts = plan.seqs, plan.drafts
        block = build_block(
            [seq.ctx.cache_len for seq in seqs] + [seq.prefilled for seq, _ in chunks],
            [[seq.ctx.tokens[-1], *draft.tokens, *_aux(draft).tokens] for seq, draft in zip(seqs, drafts)]
            + [chunk for _, chunk in chunks],
            [_block_parents(draft) for draft in drafts] + [list(range(-1, len(chunk) - 1)) for _, chunk in chunks],
            self.target.pad_id,
            self.target.block_device,
        )
        self.cache.ensure(self.max_batch, block.kv_len)
        return block

    def _run_target(self, plan: StepPlan, chunks: list[tuple[Sequence, list[int]]], block: Block,
                    clock: StepClock) -> ForwardOutput:
        """Run the target: one pass over the block. The riders' chunks are then cached; the aux branches' logits
        go back to the drafter."""
        rows = [seq.ctx.row for seq in plan.seqs] + [seq.ctx.row for seq, _ in chunks]
        began = time.perf_counter()
        capabilities = self.drafter.capabilities
        out = self.target.forward(self.cache, rows, block, hidden=capabilities.needs_hidden,
                                  hidden_layers=capabilities.hidden_layers, logit_rows=len(plan.seqs))
        if len(rows) == 1 and self.target.device.type == "cpu":  # what a row costs now (pass_costs.RowCostEstimate)
            self.target.row_costs.observe(block.input_ids.shape[1], time.perf_counter() - began)
        for b, (seq, chunk) in enumerate(chunks, start=len(plan.seqs)):
            self._prefilled(seq, len(chunk), None if out.hidden is None else out.hidden[b])
            seq.metrics.prefill_s += time.perf_counter() - clock.drafted
        for b, (seq, draft) in enumerate(zip(plan.seqs, plan.drafts)):
            if draft.aux:  # aux nodes sit after the root and the n draft nodes
                self.drafter.observe_aux(seq.ctx, out.logits[b, 1 + len(draft) : 1 + len(draft) + len(draft.aux)])
        return out

    def _verify(self, plan: StepPlan, logits: torch.Tensor) -> list[Verdict]:
        """Verify: every node scored as its sequence samples (penalties in its own path's context, the grammar's
        mask), then the longest valid prefix plus one token of the target's own, per row."""
        # logits: [b, q, vocab]; row b's first len(draft) + 1 positions are real
        for b, (seq, draft, fit) in enumerate(zip(plan.seqs, plan.drafts, plan.shaped)):
            if seq.ctx.sampling.penalized:  # every node scored in its own path's context (penalties.py)
                penalize(logits[b, : 1 + len(draft)], seq.ctx.sampling, seq.ctx.tokens[: seq.prompt_len],
                         seq.output_ids, path_tokens(draft.tokens, draft.parents))
            least = seq.generation.min_new_tokens
            if least and len(seq.output_ids) < least:  # no end before the least-th token, at any node's depth
                hold_ends(logits[b, : 1 + len(draft)], sorted(seq.ends), len(seq.output_ids),
                          [0, *depths_of(draft.parents)], least)
            if fit is not None:  # the grammar's mask at every node: the verifier sees the constrained distribution
                masking = time.perf_counter()
                mask_logits(logits[b, : fit.masks.shape[0]], fit.masks)
                seq.metrics.grammar_s += time.perf_counter() - masking
        return verify_rows(logits, plan.drafts, [seq.ctx.sampling for seq in plan.seqs],
                           [seq.ctx.generator for seq in plan.seqs])

    def _commit_row(self, plan: StepPlan, b: int, verdict: Verdict, out: ForwardOutput) -> Committed:
        """Commit one row; its failure (its drafter's feedback, say) is its own: the row leaves with the error."""
        seq = plan.seqs[b]
        try:
            return self._commit(seq, plan.drafts[b], verdict, out.logits[b],
                                None if out.hidden is None else out.hidden[b], plan.shaped[b])
        except Exception as error:  # noqa: BLE001 - reported in this row's outcome
            seq.finish_reason = "error"
            return Committed([], "", 0, None, error)

    def _outcome(self, plan: StepPlan, b: int, verdict: Verdict, done: Committed, clock: StepClock) -> StepOutcome:
        """The row's outcome; its time and acceptance go to its metrics and its speculation length policy."""
        seq, draft, mine = plan.seqs[b], plan.drafts[b], plan.proposed[b]
        draft_s, verify_s = clock.drafted - clock.began, clock.finished - clock.drafted
        seq.metrics.draft_s += draft_s
        seq.metrics.verify_s += verify_s
        seq.metrics.total_s += clock.finished - clock.began
        if seq.metrics.first_token_s is None and done.tokens:
            seq.metrics.first_token_s = seq.metrics.total_s
        if done.error is None:
            # the step's time drives the time-based pause; a seeded sampled sequence's K (and so its random
            # draws) must not depend on timing, or the same seed would not give the same text. A sequence's
            # first drafting step is not timed either: its drafter reads the prompt then (a draft model
            # prefills it), a one-off cost that would make the first window look slow. The drafter's own draft
            # is judged: tokens the grammar forced say nothing of it
            timed = not (seq.ctx.sampling.seeded or plan.first[b])
            seq.length.update(mine.depth, len(verdict.accepted) - done.forced,
                              seconds=clock.finished - clock.began if timed else None, committed=len(done.tokens))
        return StepOutcome(done.tokens, done.text, seq.ctx.k, draft.depth, len(verdict.accepted), draft_s, verify_s,
                           seq.finish_reason, done.error, done.forced, done.logprobs, done.origins, mine.free)

    def _shape(self, seq: Sequence, draft: Draft) -> Shaped | None:
        """The draft fitted to the sequence's grammar (None without one): no deeper than the tokens it may add."""
        if seq.constraint is None:
            return None
        began = time.perf_counter()
        room = seq.generation.max_new_tokens - seq.metrics.new_tokens - 1
        shaped = seq.constraint.shape(draft, room)
        seq.metrics.grammar_s += time.perf_counter() - began
        return shaped

    def _commit(self, seq: Sequence, draft: Draft, verdict: Verdict, logits: torch.Tensor, hidden: torch.Tensor | None,
                fit: Shaped | None) -> Committed:
        # logits: [q, vocab] this row's (masked) scores; hidden: [q, hidden] or None
        ctx = seq.ctx
        path_in_block = [node + 1 for node in verdict.accepted]  # block index 0 is the root
        self.cache.compact(ctx.row, [ctx.cache_len + i for i in path_in_block], ctx.cache_len + 1)
        tokens = [draft.tokens[node] for node in verdict.accepted] + [verdict.next_token]
        if seq.constraint is not None:
            tokens = seq.constraint.commit(tokens)
        tokens = self._cut_at_stops(seq, tokens)
        if seq.constraint is not None and seq.constraint.done and seq.finish_reason is None:
            seq.finish_reason = "stop"  # the grammar is complete and admits nothing more
        tokens, text = self._text(seq, tokens)
        if hidden is not None:
            ctx.hidden = hidden[[0, *path_in_block]]  # [accepted + 1, hidden]
        ctx.tokens.extend(tokens)
        own = len(verdict.accepted) if fit is None else sum(node < fit.own for node in verdict.accepted)
        seq.metrics.observe(draft.depth, len(verdict.accepted), len(tokens), forced=len(verdict.accepted) - own)
        top_n = seq.generation.logprobs
        logprobs = None if top_n is None else token_logprobs(logits[[0, *path_in_block]], tokens, top_n)
        if not seq.finished:
            self.drafter.observe(ctx, own)
        origins = _origins(draft, verdict.accepted, fit)[: len(tokens)]
        return Committed(tokens, text, len(verdict.accepted) - own, logprobs, origins=origins)

    def _cut_at_stops(self, seq: Sequence, tokens: list[int]) -> list[int]:
        """Cut the committed tokens at the first EOS or stop token (kept, like transformers) or at the length
        budget."""
        for i, token in enumerate(tokens):
            if token in seq.ends:
                tokens, seq.finish_reason = tokens[: i + 1], "eos"
                break
        remaining = seq.generation.max_new_tokens - seq.metrics.new_tokens
        if len(tokens) >= remaining:
            if len(tokens) > remaining or seq.finish_reason is None:
                seq.finish_reason = "length"
            tokens = tokens[:remaining]
        return tokens

    def _text(self, seq: Sequence, tokens: list[int]) -> tuple[list[int], str]:
        """The committed tokens, cut after the one that completes a stop string, and the text they complete. A stop
        string found finishes the sequence ("stop"; the stop string and what follows are not emitted). The tokens
        are pushed one at a time where there are stop strings, as plain decoding pushes them: a step's accepted
        tokens past the stop are dropped, so tokens, logprobs and usage are plain decoding's whatever the drafter.
        The one place stops end text. No stop string is looked for in the first min_new_tokens tokens' text."""
        if seq.text is None:
            return tokens, ""
        before = seq.metrics.new_tokens  # generated before this step's tokens
        least = seq.generation.min_new_tokens
        with self.tokenizer_lock:
            if not seq.text.stops:
                return tokens, seq.text.push_after(tokens, before, least, final=seq.finished)[0]
            text = ""
            for i, token in enumerate(tokens):
                more, stopped = seq.text.push_after([token], before + i, least,
                                                    final=seq.finished and i == len(tokens) - 1)
                text += more
                if stopped:
                    seq.finish_reason = "stop"
                    return tokens[: i + 1], text
        return tokens, text

    # -- one sequence ---------------------------------------------------------------------------------------------
    def stream(self, prompt_ids: list[int], sampling: SamplingConfig | None = None,
               generation: GenerationConfig | None = None) -> Iterator[tuple[Sequence, StepOutcome]]:
        """Decode one sequence; yields (sequence, the step's outcome) after every step."""
        seq = self.start(prompt_ids, sampling or SamplingConfig(), generation or GenerationConfig())
        try:
            while not seq.finished:
                (outcome,) = self.step([seq])
                if outcome.error is not None:
                    raise outcome.error
                yield seq, outcome
        finally:
            self.release(seq)

    def generate(self, prompt_ids: list[int], sampling: SamplingConfig | None = None,
                 generation: GenerationConfig | None = None) -> Result:
        pieces, logprobs, seq = [], [], None
        for seq, outcome in self.stream(prompt_ids, sampling, generation):  # noqa: B007 - the last seq is read after the loop
            pieces.append(outcome.text)
            logprobs.extend(outcome.logprobs or ())
        assert seq is not None
        wanted = seq.generation.logprobs is not None
        return Result(seq.output_ids, "".join(pieces), seq.finish_reason or "length", seq.metrics,
                      tuple(logprobs) if wanted else None)


def _aux(draft: Draft) -> AuxBranch:
    return draft.aux or AuxBranch()


def _origins(draft: Draft, accepted: tuple[int, ...], fit: Shaped | None) -> tuple[Origin, ...]:
    """Where each token of an accepted path and the target's token after it came from (what a client shows of
    speculation at work). The grammar's forced nodes hang under the drafter's leaves (Constraint.shape), so on a
    path they follow the drafter's. The target's token is a correction where the path's last node (or the root)
    has a draft child, which the target refused; else a bonus, or "target" where nothing was drafted.
    E.g. a chain of 4 with 2 accepted: ("draft", "draft", "correction")."""
    kinds: list[Origin] = ["grammar" if fit is not None and node >= fit.own else "draft" for node in accepted]
    last = accepted[-1] if accepted else -1
    if not draft.tokens:
        kinds.append("target")
    else:
        kinds.append("correction" if last in draft.parents else "bonus")
    return tuple(kinds)


def _block_parents(draft: Draft) -> list[int]:
    """Parents in block indices: 0 is the root, 1..n the draft nodes, then the aux nodes (an aux node whose
    parent is the root hangs off index 0, so it sees the prefix and the root but no draft node)."""
    n = len(draft)
    aux = [0 if p < 0 else 1 + n + p for p in _aux(draft).parents]
    return [-1, *(p + 1 for p in draft.parents), *aux]


@dataclass
class StepClock:
    """A step's times: began, drafting done, finished (perf_counter seconds). A chunk prefilled in a pass of its
    own during the step shifts began and drafted by its time, which is neither drafting nor the decode pass."""

    began: float
    drafted: float = 0.0
    finished: float = 0.0

    def shift(self, seconds: float) -> None:
        self.began += seconds
        self.drafted += seconds


@dataclass(frozen=True)
class StepPlan:
    """What the plan phase decided for the batch: per sequence its drafter's proposal, the proposal fitted to
    its grammar (None without one) and the draft the pass verifies, and whether the drafter reads the sequence's
    prompt in it (its first draft that may pay passes)."""

    seqs: list[Sequence]
    proposed: list[Draft]
    shaped: list[Shaped | None]
    drafts: list[Draft]
    first: list[bool]
