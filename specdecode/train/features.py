"""Cached target hidden states: one batched forward pass per group of examples (no generation), stored flat
with offsets so training never runs the target again. Saved as safetensors + a JSON record of the sources."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from specdecode.train.data import Dataset


@dataclass
class FeatureData:
    tokens: torch.Tensor  # [n] int64, all examples back to back
    offsets: torch.Tensor  # [e + 1] int64, example i is tokens[offsets[i]:offsets[i + 1]]
    loss_start: torch.Tensor  # [e] int64, per example
    features: torch.Tensor  # [n, h] target last hidden states (after the final norm); with meta["aux_layers"]
    # [n, (layers + 1) x h]: what enters each of those layers (EAGLE-3), then the last state
    meta: dict

    @property
    def num_examples(self) -> int:
        return int(self.offsets.shape[0] - 1)

    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]  # [e]

    @property
    def aux_layers(self) -> tuple[int, ...]:
        return tuple(self.meta.get("aux_layers", ()))

    def last_only(self) -> FeatureData:
        """The same data with the last hidden state alone (what EAGLE-2 and Medusa train on)."""
        if not self.aux_layers:
            return self
        width = self.features.shape[1] // (len(self.aux_layers) + 1)
        meta = {k: v for k, v in self.meta.items() if k != "aux_layers"}
        return FeatureData(self.tokens, self.offsets, self.loss_start, self.features[:, -width:], meta)

    def to(self, device) -> FeatureData:
        return FeatureData(self.tokens.to(device), self.offsets, self.loss_start, self.features.to(device), self.meta)

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_file({"tokens": self.tokens.cpu().int(), "offsets": self.offsets.cpu(),
                   "loss_start": self.loss_start.cpu()}, str(directory / "tokens.safetensors"))
        save_file({"features": self.features.cpu().contiguous()}, str(directory / "features.safetensors"))
        (directory / "meta.json").write_text(json.dumps(self.meta, indent=2) + "\n")

    @staticmethod
    def exists(directory: str | Path) -> bool:
        directory = Path(directory)
        return all((directory / name).is_file() for name in ("tokens.safetensors", "features.safetensors", "meta.json"))

    @staticmethod
    def load(directory: str | Path) -> FeatureData:
        directory = Path(directory)
        tokens = load_file(str(directory / "tokens.safetensors"))
        features = load_file(str(directory / "features.safetensors"))["features"]
        meta = json.loads((directory / "meta.json").read_text())
        return FeatureData(tokens["tokens"].long(), tokens["offsets"], tokens["loss_start"], features, meta)


@torch.no_grad()
def compute_features(model, dataset: Dataset, batch_tokens: int = 16384, dtype: torch.dtype = torch.bfloat16,
                     keep_on=None, aux_layers: tuple[int, ...] = ()) -> FeatureData:
    """Run the target's decoder over every example (right padding, causal) and keep its last hidden state, after
    what enters each of `aux_layers` (EAGLE-3) when given. keep_on: where the features live afterwards (CPU)."""
    device = next(model.parameters()).device
    decoder = model.get_decoder()
    lengths = [len(e.tokens) for e in dataset.examples]
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.long)
    hidden = decoder.config.hidden_size
    features = torch.empty((int(offsets[-1]), (len(aux_layers) + 1) * hidden), dtype=dtype, device=keep_on or "cpu")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches, current = [], []
    for i in order:
        if current and (len(current) + 1) * lengths[i] > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    for batch in tqdm(batches, desc="target hidden states", unit="batch"):
        width = max(lengths[i] for i in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, i in enumerate(batch):
            ids[row, : lengths[i]] = torch.tensor(dataset.examples[i].tokens)
            mask[row, : lengths[i]] = 1
        result = decoder(input_ids=ids.to(device), attention_mask=mask.to(device),
                         output_hidden_states=bool(aux_layers))
        out = result.last_hidden_state  # [b, t, h]
        if aux_layers:  # [b, t, (layers + 1) x h]
            out = torch.cat([*(result.hidden_states[layer] for layer in aux_layers), out], dim=-1)
        for row, i in enumerate(batch):
            features[offsets[i] : offsets[i + 1]] = out[row, : lengths[i]].to(features.device, dtype)
    tokens = torch.tensor([t for e in dataset.examples for t in e.tokens], dtype=torch.long)
    loss_start = torch.tensor([e.loss_start for e in dataset.examples], dtype=torch.long)
    per_source: dict[str, int] = {}
    for example, length in zip(dataset.examples, lengths):
        name = dataset.sources[example.source]
        per_source[name] = per_source.get(name, 0) + length
    meta = {"examples": len(lengths), "tokens": int(offsets[-1]), "sources": per_source,
            "feature_dtype": str(dtype).replace("torch.", ""),
            **({"aux_layers": list(aux_layers)} if aux_layers else {})}
    return FeatureData(tokens, offsets, loss_start, features, meta)


def target_token_counts(data: FeatureData, vocab_size: int) -> torch.Tensor:
    """[vocab] how often each token is a training target (answer tokens, plain text)."""
    positions = torch.arange(data.tokens.shape[0])
    example = torch.searchsorted(data.offsets, positions, right=True) - 1
    is_target = positions >= data.offsets[example] + data.loss_start[example]
    return torch.bincount(data.tokens.cpu()[is_target], minlength=vocab_size)


def choose_draft_vocab(counts: torch.Tensor, size: int, always: set[int]) -> tuple[torch.Tensor, float]:
    """The `size` most frequent target tokens (plus `always`, e.g. EOS) -> (ids [size] in order of frequency,
    so any prefix is a smaller draft vocabulary; share of training targets covered)."""
    size = min(size, counts.shape[0])
    ranked = torch.argsort(counts, descending=True, stable=True)
    chosen = list(dict.fromkeys([*sorted(always), *ranked.tolist()]))[:size]
    ids = torch.tensor(chosen, dtype=torch.long)
    total = float(counts.sum())
    return ids, (float(counts[ids].sum()) / total if total else 1.0)
