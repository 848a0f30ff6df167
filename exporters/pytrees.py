"""Stage 3 of tracing: pytree registration of Cache and ModelOutput types and of any object in the
outputs that holds tensors.
"""

from __future__ import annotations

import inspect
import json
import math
import weakref
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
    if _holds_tensors(obj) or _rebuilt_fresh(obj):
        fields = tuple(
            (k, _flatten_to_context(v, tensors, _join(path, _alias(k)))) for k, v in vars(obj).items()
        )
        return ("object", type(obj), fields)
    return ("const", _Const(obj))


def _rebuilt_fresh(obj: Any) -> bool:
    """A cache layer that holds no tensor yet (an empty cache, before its first update) is still rebuilt
    as a new object on every unflatten, not kept as one constant object: the model fills it in place,
    and a shared constant would carry one call's tensors into the next."""
    if not hasattr(obj, "__dict__") or isinstance(obj, type):
        return False
    if type(obj) in _REGISTERED:
        return True
    return any(c.__module__ == _CACHE_MODULE for c in type(obj).__mro__)


_CACHE_MODULE = "transformers.cache_utils"


def _cache_classes() -> list[type]:
    """Every class transformers.cache_utils defines (caches, layers, layer mixins), with the subclasses
    imported so far (model-specific caches and layers)."""
    try:
        from transformers import cache_utils
    except ImportError:  # pragma: no cover - transformers is a dependency
        return []
    bases = [v for v in vars(cache_utils).values() if isinstance(v, type) and v.__module__ == _CACHE_MODULE]
    return [c for base in bases for c in _subclasses(base)]


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


# The pytree contract: flattening what ``unflatten`` built from a spec gives that spec back, whatever
# the leaves are. ``tree_map`` and ExecuTorch's emitter rebuild outputs with non-tensor leaves (ints,
# specs); a value-driven flatten would turn those leaves into constants. An object built by
# ``unflatten`` therefore remembers its context, and flattening it follows that context.
_BUILT_FROM: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Mismatch(Exception):
    """The object no longer has the structure of the context it was built from."""


def _leaves_along(obj: Any, ctx: Any, leaves: list, path: str = "") -> None:
    kind = ctx[0]
    if kind == "tensor":
        leaves.append((path, obj))
    elif kind in ("list", "tuple"):
        if type(obj) is not (list if kind == "list" else tuple) or len(obj) != len(ctx[1]):
            raise _Mismatch
        for i, (v, c) in enumerate(zip(obj, ctx[1])):
            _leaves_along(v, c, leaves, _join(path, str(i)))
    elif kind == "dict":
        if not isinstance(obj, dict) or list(obj) != [k for k, _ in ctx[1]]:
            raise _Mismatch
        for k, c in ctx[1]:
            _leaves_along(obj[k], c, leaves, _join(path, str(k)))
    elif kind == "object":
        if type(obj) is not ctx[1]:
            raise _Mismatch
        _leaves_along(vars(obj), ("dict", ctx[2]), leaves, path)
    elif isinstance(obj, torch.Tensor) or obj != ctx[1].value:
        raise _Mismatch


def _flatten_object(obj: Any) -> tuple[list, Any]:
    built = _BUILT_FROM.get(obj) if type(obj).__weakrefoffset__ else None
    if built is not None:
        leaves: list = []
        try:
            _leaves_along(vars(obj), built, leaves)
            return leaves, built
        except _Mismatch:
            pass
    tensors: list = []
    return tensors, _flatten_to_context(vars(obj), tensors)


def _register(cls: type) -> None:
    if cls in _REGISTERED or cls in pytree.SUPPORTED_NODES:
        return

    def flatten(obj):
        leaves, ctx = _flatten_object(obj)
        return [t for _, t in leaves], (cls, ctx)

    def flatten_with_keys(obj):
        leaves, ctx = _flatten_object(obj)
        # one key per leaf, named by its dotted path inside the object: a MappingKey, as torch.export turns a
        # GetAttrKey into an attribute source, which must not hold a '.' (non-strict export of a cache input)
        keys = [(pytree.MappingKey(_path_of(p)), t) for p, t in leaves]
        return keys, (cls, ctx)

    def unflatten(values, context):
        klass, ctx = context
        obj = klass.__new__(klass)
        obj.__dict__.update(_unflatten_from_context(ctx, iter(values)))
        if klass.__weakrefoffset__:
            _BUILT_FROM[obj] = ctx
        return obj

    pytree.register_pytree_node(
        cls, flatten, unflatten, serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        flatten_with_keys_fn=flatten_with_keys,
        # .pt2 and .pte files store the output spec as JSON, and the context with it: as JSON too, never
        # pickled, so that loading a file someone else made runs no code (see context_to_json)
        to_dumpable_context=context_to_json,
        from_dumpable_context=context_from_json,
    )
    _REGISTERED.add(cls)


# ── contexts as JSON (what .pt2 and .pte files store) ─────────────────────────
# A context is rebuilt from plain JSON values. The one thing it names is a class: the class of the
# registered node, of an object inside it (a cache layer), or a class-valued attribute
# (``DynamicCache.layer_class_to_replicate``). Names are resolved against an allow-list of classes
# already imported: the classes transformers.cache_utils defines and their subclasses, and the classes
# registered here. A transformers configuration kept as an attribute (xLSTMCache.config) is stored as its
# config.json and rebuilt by its class, resolved the same way among the configuration classes imported.
# Nothing is imported by name and nothing is unpickled, so a tampered file can make loading fail but
# cannot make it run code.

CONTEXT_FORMAT = "exporters.pytree-context/1"


class ContextError(ValueError):
    """A pytree context that cannot be written as JSON, or a stored one that cannot be read back."""


def context_to_json(context: Any) -> str:
    cls, ctx = context
    return json.dumps({"format": CONTEXT_FORMAT, "class": _class_name(cls), "tree": _encode_node(ctx, _class_name(cls))},
                      allow_nan=False)


def context_from_json(text: str) -> Any:
    try:
        doc = json.loads(text)
    except (TypeError, ValueError):
        raise ContextError(
            "this file's output spec holds a pytree context that is not JSON (files saved before exporters "
            "stored contexts as JSON held pickles there, which are never loaded): export the model again"
        ) from None
    if not isinstance(doc, dict) or doc.get("format") != CONTEXT_FORMAT:
        raise ContextError(f"unknown pytree context format {doc.get('format') if isinstance(doc, dict) else doc!r}; "
                           f"this version of exporters reads {CONTEXT_FORMAT!r}")
    return _resolve_class(doc.get("class")), _decode_node(doc.get("tree"))


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _allowed_classes() -> dict[str, type]:
    return {_class_name(c): c for c in [*_REGISTERED, *_cache_classes()]}


def _resolve_class(name: Any) -> type:
    allowed = _allowed_classes()
    if not isinstance(name, str) or name not in allowed:
        raise ContextError(
            f"pytree context names the class {name!r}, which is not one exporters rebuilds (the classes of "
            f"transformers.cache_utils and their subclasses, and classes registered by register_pytree_nodes); "
            f"import the module that defines it and register it, or re-export"
        )
    return allowed[name]


def _encode_node(ctx: Any, where: str) -> Any:
    kind = ctx[0]
    if kind == "tensor":
        return {"node": "tensor"}
    if kind in ("list", "tuple"):
        return {"node": kind, "items": [_encode_node(c, where) for c in ctx[1]]}
    if kind == "dict":
        return {"node": "dict", "items": [[_encode_value(k, where), _encode_node(c, f"{where}.{k}")] for k, c in ctx[1]]}
    if kind == "object":
        return {"node": "object", "class": _class_name(ctx[1]),
                "fields": [[k, _encode_node(c, f"{where}.{k}")] for k, c in ctx[2]]}
    return {"node": "const", "value": _encode_value(ctx[1].value, where)}


def _decode_node(node: Any) -> Any:
    kind = node.get("node") if isinstance(node, dict) else None
    if kind == "tensor":
        return ("tensor",)
    if kind in ("list", "tuple"):
        return (kind, tuple(_decode_node(c) for c in node["items"]))
    if kind == "dict":
        return ("dict", tuple((_decode_value(k), _decode_node(c)) for k, c in node["items"]))
    if kind == "object":
        return ("object", _resolve_class(node["class"]), tuple((str(k), _decode_node(c)) for k, c in node["fields"]))
    if kind == "const":
        return ("const", _Const(_decode_value(node["value"])))
    raise ContextError(f"unknown node in a stored pytree context: {node!r}")


def _encode_value(value: Any, where: str) -> Any:
    """A constant attribute as JSON: plain scalars as themselves, everything else tagged."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, type):
        return {"class": _class_name(value)}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [_encode_value(v, where) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[_encode_value(k, where), _encode_value(v, where)] for k, v in value.items()]}
    if _is_config(value):  # a cache that keeps its model's config (xLSTMCache): its JSON, as config.json holds it
        return {"config": [_class_name(type(value)), json.loads(value.to_json_string(use_diff=False))]}
    raise ContextError(
        f"{where}: an attribute of type {type(value).__module__}.{type(value).__qualname__} ({value!r:.80}) cannot be "
        f"stored in a saved program's output spec (contexts are JSON: None, bool, int, float, str, dtype, "
        f"device, an allow-listed class, a transformers configuration, and lists, tuples and dicts of these); "
        f"return it outside the model's outputs, or add its type to _encode_value"
    )


def _decode_value(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict) and len(value) == 1:
        (tag, body), = value.items()
        if tag == "float" and body in ("inf", "-inf", "nan"):
            return float(body)
        if tag == "dtype" and isinstance(getattr(torch, str(body), None), torch.dtype):
            return getattr(torch, body)
        if tag == "device":
            return torch.device(str(body))
        if tag == "class":
            return _resolve_class(body)
        if tag in ("list", "tuple") and isinstance(body, list):
            items = [_decode_value(v) for v in body]
            return items if tag == "list" else tuple(items)
        if tag == "dict" and isinstance(body, list):
            return {_decode_value(k): _decode_value(v) for k, v in body}
        if tag == "config" and isinstance(body, list) and len(body) == 2 and isinstance(body[1], dict):
            cls = _config_class(body[0])
            try:
                return cls.from_dict(body[1])
            except Exception as exc:  # noqa: BLE001 - a stored config its class refuses: a bad file, named as such
                raise ContextError(f"a stored {body[0]} cannot be rebuilt from its JSON: {type(exc).__name__}: "
                                   f"{exc}") from exc
    raise ContextError(f"unknown value in a stored pytree context: {value!r:.120}")


def _is_config(value: Any) -> bool:
    from transformers import PretrainedConfig

    return isinstance(value, PretrainedConfig)


def _config_class(name: Any) -> type:
    """A configuration class named in a stored context: one of transformers' already imported
    PretrainedConfig subclasses, never anything imported by name."""
    from transformers import PretrainedConfig

    allowed = {_class_name(c): c for c in _subclasses(PretrainedConfig)}
    if not isinstance(name, str) or name not in allowed:
        raise ContextError(f"pytree context names the configuration class {name!r}, which is not a transformers "
                           f"configuration class imported here; import the model's module, or re-export")
    return allowed[name]


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
