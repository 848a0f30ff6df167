"""Read transformers' auto *name* mappings without importing torch.

``modeling_auto.py``, ``auto_mappings.py`` and ``configuration_auto.py`` of the installed
transformers are parsed with ``ast``; only the statement shapes they use are understood
(``X = OrderedDict([...])`` with literal pairs and ``*list(Y.items())``, ``X.update({...})``,
``X = OrderedDict(**{...}, **X)``).  Anything else raises ``_Unsupported`` and the caller falls
back to importing the modules (slower: imports torch).  A test checks both paths agree.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from collections import OrderedDict


class _Unsupported(Exception):
    pass


def _package_dir() -> str:
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.origin:
        raise _Unsupported("transformers not found")
    return os.path.dirname(spec.origin)


def _eval(node, env: dict):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Tuple):
        return tuple(_eval(e, env) for e in node.elts)
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        raise _Unsupported(node.id)
    if isinstance(node, ast.List):
        out = []
        for e in node.elts:
            if isinstance(e, ast.Starred):
                out.extend(_eval(e.value, env))
            else:
                out.append(_eval(e, env))
        return out
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values):
            if k is None:  # **mapping
                out.update(_eval(v, env))
            else:
                out[_eval(k, env)] = _eval(v, env)
        return out
    if isinstance(node, ast.Call):
        fn = node.func
        if isinstance(fn, ast.Name) and fn.id in ("OrderedDict", "dict"):
            out = OrderedDict()
            for a in node.args:
                out.update(_eval(a, env))
            for kw in node.keywords:
                if kw.arg is None:
                    out.update(_eval(kw.value, env))
                else:
                    out[kw.arg] = _eval(kw.value, env)
            return out
        if isinstance(fn, ast.Name) and fn.id == "list" and len(node.args) == 1:
            return list(_eval(node.args[0], env))
        if isinstance(fn, ast.Attribute) and fn.attr == "items" and not node.args:
            return list(_eval(fn.value, env).items())
    raise _Unsupported(ast.dump(node)[:80])


def _run(path: str, env: dict, wanted) -> None:
    tree = ast.parse(open(path, encoding="utf-8").read())
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
            if wanted(name):
                env[name] = _eval(stmt.value, env)
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            fn = stmt.value.func
            if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) and wanted(fn.value.id):
                if fn.attr != "update":
                    raise _Unsupported(f"{fn.value.id}.{fn.attr}")
                env[fn.value.id].update(_eval(stmt.value.args[0], env))


def read_name_mappings() -> tuple[dict[str, dict], dict[str, str]]:
    """({"MODEL_FOR_..._MAPPING_NAMES": {model_type: class name(s)}}, CONFIG_MAPPING_NAMES)."""
    base = os.path.join(_package_dir(), "models", "auto")
    env: dict = {}
    _run(os.path.join(base, "auto_mappings.py"), env, lambda n: n == "CONFIG_MAPPING_NAMES")
    _run(os.path.join(base, "configuration_auto.py"), env, lambda n: n == "CONFIG_MAPPING_NAMES")
    config_names = env.pop("CONFIG_MAPPING_NAMES")
    _run(os.path.join(base, "modeling_auto.py"), env, lambda n: n.endswith("_MAPPING_NAMES"))
    return {k: v for k, v in env.items() if k.endswith("_MAPPING_NAMES")}, dict(config_names)


def import_name_mappings() -> tuple[dict[str, dict], dict[str, str]]:
    from transformers.models.auto import configuration_auto, modeling_auto

    maps = {a: getattr(modeling_auto, a) for a in dir(modeling_auto)
            if a.endswith("_MAPPING_NAMES") and a != "CONFIG_MAPPING_NAMES" and isinstance(getattr(modeling_auto, a), dict)}
    return maps, dict(configuration_auto.CONFIG_MAPPING_NAMES)


def name_mappings() -> tuple[dict[str, dict], dict[str, str]]:
    try:
        return read_name_mappings()
    except (_Unsupported, OSError, SyntaxError):
        return import_name_mappings()
