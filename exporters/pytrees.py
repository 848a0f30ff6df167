"""Stage 3 of tracing: pytree registration of Cache and ModelOutput types and of any object in the
outputs that holds tensors.
"""

from __future__ import annotations

import base64
import inspect
import pickle
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils import _pytree as pytree

# ── Stage 3: Pytree registration ─────────────────────────────────────────────
# Every Cache (and cache layer) is flattened by attribute traversal: tensors become leaves, everything
# else goes into the context. Objects found in outputs that hold tensors but that pytree does not know
# are registered the same way. Add a branch below for a type attribute traversal cannot reach.
# A symbolic int attribute (traced under dynamic shapes) is recorded as None: it has no single value.

_REGISTERED: set[type] = set()


def _flatten_to_context(obj: Any, tensors: list, path: str = "") -> Any:
    """Append the tensors inside ``obj`` to ``tensors``; return a hashable context to rebuild it."""
    if isinstance(obj, torch.Tensor):
        tensors.append((path, obj))
        return ("tensor",)
    if isinstance(obj, (list, tuple)):
        kind = "list" if isinstance(obj, list) else "tuple"
        return (kind, tuple(_flatten_to_context(v, tensors, _join(path, str(i))) for i, v in enumerate(obj)))
    if isinstance(obj, dict):
        return ("dict", tuple((k, _flatten_to_context(v, tensors, _join(path, str(k)))) for k, v in obj.items()))
    if isinstance(obj, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        # a size-dependent attribute of a dynamic export (a sliding-window layer's cumulative_length):
        # it has no single value, and a symbol kept in the output spec drags the whole shape
        # environment along (torch.onnx's deepcopy of the module call graph fails on its fake tensors)
        return ("const", _Const(None))
    if _holds_tensors(obj):
        fields = tuple(
            (k, _flatten_to_context(v, tensors, _join(path, _alias(k)))) for k, v in vars(obj).items()
        )
        return ("object", type(obj), fields)
    return ("const", _Const(obj))


def _unflatten_from_context(ctx: Any, tensors: list) -> Any:
    """Inverse of ``_flatten_to_context``; consumes ``tensors`` (an iterator) in order."""
    kind = ctx[0]
    if kind == "tensor":
        return next(tensors)
    if kind in ("list", "tuple"):
        items = [_unflatten_from_context(c, tensors) for c in ctx[1]]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {k: _unflatten_from_context(c, tensors) for k, c in ctx[1]}
    if kind == "object":
        obj = ctx[1].__new__(ctx[1])
        for k, c in ctx[2]:
            obj.__dict__[k] = _unflatten_from_context(c, tensors)
        return obj
    return ctx[1].value


class _Const:
    """A non-tensor attribute kept in a pytree context; compared by value where it can be."""

    def __init__(self, value: Any):
        self.value = value

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, _Const):
            return False
        try:
            return bool(self.value == other.value)
        except Exception:  # noqa: BLE001 - values without a boolean equality
            return self.value is other.value

    def __hash__(self) -> int:
        return hash(type(self.value).__name__)

    def __repr__(self) -> str:
        return f"_Const({self.value!r})"


# Cache attribute names shortened in leaf names: DynamicCache.layers[0].keys -> past_key_values.0.key
_ALIASES = {"layers": "", "keys": "key", "values": "value"}


def _alias(name: str) -> str:
    return _ALIASES.get(name, name)


def _join(prefix: str, name: str) -> str:
    return ".".join(p for p in (prefix, name) if p)


def _holds_tensors(obj: Any) -> bool:
    if not hasattr(obj, "__dict__") or isinstance(obj, (type, torch.nn.Module)) or inspect.isroutine(obj):
        return False
    stack, seen = [obj], set()
    while stack:
        cur = stack.pop()
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        values = vars(cur).values() if hasattr(cur, "__dict__") else cur
        for v in values:
            if isinstance(v, torch.Tensor):
                return True
            if isinstance(v, (list, tuple)) or (hasattr(v, "__dict__") and not isinstance(v, (type, torch.nn.Module))):
                stack.append(v)
            elif isinstance(v, dict):
                stack.append(list(v.values()))
    return False


def _register(cls: type) -> None:
    if cls in _REGISTERED or cls in pytree.SUPPORTED_NODES:
        return

    def flatten(obj):
        tensors: list = []
        ctx = _flatten_to_context(vars(obj), tensors)
        return [t for _, t in tensors], (cls, ctx)

    def flatten_with_keys(obj):
        tensors: list = []
        ctx = _flatten_to_context(vars(obj), tensors)
        keys = [(pytree.GetAttrKey(_path_of(p)), t) for p, t in tensors]
        return keys, (cls, ctx)

    def unflatten(values, context):
        klass, ctx = context
        obj = klass.__new__(klass)
        obj.__dict__.update(_unflatten_from_context(ctx, iter(values)))
        return obj

    pytree.register_pytree_node(
        cls, flatten, unflatten, serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        flatten_with_keys_fn=flatten_with_keys,
        # .pt2 and .pte files store the output spec as JSON: the context travels pickled.
        to_dumpable_context=lambda ctx: base64.b64encode(pickle.dumps(ctx)).decode("ascii"),
        from_dumpable_context=lambda text: pickle.loads(base64.b64decode(text)),
    )
    _REGISTERED.add(cls)


def _path_of(path: str) -> str:
    return ".".join(_alias(p) for p in path.split(".") if _alias(p))


def _subclasses(cls: type) -> Iterable[type]:
    stack = [cls]
    while stack:
        cur = stack.pop()
        yield cur
        stack.extend(cur.__subclasses__())


def register_pytree_nodes(obj: Any = None) -> None:
    """Register every Cache class, and every unknown tensor-holding object found inside ``obj``."""
    from transformers import cache_utils

    for base in (cache_utils.Cache,):
        for cls in _subclasses(base):
            _register(cls)
    if obj is not None:
        for leaf in pytree.tree_leaves(obj):
            if not isinstance(leaf, torch.Tensor) and _holds_tensors(leaf):
                _register(type(leaf))


# Torch's shape-arithmetic patches (sympy.simplify, ShapeEnv internals) matter wherever torch rebuilds
# symbolic sizes, not only in torch.export: the ONNX and ExecuTorch lowerings re-trace the program


# ── output flattening (one naming for eager and every artifact) ───────────────

def _key_to_str(key: Any) -> str | None:
    from torch.utils._pytree import GetAttrKey, MappingKey, SequenceKey

    if isinstance(key, MappingKey):
        return str(key.key)
    if isinstance(key, SequenceKey):
        return str(key.idx)
    if isinstance(key, GetAttrKey):
        return key.name
    return str(key).strip(".[]'\"")


def leaf_names_and_values(obj: Any) -> list[tuple[str, Any]]:
    """Pytree leaves of ``obj`` in flattening order, each with a dotted name from its key path."""
    from torch.utils import _pytree as pytree

    register_pytree_nodes(obj)
    leaves, _ = pytree.tree_flatten_with_path(obj)
    out = []
    for path, value in leaves:
        parts = [p for p in (_key_to_str(k) for k in path) if p]
        out.append((".".join(parts) or "output", value))
    return out


def flatten_outputs(outputs: Any) -> dict[str, torch.Tensor]:
    """Model outputs (ModelOutput, tuple, cache, tensor) as ``{leaf name: tensor}``; non-tensors dropped."""
    flat = {}
    for name, value in leaf_names_and_values(outputs):
        if isinstance(value, torch.Tensor):
            if name in flat:
                raise ValueError(f"two output leaves flatten to the same name {name!r}")
            flat[name] = value
    return flat
