"""The native decoder layers of packed Llama-family models (backends/cpu/decoder.py, backends/cpu/layers.c): the
same model as transformers' forward over the same modules (up to rounding), and every row's bits independent of
its pass."""
import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from specdecode.backends.cpu import native
from specdecode.core.target import Target
from specdecode.core.trees import build_block
from specdecode.errors import ConfigError
from specdecode.loading.formats import apply
from tests.tiny import tiny_gemma3, tiny_llama, tiny_mistral, tiny_phi3, tiny_qwen3

pytestmark = pytest.mark.skipif(native.missing() is not None, reason=str(native.missing()))


def tiny_qwen2() -> Qwen2ForCausalLM:
    """Qwen2's layer differs from Llama's by its q/k/v biases."""
    config = Qwen2Config(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         pad_token_id=0, eos_token_id=2, initializer_range=0.3, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for name in ("q_proj", "k_proj", "v_proj"):
                getattr(layer.self_attn, name).bias.normal_(0, 0.3)
    return model


def packed(model: torch.nn.Module, fmt: str) -> torch.nn.Module:
    model = copy.deepcopy(model)
    apply(model, fmt)
    return model


def llama_heads(hidden: int, heads: int, kv_heads: int) -> LlamaForCausalLM:
    """A tiny Llama with another head layout: head_dim = hidden / heads (attention has paths for head_dim a
    multiple of 64, of 8, and neither)."""
    config = LlamaConfig(vocab_size=259, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
                         pad_token_id=0, eos_token_id=2, initializer_range=0.3, tie_word_embeddings=False)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def tiny_llama3() -> LlamaForCausalLM:
    """Llama 3.x: Llama's layer with its RoPE scaling (low frequencies stretched past an original context of 16
    positions, so the prompts here reach the scaled band)."""
    model = tiny_llama(layers=2)
    config = copy.deepcopy(model.config)
    config.rope_parameters = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    torch.manual_seed(1)
    scaled = LlamaForCausalLM(config).eval()
    assert scaled.model.rotary_emb.rope_type == "llama3"
    return scaled


MODELS = {"llama": lambda: tiny_llama(), "llama3": tiny_llama3, "qwen2": tiny_qwen2, "qwen3": tiny_qwen3,
          "gemma3": tiny_gemma3, "mistral": tiny_mistral, "phi3": tiny_phi3}
HEAD_LAYOUTS = {**MODELS, "head_dim 64": lambda: llama_heads(256, 4, 2), "head_dim 12": lambda: llama_heads(96, 8, 2)}
PROMPT = [5, 17, 99, 3, 42, 42, 7, 120, 64, 9, 33]
LONG_PROMPT = [(7 * i + 3) % 250 + 3 for i in range(45)]  # past the window of 8 tokens (gemma3, mistral), as PROMPT is


def prefill(target: Target, ids: list[int], **kwargs):
    cache = target.new_cache()
    block = build_block([0], [ids], [list(range(-1, len(ids) - 1))], target.pad_id, target.block_device)
    return cache, target.forward(cache, [0], block, **kwargs)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("arch", list(MODELS))
def test_a_layer_matches_transformers(arch, fmt):
    """One layer (and every layer, then the head) against the model's own forward over the same packed modules,
    both with an fp32 cache: the only differences are float summation orders, which int8 activation codes can
    round apart in later layers, so the whole model is held to a looser bound than one layer."""
    model = packed(MODELS[arch](), fmt)
    native_target, own = Target(model), Target(model, packed_decoder=False)
    assert native_target.packed_decoder and not own.packed_decoder
    for layers, typical, most in ((1, 1e-5, 5e-3), (None, 0.05, 0.1)):
        _, ours = prefill(native_target, PROMPT, hidden=True, num_layers=layers)
        _, theirs = prefill(own, PROMPT, hidden=True, num_layers=layers)
        apart, scale = (ours.hidden - theirs.hidden).abs(), theirs.hidden.abs().max()
        assert apart.median() <= typical * scale  # float rounding ...
        assert apart.max() <= most * scale  # ... and now and then a flipped int8 activation code
        assert ours.logits.shape == theirs.logits.shape
    assert (ours.logits.argmax(-1) == theirs.logits.argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("arch", list(MODELS))
def test_greedy_64_tokens_equal_transformers(arch):
    """64 greedy tokens decoded natively equal those of the model's own forward over the same packed modules
    (every pass through Target, one token at a time after the prompt): the rounding apart above never decides
    a token on these models, and past the sliding windows (gemma3, mistral) each layer saw its own window."""
    from specdecode.config import DrafterConfig, GenerationConfig, SamplingConfig, SpecConfig
    from specdecode.core.engine import Engine
    from specdecode.drafters import build_drafter

    model = packed(MODELS[arch](), "int4")
    outputs = []
    for target in (Target(model), Target(model, packed_decoder=False)):
        engine = Engine(target, build_drafter(target, DrafterConfig("none")), SpecConfig())
        generation = GenerationConfig(max_new_tokens=64, stop_on_eos=False)
        outputs.append(engine.generate(LONG_PROMPT, SamplingConfig(), generation).token_ids)
    assert outputs[0] == outputs[1] and len(outputs[0]) == 64


def test_fused_projections_split_into_views():
    """Phi-3's qkv_proj and gate_up_proj are cut into the q, k, v and gate, up layers layers.c reads: views of
    the packed rows (no copy), each equal to its slice of the fused layer's output."""
    from specdecode.backends.cpu.decoder import _linears

    layer = packed(tiny_phi3(), "int4").model.layers[0]
    q, k, v, _, gate, up, _ = _linears(layer)
    x = torch.randn(3, 64)
    fused, parts = layer.self_attn.qkv_proj(x), torch.cat([q(x), k(x), v(x)], -1)
    assert torch.equal(fused, parts) and q.codes.data_ptr() == layer.self_attn.qkv_proj.codes.data_ptr()
    assert torch.equal(layer.mlp.gate_up_proj(x), torch.cat([gate(x), up(x)], -1))
    with pytest.raises(ValueError, match="do not split"):
        layer.self_attn.qkv_proj.split((60, 68))


@pytest.mark.parametrize("arch", list(MODELS))
def test_an_fp16_cache_is_the_fp32_one_rounded(arch):
    """kv_half: the cache holds keys and values in fp16, exactly the fp32 cache's values rounded to nearest, and
    the model's next tokens mostly those of the fp32 cache (these tiny random models have large activations,
    which fp16 rounds coarsely: about 2e-3 of the largest state apart after one layer)."""
    model = packed(MODELS[arch](), "int4")
    half, full = Target(model, kv_half=True), Target(model)
    assert half.kv_dtype == torch.float16 and full.kv_dtype == torch.float32
    (half_cache, ours), (full_cache, theirs) = (prefill(t, PROMPT, hidden=True, num_layers=1) for t in (half, full))
    (k16, v16), (k32, v32) = (c.layers[0].row(0) for c in (half_cache, full_cache))  # [kv_heads, capacity, d]
    n = len(PROMPT)
    assert k16.dtype == torch.float16 and torch.equal(k16[:, :n], k32[:, :n].half())
    assert torch.equal(v16[:, :n], v32[:, :n].half())
    apart, scale = (ours.hidden - theirs.hidden).abs(), theirs.hidden.abs().max()
    assert 0 < apart.median() <= 5e-3 * scale
    _, ours = prefill(half, PROMPT)
    _, theirs = prefill(full, PROMPT)
    assert (ours.logits.argmax(-1) == theirs.logits.argmax(-1)).float().mean() >= 0.8


TREES = {"6 nodes": ([11, 12, 13, 14, 15, 16], [-1, 0, 1, 0, 3, 1]),  # two branches off node 0, one off node 1
         "20 nodes": (list(range(20, 40)), [-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 12, 13, 1, 15, 2, 17, 17])}


@pytest.mark.parametrize("kv_half", [False, True], ids=["fp32 cache", "fp16 cache"])
@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("prompt", [PROMPT, LONG_PROMPT], ids=["11 tokens", "45 tokens"])
@pytest.mark.parametrize("arch", list(HEAD_LAYOUTS))
def test_a_tree_pass_gives_each_node_its_one_token_logits(arch, prompt, tree, kv_half):
    """Speculation's losslessness over a packed target rests on this: a verify pass over a tree reproduces, bit
    for bit, the logits each node gets when its path is decoded one token at a time (attention shares each slice
    of the cache among the rows and heads of a unit, 8 slots at a time: prompts that do and do not fill the last
    slice, trees that are and are not split into several units)."""
    target = Target(packed(HEAD_LAYOUTS[arch](), "int4"), kv_half=kv_half)
    tokens, parents = TREES[tree]
    cache, _ = prefill(target, prompt)
    start = len(prompt)
    tree = target.forward(cache, [0], build_block([start], [tokens], [parents], target.pad_id, "cpu")).logits[0]
    for node in range(len(tokens)):
        path = [node]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        path.reverse()
        alone, _ = prefill(target, prompt)
        for depth, step in enumerate(path):
            block = build_block([start + depth], [[tokens[step]]], [[-1]], target.pad_id, "cpu")
            logits = target.forward(alone, [0], block).logits[0, 0]
        assert torch.equal(logits, tree[node]), f"node {node} differs from its one-token pass"


def test_batched_rows_of_different_lengths_are_independent():
    """A server batch: two sequences of different lengths in one pass each get their single-row logits."""
    target = Target(packed(tiny_llama(), "int4"))
    first, second = PROMPT, PROMPT[:4] + [77, 78]
    cache = target.new_cache(rows=2)
    block = build_block([0, 0], [first, second], [list(range(-1, len(first) - 1)),
                                                  list(range(-1, len(second) - 1))], target.pad_id, "cpu")
    target.forward(cache, [0, 1], block)
    step = build_block([len(first), len(second)], [[9, 10], [3, 4]], [[-1, 0], [-1, 0]], target.pad_id, "cpu")
    batched = target.forward(cache, [0, 1], step).logits  # [2, 2, vocab]
    for row, (ids, new) in enumerate(((first, [9, 10]), (second, [3, 4]))):
        alone, _ = prefill(target, ids)
        single = target.forward(alone, [0], build_block([len(ids)], [new], [[-1, 0]], target.pad_id, "cpu")).logits
        assert torch.equal(single[0], batched[row])


def test_a_ragged_batch_computes_its_real_rows_only():
    """A batch of a 1-token step, a 5-node tree and a 3-token chain is padded to 5 tokens a row, but the pass
    computes its 9 real rows, not 15. Each row's real positions get its single-row logits bit for bit, and a
    padded position its row's last real one."""
    target = Target(packed(tiny_llama(), "int4"))
    prompts = [PROMPT, PROMPT[:4] + [77, 78], PROMPT[2:9]]
    news, parents = [[9], [3, 4, 5, 6, 7], [11, 12, 13]], [[-1], [-1, 0, 1, 0, 3], [-1, 0, 1]]
    cache = target.new_cache(rows=3)
    target.forward(cache, [0, 1, 2], build_block([0] * 3, prompts, [list(range(-1, len(p) - 1)) for p in prompts],
                                                  target.pad_id, "cpu"))
    computed, stack = [], target._packed.stack

    class Spy:  # the layers' rows, as the native stack is handed them
        def forward(self, x, *rest):
            computed.append(x.shape[0])
            return stack.forward(x, *rest)

    target._packed.stack = Spy()
    step = build_block([len(p) for p in prompts], news, parents, target.pad_id, "cpu")
    batched = target.forward(cache, [0, 1, 2], step).logits  # [3, 5, vocab]
    assert computed == [9] and batched.shape[:2] == (3, 5)
    for row, (ids, new, tree) in enumerate(zip(prompts, news, parents)):
        alone, _ = prefill(target, ids)
        single = target.forward(alone, [0], build_block([len(ids)], [new], [tree], target.pad_id, "cpu")).logits
        assert torch.equal(single[0], batched[row, : len(new)])
        for padded in range(len(new), 5):
            assert torch.equal(batched[row, padded], batched[row, len(new) - 1])


def test_riding_prompt_rows_get_no_logits_and_change_no_other_row():
    """A step's decode rows (a 3-node chain, a 1-token step) with a 12-token prompt chunk riding after them:
    `logit_rows` scores the decode rows only, [2, 3, vocab], each bit for bit its logits in a pass of its own;
    the head reads the 4 decode positions, not the chunk's 12 (the head is a fifth of SmolLM2's bytes), the
    chunk's hidden states are still all there, and a pass of riders only scores nothing."""
    target = Target(packed(tiny_llama(), "int4"))
    prompts = [PROMPT, PROMPT[:4] + [77, 78], PROMPT[:2]]
    cache = target.new_cache(rows=3)
    target.forward(cache, [0, 1, 2], build_block([0] * 3, prompts, [list(range(-1, len(p) - 1)) for p in prompts],
                                                  target.pad_id, "cpu"))
    chunk = [40 + i for i in range(12)]
    news, parents = [[9, 10, 11], [3], chunk], [[-1, 0, 1], [-1], list(range(-1, 11))]
    step = build_block([len(p) for p in prompts], news, parents, target.pad_id, "cpu")
    heads, head = [], target._packed._head
    target._packed._head = lambda rows, threads: (heads.append(rows.shape[0]), head(rows, threads))[1]
    out = target.forward(cache, [0, 1, 2], step, hidden=True, logit_rows=2)
    assert out.logits.shape[:2] == (2, 3) and heads == [4] and out.hidden.shape[:2] == (3, 12)
    for row in range(2):
        alone, _ = prefill(target, prompts[row])
        single = target.forward(alone, [0], build_block([len(prompts[row])], [news[row]], [parents[row]],
                                                         target.pad_id, "cpu")).logits
        assert torch.equal(single[0], out.logits[row, : len(news[row])])
    riders = build_block([len(prompts[2]) + 12], [[50, 51, 52]], [[-1, 0, 1]], target.pad_id, "cpu")
    assert target.forward(cache, [2], riders, logit_rows=0).logits.shape == (0, 0, target.vocab_size)


def test_layer_skip_runs_the_first_layers_only():
    model = packed(tiny_llama(), "int8")
    ours = prefill(Target(model), PROMPT, hidden=True, num_layers=2)[1]
    full = prefill(Target(model), PROMPT, hidden=True)[1]
    theirs = prefill(Target(model, packed_decoder=False), PROMPT, hidden=True, num_layers=2)[1]
    assert (ours.hidden - theirs.hidden).abs().max() < (ours.hidden - full.hidden).abs().max()


def test_float_models_keep_their_own_forward():
    model = tiny_llama()
    assert not Target(model).packed_decoder and Target(model).kv_dtype == torch.float32
    with pytest.raises(ConfigError, match="an fp16 KV cache needs the native decoder"):
        Target(model, kv_half=True)
    with pytest.raises(ValueError, match="not every decoder linear layer is packed"):
        Target(model, packed_decoder=True)


def test_the_rotary_table_holds_what_the_module_returns():
    """Looked-up cos/sin equal the model's rotary module at every position, bit for bit (the table grows past
    its first size); a rope whose frequencies depend on the sequence length is not tabled."""
    from specdecode.backends.cpu.decoder import RotaryTable

    for model in (tiny_llama(), tiny_qwen2()):
        table, rotary = RotaryTable(model.model.rotary_emb), model.model.rotary_emb
        for positions in (torch.tensor([[0, 1, 2, 700]]), torch.arange(1500, 1520).reshape(2, 10)):
            cos, sin = table(positions)
            want_cos, want_sin = rotary(torch.empty(1), positions)
            assert table.exact and torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
        assert table.cos.shape[0] >= 1520
    rescaled = copy.deepcopy(tiny_llama().model.rotary_emb)
    rescaled.rope_type = "dynamic"
    assert not RotaryTable(rescaled).exact


def test_gemma_layers_read_their_own_rotary_table():
    """Gemma 3's rotary module holds a table per layer type (sliding layers rotate at theta 10,000, full ones at
    a million): each table is that type's, bit for bit."""
    from specdecode.backends.cpu.decoder import RotaryTable

    rotary, positions = tiny_gemma3().model.rotary_emb, torch.tensor([[0, 3, 40, 700]])
    tables = {kind: RotaryTable(rotary, kind)(positions) for kind in ("sliding_attention", "full_attention")}
    for kind, (cos, sin) in tables.items():
        want_cos, want_sin = rotary(torch.empty(1), positions, kind)
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    assert not torch.equal(tables["sliding_attention"][0], tables["full_attention"][0])


@pytest.mark.parametrize("arch", ["gemma3", "mistral"])
def test_sliding_window_layers_see_their_window_only(arch):
    """The match above holds past the window because sliding layers read the windowed mask: given the full
    mask instead, the native model is another model (the test can fail)."""
    model = packed(MODELS[arch](), "int8")
    native_target, own = Target(model), Target(model, packed_decoder=False)
    native_target._layer_masks = lambda block: block.mask
    _, ours = prefill(native_target, LONG_PROMPT, hidden=True)
    _, theirs = prefill(own, LONG_PROMPT, hidden=True)
    assert (ours.hidden - theirs.hidden).abs().max() > 0.1 * theirs.hidden.abs().max()


@pytest.mark.parametrize("taps", [(1, 2, 3), (0, 2), (3,)])
def test_tapped_layers_are_the_states_entering_them(taps):
    """EAGLE-3 reads what enters three target layers: the native stack runs in stretches between them, and gives
    transformers' hidden_states[l] (to the kernels' rounding: closer than the states of neighbouring layers)."""
    model = packed(tiny_llama(), "int8")
    ours = prefill(Target(model), PROMPT, hidden=True, hidden_layers=taps)[1].hidden  # [1, q, taps x hidden]
    theirs = prefill(Target(model, packed_decoder=False), PROMPT, hidden=True, hidden_layers=taps)[1].hidden
    width = model.config.hidden_size
    assert ours.shape == theirs.shape == (1, len(PROMPT), len(taps) * width)
    for i, layer in enumerate(taps):
        mine, hf = ours[..., i * width : (i + 1) * width], theirs[..., i * width : (i + 1) * width]
        assert (mine - hf).abs().max() < 1e-2 * hf.abs().max(), layer
    last = prefill(Target(model), PROMPT, hidden=True)[1].hidden
    assert not torch.allclose(ours[..., -width:], last)  # a tap is not the final state
    logits = prefill(Target(model), PROMPT)[1].logits
    assert torch.equal(prefill(Target(model), PROMPT, hidden=True, hidden_layers=taps)[1].logits, logits)
