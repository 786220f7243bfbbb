"""A training job from start to end: load the target, build (or reuse) the self-distillation data and the
target's hidden states, train a drafter head, save it. The command line (cli/train.py) builds a TrainJob once."""
from __future__ import annotations

import copy
import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError

from specdecode.config import ModelConfig
from specdecode.core.target import Target
from specdecode.drafters.common.eagle3_net import default_aux_layers
from specdecode.drafters.common.nets import fast_bf16
from specdecode.errors import ConfigError, first_line
from specdecode.loading.load import load_model
from specdecode.train.corpus import docstrings, text_files
from specdecode.train.data import DataConfig, build_dataset
from specdecode.train.features import FeatureData, choose_draft_vocab, compute_features, target_token_counts
from specdecode.train.prompts import load_user_prompts
from specdecode.train.trainer import CHECKPOINT, TrainConfig, Trainer, checkpoint_file, read_checkpoint


@dataclass(frozen=True)
class TrainJob:
    """out: the head, its checkpoint and (by default) the data cache; data: the data cache (None: out/data),
    reused when present; prompts / text / docstrings: extra prompt files, plain-text files and installed packages
    whose docstrings add plain text; draft_vocab: the draft vocabulary's size (most frequent target tokens)."""

    train: TrainConfig
    out: str
    model: str | None = None
    data: str | None = None
    device: str = "cpu"
    resume: bool = False
    prompts: tuple[str, ...] = ()
    text: tuple[str, ...] = ()
    docstrings: tuple[str, ...] = ()
    draft_vocab: int = 16384
    data_config: DataConfig = field(default_factory=DataConfig)

    @property
    def data_dir(self) -> Path:
        return Path(self.data) if self.data else Path(self.out) / "data"


def run_job(job: TrainJob) -> Path:
    """Train as the job says; returns the saved head's path."""
    began = time.monotonic()
    out = Path(job.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(job.device)
    checkpoint = checkpoint_file(out / CHECKPOINT)  # with or without --resume: the training saves there
    state = read_checkpoint(checkpoint, job.train, device) if job.resume else None  # before the data is built
    cached = _cached(job.data_dir)
    loaded = load_model(ModelConfig(job.model, device=job.device, dtype="float32", weights="same"))
    model, target = loaded.model, Target(loaded.model, loaded.tokenizer)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    if job.train.kind == "eagle3":  # the layers it fuses are fixed here: the data's and the head's
        aux = job.train.aux_layers or default_aux_layers(target.num_layers)
        if max(aux) >= target.num_layers:
            raise ConfigError(f"EAGLE-3 layers {list(aux)} must be below the target's {target.num_layers}")
        job = dataclasses.replace(job, train=dataclasses.replace(job.train, aux_layers=tuple(aux)))
    data = cached if cached is not None else _features(job, target, began)
    if job.train.kind == "eagle3" and data.aux_layers != job.train.aux_layers:
        raise ConfigError(f"the data cache in {str(job.data_dir)!r} holds the states of layers "
                          f"{list(data.aux_layers)}, not the EAGLE-3 layers {list(job.train.aux_layers)}: give "
                          "another --data directory")
    if job.train.kind != "eagle3":
        data = data.last_only()
    data = data.to(device) if device.type == "cuda" else data
    counts = target_token_counts(data, target.vocab_size)
    draft_ids, coverage = choose_draft_vocab(counts, job.draft_vocab, set(target.eos_ids))
    trainer = Trainer(job.train, model, data, draft_ids, out, device, max_len=job.data_config.max_len)
    if job.resume:
        if trainer.resume(state):
            print(f"resumed from {out / CHECKPOINT} at step {trainer.step}")
        else:
            print(f"no checkpoint in {out}; starting fresh")
    history = trainer.train()
    evaluation = trainer.evaluate()
    record = {"data": data.meta,
              "draft_vocab": {"size": int(draft_ids.shape[0]), "target_coverage": round(coverage, 4)},
              "steps": trainer.step, "train_seconds": round(trainer.elapsed, 1), "device": str(device),
              "config": {k: v for k, v in vars(job.train).items() if k != "trees"},
              "final_train": history[-1] if history else None, "evaluation": evaluation}
    path = trainer.export(record)
    print(f"saved {job.train.kind} head to {path} (steps {trainer.step}, held-out top-1 "
          f"{evaluation.get('val_top1')}, total {time.monotonic() - began:.0f}s)")
    return path


def _cached(directory: Path) -> FeatureData | None:
    """The data cached in `directory` (None: none there), read before the model loads: a cache that cannot be read
    (a garbage safetensors header, a garbage meta.json) is one line naming it."""
    if not FeatureData.exists(directory):
        return None
    print(f"reusing cached data in {directory}")
    try:
        return FeatureData.load(directory)
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as error:
        raise ConfigError(f"the data cache in {str(directory)!r} cannot be read ({first_line(error)}): give another "
                          "--data directory, or remove this one to build it again") from None


def _features(job: TrainJob, target: Target, began: float) -> FeatureData:
    """The data built now (none was cached): the target's answers to the prompts, plain texts, and the target's
    hidden states over them (saved in job.data_dir for later jobs)."""
    model, device = target.model, target.device
    texts = [docstrings(package) for package in job.docstrings]
    if job.text:
        texts.append(text_files(list(job.text)))
    # answers are generated in bf16 on CUDA and on a CPU that multiplies bf16 natively (SmolLM2 in batches of 128 on
    # the 2-core Xeon VM: 896 tokens/s against 427 in fp32); hidden states come from the fp32 model
    gen_model = copy.deepcopy(model).to(torch.bfloat16) if fast_bf16(device) else None
    dataset = build_dataset(model, target.tokenizer, job.data_config, load_user_prompts(list(job.prompts)), texts,
                            set(target.eos_ids), target.pad_id, gen_model=gen_model)
    del gen_model
    if not dataset.examples:
        raise ConfigError(f"no training data: {dataset.why_empty()}")
    print(f"data: {len(dataset.examples)} sequences, {dataset.num_tokens} tokens ({time.monotonic() - began:.0f}s)")
    data = compute_features(model, dataset, keep_on=device if device.type == "cuda" else None,
                            aux_layers=job.train.aux_layers if job.train.kind == "eagle3" else ())
    data.meta["generation"] = dict(vars(job.data_config))
    data.save(job.data_dir)
    with open(job.data_dir / "conversations.jsonl", "w", encoding="utf-8") as handle:
        for conversation in dataset.conversations:
            handle.write(json.dumps(conversation, ensure_ascii=False) + "\n")
    return data
