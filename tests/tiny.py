"""Builders for tiny random-initialised models and an offline byte-level tokenizer (no downloads)."""
from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

# A chat template that teaches Hermes' tool calls, as Qwen2.5's does (shorter): the tools as JSON, each earlier call
# as <tool_call> JSON with its arguments written by `tojson`
TOOL_TEMPLATE = (
    "{% if tools %}<|system|>Tools:{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n"
    "Call one as <tool_call>\n{\"name\": ..., \"arguments\": {...}}\n</tool_call>\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
    "{% for call in m.tool_calls or [] %}<tool_call>\n{\"name\": \"{{ call.function.name }}\", \"arguments\": "
    "{{ call.function.arguments | tojson }}}\n</tool_call>{% endfor %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer without merges: 256 byte tokens + <pad>, <s>, </s>. Round-trips any text."""
    return byte_tokenizer_without()


def tool_tokenizer() -> PreTrainedTokenizerFast:
    """byte_tokenizer with TOOL_TEMPLATE: a chat template that teaches Hermes' <tool_call> format."""
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = TOOL_TEMPLATE
    return tokenizer


def byte_tokenizer_without(*lacking: int) -> PreTrainedTokenizerFast:
    """byte_tokenizer less the tokens of the `lacking` byte values (as real vocabularies lack a few)."""
    symbols = _byte_symbols()
    alphabet = set(pre_tokenizers.ByteLevel.alphabet()) - {symbols[byte] for byte in lacking}
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2}
    for char in sorted(alphabet):
        vocab[char] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _byte_symbols() -> dict[int, str]:
    """GPT-2's byte -> printable character map (ByteLevel's alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    symbols, extra = {byte: chr(byte) for byte in printable}, 0
    for byte in range(256):
        if byte not in symbols:
            symbols[byte], extra = chr(256 + extra), extra + 1
    return symbols


def tiny_llama(vocab_size: int = 259, layers: int = 4, hidden: int = 64, seed: int = 0, std: float = 0.3,
               max_positions: int = 1024, eos_token_id: int | None = 2) -> LlamaForCausalLM:
    """A random Llama whose logits are peaked enough (std) that fp32 argmax ties are unlikely."""
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
        pad_token_id=0, bos_token_id=1, eos_token_id=eos_token_id, initializer_range=std, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    return model.eval()


def tiny_gemma3(vocab_size: int = 259, layers: int = 3, hidden: int = 64, seed: int = 0, std: float = 0.3,
                window: int = 8, eos_token_id: int | None = 2) -> Gemma3ForCausalLM:
    """A random Gemma 3: sandwich norms stored as w - 1, per-head q/k norms, a GELU-gated MLP, its own attention
    scale, a scaled embedding tied to the head, and sliding-window layers (a window of `window` tokens, so short
    prompts already reach past it) around a full-attention one with its own rotary table. The norm weights are
    random (the model's own initialisation makes every (1 + w) one)."""
    kinds = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]
    config = Gemma3TextConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=window,
        layer_types=[kinds[i % len(kinds)] for i in range(layers)], max_position_embeddings=1024, pad_token_id=0,
        bos_token_id=1, eos_token_id=eos_token_id, initializer_range=std, tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(config)
    return _random_norms(model, mean=0.0)


def tiny_qwen3(vocab_size: int = 259, layers: int = 3, hidden: int = 64, seed: int = 0,
               std: float = 0.3) -> Qwen3ForCausalLM:
    """A random Qwen3: Llama's layer with per-head q/k norms (random weights, not the initial ones)."""
    config = Qwen3Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, initializer_range=std, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    return _random_norms(model, mean=1.0)


def tiny_mistral(vocab_size: int = 259, layers: int = 3, hidden: int = 64, seed: int = 0, std: float = 0.3,
                 window: int = 8) -> MistralForCausalLM:
    """A random Mistral: Llama's layer, every layer attending within a sliding window of `window` tokens (no
    per-layer types), so short prompts already reach past it."""
    config = MistralConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=window,
        max_position_embeddings=1024, pad_token_id=0, bos_token_id=1, eos_token_id=2, initializer_range=std,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return _random_norms(MistralForCausalLM(config), mean=1.0)


def tiny_phi3(vocab_size: int = 259, layers: int = 3, hidden: int = 64, seed: int = 0,
              std: float = 0.3) -> Phi3ForCausalLM:
    """A random Phi-3: Llama's layer with q/k/v in one fused projection and gate/up in another."""
    config = Phi3Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        original_max_position_embeddings=1024, pad_token_id=0, bos_token_id=1, eos_token_id=2, initializer_range=std,
        tie_word_embeddings=False, sliding_window=None,
    )
    torch.manual_seed(seed)
    return _random_norms(Phi3ForCausalLM(config), mean=1.0)


def _random_norms(model: torch.nn.Module, mean: float) -> torch.nn.Module:
    """Every norm weight drawn around `mean` (the initial ones are all alike), in eval mode."""
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "norm" in name:
                weight.normal_(mean, 0.3)
    return model.eval()


def save_tiny(directory, model, tokenizer) -> str:
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def tiny_drafter(target, name: str, spec, draft_dir: str | None = None, exit_layer: int = 2,
                 row_cost: float | None = None, draft_weights: str = "auto", draft_vocab: int | None = None):
    """Any registered drafter for a tiny target: head drafters get random heads, draft-model gets draft_dir."""
    from specdecode.config import DrafterConfig
    from specdecode.drafters import build_drafter, registry

    entry = registry()[name]
    if entry.untrained is not None:
        return entry.untrained(target, spec)
    config = DrafterConfig(name=name, draft_model=draft_dir if entry.needs_draft_model else None, exit_layer=exit_layer,
                           row_cost=row_cost, draft_weights=draft_weights, draft_vocab=draft_vocab)
    drafter = build_drafter(target, config, spec)
    from specdecode.drafters.hybrid import Hybrid

    model = drafter.model if isinstance(drafter, Hybrid) else drafter  # a hybrid plans with its draft model's costs
    if getattr(model, "budget", None) is not None:  # a draft model: free draft passes, not the machine's costs
        from tests.fakes import fixed_chain

        model.budget = fixed_chain(depth=max(spec.k, spec.max_k))
    return drafter
