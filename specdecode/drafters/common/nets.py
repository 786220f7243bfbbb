"""The small trained networks of the feature-level drafters, and the frozen target parts they reuse.

EagleNet (Li et al. 2024, EAGLE-1/2): fc(concat(embedding of token x_{i+1}, target feature f_i)) -> one Llama
decoder layer -> predicted feature f_{i+1}; the target's LM head turns a feature into next-token logits.
MedusaHeads (Cai et al. 2024): head h is a residual block on the feature f_t whose LM-head logits predict
token x_{t+1+h} (head 1 predicts two tokens ahead: the target's own head already gives x_{t+1}).

Both score a reduced draft vocabulary (frequent tokens, `draft_ids` maps draft index -> target id): drafting
only ranks candidates, verification always uses the target's full vocabulary.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

# Draft vocabulary per device (a prefix of the head's, most frequent first; None = all of it). On the CPU the
# draft LM head is read once per depth and dominates drafting time: 8192 tokens in bf16 are read about five times
# faster than 16384 in fp32 and still cover ~98% of answer tokens (docs/design-notes.md, "Measured defaults").
DRAFT_VOCAB = {"cpu": 8192, "cuda": None}


@dataclass(frozen=True)
class EagleNetConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    draft_vocab_size: int

    @staticmethod
    def from_target(config, draft_vocab_size: int) -> EagleNetConfig:
        """Shape the draft layer like one layer of the target (its rotary base and norm eps included)."""
        heads = config.num_attention_heads
        rope = getattr(config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta") if isinstance(rope, dict) else None
        return EagleNetConfig(
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_attention_heads=heads,
            num_key_value_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            rms_norm_eps=float(getattr(config, "rms_norm_eps", 1e-6)),
            rope_theta=float(theta or getattr(config, "rope_theta", 10000.0)),
            max_position_embeddings=int(getattr(config, "max_position_embeddings", 8192)),
            draft_vocab_size=draft_vocab_size,
        )

    def llama_config(self):
        return LlamaConfig(
            vocab_size=self.draft_vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=1, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps,
            max_position_embeddings=self.max_position_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            attn_implementation="sdpa",  # boolean 4D masks (tree attention) need sdpa, not eager
        )

    def to_dict(self) -> dict:
        return asdict(self)


class EagleNet(nn.Module):
    """fc + one Llama decoder layer (transformers' own class) with rotary positions; see the module docstring."""

    def __init__(self, config: EagleNetConfig):
        super().__init__()
        self.config = config
        llama = config.llama_config()
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size)
        self.layer = LlamaDecoderLayer(llama, layer_idx=0)
        self.rotary = LlamaRotaryEmbedding(llama)
        self.register_buffer("draft_ids", torch.arange(config.draft_vocab_size), persistent=True)  # [vd]

    def forward(
        self,
        embeds: torch.Tensor,  # [b, q, h] target embeddings of tokens x_{i+1}
        features: torch.Tensor,  # [b, q, h] features f_i (target's, or predicted ones deeper in a tree)
        positions: torch.Tensor,  # [b, q] position i of each row
        mask: torch.Tensor,  # [b, 1, q, kv] bool, True = attend (cache slots, then this block)
        cache,  # a transformers Cache of one layer (RollbackCache when drafting, DynamicCache in training)
    ) -> torch.Tensor:  # [b, q, h] predicted features f_{i+1}
        hidden = self.fc(torch.cat([embeds, features], dim=-1))
        rotary = self.rotary(hidden, positions)
        out = self.layer(hidden, attention_mask=mask, position_ids=positions, past_key_values=cache,
                         use_cache=True, position_embeddings=rotary)
        return out[0] if isinstance(out, tuple) else out


@dataclass(frozen=True)
class MedusaNetConfig:
    hidden_size: int
    num_heads: int
    draft_vocab_size: int

    def to_dict(self) -> dict:
        return asdict(self)


class _ResBlock(nn.Module):
    """x + SiLU(W x + b), W zero-initialised so an untrained head starts as the target's own LM head."""

    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    def __init__(self, config: MedusaNetConfig):
        super().__init__()
        self.config = config
        self.blocks = nn.ModuleList(_ResBlock(config.hidden_size) for _ in range(config.num_heads))
        self.register_buffer("draft_ids", torch.arange(config.draft_vocab_size), persistent=True)  # [vd]

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        # features: [..., h] -> [..., heads, h]
        return torch.stack([block(features) for block in self.blocks], dim=-2)


def fast_bf16_cpu() -> bool:
    """Whether this CPU multiplies bf16 natively (oneDNN with AVX512-BF16/AMX): the draft LM head then reads
    half the bytes. Where it would be emulated, fp32 is faster."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def fast_bf16(device: torch.device) -> bool:
    """Whether bf16 matmuls are faster than fp32 on `device`: CUDA, or a CPU that multiplies bf16 natively."""
    return device.type == "cuda" or (device.type == "cpu" and fast_bf16_cpu())


class FrozenVocab:
    """The target's input embeddings and LM head, the latter restricted to a draft vocabulary (not trained).

    draft_ids: [vd] target token ids, draft index -> target id; size: keep only the first `size` of them (heads
    store them most frequent first). head_dtype: the restricted LM head's dtype (drafting only ranks tokens,
    so bf16 is enough; verification always uses the target's own full-precision head)."""

    def __init__(self, target_model: nn.Module, draft_ids: torch.Tensor, size: int | None = None,
                 head_dtype: torch.dtype | None = None):
        embed = target_model.get_input_embeddings()
        head = target_model.get_output_embeddings()
        device = embed.weight.device
        self.embed_weight = embed.weight.detach()  # [vocab, h]
        self.draft_ids = draft_ids[:size].to(device)
        dtype = head_dtype or head.weight.dtype
        self.head_weight = head.weight.detach()[self.draft_ids].to(dtype).clone()  # [vd, h]
        bias = getattr(head, "bias", None)
        self.head_bias = None if bias is None else bias.detach()[self.draft_ids].to(dtype).clone()  # [vd]

    def to(self, dtype: torch.dtype) -> FrozenVocab:
        self.head_weight = self.head_weight.to(dtype)
        self.head_bias = None if self.head_bias is None else self.head_bias.to(dtype)
        return self

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(token_ids, self.embed_weight)  # [..., h]

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        # features: [..., h] -> [..., vd]
        return nn.functional.linear(features.to(self.head_weight.dtype), self.head_weight, self.head_bias)
