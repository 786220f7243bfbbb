"""For every drafter: speculative greedy output == plain greedy output, token for token (tiny random Llama).

The reference is transformers' own greedy `generate`, so the loop, the cache and the verifier are all checked
against an independent implementation."""
import pytest
import torch

from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
from specdecode.core.drafting import Capabilities, Draft
from specdecode.core.engine import Engine
from specdecode.drafters import build_drafter, registry
from tests.fakes import ForcedHybrid, Oracle
from tests.tiny import tiny_drafter

PROMPTS = {
    "repetitive": "the cat sat on the mat. the cat sat on the mat. the cat",
    "code": "def add(a, b):\n    return a + b\n\ndef add(",
    "short": "Hi",
}
NEW_TOKENS = 48
GREEDY = SamplingConfig()  # frozen, so one shared default is safe


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                         pad_token_id=0, eos_token_id=None)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def references(tiny_model, tiny_tokenizer):
    return {key: hf_greedy(tiny_model, tiny_tokenizer(text)["input_ids"], NEW_TOKENS) for key, text in PROMPTS.items()}


@pytest.mark.parametrize("spec", [SpecConfig(k=4), SpecConfig(k=1), SpecConfig(k=3, adaptive=True, max_k=8),
                                  SpecConfig(k=6, confidence=0.3)], ids=["k4", "k1", "adaptive", "confidence"])
@pytest.mark.parametrize("name", list(registry()))
def test_greedy_equals_plain(name, spec, tiny_target, tiny_tokenizer, tiny_draft_dir, references):
    _check_greedy(Engine(tiny_target, tiny_drafter(tiny_target, name, spec, tiny_draft_dir), spec), name,
                  tiny_tokenizer, references)


@pytest.mark.parametrize("name", ["prompt-lookup", "lookahead"])
def test_greedy_equals_plain_with_free_rows(name, tiny_target, tiny_tokenizer, references):
    """Table drafters on a CPU draft only what pays for its rows (row_budget); with free rows (a GPU's cost
    model) they propose everything they find: the verification of full drafts is checked here."""
    spec = SpecConfig(k=4)
    _check_greedy(Engine(tiny_target, tiny_drafter(tiny_target, name, spec, row_cost=0.0), spec), name,
                  tiny_tokenizer, references)


@pytest.mark.parametrize("weights", ["same", "int8", "int4", "int4-all"])
def test_draft_model_greedy_with_any_draft_weights(weights, tiny_target, tiny_tokenizer, tiny_draft_dir, references):
    """The registry's draft model drafts with quantized weights on the CPU by default (loading/formats.draft_format);
    every way the output is the target's."""
    from specdecode.backends.cpu import native

    if weights.startswith("int4") and native.missing():
        pytest.skip(native.missing())
    spec = SpecConfig(k=4)
    drafter = tiny_drafter(tiny_target, "draft-model", spec, tiny_draft_dir, draft_weights=weights)
    projection = drafter.draft.model.model.layers[0].mlp.down_proj
    assert isinstance(projection, torch.nn.Linear) == (weights == "same")
    _check_greedy(Engine(tiny_target, drafter, spec), "draft-model", tiny_tokenizer, references)


@pytest.mark.parametrize("weights", ["same", "int4"])
def test_draft_model_greedy_with_a_shortlist(weights, tiny_target, tiny_tokenizer, tiny_draft_dir, references):
    """The draft head cut to its first 64 of 259 ids plus the tokens seen (drafters/common/shortlist.py): drafts the
    target rejects more often, the same output."""
    from specdecode.backends.cpu import native
    from specdecode.drafters.common.shortlist import ShortlistHead

    if weights == "int4" and native.missing():
        pytest.skip(native.missing())
    spec = SpecConfig(k=4)
    drafter = tiny_drafter(tiny_target, "draft-model", spec, tiny_draft_dir, draft_weights=weights, draft_vocab=64)
    assert isinstance(drafter.shortlist, ShortlistHead) and drafter.shortlist.size == 64
    _check_greedy(Engine(tiny_target, drafter, spec), "draft-model", tiny_tokenizer, references)
    assert len(drafter.shortlist.ids) > 0  # tokens beyond the first 64 were seen and scored


@pytest.mark.parametrize("free, seed", [(True, 0), (False, 0), (False, 2)], ids=["free", "model", "seeded"])
def test_hybrid_greedy_equals_plain_on_each_path(free, seed, tiny_target, tiny_tokenizer, tiny_draft_dir, references):
    """Every step of the hybrid one way (tests.fakes.ForcedHybrid): suffix's trees alone, the draft model's chains
    alone, and chains led by up to two of suffix's tokens; the rule that picks among them is tested in
    tests/unit/test_hybrid.py. Free rows: suffix drafts all it finds, so every path is taken often. The first step
    drafts in full too (first_step_drafts), or it would ask for free drafts alone."""
    spec = SpecConfig(k=4, first_step_drafts=True)
    hybrid = ForcedHybrid(tiny_drafter(tiny_target, "hybrid", spec, tiny_draft_dir, row_cost=0.0), free, seed)
    _check_greedy(Engine(tiny_target, hybrid, spec), "hybrid", tiny_tokenizer, references)
    assert (hybrid.free_drafts > 0, hybrid.model_drafts > 0, hybrid.seeded_drafts > 0) == (free, not free, seed > 0)


def _check_greedy(engine: Engine, name: str, tiny_tokenizer, references, sampling: SamplingConfig = GREEDY,
                  accepted: bool = False) -> None:
    proposed = taken = 0
    for key, text in PROMPTS.items():
        ids = tiny_tokenizer(text)["input_ids"]
        result = engine.generate(ids, sampling, GenerationConfig(max_new_tokens=NEW_TOKENS, stop_on_eos=False))
        assert result.token_ids == references[key], f"{name} diverged on {key!r}"
        assert result.metrics.new_tokens == NEW_TOKENS
        proposed += result.metrics.proposed
        taken += result.metrics.accepted
    if name != "none":
        assert proposed > 0, "the drafter never drafted: the test would not exercise verification"
    if accepted:
        assert taken > 0, "no draft token was accepted: deeper positions' contexts went unchecked"


# penalties and a bias change the greedy choice (penalties.py); mild, so that drafts are still accepted
PENALIZED = SamplingConfig(presence_penalty=0.3, frequency_penalty=0.25, repetition_penalty=1.2,
                           logit_bias=((5, 2.0), (17, -1.5)))


@pytest.fixture(scope="module")
def penalized_references(tiny_target, tiny_tokenizer, references):
    plain = Engine(tiny_target, build_drafter(tiny_target, DrafterConfig("none"), SpecConfig()), SpecConfig())
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, stop_on_eos=False)
    out = {key: plain.generate(tiny_tokenizer(text)["input_ids"], PENALIZED, config).token_ids
           for key, text in PROMPTS.items()}
    assert all(out[key] != references[key] for key in PROMPTS)  # the settings change the output
    return out


@pytest.mark.parametrize("name", [n for n in registry() if n != "none"])
def test_greedy_equals_plain_with_penalties(name, tiny_target, tiny_tokenizer, tiny_draft_dir, penalized_references):
    """Each position of a draft is scored with the counts of its own path (a token drafted twice is penalized
    twice at the second's successor): speculative greedy output equals plain greedy output with the same
    penalties and bias. Free rows: table drafters draft all they find."""
    spec = SpecConfig(k=4, pause_on_time=False)
    engine = Engine(tiny_target, tiny_drafter(tiny_target, name, spec, tiny_draft_dir, row_cost=0.0), spec)
    _check_greedy(engine, name, tiny_tokenizer, penalized_references, PENALIZED,
                  accepted=name in ("prompt-lookup", "suffix", "draft-model"))


LEAST = 24  # min_new_tokens (vLLM's min_tokens) in the next test


def _least_configs(tiny_tokenizer, references, key: str) -> tuple[GenerationConfig, GenerationConfig]:
    """A stop token that plain decoding writes 3rd, and a stop string it writes at tokens 6-7: both would end the
    output early; with min_new_tokens neither may before the LEAST-th token."""
    early = references[key]
    token = GenerationConfig(NEW_TOKENS, stop_on_eos=False, stop_token_ids=(early[2],), min_new_tokens=LEAST)
    text = GenerationConfig(NEW_TOKENS, stop_on_eos=False, stop_strings=(tiny_tokenizer.decode(early[5:7]),),
                            min_new_tokens=LEAST)
    return token, text


@pytest.mark.parametrize("name", [n for n in registry() if n != "none"])
def test_greedy_equals_plain_with_min_tokens(name, tiny_target, tiny_tokenizer, tiny_draft_dir, references):
    """min_new_tokens masks the ending tokens at every draft position by its depth and leaves stop strings unsearched
    in the first tokens' text: speculative greedy output equals plain greedy output, the stop token cut (tokens
    equal) and the stop string cut (text equal), and neither ends the output before the LEAST-th token."""
    plain = Engine(tiny_target, build_drafter(tiny_target, DrafterConfig("none"), SpecConfig()), SpecConfig())
    spec = SpecConfig(k=4, pause_on_time=False)
    engine = Engine(tiny_target, tiny_drafter(tiny_target, name, spec, tiny_draft_dir, row_cost=0.0), spec)
    proposed = 0
    for key, prompt in PROMPTS.items():
        ids = tiny_tokenizer(prompt)["input_ids"]
        by_token, by_text = _least_configs(tiny_tokenizer, references, key)
        expected, got = plain.generate(ids, GREEDY, by_token), engine.generate(ids, GREEDY, by_token)
        assert got.token_ids == expected.token_ids, f"{name} diverged on {key!r} (stop token)"
        assert by_token.stop_token_ids[0] not in expected.token_ids[:LEAST - 1] and len(expected.token_ids) >= LEAST
        expected, got = plain.generate(ids, GREEDY, by_text), engine.generate(ids, GREEDY, by_text)
        assert got.text == expected.text and len(expected.text) >= LEAST, f"{name} diverged on {key!r} (stop string)"
        proposed += got.metrics.proposed
    assert proposed > 0


@pytest.mark.parametrize("name", [n for n in registry() if n != "none"] + ["oracle"])
def test_a_stop_string_cuts_tokens_and_logprobs_as_plain_decoding(name, tiny_target, tiny_tokenizer, tiny_draft_dir):
    """A stop string ends a step's accepted tokens where plain decoding would have stopped, after the token that
    completes it: the tokens, their logprobs and the count (a server's usage) are plain decoding's, never the rest
    of the step's block, whichever drafter drafted it (the text was cut before; the tokens were not). The oracle
    drafts plain decoding's own next 8 tokens, so its stops fall inside a block with tokens after them."""
    plain = Engine(tiny_target, build_drafter(tiny_target, DrafterConfig("none"), SpecConfig()), SpecConfig())
    spec = SpecConfig(k=8 if name == "oracle" else 4, pause_on_time=False)
    cut_inside = 0  # stops completed inside a step's block with accepted tokens after them
    for prompt in PROMPTS.values():
        ids = tiny_tokenizer(prompt)["input_ids"]
        whole = plain.generate(ids, GREEDY, GenerationConfig(NEW_TOKENS, stop_on_eos=False))
        drafter = (Oracle(whole.token_ids, len(ids), vocab=tiny_target.vocab_size) if name == "oracle" else
                   tiny_drafter(tiny_target, name, spec, tiny_draft_dir, row_cost=0.0))
        engine = Engine(tiny_target, drafter, spec)
        for end in (7, 12, 20):  # stop strings that plain decoding writes by its end-th character
            generation = GenerationConfig(NEW_TOKENS, stop_on_eos=False, logprobs=2,
                                          stop_strings=(whole.text[end - 2:end],))
            expected = plain.generate(ids, GREEDY, generation)
            steps = [outcome for _, outcome in engine.stream(ids, GREEDY, generation)]
            tokens = [token for outcome in steps for token in outcome.token_ids]
            logprobs = [entry for outcome in steps for entry in outcome.logprobs]
            assert expected.finish_reason == "stop" and steps[-1].finish_reason == "stop"
            assert tokens == expected.token_ids, f"{name} on {prompt!r}, stop by character {end}"
            assert "".join(outcome.text for outcome in steps) == expected.text
            assert [entry.token for entry in logprobs] == expected.token_ids
            assert max(abs(a.logprob - b.logprob) for a, b in zip(logprobs, expected.logprobs)) <= 1e-4
            cut_inside += steps[-1].accepted + 1 > len(steps[-1].token_ids)
    if name == "oracle":
        assert cut_inside >= 6, "the oracle's stops did not fall inside its blocks: the cut was not tested"


def test_prompt_lookup_accepts_and_rejects(tiny_target, tiny_tokenizer):
    """Guard against a vacuous equivalence test: both acceptance and rejection must occur."""
    spec = SpecConfig(k=4, pause_on_time=False)  # acceptance is asserted: K must not depend on the machine's timing
    config = DrafterConfig("prompt-lookup", row_cost=0.0)  # every match drafted in full
    engine = Engine(tiny_target, build_drafter(tiny_target, config, spec), spec)
    metrics = engine.generate(tiny_tokenizer(PROMPTS["repetitive"])["input_ids"], SamplingConfig(),
                              GenerationConfig(max_new_tokens=NEW_TOKENS, stop_on_eos=False)).metrics
    assert 0 < metrics.accepted < metrics.proposed
    assert metrics.tau > 1.0


@pytest.fixture(scope="module", params=["torch-int8", "int8", "int4", "qwen3 int4", "gemma3 int4",
                                                   "mistral int4", "phi3 int4"])
def quantized_target(request, tiny_model, tiny_tokenizer):
    """The tiny target with quantized linear weights: torch's per-channel int8 kernel, and the packed q8 / q4
    layers of `--weights int8` / `int4` (backends/cpu/); and tiny Qwen3, Gemma 3, Mistral (sliding-window layers
    whose window the prompts pass) and Phi-3 (fused projections) models packed in int4, whose decoders run
    natively too. The quantized model IS the target."""
    import copy

    from specdecode.backends.cpu import native
    from specdecode.backends.cpu.int8 import quantize_linears
    from specdecode.core.target import Target
    from specdecode.loading.formats import apply
    from specdecode.loading.load import exact_attention
    from tests.tiny import tiny_gemma3, tiny_mistral, tiny_phi3, tiny_qwen3

    arch, _, fmt = request.param.rpartition(" ")
    builders = {"qwen3": tiny_qwen3, "gemma3": tiny_gemma3, "mistral": tiny_mistral, "phi3": tiny_phi3}
    model = builders[arch]() if arch else copy.deepcopy(tiny_model)
    if fmt == "torch-int8":
        assert quantize_linears(model)
    else:
        if native.missing():
            pytest.skip(native.missing())
        apply(model, fmt)
        exact_attention(model)  # as load_model does for quantized weights
        assert not arch or Target(model).packed_decoder
    return Target(model, tiny_tokenizer)


@pytest.mark.parametrize("name", list(registry()))
def test_greedy_equals_plain_on_a_quantized_target(name, quantized_target, tiny_tokenizer, tiny_draft_dir):
    """Every drafter over a target whose linears are quantized: output equals greedy decoding of that same
    quantized model (which differs from the fp32 model's: the reference must be the quantized one). That is
    transformers' `generate` for torch's int8 layers; for packed layers, whose decoder runs natively
    (backends/cpu/decoder.py, the model up to rounding: tests/unit/test_packed_decoder.py), our own plain decoding of
    the packed target, so plain decoding itself is not compared there."""
    target = quantized_target
    if target.packed_decoder:
        if name == "none":
            pytest.skip("the reference is plain decoding itself")
        plain = Engine(target, build_drafter(target, DrafterConfig("none"), SpecConfig()), SpecConfig())
        config = GenerationConfig(max_new_tokens=NEW_TOKENS, stop_on_eos=False)
        references = {key: plain.generate(tiny_tokenizer(text)["input_ids"], SamplingConfig(), config).token_ids
                      for key, text in PROMPTS.items()}
    else:
        references = {key: hf_greedy(target.model, tiny_tokenizer(text)["input_ids"], NEW_TOKENS)
                      for key, text in PROMPTS.items()}
    spec = SpecConfig(k=4)
    _check_greedy(Engine(target, tiny_drafter(target, name, spec, tiny_draft_dir, row_cost=0.0), spec), name,
                  tiny_tokenizer, references)


class _Oracle:
    """Drafts plain decoding's own continuation (known in advance) behind a wrong first branch: every draft is
    accepted and every position of the tree, a second branch's included, decides a token."""

    name = "oracle"
    capabilities = Capabilities()

    def __init__(self, continuations: dict[tuple[int, ...], list[int]]):
        self.continuations = continuations

    def start(self, seq):
        seq.state = next(ids for prompt, ids in self.continuations.items()
                         if tuple(seq.tokens[: len(prompt)]) == prompt)

    def propose(self, seqs):
        drafts = []
        for seq in seqs:
            right = seq.state[len(seq.tokens) : len(seq.tokens) + seq.k]  # seq.state: the prompt + plain's output
            if not right:
                drafts.append(Draft())
                continue
            # a wrong first branch, whose token would change the next choice if counted in the right branch's context
            wrong = right[1] if len(right) > 1 and right[1] != right[0] else (right[0] + 1) % 100
            drafts.append(Draft((wrong, *right), (-1, -1, *range(1, len(right)))))
        return drafts

    def observe(self, seq, accepted):
        pass

    def observe_aux(self, seq, logits):
        pass

    def finish(self, seq):
        pass

    def max_nodes(self, k):
        return k + 1

    def forget_prefixes(self):
        pass


@pytest.mark.parametrize("sampling", [PENALIZED, SamplingConfig(frequency_penalty=2.0, presence_penalty=-1.0),
                                      SamplingConfig(repetition_penalty=3.0)], ids=["mild", "frequency", "repetition"])
def test_penalties_score_each_position_in_its_path(sampling, tiny_target, tiny_tokenizer):
    """A drafter that always drafts plain decoding's continuation (on the second branch of a tree): the output
    equals plain decoding only if every accepted position was penalized with its own path's tokens, since each
    decides the next token. Scoring all positions with the committed tokens alone fails this."""
    plain = Engine(tiny_target, build_drafter(tiny_target, DrafterConfig("none"), SpecConfig()), SpecConfig())
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, stop_on_eos=False)
    prompts = [tuple(tiny_tokenizer(text)["input_ids"]) for text in PROMPTS.values()]
    expected = {ids: plain.generate(list(ids), sampling, config).token_ids for ids in prompts}
    oracle = _Oracle({ids: list(ids) + out for ids, out in expected.items()})
    spec = SpecConfig(k=4, pause_on_time=False)
    engine = Engine(tiny_target, oracle, spec)
    for ids in prompts:
        result = engine.generate(list(ids), sampling, config)
        assert result.token_ids == expected[ids]
        assert result.metrics.accepted >= NEW_TOKENS // 2  # deep positions decided the tokens
