"""Checks that make a bad skip-list entry stop collection, naming the entry.

Rules (each violation raises :class:`SkipListError` with the list name, index and models):
- every class / model type exists in the installed transformers (close matches suggested);
- the scope means something: known backends and variants, not empty; an
  ONNX_DISABLE_OPTIMIZE entry is scoped to ``onnx`` only; ``stage`` is a known stage;
- the reason names a cause: not empty, not just "fails"/"TODO"/"flaky"/"broken", not tiny;
- links are http(s) URLs that point at something specific (a GitHub link names an issue
  or pull request); ONNX_DISABLE_OPTIMIZE entries must have one;
- no two entries of one list cover the same model in an overlapping scope.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import urlparse

from skips.records import BACKENDS, STAGES, TESTS, VARIANTS, ExportSkip, OnnxDisableOptimize, SkipListError, normalize_model_type

MIN_REASON_CHARS = 15
_VAGUE_WORDS = {"fail", "fails", "failed", "failing", "todo", "tbd", "fixme", "xxx", "flaky",
                "broken", "bug", "error", "errors", "skip", "skipped", "unknown", "n/a", "na",
                "wip", "crash", "crashes", "does", "not", "doesn't", "work", "works", "it",
                "on", "in", "export", "exports", "onnx", "dynamo", "executorch", "model"}
_GITHUB_SPECIFIC = re.compile(r"^/[^/]+/[^/]+/(issues|pull|discussions|commit)/\w+")


def installed_names() -> tuple[set[str], dict[str, set[str]]]:
    """Class names and ``{model_type: classes}`` from the installed transformers auto mappings.

    Cheap: reads the ``*_MAPPING_NAMES`` dicts, imports no modeling module.
    """
    from transformers.models.auto import modeling_auto

    classes: set[str] = set()
    families: dict[str, set[str]] = {}
    for attr in dir(modeling_auto):
        if not attr.endswith("_MAPPING_NAMES") or attr == "CONFIG_MAPPING_NAMES":
            continue
        mapping = getattr(modeling_auto, attr)
        if not isinstance(mapping, Mapping):
            continue
        for model_type, names in mapping.items():
            names = (names,) if isinstance(names, str) else tuple(names)
            classes.update(names)
            families.setdefault(model_type, set()).update(names)
    return classes, families


def _where(list_name: str, index: int, entry) -> str:
    return f"{list_name}[{index}] ({', '.join(entry.models) or 'no models'})"


def _fail(list_name: str, index: int, entry, problem: str) -> SkipListError:
    return SkipListError(f"{_where(list_name, index, entry)}: {problem}")


def _unknown(name: str, known: Iterable[str], what: str) -> str:
    close = difflib.get_close_matches(name, list(known), n=5, cutoff=0.6)
    hint = f"; close matches: {', '.join(close)}" if close else "; no close match"
    return f"unknown {what} {name!r}{hint}"


def reason_problem(reason: object) -> str | None:
    """Why ``reason`` is not acceptable, or None if it is."""
    if not isinstance(reason, str) or not reason.strip():
        return "reason is missing or empty; say what fails and what model-side change removes it"
    text = reason.strip()
    words = re.findall(r"[\w/']+", text.lower())
    if all(w in _VAGUE_WORDS for w in words) or words[0] in {"todo", "tbd", "fixme", "xxx"}:
        return f"reason {text!r} is vague; name the real cause"
    if len(text) < MIN_REASON_CHARS:
        return f"reason {text!r} is shorter than {MIN_REASON_CHARS} characters; name the real cause"
    return None


def link_problem(url: object) -> str | None:
    """Why ``url`` is not a usable upstream link, or None if it is."""
    if not isinstance(url, str):
        return f"upstream must be an http(s) URL string, got {url!r}"
    parsed = urlparse(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc or " " in url.strip():
        return f"upstream {url!r} is not an http(s) URL"
    if parsed.path in ("", "/"):
        return f"upstream {url!r} points at a site, not a specific issue"
    if parsed.netloc.endswith("github.com") and not _GITHUB_SPECIFIC.match(parsed.path):
        return f"upstream {url!r} does not name a GitHub issue or pull request"
    return None


def _check_entry(list_name, index, entry, known_classes, known_types) -> None:
    fail = lambda problem: _fail(list_name, index, entry, problem)  # noqa: E731
    if not entry.models:
        raise fail("names no model: set classes=... or model_types=...")
    for field, values in (("classes", entry.classes), ("model_types", entry.model_types)):
        if len(set(values)) != len(values):
            raise fail(f"{field} lists a name twice: {values}")
    for name in entry.classes:
        if name not in known_classes:
            raise fail(_unknown(name, known_classes, "model class"))
    types_by_norm = {normalize_model_type(t): t for t in known_types}
    for name in entry.model_types:
        if normalize_model_type(name) not in types_by_norm:
            raise fail(_unknown(name, known_types, "model type"))
    for field, values, known in (("backends", entry.backends, BACKENDS),
                                 ("variants", entry.variants, VARIANTS), ("tests", entry.tests, TESTS)):
        if not values:
            raise fail(f"{field} is empty; the entry would match nothing (use 'all')")
        for value in values:
            if value not in known:
                raise fail(f"unknown {field[:-1]} {value!r}; known: {', '.join(known)} or 'all'")
    problem = reason_problem(entry.reason)
    if problem:
        raise fail(problem)
    if isinstance(entry, OnnxDisableOptimize):
        if tuple(entry.backends) != ("onnx",):
            raise fail(f"ONNX_DISABLE_OPTIMIZE is ONNX-only; got backends={entry.backends}")
        problem = link_problem(entry.upstream)
        if problem:
            raise fail(problem + " (every entry must cite a specific upstream bug)")
    else:
        if entry.stage is not None and entry.stage not in STAGES:
            raise fail(f"unknown stage {entry.stage!r}; known: {', '.join(STAGES)}")
        if entry.upstream is not None:
            problem = link_problem(entry.upstream)
            if problem:
                raise fail(problem)


def _model_keys(entry, families: Mapping[str, Iterable[str]] | None) -> set[str]:
    keys = {f"class:{c}" for c in entry.classes}
    keys |= {f"type:{normalize_model_type(t)}" for t in entry.model_types}
    if families:
        by_norm = {normalize_model_type(t): classes for t, classes in families.items()}
        for t in entry.model_types:
            keys |= {f"class:{c}" for c in by_norm.get(normalize_model_type(t), ())}
    return keys


def _check_overlaps(list_name, entries, families) -> None:
    seen: list[tuple[int, object, set[str]]] = []
    for index, entry in enumerate(entries):
        keys = _model_keys(entry, families)
        for other_index, other, other_keys in seen:
            shared = keys & other_keys
            if (shared and set(entry.backends) & set(other.backends)
                    and set(entry.variants) & set(other.variants) and set(entry.tests) & set(other.tests)):
                models = ", ".join(sorted(k.split(":", 1)[1] for k in shared))
                raise _fail(list_name, index, entry,
                            f"overlaps {list_name}[{other_index}] on {models} for "
                            f"backends {sorted(set(entry.backends) & set(other.backends))}, "
                            f"variants {sorted(set(entry.variants) & set(other.variants))}; "
                            "merge them or narrow the scopes")
        seen.append((index, entry, keys))


def validate_list(list_name: str, entries: Sequence, record_type: type,
                  known_classes: Iterable[str], known_model_types: Iterable[str]) -> None:
    """Validate one list; see the module docstring for the rules."""
    known_classes = set(known_classes)
    families = known_model_types if isinstance(known_model_types, Mapping) else None
    known_types = set(known_model_types)
    for index, entry in enumerate(entries):
        if not isinstance(entry, record_type):
            raise SkipListError(f"{list_name}[{index}]: expected a {record_type.__name__}, "
                                f"got {type(entry).__name__}")
        _check_entry(list_name, index, entry, known_classes, known_types)
    _check_overlaps(list_name, entries, families)


def validate_lists(known_classes: Iterable[str], known_model_types: Iterable[str], *,
                   export_skips: Sequence[ExportSkip] | None = None,
                   onnx_disable: Sequence[OnnxDisableOptimize] | None = None) -> None:
    """Validate EXPORT_SKIPS and ONNX_DISABLE_OPTIMIZE (or the injected lists).

    ``known_model_types`` may be a mapping ``{model_type: class names}``; then an entry
    naming a class and another naming its family are detected as overlapping.
    Raises :class:`SkipListError` on the first bad entry.
    """
    from skips.export_skips import EXPORT_SKIPS
    from skips.onnx_disable_optimize import ONNX_DISABLE_OPTIMIZE

    known_classes = set(known_classes)
    if not isinstance(known_model_types, Mapping):
        known_model_types = set(known_model_types)
    validate_list("EXPORT_SKIPS", EXPORT_SKIPS if export_skips is None else export_skips,
                  ExportSkip, known_classes, known_model_types)
    validate_list("ONNX_DISABLE_OPTIMIZE",
                  ONNX_DISABLE_OPTIMIZE if onnx_disable is None else onnx_disable,
                  OnnxDisableOptimize, known_classes, known_model_types)
