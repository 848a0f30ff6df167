"""The form the capture gives a model's generate in place of a compressed-attention cache layer: a
sliding-window layer that also feeds a compressor (DeepseekV4's HCA / CSA layers), whose Python counts
and drained buffers would otherwise make each decode step a program of its own.

Such a layer serves the compressor through three calls (transformers' protocol, found by what the
layer offers, not by its class): ``store_compression_weights(name, kv, gate)`` joins the call's source
projections to what the layer holds since the last full window of ``compress_rate`` tokens and returns
the complete windows (none, or one every ``compress_rate`` steps when decoding), with the absolute
position of their first token; ``update_overlap_state`` (CSA only) hands back the previous window's
first-series slice and keeps this call's last; ``update_compressor_states(name, compressed)`` appends
the entries the compressor made and returns them all. Eager keeps the pending tokens at their own
length (0 to ``compress_rate - 1``), counts entries and positions in Python ints, and the model's
compressor branches on whether a window closed (``if chunk_kv.shape[1] > 0``): a decode program would
be the branch of its example step, its buffer lengths the example's.

``PlainCompressedLayer`` keeps the same state under the same names (the entries aside), every piece a tensor of one
structure from step to step, and gives a one-token call a branch-free path:

- keys and values keep every position (as ``sliding_forms``' plain layers: the model's sliding mask,
  over absolute positions, limits each query to eager's window); the positions seen are their length;
- ``buffer_kv`` / ``buffer_gate`` keep the last ``compress_rate - 1`` source tokens, zeros before the
  first (eager's pending tokens are their last ``seen % compress_rate``);
- a one-token call gets the last ``compress_rate`` tokens as one window, every step: the model's
  compressor runs its own arithmetic over it (position bias, softmax, norm, rotary at the window's
  first position) and the entry is eager's exactly when the window is a full one, that is when the
  positions seen are a multiple of ``compress_rate``;
- the entries are kept one slot a position (``entry_slots``, as long as the keys): the slot of the
  position a window ends at holds its entry, a one-token call's slot its candidate, the rest zeros; the
  model is given every ``compress_rate``-th slot (eager's ``compressed_kv``), a strided slice whose
  length is a size expression of the positions seen, not a branch, and whose input is never a size of
  its own at the trace (ExecuTorch plans a dim traced at 1 for at most 2: a count of entries would be);
- the overlap state starts as eager's absent one reads (zero kv, ``-inf`` gate: softmax weight 0) and
  a one-token call takes this window's slice only where the window closed (``torch.where`` on the
  count as a tensor).

A call of several tokens (the prompt) follows eager's arithmetic as it is (the model's branches on the
prompt's length are the prefill's). What eager's generate returns and this form's cache hold are the
same tensors under the same names, the buffers longer (eager's are their last positions), the entries
in their slots (sweeps/generate.py compares them so).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

# the compressor protocol a layer must offer, and the state a layer offering it may hold
PROTOCOL = ("store_compression_weights", "update_compressor_states")
OVERLAP = "update_overlap_state"
_STATE = {"keys", "values", "is_initialized", "sliding_window", "cumulative_length", "_sliding_window_tensor",
          "record_past", "dtype", "device", "compress_rate", "buffer_kv", "buffer_gate", "compressed_kv", "entry_count"}
_OVERLAP_STATE = {"overlap_kv", "overlap_gate"}


class PlainCompressedLayer(DynamicLayer):
    """A compressed-attention sliding-window layer as a plain one (module docstring)."""

    def __init__(self, compress_rate: int, names: tuple[str, ...], overlap: bool) -> None:
        super().__init__()
        self.compress_rate = compress_rate
        self.buffer_kv: dict[str, torch.Tensor | None] = dict.fromkeys(names)
        self.buffer_gate: dict[str, torch.Tensor | None] = dict.fromkeys(names)
        # one slot a position: the entry of the window that ends there, zeros or an open window's candidate
        # elsewhere (as long as the keys, so its length is never a size of its own at the trace)
        self.entry_slots: dict[str, torch.Tensor | None] = dict.fromkeys(names)
        if overlap:
            self.overlap_kv: dict[str, torch.Tensor | None] = dict.fromkeys(names)
            self.overlap_gate: dict[str, torch.Tensor | None] = dict.fromkeys(names)
        # within one forward call only: the one-token path's "this window is full" flag per name, set by
        # store_compression_weights, taken by update_compressor_states (empty between calls: no state)
        self._closing: dict[str, torch.Tensor] = {}

    def store_compression_weights(self, name: str, kv: torch.Tensor, gate: torch.Tensor
                                  ) -> tuple[torch.Tensor, torch.Tensor, Any]:
        rate, seen, new = self.compress_rate, self.keys.shape[-2], kv.shape[1]  # update ran first: seen counts this call
        if self.buffer_kv[name] is None:  # the first call: the pending slots before any token
            self.buffer_kv[name] = kv.new_zeros((kv.shape[0], rate - 1, kv.shape[-1]))
            self.buffer_gate[name] = gate.new_zeros((gate.shape[0], rate - 1, gate.shape[-1]))
            if hasattr(self, "overlap_kv"):  # eager's "no previous window": zero kv, a gate of softmax weight 0
                half = kv.shape[-1] // 2
                self.overlap_kv[name] = kv.new_zeros((kv.shape[0], rate, half))
                self.overlap_gate[name] = gate.new_full((gate.shape[0], rate, half), float("-inf"))
        joined_kv = torch.cat([self.buffer_kv[name], kv], dim=1)
        joined_gate = torch.cat([self.buffer_gate[name], gate], dim=1)
        keep = joined_kv.shape[1] - (rate - 1)
        self.buffer_kv[name], self.buffer_gate[name] = joined_kv[:, keep:], joined_gate[:, keep:]
        if new == 1:  # a decode step: the last `rate` tokens, a full window exactly when seen % rate == 0
            self._closing[name] = torch.full((), seen, dtype=torch.long, device=kv.device) % rate == 0
            return joined_kv[:, -rate:], joined_gate[:, -rate:], seen - rate
        held = (seen - new) % rate  # eager's pending tokens before this call
        start = (rate - 1) - held
        usable = (held + new) // rate * rate
        if usable == 0:  # no full window (the model's next line asks the same): an empty chunk of a constant size,
            start = usable = 0  # not a size expression at 0 (ExecuTorch refuses a tensor with a zero stride)
        return (joined_kv[:, start:start + usable], joined_gate[:, start:start + usable], seen - new - held)

    def update_overlap_state(self, name: str, chunk_kv: torch.Tensor, chunk_gate: torch.Tensor, head_dim: int
                             ) -> tuple[torch.Tensor, torch.Tensor]:
        prior_kv, prior_gate = self.overlap_kv[name], self.overlap_gate[name]
        last_kv, last_gate = chunk_kv[:, -1, :, :head_dim], chunk_gate[:, -1, :, :head_dim]
        closing = self._closing.get(name)
        if closing is None:  # a call of several tokens: its last full window, as eager's
            self.overlap_kv[name], self.overlap_gate[name] = last_kv.clone(), last_gate.clone()
        else:
            self.overlap_kv[name] = torch.where(closing, last_kv, prior_kv).to(prior_kv.dtype)
            self.overlap_gate[name] = torch.where(closing, last_gate, prior_gate).to(prior_gate.dtype)
        return prior_kv, prior_gate

    def update_compressor_states(self, name: str, compressed: torch.Tensor) -> torch.Tensor:
        closing = self._closing.pop(name, None)
        rate, seen, slots = self.compress_rate, self.keys.shape[-2], self.entry_slots[name]
        if closing is not None:  # one token: its slot holds the candidate entry, an entry where its window is full
            new_slots = compressed
        else:  # several: entry w closes its window at position first + (w + 1) * rate - 1, zeros elsewhere
            new = self.keys.shape[-2] - (0 if slots is None else slots.shape[1])
            held = (seen - new) % rate
            if compressed.shape[1] == 0:
                new_slots = compressed.new_zeros((compressed.shape[0], new, compressed.shape[-1]))
            else:
                windows = torch.cat([compressed.new_zeros((*compressed.shape[:2], rate - 1, compressed.shape[-1])),
                                     compressed.unsqueeze(2)], dim=2).flatten(1, 2)[:, held:]
                tail = compressed.new_zeros((compressed.shape[0], new - windows.shape[1], compressed.shape[-1]))
                new_slots = torch.cat([windows, tail], dim=1)
        slots = new_slots if slots is None else torch.cat([slots, new_slots], dim=1)
        self.entry_slots[name] = slots
        if seen < rate:  # no full window yet (the model's attention asks the same of the step's length): a
            return slots[:, :0]  # constant size 0, not an expression at 0 (ExecuTorch refuses a zero stride)
        return slots[:, rate - 1::rate]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        for states in (self.buffer_kv, self.buffer_gate, self.entry_slots,
                       getattr(self, "overlap_kv", {}), getattr(self, "overlap_gate", {})):
            for name, tensor in states.items():
                if tensor is not None:
                    states[name] = tensor.index_select(0, beam_idx.to(tensor.device))

    def reset(self) -> None:
        super().reset()
        for states in (self.buffer_kv, self.buffer_gate, self.entry_slots,
                       getattr(self, "overlap_kv", {}), getattr(self, "overlap_gate", {})):
            for name in states:
                states[name] = None

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a compressed-attention layer's compressor state cannot be rolled back")


def compressed_form(layer: Any) -> PlainCompressedLayer | None:
    """``layer``'s form where it is a sliding-window layer that holds nothing yet and serves a compressor
    through transformers' protocol (``PROTOCOL``, with ``OVERLAP`` where it keeps overlap state), holding
    that protocol's state and nothing more; else None."""
    if not isinstance(layer, DynamicSlidingWindowLayer) or not all(callable(getattr(layer, m, None)) for m in PROTOCOL):
        return None
    overlap = callable(getattr(layer, OVERLAP, None))
    state = set(vars(layer))
    if not state <= (_STATE | _OVERLAP_STATE if overlap else _STATE) or not {"compress_rate", "compressed_kv"} <= state:
        return None
    names, rate = layer.compressed_kv, layer.compress_rate
    if not isinstance(names, dict) or any(v is not None for v in names.values()) or not isinstance(rate, int) or rate < 1:
        return None
    if overlap and not _OVERLAP_STATE <= state:
        return None
    return PlainCompressedLayer(rate, tuple(names), overlap)
