"""A KV cache written by slot, for rollback and tree compaction without reallocation.

A row belongs to one sequence. Who owns which slots is the engine's business: before each forward it calls
`prepare(rows, slots, kv_len)` to say where the new keys go; rolling back is the engine forgetting a length
(stale slots are masked out and overwritten later), and keeping an accepted tree path is `compact` (a gather
inside one row).

Two layouts, one interface:
- dynamic (the default): each row has its own buffers per layer, [kv_heads, row_capacity, head_dim], sized to
  that sequence's need (`reserve(row, slots)` at admission; a write past the end grows the row by at least a
  quarter) and freed by `release(row)` when the sequence leaves. Memory is the sum of the live sequences' needs,
  so one long request neither sizes every row to itself nor stays allocated after it finishes, and a server
  can bound KV memory by admitting requests against a byte budget (`kv_bytes_per_slot`). Why per-row buffers
  rather than pages: attention here is the model's own SDPA over a dense [b, kv_heads, kv_len, head_dim] tensor
  (no paged-attention kernel), so pages would have to be gathered into that tensor on every forward anyway;
  a row's buffer is already contiguous, so a batch of one (library decoding, `generate`) attends to a view of
  it without any copy, and a batch of several copies each row's live slots into one padded tensor per layer
  (the gather paging would need too; one [rows, ...] tensor could be read as a view when the batch's rows were
  contiguous, so batched steps now copy about as much KV as attention reads).
- static (the fast path: fixed shapes, CUDA graphs): keys/values of shape [rows, kv_heads, capacity,
  head_dim] per layer, read whole by attention; `ensure` grows it (doubling) and it never shrinks, since
  captured graphs hold its addresses.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from specdecode.backends.cuda.graphs import StepGraphs

GROWTH_ROUND = 64  # a dynamic row grows to a multiple of this many slots


def kv_bytes_per_slot(config, num_layers: int, dtype: torch.dtype) -> int:
    """Bytes one cached token takes over all layers (keys and values), from a transformers config."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * num_layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


class _OwnedLayer(CacheLayerMixin):
    """A layer whose lengths are its cache's (the engine says where each forward writes and reads)."""

    is_compileable = False
    is_sliding = False

    def __init__(self, owner: RollbackCache):
        super().__init__()
        self.owner = owner

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.kv_len, 0

    def get_seq_length(self) -> int:
        return self.owner.kv_len

    def get_max_length(self) -> int:
        return self.owner.capacity


class _SlotLayer(_OwnedLayer):
    """One layer's static buffers; allocated lazily at the first write (shape and dtype come from the model)."""

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

    def row(self, row: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[row], self.values[row]  # [kv_heads, capacity, head_dim] views

    @property
    def nbytes(self) -> int:
        if not self.is_initialized:
            return 0
        return self.keys.nbytes + self.values.nbytes


class _RowLayer(_OwnedLayer):
    """One layer's dynamic buffers: one (keys, values) pair per live row, each [kv_heads, capacity, head_dim]."""

    def __init__(self, owner: RollbackCache):
        super().__init__(owner)
        self.buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # per batch row, last pass: keys, values, length
        self.written: list[tuple[torch.Tensor, torch.Tensor, int]] = []

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.is_initialized = True  # buffers are per row, made at a row's first write

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        # key_states: [b, kv_heads, q, head_dim] -> [b, kv_heads, kv_len, head_dim] (a view for one row)
        self.is_initialized = True
        owner, q = self.owner, key_states.shape[2]
        slots = owner._slots if isinstance(owner._slots, int) else owner._slots.to(key_states.device)
        rows, kv_len = owner._row_list, owner.kv_len
        written = []
        for b, row in enumerate(rows):
            end = slots + q if isinstance(slots, int) else int(slots[b].max()) + 1
            keys, values = self._grown(row, max(end, kv_len) if len(rows) == 1 else end, key_states)
            where = slice(slots, slots + q) if isinstance(slots, int) else slots[b]
            keys[:, where] = key_states[b]
            values[:, where] = value_states[b]
            written.append((keys, values, min(end, kv_len)))  # slots past `end` are stale: masked out
        if owner.per_row:  # attention reads each row's buffers itself (attention.row_sdpa_forward)
            self.written = written
            return key_states, value_states
        if len(rows) == 1:
            keys, values, _ = written[0]
            return keys[None, :, :kv_len], values[None, :, :kv_len]
        b, heads, _, dim = key_states.shape
        out_keys = key_states.new_zeros((b, heads, kv_len, dim))  # slots past a row's end are masked out
        out_values = value_states.new_zeros((b, heads, kv_len, value_states.shape[3]))
        for i, (keys, values, n) in enumerate(written):
            out_keys[i, :, :n] = keys[:, :n]
            out_values[i, :, :n] = values[:, :n]
        return out_keys, out_values

    def _grown(self, row: int, slots: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Row `row`'s buffers, grown (by at least a quarter, to the reservation at first) to hold `slots`."""
        keys, values = self.buffers.get(row, (None, None))
        have = 0 if keys is None else keys.shape[1]
        if slots <= have:
            return keys, values
        want = max(slots, have + have // 4, self.owner.reserved.get(row, 0))
        want = -(-want // GROWTH_ROUND) * GROWTH_ROUND
        self.owner.generation += 1  # addresses handed out by row_pointers are stale
        # uninitialised: a row's slots are read only up to its last write (update's `end`), so nothing unwritten is
        # read; zeroing a long prompt's reservation at its first chunk (~150 MB for 3,300 slots of SmolLM2) cost the
        # running streams a step's worth of time at once, where the pages are now touched a chunk at a time
        new_keys = like.new_empty((like.shape[1], want, like.shape[3]))
        new_values = like.new_empty((like.shape[1], want, like.shape[3]))
        if keys is not None:
            new_keys[:, :have] = keys
            new_values[:, :have] = values
        self.buffers[row] = (new_keys, new_values)
        return new_keys, new_values

    def resize(self, rows: int, capacity: int) -> None:
        pass  # rows grow on write

    def row(self, row: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.buffers[row]

    def release(self, row: int) -> None:
        if self.buffers.pop(row, None) is not None:
            self.owner.generation += 1

    @property
    def nbytes(self) -> int:
        return sum(keys.nbytes + values.nbytes for keys, values in self.buffers.values())


class RollbackCache(Cache):
    """transformers `Cache` over slot buffers, dynamic per row or static; see the module docstring."""

    def __init__(self, num_layers: int, rows: int = 1, capacity: int = 256, static: bool = False):
        self.static = static  # fast path: attention always reads all `capacity` slots (fixed shapes)
        self.num_rows = rows
        self.capacity = capacity  # static: every row's slots; dynamic: the initial reservation of a row
        self.kv_len = 0
        self.reserved: dict[int, int] = {}  # dynamic: row -> slots to allocate at its first write
        self._rows: slice | torch.Tensor = slice(0, rows)
        self._row_list: list[int] = list(range(rows))
        self._slots: int | torch.Tensor = 0
        self.per_row = False  # dynamic, this pass: attention reads rows in place (`rows_written`), no padded copy
        self.graphs = StepGraphs()  # fast path on CUDA: captured steps that write these buffers
        self.generation = 0  # dynamic: bumped whenever a row's buffer is made or freed
        self._pointers: tuple[tuple, list[int], torch.Tensor] | None = None  # row_pointers' last table
        layer = _SlotLayer if static else _RowLayer
        super().__init__(layers=[layer(self) for _ in range(num_layers)])

    @property
    def device(self) -> torch.device:
        for layer in self.layers:
            if isinstance(layer, _SlotLayer) and layer.is_initialized:
                return layer.keys.device
            if isinstance(layer, _RowLayer) and layer.buffers:
                return next(iter(layer.buffers.values()))[0].device
        return torch.device("cpu")

    @property
    def nbytes(self) -> int:
        """Bytes allocated for keys and values, all layers and rows."""
        return sum(layer.nbytes for layer in self.layers)

    def copy_prefix(self, source: int, row: int, slots: int) -> None:
        """Row `row`'s first `slots` slots become row `source`'s (dynamic; `row` reserved, `source` holding at least
        that many): a prompt starts from another row's prefix while that row keeps its own. Under inference mode, as
        the passes that wrote the buffers."""
        with torch.inference_mode():
            for layer in self.layers:
                if isinstance(layer, _RowLayer) and slots:
                    keys, values = layer.buffers[source]
                    new_keys, new_values = layer._grown(row, slots, keys[None])
                    new_keys[:, :slots] = keys[:, :slots]
                    new_values[:, :slots] = values[:, :slots]

    def row_nbytes(self, row: int) -> int:
        """Bytes allocated for one row's keys and values, all layers (dynamic; a static row's are never freed)."""
        held = [layer.buffers[row] for layer in self.layers if isinstance(layer, _RowLayer) and row in layer.buffers]
        return sum(keys.nbytes + values.nbytes for keys, values in held)

    # -- sizing ---------------------------------------------------------------------------------------------
    def ensure(self, rows: int, capacity: int) -> None:
        """Static: grow (doubling) when a request needs more rows or slots; never shrinks, never per step.
        Dynamic: only the row count is kept (a row is sized by `reserve` and grows on write)."""
        if not self.static:
            self.num_rows = max(rows, self.num_rows)
            return
        if rows <= self.num_rows and capacity <= self.capacity:
            return
        new_rows = max(rows, self.num_rows)
        new_capacity = self.capacity if capacity <= self.capacity else max(capacity, 2 * self.capacity)
        for layer in self.layers:
            layer.resize(new_rows, new_capacity)
        self.graphs.clear()  # they point at the old buffers
        self.num_rows, self.capacity = new_rows, new_capacity

    def reserve(self, row: int, slots: int) -> None:
        """A sequence that may need `slots` slots takes `row` (dynamic: allocated at its first write)."""
        if self.static:
            self.ensure(self.num_rows, slots)
        else:
            self.num_rows = max(self.num_rows, row + 1)
            self.reserved[row] = slots

    def release(self, row: int) -> None:
        """The row's sequence left: free its buffers (dynamic; static buffers stay for the next sequence)."""
        self.reserved.pop(row, None)
        for layer in self.layers:
            if isinstance(layer, _RowLayer):
                layer.release(row)

    # -- one forward ----------------------------------------------------------------------------------------
    def prepare(self, rows: list[int], slots: int | torch.Tensor, kv_len: int, per_row: bool = False) -> None:
        """Say where the next forward writes. rows: cache rows of the batch (in batch order);
        slots: first slot if every row writes the same contiguous block, else a [b, q] tensor of slots;
        kv_len: how many slots attention reads (the mask's last dimension); per_row (dynamic only): the model's
        attention reads each row's own buffers over its own length (`rows_written`), so update returns no
        padded gather."""
        if per_row and self.static:
            raise ValueError("per-row attention reads the dynamic cache's rows; a static cache is read whole")
        self.per_row = per_row
        if self.static:
            if kv_len > self.capacity:
                raise ValueError(f"KV cache overflow: need {kv_len} slots, have {self.capacity}")
            if kv_len != self.capacity:
                raise ValueError("a static cache is read whole: kv_len must equal its capacity")
            contiguous = rows == list(range(rows[0], rows[0] + len(rows)))
            self._rows = slice(rows[0], rows[0] + len(rows)) if contiguous else torch.tensor(rows, device=self.device)
        self._row_list = list(rows)
        self._slots = slots
        self.kv_len = kv_len

    def write(self, layer: _SlotLayer, keys: torch.Tensor, values: torch.Tensor):
        # static layout. keys: [b, kv_heads, q, head_dim] -> buffers; returns [b, kv_heads, kv_len, head_dim]
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
        end = first_slot + len(source_slots)
        for layer in self.layers:
            if not self._has_row(layer, row):
                continue
            keys, values = layer.row(row)  # [kv_heads, capacity, head_dim]
            index = torch.tensor(source_slots, device=keys.device)
            keys[:, first_slot:end] = keys[:, index]
            values[:, first_slot:end] = values[:, index]

    def row_view(self, row: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The first `length` slots of a row for every layer, [kv_heads, length, head_dim] (tests, debugging)."""
        return [tuple(t[:, :length] for t in layer.row(row)) for layer in self.layers]  # type: ignore[misc]

    @staticmethod
    def _has_row(layer, row: int) -> bool:
        return layer.is_initialized if isinstance(layer, _SlotLayer) else row in layer.buffers

    def row_buffers(self, layer_idx: int, ends: list[int],
                    like: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Dynamic: one layer's buffers [kv_heads, capacity, head_dim] for the rows of this pass (`prepare`),
        grown to hold ends[b] slots, for a forward that writes and reads them itself (backends/cpu/decoder.py).
        like: [1, kv_heads, 0, head_dim] in the keys' dtype."""
        if self.static:
            raise ValueError("row buffers are the dynamic cache's; a static cache is read whole")
        layer = self.layers[layer_idx]
        layer.is_initialized = True
        return [layer._grown(row, end, like) for row, end in zip(self._row_list, ends)]

    def row_pointers(self, num_layers: int, ends: list[int], like: torch.Tensor) -> torch.Tensor:
        """Dynamic: for the first num_layers layers, the addresses of this pass's rows' key and value buffers and
        their capacities (`row_buffers`, grown to ends[b] slots) as one [num_layers, 3, b] int64 tensor, for the
        native decoder. Decoding asks for the same rows pass after pass and a buffer grows by a quarter at a
        time, so the table of the last call is handed out again while no buffer was made or freed since and
        every row still has room (building it is a noticeable share of a pass's Python for SmolLM2's 30 layers:
        docs/design-notes.md, "Native decoder layers")."""
        key = (tuple(self._row_list), num_layers, self.generation)
        if self._pointers is not None and self._pointers[0] == key:
            if all(end <= room for end, room in zip(ends, self._pointers[1])):
                return self._pointers[2]
        table = []  # per layer: the rows' key addresses, value addresses, capacities
        for index in range(num_layers):
            buffers = self.row_buffers(index, ends, like)  # per batch row: keys, values [kv_heads, cap, head_dim]
            table.append([[keys.data_ptr() for keys, _ in buffers], [values.data_ptr() for _, values in buffers],
                          [keys.shape[1] for keys, _ in buffers]])
        room = [min(layer[2][b] for layer in table) for b in range(len(ends))] if table else list(ends)
        pointers = torch.tensor(table, dtype=torch.int64).reshape(num_layers, 3, len(ends))
        self._pointers = ((tuple(self._row_list), num_layers, self.generation), room, pointers)
        return pointers

    def rows_written(self, layer_idx: int) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
        """Per-row attention's view of a layer after this pass's write: per batch row, its keys and values
        [kv_heads, S, head_dim] and how many slots attention reads."""
        return self.layers[layer_idx].written

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.kv_len

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.kv_len, 0
