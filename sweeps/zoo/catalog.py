"""Catalog of every model class in the installed transformers' auto mappings.

Cheap by design: it reads only the *name* mappings (``*_MAPPING_NAMES``) of
``transformers.models.auto.modeling_auto`` and ``CONFIG_MAPPING_NAMES`` -- parsed from the
installed sources (see ``_names.py``, no torch import), with an import fallback; it builds
no model and imports no modeling module.  The result is cached.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
from collections.abc import Iterable
from dataclasses import dataclass

from .blocked import blocked_reason

__all__ = ["CatalogEntry", "UnknownModelError", "catalog", "resolve_models"]


@dataclass(frozen=True)
class CatalogEntry:
    class_name: str
    model_type: str
    config_class_name: str
    tasks: tuple[str, ...]
    blocked_by: str | None = None


class UnknownModelError(ValueError):
    """A --model pattern matched no model type or class name in the catalog."""


def _task_name(mapping_name: str) -> str:
    name = mapping_name[: -len("_MAPPING_NAMES")]
    if name == "MODEL":
        return "base"
    return name[len("MODEL_FOR_"):].lower() if name.startswith("MODEL_FOR_") else name.lower()


@functools.lru_cache(maxsize=1)
def _catalog() -> tuple[CatalogEntry, ...]:
    from ._names import name_mappings

    mappings, config_names = name_mappings()
    # class name -> {model_type: [tasks]} ; a class can appear under several model types
    seen: dict[str, dict[str, list[str]]] = {}
    for attr in sorted(mappings):
        mapping = mappings[attr]
        task = _task_name(attr)
        for model_type, value in mapping.items():
            for cls_name in value if isinstance(value, (tuple, list)) else (value,):
                if not cls_name:
                    continue
                tasks = seen.setdefault(cls_name, {}).setdefault(model_type, [])
                if task not in tasks:
                    tasks.append(task)
    entries = []
    for cls_name, by_type in seen.items():
        model_type = _pick_model_type(cls_name, by_type, config_names)
        tasks = sorted({t for ts in by_type.values() for t in ts})
        entries.append(
            CatalogEntry(
                class_name=cls_name,
                model_type=model_type,
                config_class_name=config_names.get(model_type, ""),
                tasks=tuple(tasks),
                blocked_by=blocked_reason(model_type, cls_name),
            )
        )
    entries.sort(key=lambda e: e.class_name)
    return tuple(entries)


def _pick_model_type(cls_name: str, by_type: dict[str, list[str]], config_names: dict[str, str]) -> str:
    """A class listed under several model types: prefer the type whose config class shares
    the class's name prefix (e.g. ``MistralModel`` under ``mistral``), else the first one."""
    types = list(by_type)
    if len(types) == 1:
        return types[0]
    lowered = cls_name.lower()

    def score(mt: str) -> tuple[int, int]:
        cfg = config_names.get(mt, "")
        prefix = cfg[: -len("Config")].lower() if cfg.endswith("Config") else mt.replace("_", "")
        return (int(lowered.startswith(prefix)), len(prefix))

    return max(types, key=score)


def catalog() -> list[CatalogEntry]:
    """Every model class of the installed transformers, sorted by class name."""
    return list(_catalog())


def _norm(s: str) -> str:
    return s.lower().replace("-", "_")


def resolve_models(patterns: Iterable[str] | str) -> list[CatalogEntry]:
    """Entries matching any pattern: a model type (``nllb_moe``), a class name
    (``BertModel``), either in any case, or a glob over either (``Llama*``).
    Order follows the catalog; duplicates are removed.  Raises UnknownModelError
    (listing the closest names) for a pattern that matches nothing."""
    if isinstance(patterns, str):
        patterns = [patterns]
    entries = _catalog()
    picked: dict[str, CatalogEntry] = {}
    for pat in patterns:
        if not isinstance(pat, str) or not pat.strip():
            raise UnknownModelError(f"model pattern must be a non-empty string, got {pat!r}")
        p = _norm(pat.strip())
        is_glob = any(ch in p for ch in "*?[")
        matched = []
        for e in entries:
            keys = (_norm(e.class_name), _norm(e.model_type))
            if is_glob:
                ok = any(fnmatch.fnmatchcase(k, p) for k in keys)
            else:
                ok = p in keys
            if ok:
                matched.append(e)
        if not matched:
            names = sorted({e.class_name for e in entries} | {e.model_type for e in entries})
            close = difflib.get_close_matches(pat.strip(), names, n=5, cutoff=0.5)
            if not close:
                lowered = {_norm(n): n for n in names}
                close = [lowered[c] for c in difflib.get_close_matches(p, list(lowered), n=5, cutoff=0.5)]
            hint = f" Closest names: {', '.join(close)}." if close else ""
            raise UnknownModelError(
                f"no model type or class name matches {pat!r}.{hint} "
                "Use a model type (e.g. 'llama'), a class name (e.g. 'LlamaForCausalLM') or a glob ('Llama*')."
            )
        for e in matched:
            picked.setdefault(e.class_name, e)
    order = {e.class_name: i for i, e in enumerate(entries)}
    return sorted(picked.values(), key=lambda e: order[e.class_name])
