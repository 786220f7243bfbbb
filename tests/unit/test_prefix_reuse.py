"""A finished request's KV stays in its row and the next prompt skips prefilling the prefix they share
(Engine.prefix_reuse): on a packed target the reused KV is the very KV a fresh prefill writes, so the output is
the same token for token."""
from __future__ import annotations

import pytest

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.drafting import common_prefix
from specdecode.core.engine import Engine
from specdecode.core.target import Target
from specdecode.drafters import build_drafter
from tests.tiny import tiny_drafter

CONFIG = GenerationConfig(max_new_tokens=24, stop_on_eos=False)
SPEC = SpecConfig(k=4)


def engine(target: Target, name: str, **kwargs) -> Engine:
    return Engine(target, tiny_drafter(target, name, SPEC, row_cost=0.0), SPEC, **kwargs)


@pytest.mark.parametrize("name", ["none", "prompt-lookup"])  # KV written by one-token passes / by verify passes
def test_the_next_turn_prefills_only_its_new_tokens_and_decodes_the_same(name, tiny_packed_target, tiny_tokenizer):
    ids = tiny_tokenizer("the cat sat on the mat. the cat sat on the")["input_ids"]
    reusing = engine(tiny_packed_target, name)
    assert reusing.prefix_reuse
    first = reusing.generate(ids, SamplingConfig(), CONFIG)
    assert first.metrics.cached_prompt_tokens == 0
    turn = ids + first.token_ids + tiny_tokenizer(" and the dog")["input_ids"]
    second = reusing.generate(turn, SamplingConfig(), CONFIG)
    # the row held the first prompt and every new token but the last (whose KV the next step would have written)
    assert second.metrics.cached_prompt_tokens == len(ids) + len(first.token_ids) - 1
    fresh = engine(tiny_packed_target, "none", prefix_reuse=False).generate(turn, SamplingConfig(), CONFIG)
    assert fresh.metrics.cached_prompt_tokens == 0
    assert second.token_ids == fresh.token_ids
    other = reusing.generate(tiny_tokenizer("def add(a, b):")["input_ids"], SamplingConfig(), CONFIG)
    assert other.metrics.cached_prompt_tokens == 0  # nothing shared: prefilled from scratch
    reusing.generate(turn, SamplingConfig(), CONFIG)
    reusing.forget_prefixes()
    assert reusing.generate(turn, SamplingConfig(), CONFIG).metrics.cached_prompt_tokens == 0


def test_reuse_is_off_where_it_would_not_be_exact(tiny_packed_target, tiny_target):
    assert not engine(tiny_target, "none").prefix_reuse  # float forward: a pass's rounding depends on its width
    eagle = Engine(tiny_packed_target, tiny_drafter(tiny_packed_target, "eagle", SPEC), SPEC)
    assert not eagle.prefix_reuse  # needs the prefill's hidden states


def _together(reusing: Engine, prompts: list[list[int]]) -> tuple[list[list[int]], list[int], list[int]]:
    """The prompts decoded in one batch -> (outputs, cached prompt tokens, rows), each row leaving when done."""
    seqs = [reusing.start(prompt, SamplingConfig(), CONFIG) for prompt in prompts]
    cached, rows = [s.metrics.cached_prompt_tokens for s in seqs], [s.ctx.row for s in seqs]
    live = list(seqs)
    while live:
        reusing.step(live)
        for seq in [s for s in live if s.finished]:
            reusing.release(seq)
            live.remove(seq)
    return [s.output_ids for s in seqs], cached, rows


def test_a_batch_keeps_each_rows_prefix_for_its_next_turn(tiny_packed_target, tiny_tokenizer):
    """Two conversations decoded together: each next turn takes the row that holds its own history, prefills only
    what it adds, and decodes what a fresh engine decodes. A prompt that shares nothing takes an empty row while
    there is one, then the row parked longest ago; `evict_parked` frees the oldest, as a server's KV budget asks."""
    def ids(text: str) -> list[int]:
        return tiny_tokenizer(text)["input_ids"]

    reusing = engine(tiny_packed_target, "prompt-lookup", max_batch=3)
    assert reusing.prefix_reuse and reusing.parked_bytes == 0
    firsts = [ids("the cat sat on the mat. the cat sat on the"), ids("def add(a, b): return a + b")]
    outputs, cached, rows = _together(reusing, firsts)
    assert cached == [0, 0] and reusing.parked_bytes > 0
    turns = [first + out + ids(" and then") for first, out in zip(firsts, outputs)]
    again, cached, reused = _together(reusing, turns[::-1])
    assert reused == rows[::-1]  # each took its own history's row
    assert cached == [len(first) + len(out) - 1 for first, out in zip(firsts[::-1], outputs[::-1])]
    fresh = engine(tiny_packed_target, "prompt-lookup", max_batch=3, prefix_reuse=False)
    assert again == _together(fresh, turns[::-1])[0]
    # rows 0 and 1 parked (the second turns), row 2 empty: a new prompt takes row 2, the next evicts the oldest
    order = list(reusing._parked.held)
    (_, _, (empty,)) = _together(reusing, [ids("zzz yyy")])
    assert empty not in order and list(reusing._parked.held) == [*order, empty]
    (_, _, (oldest,)) = _together(reusing, [ids("qqq www")])
    assert oldest == order[0] and list(reusing._parked.held) == [order[1], empty, oldest]
    held = reusing.parked_bytes
    assert reusing.evict_parked() and 0 < reusing.parked_bytes < held and list(reusing._parked.held) == [empty, oldest]


def test_an_aborted_prefill_leaves_only_what_it_wrote(tiny_packed_target, tiny_tokenizer):
    ids = tiny_tokenizer("the cat sat on the mat. the cat sat on the")["input_ids"]
    reusing = Engine(tiny_packed_target, build_drafter(tiny_packed_target, DrafterConfig("none"), SPEC), SPEC)
    seq = reusing.admit(ids, SamplingConfig(), CONFIG)
    reusing.prefill_chunk(seq, 5)
    reusing.release(seq)
    again = reusing.generate(ids, SamplingConfig(), CONFIG)
    assert again.metrics.cached_prompt_tokens == 5
    fresh = Engine(tiny_packed_target, build_drafter(tiny_packed_target, DrafterConfig("none"), SPEC), SPEC,
                   prefix_reuse=False).generate(ids, SamplingConfig(), CONFIG)
    assert again.token_ids == fresh.token_ids


def _fed(drafter) -> list[int]:
    """The tokens of each pass the draft model runs from now on (its forward counted). A sequence's first draft
    pass feeds what the row lacks of the prompt and the first generated token (the first step drafts nothing)."""
    fed: list[int] = []
    forward = drafter.draft.forward

    def counting(cache, rows, block, **kwargs):
        fed.append(block.input_ids.shape[1])
        return forward(cache, rows, block, **kwargs)

    drafter.draft.forward = counting
    return fed


def test_a_draft_model_prefills_only_what_the_next_prompt_adds(tiny_target, tiny_tokenizer, tiny_draft_dir):
    """The draft model's cache row keeps its sequence's tokens after it finishes; the next prompt that shares a
    prefix with them takes that row and feeds the draft only the rest. The output stays the target's."""
    ids = tiny_tokenizer("the cat sat on the mat. the cat sat on the")["input_ids"]
    drafter = tiny_drafter(tiny_target, "draft-model", SPEC, tiny_draft_dir)
    reusing = Engine(tiny_target, drafter, SPEC)
    fed = _fed(drafter)
    first = reusing.generate(ids, SamplingConfig(), CONFIG)
    assert fed[0] == len(ids) + 1
    turn = ids + first.token_ids + tiny_tokenizer(" and the dog")["input_ids"]
    fed.clear()
    second = reusing.generate(turn, SamplingConfig(), CONFIG)
    assert 0 < fed[0] <= len(turn) - len(ids) + 1  # the first prompt and some of its answer were in the row
    fresh = Engine(tiny_target, tiny_drafter(tiny_target, "draft-model", SPEC, tiny_draft_dir), SPEC)
    assert second.token_ids == fresh.generate(turn, SamplingConfig(), CONFIG).token_ids
    reusing.forget_prefixes()
    fed.clear()
    reusing.generate(turn, SamplingConfig(), CONFIG)
    assert fed[0] == len(turn) + 1


def test_a_prompt_sharing_a_little_copies_it_and_leaves_the_row_to_its_conversation(tiny_packed_target,
                                                                                    tiny_tokenizer):
    """A new conversation that shares only its start with a parked one (a system prompt) gets a copy of that
    prefix in another row; the parked row keeps its tokens, and its own next turn still finds them."""
    def ids(text: str) -> list[int]:
        return tiny_tokenizer(text)["input_ids"]

    system = ids("You are helpful. ")
    reusing = engine(tiny_packed_target, "prompt-lookup", max_batch=2)
    first = system + ids("the cat sat on the mat. the cat sat on the")
    (out,), _, (row,) = _together(reusing, [first])
    other = system + ids("def add(a, b): return a + b")
    (answer,), (cached,), (other_row,) = _together(reusing, [other])
    assert other_row != row and cached == common_prefix(first, other)
    fresh = engine(tiny_packed_target, "prompt-lookup", prefix_reuse=False)
    assert answer == fresh.generate(other, SamplingConfig(), CONFIG).token_ids
    turn = first + out + ids(" and then")
    (again,), (cached,), (again_row,) = _together(reusing, [turn])
    assert again_row == row and cached == len(first) + len(out) - 1
    assert again == fresh.generate(turn, SamplingConfig(), CONFIG).token_ids


def test_a_draft_models_row_stays_with_its_conversation(tiny_target, tiny_tokenizer, tiny_draft_dir):
    """The draft model's held rows follow the same choice (prefix_rows.choose_row): a new conversation that shares
    only the system prompt with a held row is fed from a copy of that prefix in another row, and the held row's
    own next turn is fed only what it adds. The output stays the target's."""
    def ids(text: str) -> list[int]:
        return tiny_tokenizer(text)["input_ids"]

    system = ids("You are helpful. ")
    drafter = tiny_drafter(tiny_target, "draft-model", SPEC, tiny_draft_dir)
    reusing = Engine(tiny_target, drafter, SPEC, max_batch=2)
    fed = _fed(drafter)
    first, other = system + ids("the cat sat on the mat. the cat sat on the"), system + ids("Once upon a time")
    (out, _), _, _ = _together(reusing, [first, other])  # two draft rows, each holding its conversation
    new = system + ids("def add(a, b): return a + b")
    fed.clear()
    (answer,), _, _ = _together(reusing, [new])
    shared = max(common_prefix(new, first), common_prefix(new, other))
    assert 0 < shared and fed[0] == len(new) - shared + 1  # the system prompt came from a copy
    turn = first + out + ids(" and then")
    fed.clear()
    (again,), _, _ = _together(reusing, [turn])
    assert fed[0] <= len(turn) - len(first) + 1  # its own row kept the first turn
    fresh = Engine(tiny_target, tiny_drafter(tiny_target, "draft-model", SPEC, tiny_draft_dir), SPEC)
    assert answer == fresh.generate(new, SamplingConfig(), CONFIG).token_ids
    assert again == fresh.generate(turn, SamplingConfig(), CONFIG).token_ids


def test_a_cache_salt_keeps_the_draft_models_rows_apart(tiny_target, tiny_tokenizer, tiny_draft_dir):
    """A draft row left under one cache salt does not feed a prompt with another (GenerationConfig.cache_salt)."""
    ids = tiny_tokenizer("the cat sat on the mat. the cat sat on the")["input_ids"]
    drafter = tiny_drafter(tiny_target, "draft-model", SPEC, tiny_draft_dir)
    reusing = Engine(tiny_target, drafter, SPEC)
    fed = _fed(drafter)
    salted = [GenerationConfig(max_new_tokens=8, stop_on_eos=False, cache_salt=salt) for salt in ("a", "b", "b")]
    firsts = []  # the tokens each prompt's first draft pass fed
    for generation in salted:
        fed.clear()
        reusing.generate(ids, SamplingConfig(), generation)
        firsts.append(fed[0])
    assert firsts[0] == firsts[1] == len(ids) + 1 and firsts[2] < len(ids)


def test_a_draft_models_kv_is_reserved_and_its_kept_rows_give_way(tiny_packed_target, tiny_tokenizer,
                                                                   tiny_draft_dir):
    """A server's KV budget counts the draft model's cache: a request reserves its bytes per token beside the
    target's (Engine.kv_bytes with the request's drafter), and the rows it keeps for the next turn are parked
    bytes that Engine.evict_parked frees with the target's. The next turn is then fed whole, and decodes the same."""
    ids = tiny_tokenizer("the cat sat on the mat. the cat sat on the")["input_ids"]
    drafter = tiny_drafter(tiny_packed_target, "draft-model", SPEC, tiny_draft_dir)
    reusing = Engine(tiny_packed_target, drafter, SPEC)
    slots = reusing.kv_slots(len(ids), CONFIG)
    draft_per_slot = drafter.draft.kv_bytes_per_slot
    assert draft_per_slot > 0 and drafter.kv_bytes_per_slot() == draft_per_slot
    assert reusing.kv_bytes(len(ids), CONFIG, drafter) == reusing.kv_bytes(len(ids), CONFIG) + slots * draft_per_slot
    fed = _fed(drafter)
    first = reusing.generate(ids, SamplingConfig(), CONFIG)
    target_parked = reusing.parked_bytes - drafter.parked_bytes()
    assert drafter.parked_bytes() > 0 and target_parked > 0
    assert reusing.evict_parked() and reusing.parked_bytes == drafter.parked_bytes() == 0
    assert not reusing.evict_parked()
    turn = ids + first.token_ids + tiny_tokenizer(" and the dog")["input_ids"]
    fed.clear()
    again = reusing.generate(turn, SamplingConfig(), CONFIG)
    assert again.metrics.cached_prompt_tokens == 0 and fed[0] == len(turn) + 1  # nothing left of the first turn
    fresh = Engine(tiny_packed_target, tiny_drafter(tiny_packed_target, "draft-model", SPEC, tiny_draft_dir), SPEC)
    assert again.token_ids == fresh.generate(turn, SamplingConfig(), CONFIG).token_ids
    reusing.forget_prefixes()
    assert reusing.parked_bytes == 0  # the benchmark's forgetting frees the buffers too
