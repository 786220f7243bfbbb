"""The training loop: length-bucketed batches of cached features, AdamW with warm-up + cosine decay (driven by
steps or by the time budget, whichever is further along), a tqdm bar, checkpoints with optimizer state for
--resume, a held-out evaluation, and the final head (safetensors + JSON config) in the output directory."""
from __future__ import annotations

import contextlib
import math
import pickle
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specdecode.drafters.common.eagle3_format import save_eagle3
from specdecode.drafters.common.eagle3_net import Eagle3Net, Eagle3NetConfig
from specdecode.drafters.common.head_io import fingerprint, save_head
from specdecode.drafters.common.nets import (
    EagleNet,
    EagleNetConfig,
    FrozenVocab,
    MedusaHeads,
    MedusaNetConfig,
    fast_bf16,
)
from specdecode.drafters.medusa import medusa_paths
from specdecode.errors import ConfigError, first_line
from specdecode.train.features import FeatureData
from specdecode.train.objectives import Batch, eagle3_loss, eagle_loss, medusa_loss, medusa_topk_accuracy

CHECKPOINT = "checkpoint.pt"
CHECKPOINT_KEYS = ("net", "optimizer", "step", "elapsed", "history", "config")


@dataclass(frozen=True)
class TrainConfig:
    kind: str  # "eagle" | "eagle3" | "medusa"
    epochs: float = 4.0
    max_steps: int = 0  # 0 = from epochs
    max_minutes: float = 0.0  # 0 = no time budget
    batch_tokens: int = 8192  # padded tokens per batch
    lr: float = 5e-4
    weight_decay: float = 0.0
    warmup: int = 50
    ttt_steps: int = 3  # eagle: unrolled steps
    reg_weight: float = 1.0  # eagle: feature regression weight
    num_heads: int = 4  # medusa
    val_fraction: float = 0.03
    checkpoint_every: int = 200
    seed: int = 0
    trees: tuple[tuple[str, int], ...] = (("cpu", 3), ("cuda", 63))  # medusa: nodes per device (design-notes)
    layout: str = "sglang"  # eagle3: the shared layout the head is written in (eagle3_format.LAYOUTS)
    aux_layers: tuple[int, ...] = ()  # eagle3: the target layers fused (empty: default_aux_layers)


def checkpoint_file(path: Path) -> Path:
    """`path`, where a checkpoint is read and written, checked to be a file or nothing: a folder there was found
    only by the save after the training."""
    if path.exists() and not path.is_file():
        raise ConfigError(f"{path} is not a checkpoint file; remove it, or give another --out")
    return path


def read_checkpoint(path: Path, config: TrainConfig, device=None) -> dict | None:
    """The checkpoint at `path` to resume from (None: there is none), read and checked against `config` before the
    model loads and the data is built: a file that is no checkpoint, or one of another kind of head or another
    number of Medusa heads, is one line naming it, where it was a traceback once the data was built."""
    if not checkpoint_file(path).exists():
        return None
    try:
        state = torch.load(path, map_location=device, weights_only=False)
    except (OSError, EOFError, ValueError, RuntimeError, pickle.UnpicklingError) as error:  # empty, cut or foreign
        raise ConfigError(f"cannot resume from {path}: not a checkpoint ({first_line(error)}); remove it to start "
                          "afresh") from None
    if not isinstance(state, dict) or not all(key in state for key in CHECKPOINT_KEYS):
        raise ConfigError(f"cannot resume from {path}: not a training checkpoint; remove it to start afresh")
    saved = state["config"]
    if saved.get("kind") != config.kind:
        raise ConfigError(f"cannot resume from {path}: it holds a {saved.get('kind')} head, not {config.kind} "
                          "(--kind); give another --out")
    if config.kind == "medusa" and saved.get("num_heads") != config.num_heads:
        raise ConfigError(f"cannot resume from {path}: it holds {saved.get('num_heads')} Medusa heads, not "
                          f"{config.num_heads} (--heads)")
    return state


def make_net(config: TrainConfig, target_config, draft_ids: torch.Tensor) -> torch.nn.Module:
    if config.kind == "eagle3":
        net = Eagle3Net(Eagle3NetConfig.from_target(target_config, int(draft_ids.shape[0]),
                                                    int(target_config.vocab_size), config.aux_layers or None))
        net.set_draft_ids(draft_ids)
        return net
    if config.kind == "eagle":
        net = EagleNet(EagleNetConfig.from_target(target_config, int(draft_ids.shape[0])))
    else:
        net = MedusaHeads(MedusaNetConfig(target_config.hidden_size, config.num_heads, int(draft_ids.shape[0])))
    net.draft_ids.copy_(draft_ids)
    return net


def split(data: FeatureData, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    order = list(range(data.num_examples))
    random.Random(seed).shuffle(order)
    n_val = max(1, int(len(order) * val_fraction)) if len(order) > 1 else 0
    return order[n_val:], order[:n_val]


def bucket_batches(data: FeatureData, examples: list[int], batch_tokens: int, max_len: int) -> list[list[int]]:
    """Examples of similar length together, at most batch_tokens padded tokens per batch."""
    lengths = data.lengths().tolist()
    ordered = sorted(examples, key=lambda i: lengths[i])
    batches, current = [], []
    for i in ordered:
        width = min(lengths[i], max_len)
        if current and (len(current) + 1) * width > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def collate(data: FeatureData, examples: list[int], max_len: int, device) -> Batch:
    lengths = [min(int(data.offsets[i + 1] - data.offsets[i]), max_len) for i in examples]
    width = max(lengths)
    hidden = data.features.shape[1]
    tokens = torch.zeros((len(examples), width), dtype=torch.long, device=device)
    features = torch.zeros((len(examples), width, hidden), dtype=data.features.dtype, device=device)
    for row, (i, n) in enumerate(zip(examples, lengths)):
        start = int(data.offsets[i])
        tokens[row, :n] = data.tokens[start : start + n].to(device)
        features[row, :n] = data.features[start : start + n].to(device)
    return Batch(tokens, features, torch.tensor(lengths, device=device), data.loss_start[examples].to(device))


class Trainer:
    def __init__(self, config: TrainConfig, model, data: FeatureData, draft_ids: torch.Tensor, out: Path,
                 device, max_len: int = 1024):
        self.config, self.data, self.out, self.device, self.max_len = config, data, out, device, max_len
        self.target_model = model
        self.vocab = FrozenVocab(model, draft_ids).to(torch.float32)
        self.vocab.embed_weight = self.vocab.embed_weight.float()
        torch.manual_seed(config.seed)
        self.net = make_net(config, model.config, draft_ids).to(device)
        self.train_ids, self.val_ids = split(data, config.val_fraction, config.seed)
        self.batches = bucket_batches(data, self.train_ids, config.batch_tokens, max_len)
        per_epoch = len(self.batches)
        self.total_steps = config.max_steps or max(1, math.ceil(config.epochs * per_epoch))
        self.optimizer = torch.optim.AdamW(self.net.parameters(), lr=config.lr, weight_decay=config.weight_decay,
                                           betas=(0.9, 0.95))
        self.step, self.elapsed, self.history = 0, 0.0, []
        # bf16 autocast where it is fast (see _autocast), decided once rather than asked of the CPU every step
        self.bf16 = fast_bf16(device)

    # -- checkpoints ------------------------------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        state = {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step,
                 "elapsed": self.elapsed, "history": self.history, "config": asdict(self.config)}
        tmp = self.out / (CHECKPOINT + ".tmp")
        torch.save(state, tmp)
        tmp.replace(self.out / CHECKPOINT)

    def resume(self, state: dict | None = None) -> bool:
        """Continue from `state` (read_checkpoint's; None: read OUT/checkpoint.pt now) -> whether there was one. A
        checkpoint whose shapes do not fit this head (another draft vocabulary, say) is one line naming it."""
        path = self.out / CHECKPOINT
        state = state if state is not None else read_checkpoint(path, self.config, self.device)
        if state is None:
            return False
        try:
            self.net.load_state_dict(state["net"])
            self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as error:
            raise ConfigError(f"cannot resume from {path}: it does not fit this head ({first_line(error)}); give "
                              "another --out") from None
        self.step, self.elapsed, self.history = state["step"], state["elapsed"], state["history"]
        return True

    # -- loop -------------------------------------------------------------------------------------------------
    def _autocast(self):
        """bf16 autocast (fp32 master weights) on CUDA, and on a CPU that multiplies bf16 natively (AMX or
        AVX512-BF16): an EAGLE-3 step of 4,096 tokens took 2.05 s there against 3.7 s in fp32 (the 2-core Xeon VM,
        docs/training.md). Elsewhere plain fp32: emulated bf16 is slower."""
        if self.bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _loss(self, batch: Batch):
        with self._autocast():
            if self.config.kind == "eagle":
                return eagle_loss(self.net, self.vocab, batch, self.config.ttt_steps, self.config.reg_weight)
            if self.config.kind == "eagle3":
                return eagle3_loss(self.net, self.vocab, batch, self.config.ttt_steps)
            return medusa_loss(self.net, self.vocab, batch)

    def _lr(self) -> float:
        config = self.config
        progress = self.step / self.total_steps
        if config.max_minutes > 0:
            progress = max(progress, self.elapsed / (60 * config.max_minutes))
        warm = min(1.0, (self.step + 1) / max(1, config.warmup))
        return config.lr * warm * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))

    def _done(self) -> bool:
        over_time = self.config.max_minutes > 0 and self.elapsed >= 60 * self.config.max_minutes
        return self.step >= self.total_steps or over_time

    def train(self) -> list[dict]:
        rng = random.Random(self.config.seed + self.step)
        self.net.train()
        bar = tqdm(total=self.total_steps, initial=self.step, desc=f"train {self.config.kind}", unit="step")
        order: list[int] = []
        while not self._done():
            began = time.monotonic()
            if not order:
                order = list(range(len(self.batches)))
                rng.shuffle(order)
            batch = collate(self.data, self.batches[order.pop()], self.max_len, self.device)
            for group in self.optimizer.param_groups:
                group["lr"] = self._lr()
            loss, stats = self._loss(batch)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), 1.0)
            self.optimizer.step()
            self.step += 1
            self.elapsed += time.monotonic() - began
            self.history.append({"step": self.step, "loss": round(stats.loss, 5),
                                 "accuracy": [round(a, 4) for a in stats.accuracy]})
            bar.update(1)
            bar.set_postfix(loss=f"{stats.loss:.3f}", acc="/".join(f"{a:.2f}" for a in stats.accuracy))
            if self.step % self.config.checkpoint_every == 0:
                self.save_checkpoint()
        bar.close()
        self.save_checkpoint()
        return self.history

    # -- evaluation and export --------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict:
        """Held-out top-1 agreement with the target per unrolled step / head (and Medusa top-k hit rates)."""
        self.net.eval()
        batches = bucket_batches(self.data, self.val_ids, self.config.batch_tokens, self.max_len)
        sums, weight, topk = None, 0.0, None
        for examples in batches:
            batch = collate(self.data, examples, self.max_len, self.device)
            loss, stats = self._loss(batch)
            rows = float((batch.lengths - batch.loss_start).clamp(min=0).sum())
            acc = torch.tensor([stats.loss, *stats.accuracy]) * rows
            sums = acc if sums is None else sums + acc
            weight += rows
            if self.config.kind == "medusa":
                with self._autocast():
                    counts = medusa_topk_accuracy(self.net, self.vocab, batch)
                topk = counts if topk is None else topk + counts
        self.net.train()
        if sums is None:
            return {}
        mean = (sums / max(weight, 1.0)).tolist()
        result = {"val_loss": round(mean[0], 4), "val_top1": [round(a, 4) for a in mean[1:]],
                  "val_examples": len(self.val_ids)}
        if topk is not None:
            rates = topk[:, :-1] / topk[:, -1:].clamp(min=1)
            result["val_topk_hit_rate"] = [[round(float(x), 4) for x in row] for row in rates]
        return result

    def export(self, record: dict) -> Path:
        extra = {"training": record}
        if self.config.kind == "eagle3":
            verifier = {"name_or_path": getattr(self.target_model.config, "_name_or_path", None) or None,
                        "architectures": list(getattr(self.target_model.config, "architectures", None) or [])}
            return save_eagle3(self.out, self.net, self.config.layout, verifier,
                               {"target": fingerprint(self.target_model), **extra})
        if self.config.kind == "medusa" and "val_topk_hit_rate" in record.get("evaluation", {}):
            accuracy = record["evaluation"]["val_topk_hit_rate"]
            extra["trees"] = {device: medusa_paths(accuracy, budget) for device, budget in self.config.trees}
        return save_head(self.out, self.config.kind, self.net, fingerprint(self.target_model), extra)

