"""Structured outputs: the grammar state at every node of a draft tree, forced chains, q masking, bit masks."""
from __future__ import annotations

import json

import pytest
import torch

from specdecode.config import GenerationConfig, Structure
from specdecode.core.drafting import Draft
from specdecode.core.structured import Grammars, allowed_tokens, mask_logits
from specdecode.errors import ConfigError, StructureError
from tests.tiny import byte_tokenizer, byte_tokenizer_without

VOCAB = 259


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def grammars(tokenizer) -> Grammars:
    return Grammars(tokenizer, VOCAB, [tokenizer.eos_token_id])


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def allowed_after(grammars: Grammars, structure: Structure, tokens: list[int]) -> torch.Tensor:
    """[vocab] bool: what a fresh matcher allows after `tokens` (the reference for a node's mask)."""
    fresh = grammars.constraint(structure, 0)
    fresh.commit(tokens)
    return allowed_tokens(fresh.mask().unsqueeze(0), VOCAB)[0]


def test_tree_is_cut_to_the_grammar_and_each_node_has_its_paths_mask(grammars, tokenizer):
    """A tree with a valid and an invalid branch: the invalid node and its subtree go, every kept node's mask is
    the one its own path reaches (not its sibling's), and the matcher is back where it began."""
    structure = Structure.regex(r"(ab|ac)[0-9]+")
    a, b, c, x, one = ids(tokenizer, "abcx1")
    # root -> a -> {b -> 1, x -> 1, c}; root -> x (invalid at the root)
    draft = Draft((a, b, one, x, one, c, x), (-1, 0, 1, 0, 3, 0, -1))
    constraint = grammars.constraint(structure, grammar_draft=0)
    shaped = constraint.shape(draft, room=8)
    assert shaped.draft.tokens == (a, b, one, c)
    assert shaped.draft.parents == (-1, 0, 1, 0)
    assert shaped.own == 4 and shaped.forced == 0
    paths = [[], [a], [a, b], [a, b, one], [a, c]]  # root, then each kept node
    assert shaped.masks.shape == (5, (VOCAB + 31) // 32)
    for row, path in zip(shaped.masks, paths):
        assert torch.equal(allowed_tokens(row.unsqueeze(0), VOCAB)[0], allowed_after(grammars, structure, path))
    assert constraint.shape(draft, room=8).draft == shaped.draft  # the walk left the matcher at the root


def test_an_eos_node_ends_its_branch_and_leaves_the_matcher_where_it_was(grammars, tokenizer):
    """A drafted EOS where the grammar may end is kept as a leaf with an EOS-only row; the matcher does not consume
    it (a matcher cannot roll back over its end), so the next step starts from the committed state."""
    one, two = ids(tokenizer, "12")
    eos = tokenizer.eos_token_id
    for structure in (Structure.regex("[0-9]+"), Structure.choice(["12"])):  # open-ended; complete after "12"
        constraint = grammars.constraint(structure, grammar_draft=0)
        constraint.commit([one])
        shaped = constraint.shape(Draft.chain([two, eos, two]), room=8)
        assert shaped.draft.tokens == (two, eos)
        assert allowed_tokens(shaped.masks[2:], VOCAB)[0].nonzero().flatten().tolist() == [eos]
        assert constraint.commit([two, eos])[:1] == [two]


def test_room_limits_depth(grammars, tokenizer):
    a, b, one = ids(tokenizer, "ab1")
    constraint = grammars.constraint(Structure.regex(r"ab[0-9]+"), grammar_draft=0)
    assert constraint.shape(Draft.chain([a, b, one]), room=2).draft.tokens == (a, b)


def test_forced_tokens_extend_the_leaves_or_form_the_draft(grammars, tokenizer):
    structure = Structure.json_schema({"type": "object", "properties": {"name": {"type": "string"}},
                                       "required": ["name"], "additionalProperties": False})
    constraint = grammars.constraint(structure, grammar_draft=16)
    alone = constraint.shape(Draft(), room=64)
    text = tokenizer.decode(list(alone.draft.tokens))
    assert text == '{"name": "'[: len(text)] and len(text) >= 4, text  # the grammar admits one opening
    assert alone.own == 0 and alone.forced == len(alone.draft)
    assert alone.draft.parents == tuple(range(-1, len(alone.draft) - 1))
    brace = ids(tokenizer, "{")
    after = constraint.shape(Draft.chain(brace), room=64)  # the drafter's "{" then the grammar's chain
    assert after.own == 1 and after.draft.tokens == alone.draft.tokens
    assert constraint.shape(Draft(), room=3).forced == 3  # no deeper than the room
    capped = grammars.constraint(structure, grammar_draft=2).shape(Draft(), room=64)
    assert capped.forced == 2


def test_q_is_masked_and_renormalised_and_forced_nodes_are_one_hot(grammars, tokenizer):
    a, b, c = ids(tokenizer, "abc")
    structure = Structure.regex(r"a(b|c)d")
    q = torch.full((2, VOCAB), 1.0 / VOCAB)
    shaped = grammars.constraint(structure, grammar_draft=4).shape(Draft.chain([a, b], q), room=8)
    assert shaped.draft.tokens[:2] == (a, b) and shaped.forced == 1  # "d" is forced after "ab"
    assert torch.allclose(shaped.draft.q.sum(dim=-1), torch.ones(3))
    assert shaped.draft.q[0, a] == 1.0  # only "a" is allowed at the root
    assert shaped.draft.q[1, b] == pytest.approx(0.5) and shaped.draft.q[1, c] == pytest.approx(0.5)
    assert shaped.draft.q[2, shaped.draft.tokens[2]] == 1.0


def test_bit_31_and_mask_logits():
    masks = torch.tensor([[-(1 << 31), 1]], dtype=torch.int32)  # token 31 and token 32
    allowed = allowed_tokens(masks, 40)
    assert allowed[0].nonzero().flatten().tolist() == [31, 32]
    logits = torch.zeros(1, 40)
    mask_logits(logits, masks)
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [31, 32]


def test_committed_tokens_advance_and_done(grammars, tokenizer):
    structure = Structure.choice(["yes", "no"])
    constraint = grammars.constraint(structure, grammar_draft=8)
    constraint.commit(ids(tokenizer, "no"))
    assert constraint.done  # nothing can follow "no": the sequence ends without waiting for an EOS
    open_ended = grammars.constraint(Structure.regex("[0-9]+"), 0)
    open_ended.commit(ids(tokenizer, "12"))
    assert not open_ended.done
    open_ended.commit([tokenizer.eos_token_id])
    assert open_ended.done
    with pytest.raises(StructureError, match="cannot follow"):  # a 4xx for its request, not a 500
        grammars.constraint(structure, 0).commit(ids(tokenizer, "x"))


@pytest.mark.parametrize("make, message", [
    (lambda: Structure.json_schema("{not json"), "not valid JSON"),
    (lambda: Structure.json_schema([1, 2]), "must be an object"),
    (lambda: Structure.choice([]), "non-empty list"),
    (lambda: Structure.regex(""), "needs its text"),
    (lambda: Structure("yaml", "x"), "kind must be one of"),
    (lambda: GenerationConfig(structure="json"), "must be a Structure"),
    (lambda: GenerationConfig(logprobs=21), "logprobs must be in 0..20"),
])
def test_bad_structures_are_config_errors(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


@pytest.mark.parametrize("structure, message", [
    (Structure.regex("(ab"), "invalid regex.*regex parse error: unclosed group$"),  # what is wrong, not only where
    (Structure.json_schema({"type": "string", "pattern": "[z-a]"}), "invalid json schema.*start must be <= the end"),
    (Structure.grammar("start: foo\nfoo: bar"), "invalid grammar"),
    (Structure.grammar("0"), "invalid grammar"),  # read as GBNF, which fails to parse
    (Structure.json_schema({"type": "object", "properties": {"a": {"$ref": "#/nope"}}}), "invalid json schema"),
])
def test_grammars_that_do_not_compile_are_one_line_errors(grammars, structure, message):
    with pytest.raises(ConfigError, match=message) as error:
        grammars.check(structure)
    assert "\n" not in str(error.value)


def test_json_layout_is_the_one_json_dumps_writes(grammars, tokenizer):
    structure = Structure.json_schema({"type": "object", "properties": {"a": {"type": "integer"},
                                                                        "b": {"type": "integer"}}})
    constraint = grammars.constraint(structure, 0)
    constraint.commit(ids(tokenizer, json.dumps({"a": 1, "b": 2})))
    assert constraint.matcher.is_accepting()


# -- what a model cannot follow: the grammar engine's limits, bytes no token holds ----------------------------------
@pytest.mark.parametrize("structure, limit", [
    (Structure.json_schema({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(500)}}),
     "more than 2,000 alternatives"),
    (Structure.choice([f"option {i}" for i in range(3000)]), "more than 2,000 alternatives"),
    (Structure.json_schema({"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}},
                                               "required": ["next"]}}, "$ref": "#/$defs/node"}),
     "more than 50,000 parser items"),
])
def test_structures_beyond_the_grammar_engines_limits_are_refused_when_checked(grammars, structure, limit):
    """They compile, and broke a limit only after a few tokens, mid-generation (a 500 then)."""
    with pytest.raises(StructureError, match=limit):
        grammars.check(structure)


def test_a_structure_needing_a_byte_no_token_holds_is_refused():
    """SmolLM2's tokenizer holds no token with the bytes 0xF1 or 0xF2 (the lead bytes of U+40000-U+BFFFF), and
    llguidance forced the tokens of the rest of such a character, which the grammar then refused."""
    tokenizer = byte_tokenizer_without(0xF1, 0xF2)
    grammars = Grammars(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    assert grammars.unproducible == {0xF1, 0xF2}
    with pytest.raises(StructureError, match=r"U\+8DE9B \(bytes f2 8d ba 9b\).*cannot produce"):
        grammars.check(Structure.choice(["\U0008de9b"]))
    grammars.check(Structure.choice(["\U0001f600", "caf\u00e9"]))  # F0 and C3 are held: fine
    # a branch the model may take or not: checked fine; a generation that takes it ends with the error, alone
    grammars.check(Structure.choice(["ab\U0008de9b", "ac"]))
    constraint = grammars.constraint(Structure.choice(["ab\U0008de9b", "ac"]), 0)
    constraint.commit(ids(tokenizer, "ab"))
    with pytest.raises(StructureError, match="U\\+8DE9B"):
        constraint.mask()
    full = Grammars(byte_tokenizer(), VOCAB, [2])
    assert not full.unproducible  # every byte: the astral character is generated
    full.check(Structure.choice(["\U0008de9b"]))
