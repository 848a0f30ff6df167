"""Input tensors whose shapes are written down, not derived by a generic rule: the shape a forward's
docstring documents for an argument (``documented_shape``, ``documented_input``), and explicit tensors
from override data (``tensor_from_recipe``). Used by ``inputs.make_inputs``.
"""

from __future__ import annotations

import re

import torch

from ._inputs_common import T_DEC, B, S, _as_hw, token_ids, vision_config

# ---- shapes documented in the forward's docstring -------------------------------------------
_DOC_ARG = r"^\s*{name} \(`torch\.(\w+)`\s+of shape\s+`[\[(](.*?)[\])]`"
_LEN_NAME = re.compile(r"len|frames|tokens|steps|positions|number_of|^num_|time", re.I)
_WIDTH_ALIASES = {"dim": "hidden_size", "embed_dim": "hidden_size", "d_model": "hidden_size", "hidden_dim": "hidden_size"}


def _config_int(config, name):
    for src in (config, getattr(config, "text_config", None)):
        v = getattr(src, name, None) if src is not None else None
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _eval_dim(expr: str, config, seq: int) -> int | None:
    """One documented dimension: an int, ``batch_size``, a config field (``config.x`` or ``x``),
    a length-like name (the sequence length) or simple arithmetic of those (``dim * len(config.ids)``)."""
    import ast

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "config":
            v = getattr(config, node.attr, None)
            if isinstance(v, (list, tuple)):
                return list(v)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
            raise ValueError(node.attr)
        if isinstance(node, ast.Name):
            n = node.id
            if n == "batch_size":
                return B
            v = _config_int(config, n)
            if v is None and n in _WIDTH_ALIASES:
                v = _config_int(config, _WIDTH_ALIASES[n])
            if v is not None:
                return v
            if n in ("height", "width"):  # image planes: the (tiny) image size the pixel recipes use
                h, w = _as_hw(getattr(vision_config(config), "image_size", None) or getattr(config, "image_size", None))
                return h if n == "height" else w
            if _LEN_NAME.search(n) or n in ("sequence_length", "seq_len", "length"):
                return seq
            raise ValueError(n)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len" and len(node.args) == 1:
            v = ev(node.args[0])
            if isinstance(v, list):
                return len(v)
            raise ValueError("len")
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv)):
            a, b = ev(node.left), ev(node.right)
            if not (isinstance(a, int) and isinstance(b, int)):
                raise ValueError("operand")
            return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b, ast.FloorDiv: a // max(b, 1)}[type(node.op)]
        raise ValueError(ast.dump(node))

    try:
        v = ev(ast.parse(expr.strip(), mode="eval").body)
    except (SyntaxError, ValueError):
        return None
    return v if isinstance(v, int) and v > 0 else None


def documented_shape(model, name: str, config, seq: int = S):
    """(torch type name, shape) of a forward argument as its docstring documents it, or None."""
    doc = getattr(type(model).forward, "__doc__", None) or ""
    m = re.search(_DOC_ARG.format(name=re.escape(name)), doc, re.M)
    if not m:
        return None
    dims = [_eval_dim(d, config, seq) for d in _split_dims(m.group(2))]
    if not dims or any(d is None for d in dims):
        return None
    return m.group(1), tuple(dims)


def _split_dims(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p for p in parts if p.strip()]


def documented_input(gen, config, model, name: str, vocab: int, avoid: set[int]):
    """A tensor of the documented shape: masks all ones, ids in the vocab, other integer tensors
    small indices (< S), float tensors standard normal."""
    found = documented_shape(model, name, config)
    if found is None:
        return None
    kind, shape = found
    if "mask" in name:
        return torch.ones(shape, dtype=torch.bool if kind == "BoolTensor" else torch.long)
    if kind in ("LongTensor", "IntTensor"):
        if name.endswith("ids"):
            return token_ids(gen, shape, vocab, avoid)
        return torch.randint(0, S, shape, generator=gen)
    if kind == "BoolTensor":
        return torch.ones(shape, dtype=torch.bool)
    return torch.randn(shape, generator=gen)


# ---- explicit tensors from override data ------------------------------------------------------
def _resolve_dim(d, config, out):
    """A dim in override data: an int, "B"/"S"/"T", "<input>.<axis>" (a dim of an input built
    above, e.g. "pixel_values.2"), or a config expression as in docstrings ("vision_config.hidden_size * 2")."""
    if isinstance(d, int):
        return d
    if d in ("B", "S", "T"):
        return {"B": B, "S": S, "T": T_DEC}[d]
    m = re.fullmatch(r"(\w+)\.(-?\d+)", d)
    if m and m.group(1) in out:
        return int(out[m.group(1)].shape[int(m.group(2))])
    expr = re.sub(r"\b([a-z_]\w*(?:\.\w+)+)", lambda mm: str(_dotted(config, mm.group(1))), d)
    expr = re.sub(r"\b([BST])\b", lambda mm: str({"B": B, "S": S, "T": T_DEC}[mm.group(1)]), expr)
    v = _eval_dim(expr, config, S)
    if v is None:
        raise ValueError(f"override tensor dim {d!r} does not resolve on {type(config).__name__}")
    return v


def _dotted(config, path):
    cur = config
    for k in path.split("."):
        cur = getattr(cur, k)
    return len(cur) if isinstance(cur, (list, tuple)) else cur


def tensor_from_recipe(gen, config, recipe: dict, out: dict, vocab: int, avoid: set[int]) -> torch.Tensor:
    """{"shape": [dims], "kind": "float" | "rand" | "ids" | "ones" | "zeros" | "int" | "like", "high": dim,
    "dtype": "long" | "bool" | "float", "of": input name (for "like": same shape, fresh values)}."""
    kind = recipe.get("kind", "float")
    if kind == "like":
        shape = tuple(out[recipe["of"]].shape)
    else:
        shape = tuple(_resolve_dim(d, config, out) for d in recipe["shape"])
    default = "long" if kind in ("ids", "int") else "float"
    dtype = {"long": torch.long, "bool": torch.bool, "float": torch.float32}[recipe.get("dtype", default)]
    if kind in ("float", "like"):
        t = torch.randn(shape, generator=gen)
    elif kind == "rand":  # uniform [0, 1): flow-matching times, probabilities
        t = torch.rand(shape, generator=gen)
    elif kind == "ids":
        t = token_ids(gen, shape, vocab, avoid)
    elif kind == "int":
        t = torch.randint(
            int(_resolve_dim(recipe.get("low", 0), config, out)), int(_resolve_dim(recipe["high"], config, out)), shape, generator=gen
        )
    elif kind == "ones":
        t = torch.ones(shape)
    elif kind == "zeros":
        t = torch.zeros(shape)
    else:
        raise ValueError(f"unknown override tensor kind {kind!r}")
    return t.to(dtype)
