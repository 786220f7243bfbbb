"""A finished request's KV stays in its row and the next prompt skips prefilling the prefix they share
(Engine.prefix_reuse): on a packed target the reused KV is the very KV a fresh prefill writes, so the output is
the same token for token."""
from __future__ import annotations

import copy

import pytest

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.engine import Engine
from specdecode.core.target import Target
from specdecode.drafters import build_drafter
from tests.tiny import tiny_drafter

CONFIG = GenerationConfig(max_new_tokens=24, stop_on_eos=False)
SPEC = SpecConfig(k=4)


@pytest.fixture(scope="module")
def packed_target(tiny_model, tiny_tokenizer):
    from specdecode.backends.cpu import native
    from specdecode.loading.formats import apply
    from specdecode.loading.load import exact_attention

    if native.missing():
        pytest.skip(native.missing())
    model = copy.deepcopy(tiny_model)
    apply(model, "int4")
    exact_attention(model)
    return Target(model, tiny_tokenizer)


def engine(target: Target, name: str, **kwargs) -> Engine:
    return Engine(target, tiny_drafter(target, name, SPEC, row_cost=0.0), SPEC, **kwargs)


@pytest.mark.parametrize("name", ["none", "prompt-lookup"])  # KV written by one-token passes / by verify passes
def test_the_next_turn_prefills_only_its_new_tokens_and_decodes_the_same(name, packed_target, tiny_tokenizer):
    ids = tiny_tokenizer("the cat sat on the mat. the cat sat on the")["input_ids"]
    reusing = engine(packed_target, name)
    assert reusing.prefix_reuse
    first = reusing.generate(ids, SamplingConfig(), CONFIG)
    assert first.metrics.cached_prompt_tokens == 0
    turn = ids + first.token_ids + tiny_tokenizer(" and the dog")["input_ids"]
    second = reusing.generate(turn, SamplingConfig(), CONFIG)
    # the row held the first prompt and every new token but the last (whose KV the next step would have written)
    assert second.metrics.cached_prompt_tokens == len(ids) + len(first.token_ids) - 1
    fresh = engine(packed_target, "none", prefix_reuse=False).generate(turn, SamplingConfig(), CONFIG)
    assert fresh.metrics.cached_prompt_tokens == 0
    assert second.token_ids == fresh.token_ids
    other = reusing.generate(tiny_tokenizer("def add(a, b):")["input_ids"], SamplingConfig(), CONFIG)
    assert other.metrics.cached_prompt_tokens == 0  # nothing shared: prefilled from scratch
    reusing.generate(turn, SamplingConfig(), CONFIG)
    reusing.forget_prefixes()
    assert reusing.generate(turn, SamplingConfig(), CONFIG).metrics.cached_prompt_tokens == 0


def test_reuse_is_off_where_it_would_not_be_exact_or_bounded(packed_target, tiny_target):
    assert not engine(tiny_target, "none").prefix_reuse  # float forward: a pass's rounding depends on its width
    assert not engine(packed_target, "none", max_batch=4).prefix_reuse  # the server's KV budget
    eagle = Engine(packed_target, tiny_drafter(packed_target, "eagle", SPEC), SPEC)
    assert not eagle.prefix_reuse  # needs the prefill's hidden states


def test_an_aborted_prefill_leaves_only_what_it_wrote(packed_target, tiny_tokenizer):
    ids = tiny_tokenizer("the cat sat on the mat. the cat sat on the")["input_ids"]
    reusing = Engine(packed_target, build_drafter(packed_target, DrafterConfig("none"), SPEC), SPEC)
    seq = reusing.admit(ids, SamplingConfig(), CONFIG)
    reusing.prefill_chunk(seq, 5)
    reusing.release(seq)
    again = reusing.generate(ids, SamplingConfig(), CONFIG)
    assert again.metrics.cached_prompt_tokens == 5
    fresh = Engine(packed_target, build_drafter(packed_target, DrafterConfig("none"), SPEC), SPEC,
                   prefix_reuse=False).generate(ids, SamplingConfig(), CONFIG)
    assert again.token_ids == fresh.token_ids


def test_a_draft_model_prefills_only_what_the_next_prompt_adds(tiny_target, tiny_tokenizer, tiny_draft_dir):
    """The draft model's cache row keeps its sequence's tokens after it finishes; the next prompt that shares a
    prefix with them takes that row and feeds the draft only the rest. The output stays the target's."""
    ids = tiny_tokenizer("the cat sat on the mat. the cat sat on the")["input_ids"]
    drafter = tiny_drafter(tiny_target, "draft-model", SPEC, tiny_draft_dir)
    reusing = Engine(tiny_target, drafter, SPEC)
    fed: list[int] = []
    forward = drafter.draft.forward

    def counting(cache, rows, block, **kwargs):
        fed.append(block.input_ids.shape[1])
        return forward(cache, rows, block, **kwargs)

    drafter.draft.forward = counting
    first = reusing.generate(ids, SamplingConfig(), CONFIG)
    assert fed[0] == len(ids)
    turn = ids + first.token_ids + tiny_tokenizer(" and the dog")["input_ids"]
    fed.clear()
    second = reusing.generate(turn, SamplingConfig(), CONFIG)
    assert 0 < fed[0] <= len(turn) - len(ids)  # the first prompt and some of its answer were in the row
    fresh = Engine(tiny_target, tiny_drafter(tiny_target, "draft-model", SPEC, tiny_draft_dir), SPEC)
    assert second.token_ids == fresh.generate(turn, SamplingConfig(), CONFIG).token_ids
    reusing.forget_prefixes()
    fed.clear()
    reusing.generate(turn, SamplingConfig(), CONFIG)
    assert fed[0] == len(turn)
