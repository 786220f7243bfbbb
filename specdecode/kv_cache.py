"""A preallocated KV cache written by slot, for rollback and tree compaction without reallocation.

Each layer holds keys/values of shape [rows, kv_heads, capacity, head_dim]. A row belongs to one sequence.
Who owns which slots is the engine's business: before each forward it calls `prepare(rows, slots, kv_len)`
to say where the new keys go; rolling back is the engine forgetting a length (stale slots are masked out
and overwritten later), and keeping an accepted tree path is `compact` (a gather inside one row).
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .cuda_graphs import StepGraphs


class _SlotLayer(CacheLayerMixin):
    """One layer's buffers; allocated lazily at the first write (shape and dtype come from the model)."""

    is_compileable = False
    is_sliding = False

    def __init__(self, owner: "RollbackCache"):
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        rows, capacity = self.owner.num_rows, self.owner.capacity
        self.keys = key_states.new_zeros((rows, key_states.shape[1], capacity, key_states.shape[3]))
        self.values = value_states.new_zeros((rows, value_states.shape[1], capacity, value_states.shape[3]))
        self.is_initialized = True
        if self.owner.static:  # CUDA graphs mutate these in place: their addresses must not change
            torch._dynamo.mark_static_address(self.keys)
            torch._dynamo.mark_static_address(self.values)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        # key_states: [b, kv_heads, q, head_dim]
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        return self.owner.write(self, key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.kv_len, 0

    def get_seq_length(self) -> int:
        return self.owner.kv_len

    def get_max_length(self) -> int:
        return self.owner.capacity

    def resize(self, rows: int, capacity: int) -> None:
        if not self.is_initialized:
            return
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros((rows, old.shape[1], capacity, old.shape[3]))
            new[: old.shape[0], :, : old.shape[2]] = old
            setattr(self, name, new)
            if self.owner.static:
                torch._dynamo.mark_static_address(new)


class RollbackCache(Cache):
    """transformers `Cache` over preallocated slot buffers; see the module docstring."""

    def __init__(self, num_layers: int, rows: int = 1, capacity: int = 256, static: bool = False):
        self.static = static  # fast path: attention always reads all `capacity` slots (fixed shapes)
        self.num_rows = rows
        self.capacity = capacity
        self.kv_len = 0
        self._rows: slice | torch.Tensor = slice(0, rows)
        self._slots: int | torch.Tensor = 0
        self.graphs = StepGraphs()  # fast path on CUDA: captured steps that write these buffers
        super().__init__(layers=[_SlotLayer(self) for _ in range(num_layers)])

    @property
    def device(self) -> torch.device:
        first = self.layers[0]
        return first.keys.device if first.is_initialized else torch.device("cpu")

    # -- sizing ---------------------------------------------------------------------------------------------
    def ensure(self, rows: int, capacity: int) -> None:
        """Grow (doubling) when a request needs more rows or slots; never shrinks, never per step."""
        if rows <= self.num_rows and capacity <= self.capacity:
            return
        new_rows = max(rows, self.num_rows)
        new_capacity = self.capacity if capacity <= self.capacity else max(capacity, 2 * self.capacity)
        for layer in self.layers:
            layer.resize(new_rows, new_capacity)
        self.graphs.clear()  # they point at the old buffers
        self.num_rows, self.capacity = new_rows, new_capacity

    # -- one forward ----------------------------------------------------------------------------------------
    def prepare(self, rows: list[int], slots: int | torch.Tensor, kv_len: int) -> None:
        """Say where the next forward writes. rows: cache rows of the batch (in batch order);
        slots: first slot if every row writes the same contiguous block, else a [b, q] tensor of slots;
        kv_len: how many slots attention reads (the mask's last dimension)."""
        if kv_len > self.capacity:
            raise ValueError(f"KV cache overflow: need {kv_len} slots, have {self.capacity}")
        if self.static and kv_len != self.capacity:
            raise ValueError("a static cache is read whole: kv_len must equal its capacity")
        contiguous = rows == list(range(rows[0], rows[0] + len(rows)))
        self._rows = slice(rows[0], rows[0] + len(rows)) if contiguous else torch.tensor(rows, device=self.device)
        self._slots = slots
        self.kv_len = kv_len

    def write(self, layer: _SlotLayer, keys: torch.Tensor, values: torch.Tensor):
        # keys: [b, kv_heads, q, head_dim] -> buffers; returns [b, kv_heads, kv_len, head_dim] views/copies
        rows, slots = self._rows, self._slots
        if isinstance(slots, int):
            q = keys.shape[2]
            if isinstance(rows, slice):
                layer.keys[rows, :, slots : slots + q] = keys
                layer.values[rows, :, slots : slots + q] = values
            else:
                index = torch.arange(slots, slots + q, device=keys.device)
                layer.keys[rows[:, None], :, index[None, :]] = keys.transpose(1, 2)
                layer.values[rows[:, None], :, index[None, :]] = values.transpose(1, 2)
        else:
            if isinstance(rows, slice):
                row_index = torch.arange(rows.start, rows.stop, device=keys.device)[:, None]
            else:
                row_index = rows[:, None]
            slots = slots.to(keys.device)
            layer.keys[row_index, :, slots] = keys.transpose(1, 2)
            layer.values[row_index, :, slots] = values.transpose(1, 2)
        return layer.keys[rows, :, : self.kv_len], layer.values[rows, :, : self.kv_len]

    # -- after verification ---------------------------------------------------------------------------------
    @torch.inference_mode()  # the buffers were made by forwards under inference mode
    def compact(self, row: int, source_slots: list[int], first_slot: int) -> None:
        """Move the KV of `source_slots` (an accepted tree path) to first_slot, first_slot+1, ... in one row."""
        if source_slots == list(range(first_slot, first_slot + len(source_slots))):
            return
        index = torch.tensor(source_slots, device=self.layers[0].keys.device)
        end = first_slot + len(source_slots)
        for layer in self.layers:
            if layer.is_initialized:
                layer.keys[row, :, first_slot:end] = layer.keys[row, :, index]
                layer.values[row, :, first_slot:end] = layer.values[row, :, index]

    def row_view(self, row: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The first `length` slots of a row for every layer (for tests and debugging)."""
        return [(layer.keys[row, :, :length], layer.values[row, :, :length]) for layer in self.layers]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.kv_len

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.kv_len, 0
