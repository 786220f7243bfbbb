"""Adapter over a Hugging Face causal LM: one forward over a Block, through the model's own attention, with a
cache we control (4D mask, explicit position ids). Nothing is forked from transformers' modelling files."""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from specdecode.backends.attention import ROWS_NAME, per_row_attention_applies, using_grouped_attention
from specdecode.backends.cpu.decoder import PackedDecoder
from specdecode.backends.cpu.decoder import unsupported as packed_decoder_unsupported
from specdecode.backends.cpu.skinny import SkinnyLinears
from specdecode.backends.cuda.fast_path import bucket_for, raise_recompile_limits
from specdecode.config import FastPathConfig
from specdecode.core.kv_cache import RollbackCache, kv_bytes_per_slot
from specdecode.core.pass_costs import RowCostEstimate, measure_row_cost, skinny_rows
from specdecode.core.trees import Block, build_block, pad_block
from specdecode.errors import ConfigError


@dataclass(frozen=True)
class ForwardOutput:
    logits: torch.Tensor  # [b, q_kept, vocab]
    hidden: torch.Tensor | None  # [b, q, hidden] last hidden state (after the final norm), when asked for; with
    # hidden_layers [b, q, layers x hidden]: what enters each of those layers, side by side


def eager_attention(device: torch.device) -> contextlib.AbstractContextManager:
    """SDPA backends for uncompiled passes. On CUDA, cuDNN attention (torch's first choice for masked bf16 on an
    H100) builds an execution plan for every new shape, which costs far more host time per call than the attention
    itself (docs/gpu.md, "What limits it"); decoding changes shape every step, so memory-efficient / flash / math
    kernels are used instead."""
    return sdpa_kernels(device, ("flash", "efficient", "math"))


def sdpa_kernels(device: torch.device, names: tuple[str, ...]) -> contextlib.AbstractContextManager:
    """Restrict SDPA to the named kernels ("flash", "efficient", "cudnn", "math"), in that order of preference,
    on CUDA; elsewhere, or with no names, leave torch's choice alone."""
    if device.type != "cuda" or not names:
        return contextlib.nullcontext()
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    return sdpa_kernel([backends[name] for name in names], set_priority=True)


def _decoder(model: torch.nn.Module) -> torch.nn.Module:
    inner = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise ValueError(f"{type(model).__name__} has no decoder layer list; layer skipping is unsupported")
    return inner


PER_ROW_MIN_CONTEXT = 512  # per-row attention pays once the longest row is this long and the rows are uneven


def _uneven(slots: int | torch.Tensor, kv_len: int) -> bool:
    """Whether rows' contexts differ enough for per-row attention to pay: one attention call per row and layer
    costs more than the padded batch's one where rows are alike (a third more a step for 16 rows of 60 tokens,
    SmolLM2 on a 2-core CPU: docs/serving.md, "Continuous batching"); it saves the padded copy and attention
    where one row is long."""
    if isinstance(slots, int) or kv_len < PER_ROW_MIN_CONTEXT:
        return False
    ends = slots.max(dim=1).values + 1  # [b] each row's context after this pass
    return kv_len > 2 * float(ends.float().median())


def _layers_know_their_index(model: torch.nn.Module) -> bool:
    try:
        layers = _decoder(model).layers
    except ValueError:
        return False
    return all(hasattr(getattr(layer, "self_attn", None), "layer_idx") for layer in layers)


class Target:
    """The model being decoded (also used by drafters that run a model: draft-model, layer-skip).

    skinny_gemm: compute linear layers as W @ X^T in our passes, compiled ones too (backends/cpu/skinny.py);
    None = where it is faster on this machine (CPU only), timed when first needed (pass_costs.skinny_rows).
    packed_decoder: run a packed (int4/int8/gguf) Llama-family model's decoder layers natively, one call a
    layer (backends/cpu/decoder.py), on the dynamic cache; None = wherever it can run, False = the model's own
    forward.
    kv_half: the native decoder's cache holds fp16 keys and values (default: fp32, as the model's own forward)."""

    def __init__(self, model: torch.nn.Module, tokenizer=None, fast: FastPathConfig | None = None,
                 skinny_gemm: bool | None = None, packed_decoder: bool | None = None, kv_half: bool = False):
        self.model = model
        self.tokenizer = tokenizer
        self.fast = fast or FastPathConfig()
        self._step_fn = model
        self._pool = None
        first = next(model.parameters())
        self.device, self.dtype = first.device, first.dtype
        self._captures = self.fast.captures(self.device)
        if self.fast.enabled and self.fast.compile:
            raise_recompile_limits()
            options = {"mode": self.fast.mode_for(self.device)} if self.fast.backend == "inductor" else {}
            self._step_fn = torch.compile(model, backend=self.fast.backend, dynamic=self.fast.dynamic, **options)
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.config = config
        self.num_layers: int = config.num_hidden_layers
        head = model.get_output_embeddings()  # nn.Linear, or a quantized linear (backends/cpu)
        self.vocab_size: int = head.out_features if hasattr(head, "out_features") else head.weight.shape[0]
        self.max_positions: int = getattr(config, "max_position_embeddings", None) or 1 << 20
        self.eos_ids = _eos_ids(model, tokenizer)
        pad = getattr(config, "pad_token_id", None)
        self.pad_id: int = pad if isinstance(pad, int) else (min(self.eos_ids) if self.eos_ids else 0)
        # batches over the dynamic cache attend row by row (attention.row_sdpa_forward) where the model's attention
        # is SDPA and its layers know their index
        self._per_row_attention = per_row_attention_applies(config) and _layers_know_their_index(model)
        self._skinny_choice = skinny_gemm
        native = packed_decoder is not False and self.device.type == "cpu" and packed_decoder_unsupported(model) is None
        if packed_decoder and not native:
            raise ValueError(f"packed decoder unavailable: {packed_decoder_unsupported(model) or 'not on the CPU'}")
        if kv_half and not native:
            why = packed_decoder_unsupported(model) or ("off" if packed_decoder is False else "not on the CPU")
            raise ConfigError(f"an fp16 KV cache needs the native decoder (a packed Llama or Qwen2 model on the CPU): "
                              f"{why}")
        self._packed = PackedDecoder(model, kv_half) if native else None

    @property
    def block_device(self) -> torch.device:
        """Where the engine builds its blocks: on the CPU for the fast path, which pads them there and copies
        each tensor to the device once (a dozen small device ops per step cost more host time on CUDA)."""
        return torch.device("cpu") if self.fast.enabled else self.device

    @property
    def kv_dtype(self) -> torch.dtype:
        """What the KV cache holds: fp16 under the native decoder with kv_half, else the model's dtype
        (the fast path's static cache runs the model's own forward)."""
        return self._packed.kv_dtype if self._packed is not None and not self.fast.enabled else self.dtype

    @property
    def kv_bytes_per_slot(self) -> int:
        """Bytes one cached token takes over all layers, keys and values."""
        return kv_bytes_per_slot(self.config, self.num_layers, self.kv_dtype)

    @property
    def packed_decoder(self) -> bool:
        """Whether passes over the dynamic cache run the decoder layers natively (backends/cpu/decoder.py)."""
        return self._packed is not None

    @functools.cached_property
    def _skinny(self) -> SkinnyLinears | None:
        """The few-row kernel's swap for our passes (backends/cpu/skinny.py), or None; decided on first use: as given
        (skinny_gemm), else as timed on this machine (pass_costs.skinny_rows)."""
        if self.device.type != "cpu" or self._skinny_choice is False:
            return None
        rows = 1 if self._skinny_choice else skinny_rows(self.model)
        return SkinnyLinears(self.model, rows) if rows else None

    @property
    def skinny_gemm(self) -> bool:
        return self._skinny is not None

    @property
    def skinny_rows(self) -> int | None:
        """The fewest rows our passes compute as W @ X^T (backends/cpu/skinny.py), or None: never."""
        return None if self._skinny is None else self._skinny.min_rows

    @functools.cached_property
    def row_costs(self) -> RowCostEstimate:
        """What one more verify row costs as the machine runs now (pass_costs.RowCostEstimate): measured at first
        ask, then followed from the passes the engine reports."""
        return RowCostEstimate(lambda: measure_row_cost(self))

    @property
    def row_cost(self) -> float:
        """One more token of a verify pass, in one-token passes (0 off the CPU: passes are flat there)."""
        return self.row_costs.value if self.device.type == "cpu" else 0.0

    def rides(self, tokens: int, width: int) -> bool:
        """Whether a prompt chunk of `tokens` rides in a step's pass whose widest decode row is `width` tokens
        (Engine.step), rather than being a pass of its own. On a GPU a pass of a few rows costs about the same
        padded or not, and a pass of its own would add a step's fixed cost: always. On the native CPU decoder
        always too: it computes real rows only and, with `logit_rows`, scores the decode rows only. Beside a
        one-token SmolLM2 int4 step at a 1,000-token context (8.3-8.8 ms) a riding chunk adds about 2.2-2.5 ms a
        token from the first one (1.26x for one, 2.4x for four), a pass of its own the same and about 6 ms more
        (2.01x for two, 2.65x for four), 2026-11-28, AMD EPYC VM. Riding once measured slower here (193 against
        260 tokens/s, bench-serve agentic, 8 clients), when the riders' 49,152-wide logits were computed too.
        Through transformers' forward on a CPU only a chunk no wider than the widest decode row: a wider one
        would pad every row of the pass to its length, which that forward computes (40 prompt tokens beside
        three one-token rows: 160 rows for 43)."""
        return self.device.type != "cpu" or tokens <= width or (self._packed is not None and not self.fast.enabled)

    def new_cache(self, rows: int = 1, capacity: int = 256, num_layers: int | None = None) -> RollbackCache:
        if self.fast.enabled:
            return RollbackCache(num_layers or self.num_layers, rows=rows,
                                 capacity=max(capacity, self.fast.capacity_for(self.device)), static=True)
        return RollbackCache(num_layers or self.num_layers, rows=rows, capacity=capacity)

    @torch.inference_mode()
    def forward(
        self,
        cache: RollbackCache,
        rows: list[int],
        block: Block,
        keep: str = "all",  # "all" | "last": which positions get logits
        hidden: bool = False,
        num_layers: int | None = None,  # run only the first num_layers decoder layers (layer skip)
        hidden_layers: tuple[int, ...] = (),  # with hidden: these layers' input states side by side (EAGLE-3)
        logit_rows: int | None = None,  # only the first logit_rows rows get logits, over their widest length
    ) -> ForwardOutput:
        # logits: [b, q, vocab], or [logit_rows, widest of them, vocab]: the rows after them are riding prompt
        # chunks, whose scores no one reads (the packed decoder skips them; the head is a fifth of SmolLM2)
        taps = tuple(hidden_layers) if hidden else ()
        if self._packed is not None and not cache.static:
            out = self._packed.forward(cache, rows, block.input_ids, block.positions, block.slots,
                                       self._layer_masks(block), keep_last=keep == "last", num_layers=num_layers,
                                       lengths=block.lengths, taps=taps, logit_rows=logit_rows)
            return ForwardOutput(out.logits, (out.taps if taps else out.hidden) if hidden else None)
        fn, q = self.model, block.input_ids.shape[1]
        if cache.static:
            bucket = bucket_for(q, self.fast.buckets)
            cache.ensure(cache.num_rows, max(block.slots.max().item() + 1 + (bucket or q) - q, cache.capacity))
            block = pad_block(block, bucket or q, cache.capacity, self.pad_id)
            # fixed-shape steps are compiled; prefill and the very first write (which allocates the cache
            # buffers, whose addresses CUDA graphs must see as static) stay eager
            if bucket is not None and keep == "all" and cache.layers[0].is_initialized:
                fn = self._step_fn
        slots = block.uniform_start if block.uniform_start is not None else block.slots
        inputs = {"input_ids": block.input_ids, "positions": block.positions, "slots": slots}
        masks = self._layer_masks(block)
        inputs.update({"mask": masks} if isinstance(masks, torch.Tensor)
                      else {f"mask:{k}": v for k, v in masks.items()})

        def step(inputs: dict) -> tuple[torch.Tensor, ...]:
            return self._call(fn, cache, rows, inputs, block.kv_len, keep, hidden, num_layers, taps)

        outputs = None
        if fn is not self.model and self._captures and isinstance(slots, torch.Tensor):
            key = (tuple(rows), q if bucket is None else bucket, hidden, num_layers, taps)
            outputs = cache.graphs.run(key, inputs, step, self._graph_pool(), self.device)  # copies the inputs in
        if outputs is None:
            inputs = {name: value.to(self.device) if isinstance(value, torch.Tensor) else value
                      for name, value in inputs.items()}
            if fn is not self.model and self.device.type == "cuda":
                torch.compiler.cudagraph_mark_step_begin()
            outputs = step(inputs)
        logits, states = outputs[0][:, :q], (outputs[1][:, :q] if hidden else None)
        if logit_rows is not None and logit_rows < len(rows):
            logits = logits[:logit_rows, : q if block.lengths is None else max(block.lengths[:logit_rows], default=0)]
        if fn is not self.model:  # CUDA-graph outputs are overwritten by the next replay: own a copy
            logits, states = logits.clone(), (None if states is None else states.clone())
        return ForwardOutput(logits, states)

    def _call(self, fn, cache: RollbackCache, rows: list[int], inputs: dict, kv_len: int, keep: str, hidden: bool,
              num_layers: int | None, taps: tuple[int, ...] = ()) -> tuple[torch.Tensor, ...]:
        """One model call on `inputs` (a dict, so a captured graph can replay it on its own static copies)."""
        per_row = not cache.static and len(rows) > 1 and self._per_row_attention and _uneven(inputs["slots"], kv_len)
        cache.prepare(rows, inputs["slots"], kv_len, per_row=per_row)
        masks = inputs.get("mask")
        if masks is None:
            masks = {name.split(":", 1)[1]: value for name, value in inputs.items() if name.startswith("mask:")}
        eager = fn is self.model
        attention = eager_attention(self.device) if eager else sdpa_kernels(self.device, self.fast.attention_kernels)
        linears = self._skinny if self._skinny is not None else contextlib.nullcontext()  # compiled too: traced in
        if per_row:  # rows of different lengths: each attends over its own (attention.row_sdpa_forward)
            routed = using_grouped_attention(self.config, name=ROWS_NAME)
            extra = {"specdecode_rows": cache.rows_written}
        else:
            routed, extra = using_grouped_attention(self.config, cache.static and self.fast.grouped_attention), {}
        with self._truncated(num_layers), attention, linears, routed:
            out = fn(
                input_ids=inputs["input_ids"],
                position_ids=inputs["positions"],
                attention_mask=masks,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1 if keep == "last" else 0,
                output_hidden_states=hidden,
                **extra,
            )
        if not hidden:
            return (out.logits,)
        if taps:  # hidden_states[l]: what enters layer l ([0] the embeddings)
            return out.logits, torch.cat([out.hidden_states[t] for t in taps], dim=-1)
        return out.logits, out.hidden_states[-1]

    def _graph_pool(self):
        """One memory pool for all graphs of this target (they never run at the same time)."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

    def _layer_masks(self, block: Block) -> torch.Tensor | dict[str, torch.Tensor]:
        """The block's tree mask, plus a sliding-window copy where the model has sliding-window layers:
        transformers passes a ready 4D mask through unchanged, so the window must be applied here. A key is
        visible within the window when key position > query position - window (transformers' overlay).
        Models with per-layer types (Gemma 3) get a mask per type; older ones (Mistral) one windowed mask."""
        window = getattr(self.config, "sliding_window", None)
        types = set(getattr(self.config, "layer_types", None) or ())
        mask = block.mask  # [b, 1, q, kv]
        if not window or mask.shape[-1] <= window or (types and "sliding_attention" not in types):
            return mask
        if not types and getattr(self.config, "use_sliding_window", True) is False:
            return mask
        b, kv = mask.shape[0], mask.shape[-1]
        key_positions = torch.arange(kv, device=mask.device).expand(b, kv).clone()  # committed slot == position
        key_positions.scatter_(1, block.slots.to(mask.device), block.positions)  # this block's nodes
        windowed = mask & (key_positions[:, None, None, :] > block.positions[:, None, :, None] - window)
        if not types:
            return windowed
        return {kind: windowed if kind == "sliding_attention" else mask for kind in types}

    def warmup(self, cache: RollbackCache, max_q: int, num_layers: int | None = None, hidden: bool = False,
               hidden_layers: tuple[int, ...] = ()) -> None:
        """Compile (and record) every fixed-shape step up to max_q tokens before timing anything, with the
        hidden-state output the steps will ask for (another graph). Writes only scratch slots of row 0, which
        the next prefill overwrites."""
        if not cache.static:
            return
        sizes = sorted({bucket_for(n, self.fast.buckets) or n for n in range(1, max_q + 1)})
        if not cache.layers[0].is_initialized:  # the first write allocates the cache and runs eager: not a warm-up
            sizes = [sizes[0], *sizes]
        for q in sizes:
            block = build_block([0], [[self.pad_id] * q], [list(range(-1, q - 1))], self.pad_id, self.block_device)
            self.forward(cache, [0], block, num_layers=num_layers, hidden=hidden, hidden_layers=hidden_layers)

    @contextlib.contextmanager
    def _truncated(self, num_layers: int | None) -> Iterator[None]:
        """Run only the first num_layers layers; always restores the model, even on error."""
        if num_layers is None or num_layers >= self.num_layers:
            yield
            return
        decoder = _decoder(self.model)
        layers, configured = decoder.layers, self.config.num_hidden_layers
        decoder.layers = torch.nn.ModuleList(list(layers)[:num_layers])
        self.config.num_hidden_layers = num_layers
        try:
            yield
        finally:
            decoder.layers = layers
            self.config.num_hidden_layers = configured


def _eos_ids(model: torch.nn.Module, tokenizer) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return frozenset(ids)
