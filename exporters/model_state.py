"""Stage 5 of tracing: attributes a model sets in forward, restored after export.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

# ── Stage 5: State cleanup ───────────────────────────────────────────────────
# Attributes a model sets in forward survive tracing as fake tensors or symbols and break the next eager
# call or export. Restore, after export, every public attribute the forward replaced, every private one
# named here, and drop new ones holding fake tensors or symbols.

_STATEFUL_CACHE_ATTRS: tuple[str, ...] = (
    "cached_sequence_length",  # Wav2Vec2-BERT / Wav2Vec2-Conformer rotary cache key: an int set to a SymInt
    "cached_rotary_positional_embedding",  # ... and the cached table itself
    "_cached_decode_position_ids",
)


def _tracked(name: str) -> bool:
    """Attributes a forward may set: public ones and the named caches (torch's own ``_parameters``,
    ``_buffers``, ``_modules`` and hooks are private and left alone)."""
    return not name.startswith("_") or name in _STATEFUL_CACHE_ATTRS


def _snapshot_state(model: torch.nn.Module) -> dict[tuple[int, str], Any]:
    return {(id(m), k): v for m in model.modules() for k, v in vars(m).items() if _tracked(k)}


def _traced_value(value: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(value, (FakeTensor, torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, (list, tuple)):
        return any(_traced_value(v) for v in value)
    return False


def reset_model_state(model: torch.nn.Module, snapshot: dict[tuple[int, str], Any]) -> list[str]:
    """Put back every tracked attribute the traced forward replaced (Swin's ``window_size`` left as a
    SymInt broke the next export), and drop new ones that hold fake tensors or symbols."""
    reset = []
    for name, m in model.named_modules():
        for k, v in list(vars(m).items()):
            if not _tracked(k):
                continue
            key = (id(m), k)
            if key in snapshot:
                if snapshot[key] is not v:
                    m.__dict__[k] = snapshot[key]
                    reset.append(f"{name}.{k}")
            elif _traced_value(v):
                del m.__dict__[k]
                reset.append(f"{name}.{k}")
    return reset


def _is_dim_marking(name: str) -> bool:
    return name.startswith("_dynamo_") or name == "_has_dynamo_dim_marking"


def _dim_markings(tensors: Mapping[str, torch.Tensor]) -> dict[str, dict[str, Any]]:
    return {k: {a: v for a, v in vars(t).items() if _is_dim_marking(a)} for k, t in tensors.items()}


def restore_dim_markings(tensors: Mapping[str, torch.Tensor], before: dict[str, dict[str, Any]]) -> None:
    """torch.export marks the input tensors it is given dynamic dims for (``_dynamo_dynamic_indices``
    and friends, set on the tensor objects) and leaves the marks when the export fails; the next
    export of the same tensors (the sweep's cached inputs: another backend's static item) then traced
    them as dynamic. Put each tensor's marks back as they were before the export."""
    for name, tensor in tensors.items():
        for attr in [a for a in vars(tensor) if _is_dim_marking(a)]:
            if attr not in before[name]:
                delattr(tensor, attr)
        for attr, value in before[name].items():
            setattr(tensor, attr, value)
