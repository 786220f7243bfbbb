"""The EAGLE-3 draft network (Li et al. 2025, arXiv 2503.01840), laid out as the serving engines load it.

Where EAGLE-1/2 feed the draft layer the target's last hidden state, EAGLE-3 fuses three of the target's layers
(low, middle, high): fc([h_low, h_mid, h_high]) -> f_i. The one decoder layer reads the embedding of token
x_{i+1} and f_i side by side (each normed; attention's q/k/v project the 2h-wide concatenation), and returns
the next feature before the final norm, which deeper draft steps feed back in place of f. Its own LM head scores
a reduced draft vocabulary; draft index i is target token i + d2t[i], and t2d marks the target tokens it holds.

The module names are those of SGLang's LlamaForCausalLMEagle3 and SpecForge (fc, midlayer.*, norm, lm_head,
d2t, t2d), so a state dict is the SGLang layout as it stands; speculators/vLLM name the layer layers.0.*
(eagle3_format.py maps the two). The residual is taken before hidden_norm (SGLang's layer, vLLM's default
for plain checkpoints); `norm_before_residual` takes it after, as speculators may train it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

from specdecode.drafters.common.nets import EagleNetConfig


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """The target layers whose inputs EAGLE-3 fuses: (2, L // 2, L - 3), as vLLM and SGLang choose by default.
    Index l is the hidden state entering decoder layer l (transformers' hidden_states[l])."""
    if num_layers >= 8:
        return (2, num_layers // 2, num_layers - 3)
    return (min(1, num_layers - 1), num_layers // 2, max(num_layers - 1, 0))  # tiny test models: spread out


@dataclass(frozen=True)
class Eagle3NetConfig(EagleNetConfig):
    """The draft layer's shape (EagleNetConfig: one layer of the target), and what EAGLE-3 adds."""

    vocab_size: int  # the target's: d2t maps into it, t2d has one entry per target token
    target_hidden_size: int
    aux_layers: tuple[int, int, int]
    norm_before_residual: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "aux_layers", tuple(int(i) for i in self.aux_layers))
        if len(self.aux_layers) != 3:
            raise ValueError(f"EAGLE-3 fuses three target layers, got {self.aux_layers}")

    @staticmethod
    def from_target(config, draft_vocab_size: int, vocab_size: int,  # type: ignore[override]
                    aux_layers: tuple[int, int, int] | None = None) -> Eagle3NetConfig:
        """Shape the draft layer like one layer of the target (EagleNetConfig.from_target), fusing aux_layers
        (default_aux_layers when None)."""
        like = EagleNetConfig.from_target(config, draft_vocab_size)
        layers = aux_layers or default_aux_layers(config.num_hidden_layers)
        return Eagle3NetConfig(**asdict(like), vocab_size=vocab_size, target_hidden_size=config.hidden_size,
                               aux_layers=tuple(layers))

    def llama_config(self) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=1, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps,
            max_position_embeddings=self.max_position_embeddings, hidden_act="silu",
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            attn_implementation="sdpa",  # boolean 4D masks (tree attention) need sdpa, not eager
        )

    def to_dict(self) -> dict:
        return {**asdict(self), "aux_layers": list(self.aux_layers)}


class Eagle3Layer(nn.Module):
    """The draft decoder layer: attention over [norm(embedding), norm(feature)] (2h wide in, h out), then MLP."""

    def __init__(self, config: Eagle3NetConfig, llama: LlamaConfig):
        super().__init__()
        wide, heads, kv_heads, head_dim = 2 * config.hidden_size, config.num_attention_heads, \
            config.num_key_value_heads, config.head_dim
        self.self_attn = LlamaAttention(llama, layer_idx=0)
        self.self_attn.q_proj = nn.Linear(wide, heads * head_dim, bias=False)
        self.self_attn.k_proj = nn.Linear(wide, kv_heads * head_dim, bias=False)
        self.self_attn.v_proj = nn.Linear(wide, kv_heads * head_dim, bias=False)
        self.mlp = LlamaMLP(llama)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)  # on the token embedding
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)  # on the feature
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.norm_before_residual = config.norm_before_residual

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, rotary, mask: torch.Tensor | None, cache
                ) -> torch.Tensor:
        # embeds, features: [b, q, h] -> [b, q, h] (before the final norm)
        normed = self.hidden_norm(features)
        residual = normed if self.norm_before_residual else features
        both = torch.cat([self.input_layernorm(embeds), normed], dim=-1)  # [b, q, 2h]
        attended, _ = self.self_attn(both, position_embeddings=rotary, attention_mask=mask, past_key_values=cache)
        residual = residual + attended
        return residual + self.mlp(self.post_attention_layernorm(residual))


class Eagle3Net(nn.Module):
    """fc + the draft layer + norm + draft LM head, with the vocabulary maps (see the module docstring)."""

    def __init__(self, config: Eagle3NetConfig):
        super().__init__()
        self.config = config
        llama = config.llama_config()
        self.fc = nn.Linear(3 * config.target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(config, llama)
        self.norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.rotary = LlamaRotaryEmbedding(llama)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))  # [vd] target - draft
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))  # [v] in the draft vocab
        self.set_draft_ids(torch.arange(config.draft_vocab_size))

    def set_draft_ids(self, draft_ids: torch.Tensor) -> None:
        """draft_ids: [vd] the target token of each draft index (any order, no repeats)."""
        if draft_ids.shape != self.d2t.shape or int(draft_ids.max()) >= self.t2d.shape[0] or int(draft_ids.min()) < 0:
            raise ValueError(f"draft ids must be {tuple(self.d2t.shape)} target tokens below {self.t2d.shape[0]}")
        if torch.unique(draft_ids).numel() != draft_ids.numel():
            raise ValueError("draft ids repeat a target token")
        ids = draft_ids.to(self.d2t.device, torch.long)
        self.d2t.copy_(ids - torch.arange(ids.shape[0], device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    @property
    def draft_ids(self) -> torch.Tensor:
        """[vd] target token id of each draft index."""
        return self.d2t + torch.arange(self.d2t.shape[0], device=self.d2t.device)

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        # aux: [..., 3 * target_hidden] the three target layers side by side -> [..., h] feature
        return self.fc(aux)

    def forward(
        self,
        embeds: torch.Tensor,  # [b, q, h] target embeddings of tokens x_{i+1}
        features: torch.Tensor,  # [b, q, h] fused target features f_i, or the layer's own output deeper in a tree
        positions: torch.Tensor,  # [b, q]
        mask: torch.Tensor | None,  # [b, 1, q, kv] bool, True = attend
        cache,  # a transformers Cache of one layer
    ) -> torch.Tensor:  # [b, q, h] the next feature, before the final norm
        rotary = self.rotary(features, positions)
        return self.midlayer(embeds, features, rotary, mask, cache)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        # features: [..., h] -> [..., vd] draft-vocabulary logits
        return self.lm_head(self.norm(features))
