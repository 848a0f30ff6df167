"""Re-check that every workaround and every list entry is still needed; they should all shrink.

    python -m sweeps.recheck workarounds --results docs/conformance/results.json [--only NAME] [--limit N] [--json]
    python -m sweeps.recheck onnx-optimize [--json]
    python -m sweeps.recheck skips [--json]

``workarounds``: for each registered workaround (``exporters.inventory.list_workarounds()``) that
fired for some items of a sweep run, re-run those items with that one workaround switched off and
report the classes that pass without it: for them it is not needed; a workaround no item needs is a
candidate for removal. Patches and fixes are switched off with ``Registry.without(name)``, ONNX
translations and IR fixes by taking them out of ``_ONNX_TRANSLATION_TABLE`` / ``_IR_FIXES`` for the
duration of the re-run. Only items that passed with the workaround are re-run (``--include-failing``
re-runs the others too): a failing item cannot say whether the workaround is needed.

``onnx-optimize``: re-export every class of ``ONNX_DISABLE_OPTIMIZE`` with the optimizer on; an
entry whose classes all pass no longer reproduces its upstream bug and should go.

``skips``: the ``EXPORT_SKIPS`` entries, grouped by the model-side change their reason asks for,
each with its age (the oldest commit that touched its class name in ``skips/export_skips.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIPS_FILE = "skips/export_skips.py"


# ── one item, run with a given registry ──────────────────────────────────────


@dataclasses.dataclass(frozen=True, order=True)
class Item:
    """One sweep item: ``<backend>-<variant>-<model_class>``."""

    backend: str
    variant: str
    model_class: str
    model_type: str | None = dataclasses.field(default=None, compare=False)

    @property
    def id(self) -> str:
        return f"{self.backend}-{self.variant}-{self.model_class}"


@dataclasses.dataclass
class Rerun:
    """The outcome of re-running one item: ``passed``, or the stage it stopped at and why."""

    item: Item
    passed: bool
    stage: str  # "done" when passed
    error: str | None = None
    recorded: str | None = None  # the item's outcome in the results, with the workaround
    fired: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"item": self.item.id, "model_class": self.item.model_class, "backend": self.item.backend,
                "variant": self.item.variant, "passed": self.passed, "stage": self.stage, "error": self.error,
                "recorded": self.recorded, "workarounds_fired": self.fired}


def run_item(item: Item, registry=None, *, reference: Callable[[str], Any] | None = None,
             config_overrides: dict[str, Any] | None = None, shapes: bool = True) -> Rerun:
    """Run one item exactly as the sweep does (``sweeps.runner.run_case``), exporting with
    ``get_exporter(backend, registry=registry)``. Never raises for a failing item: returns a Rerun.

    ``reference(class_name)`` gives the tiny model and its eager outputs (``sweeps.runner.reference``
    by default; tests pass a hand-built model); ``config_overrides`` set exporter config fields
    (``{"optimize": True}``).
    """
    from sweeps.runner import Case, StageFailure, run_case
    from sweeps.signature import error_signature, root_cause

    props: dict[str, Any] = {}
    case = Case(item.backend, item.variant, _Entry(item.model_class, item.model_type))
    try:
        run_case(case, props.__setitem__, registry=registry, reference_fn=reference,
                 config_overrides=config_overrides, shapes=shapes)
    except StageFailure as failure:
        return Rerun(item, False, failure.stage, error_signature(root_cause(failure.__cause__)),
                     fired=list(props.get("workarounds_fired", [])))
    return Rerun(item, True, "done", fired=list(props.get("workarounds_fired", [])))


@dataclasses.dataclass(frozen=True)
class _Entry:
    """What ``sweeps.runner.export_config`` reads of a catalog entry."""

    class_name: str
    model_type: str | None


# ── switching one workaround off ─────────────────────────────────────────────


def workaround_kind(name: str, registry=None) -> str:
    """``registry`` (a patch or fix in the Registry), ``translation``, ``ir_fix`` or ``stage_1`` (the baked-mask
    rule, exporters/specialize.py); raises if unknown."""
    from exporters import exporter_onnx
    from exporters.specialize import BAKED_MASK_FIX
    from exporters.utils import DEFAULT_REGISTRY, WorkaroundError

    reg = registry if registry is not None else DEFAULT_REGISTRY
    if name in {w.name for w in reg.all_workarounds()}:
        return "registry"
    fn_name = name.rsplit(":", 1)[-1]
    if name.startswith("translation:onnx:") and any(
            fn.__name__ == fn_name for fn in exporter_onnx._ONNX_TRANSLATION_TABLE.values()):
        return "translation"
    if name.startswith("fix:onnx:") and any(fn.__name__ == fn_name for fn in exporter_onnx._IR_FIXES):
        return "ir_fix"
    if name == BAKED_MASK_FIX:
        return "stage_1"
    raise WorkaroundError(f"no registered workaround named {name!r} (see exporters.inventory.list_workarounds())")


@contextlib.contextmanager
def switched_off(name: str, registry=None) -> Iterator[Any]:
    """Yield the registry to export with while ``name`` is off; tables are restored on exit.

    Patches and fixes: ``registry.without(name)``. ONNX translations and IR fixes are not in the
    Registry: their entry is taken out of ``_ONNX_TRANSLATION_TABLE`` / ``_IR_FIXES`` meanwhile; the baked-mask
    rule (exporters/specialize.py) is switched off by its flag.
    """
    from exporters import exporter_onnx
    from exporters.utils import DEFAULT_REGISTRY

    reg = registry if registry is not None else DEFAULT_REGISTRY
    kind = workaround_kind(name, reg)
    if kind == "registry":
        yield reg.without(name)
        return
    if kind == "stage_1":
        from exporters.specialize import BAKED_MASK_RULE

        BAKED_MASK_RULE[0] = False
        try:
            yield reg
        finally:
            BAKED_MASK_RULE[0] = True
        return
    fn_name = name.rsplit(":", 1)[-1]
    if kind == "translation":
        table = exporter_onnx._ONNX_TRANSLATION_TABLE
        saved = dict(table)
        try:
            for key in [k for k, fn in table.items() if fn.__name__ == fn_name]:
                del table[key]
            yield reg
        finally:
            table.clear()
            table.update(saved)
        return
    saved_fixes = exporter_onnx._IR_FIXES
    try:
        exporter_onnx._IR_FIXES = tuple(fn for fn in saved_fixes if fn.__name__ != fn_name)
        yield reg
    finally:
        exporter_onnx._IR_FIXES = saved_fixes


# ── workarounds ──────────────────────────────────────────────────────────────


@dataclasses.dataclass
class WorkaroundCheck:
    name: str
    stage: str
    fired_for: list[Item]  # every item of the results it fired for
    reruns: list[Rerun]
    skipped: list[tuple[Item, str]]  # fired, not re-run: (item, why)

    @property
    def pass_without(self) -> list[str]:
        return sorted({r.item.model_class for r in self.reruns if r.passed})

    @property
    def needed_by(self) -> list[str]:
        return sorted({r.item.model_class for r in self.reruns if not r.passed})

    @property
    def removable(self) -> bool:
        """Every item re-run passes without it (and at least one was re-run)."""
        return bool(self.reruns) and all(r.passed for r in self.reruns)

    @property
    def verdict(self) -> str:
        if not self.fired_for:
            return "fired for no item in these results: nothing to re-run"
        if not self.reruns:
            return "no passing item to re-run"
        if self.removable and self.skipped:
            return (f"not needed by the {len(self.reruns)} item(s) re-run ({len(self.skipped)} not re-run): "
                    "re-run the others before removing it")
        if self.removable:
            return "not needed by any item it fired for: candidate for removal"
        if self.pass_without:
            return f"needed by {len(self.needed_by)} class(es); {len(self.pass_without)} pass without it"
        return "needed by every item re-run"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "stage": self.stage, "fired_for": [i.id for i in self.fired_for],
                "rerun": [r.to_dict() for r in self.reruns],
                "not_rerun": [{"item": i.id, "why": why} for i, why in self.skipped],
                "pass_without": self.pass_without, "needed_by": self.needed_by,
                "removable": self.removable, "verdict": self.verdict}


def fired_items(results: Iterable[Any], name: str) -> dict[Item, str]:
    """``{item: recorded outcome}`` for every result whose ``workarounds_fired`` has ``name``."""
    out: dict[Item, str] = {}
    for r in results:
        if name in (r.workarounds_fired or ()) and r.model_class and r.backend and r.variant:
            out[Item(r.backend, r.variant, r.model_class, r.model_type)] = r.outcome
    return dict(sorted(out.items()))


def recheck_workarounds(results: Sequence[Any], *, only: Sequence[str] = (), limit: int | None = None,
                        include_failing: bool = False, registry=None,
                        run: Callable[..., Rerun] | None = None,
                        progress: Callable[[str], None] | None = None) -> list[WorkaroundCheck]:
    """Re-run, for each workaround, the items it fired for with it switched off.

    ``only`` restricts to those names (unknown names raise, with close matches); ``limit`` re-runs at
    most that many items per workaround; ``run(item, registry)`` runs one item (``run_item``).
    """
    from exporters.inventory import list_workarounds
    from exporters.utils import WorkaroundError

    run = run or run_item
    inventory = {w["name"]: w for w in list_workarounds(registry)}
    if only:
        unknown = [n for n in only if n not in inventory]
        if unknown:
            import difflib

            close = {n: difflib.get_close_matches(n, list(inventory), n=3, cutoff=0.4) for n in unknown}
            raise WorkaroundError(f"no registered workaround named {unknown}; close matches: {close}")
    names = list(only) or list(inventory)
    checks = []
    for name in names:
        items = fired_items(results, name)
        check = WorkaroundCheck(name, inventory[name]["stage"], list(items), [], [])
        for item, outcome in items.items():
            if outcome != "pass" and not include_failing:
                check.skipped.append((item, f"recorded {outcome} with it"))
            elif limit is not None and len(check.reruns) >= limit:
                check.skipped.append((item, f"--limit {limit}"))
            else:
                if progress:
                    progress(f"{name}: re-running {item.id} without it")
                with switched_off(name, registry) as reg:
                    rerun = run(item, reg)
                rerun.recorded = outcome
                if name in rerun.fired:  # switched off, it cannot fire: a bug in the switch
                    raise WorkaroundError(f"{name} fired for {item.id} although it was switched off")
                check.reruns.append(rerun)
        checks.append(check)
    return checks


def workarounds_markdown(checks: Sequence[WorkaroundCheck], source: str = "") -> str:
    lines = ["# Workarounds re-checked without themselves", ""]
    if source:
        lines += [f"Results: `{source}`. Each item the workaround fired for (and that passed with it) was "
                  "re-run with that one workaround switched off.", ""]
    lines += ["| workaround | stage | fired for | re-run | pass without it | verdict |",
              "| --- | --- | --- | --- | --- | --- |"]
    for c in checks:
        passing = ", ".join(c.pass_without) or "-"
        lines.append(f"| `{c.name}` | {c.stage} | {len(c.fired_for)} | {len(c.reruns)} | {passing} | {c.verdict} |")
    for c in checks:
        if not c.reruns and not c.skipped:
            continue
        lines += ["", f"## `{c.name}`", "", "| item | with it (recorded) | without it | stage | error |",
                  "| --- | --- | --- | --- | --- |"]
        for r in c.reruns:
            error = (r.error or "").replace("|", "\\|")
            lines.append(f"| {r.item.id} | {r.recorded} | {'pass' if r.passed else 'fail'} | {r.stage} | {error} |")
        for item, why in c.skipped:
            lines.append(f"| {item.id} | | not re-run ({why}) | | |")
    removable = [c.name for c in checks if c.removable and not c.skipped]
    partial = [c.name for c in checks if c.removable and c.skipped]
    lines += ["", f"Candidates for removal: {', '.join(f'`{n}`' for n in removable) if removable else 'none'}."]
    if partial:
        lines.append(f"Not needed so far (some items not re-run): {', '.join(f'`{n}`' for n in partial)}.")
    lines.append("")
    return "\n".join(lines)


# ── ONNX_DISABLE_OPTIMIZE ────────────────────────────────────────────────────


def _entry_classes(entry) -> list[str]:
    classes = list(entry.classes)
    if entry.model_types:
        from skips import installed_names
        from skips.records import normalize_model_type

        _, families = installed_names()
        wanted = {normalize_model_type(t) for t in entry.model_types}
        for model_type, names in families.items():
            if normalize_model_type(model_type) in wanted:
                classes.extend(sorted(names))
    return list(dict.fromkeys(classes))


def recheck_onnx_optimize(entries: Sequence[Any] | None = None, *, run: Callable[..., Rerun] | None = None,
                          progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Re-export each ONNX_DISABLE_OPTIMIZE class with the optimizer on. One row per entry:
    ``still_needed`` is False when every class and variant now passes (the bug no longer reproduces)."""
    from skips import ONNX_DISABLE_OPTIMIZE

    entries = ONNX_DISABLE_OPTIMIZE if entries is None else entries
    run = run or (lambda item, reg: run_item(item, reg, config_overrides={"optimize": True}))
    rows = []
    for index, entry in enumerate(entries):
        reruns = []
        for class_name in _entry_classes(entry):
            for variant in entry.variants:
                item = Item("onnx", variant, class_name)
                if progress:
                    progress(f"ONNX_DISABLE_OPTIMIZE[{index}]: {item.id} with the optimizer on")
                reruns.append(run(item, None))
        rows.append({"index": index, "models": list(entry.models), "upstream": entry.upstream,
                     "reason": entry.reason, "rerun": [r.to_dict() for r in reruns],
                     "still_needed": not reruns or not all(r.passed for r in reruns)})
    return rows


def onnx_optimize_markdown(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return ("ONNX_DISABLE_OPTIMIZE is empty: nothing to re-check; every ONNX export already runs "
                "with the onnxscript optimizer on.\n")
    lines = ["# ONNX_DISABLE_OPTIMIZE re-checked with the optimizer on", "",
             "| entry | models | upstream | with optimize=True | verdict |", "| --- | --- | --- | --- | --- |"]
    for row in rows:
        outcome = "; ".join(f"{r['item']}: {'pass' if r['passed'] else 'fail at ' + r['stage']}" for r in row["rerun"])
        verdict = ("upstream bug still reproduces: keep" if row["still_needed"]
                   else "no longer reproduces: remove the entry")
        lines.append(f"| {row['index']} | {', '.join(row['models'])} | {row['upstream']} | {outcome} | {verdict} |")
    gone = [row for row in rows if not row["still_needed"]]
    lines += ["", f"{len(gone)} of {len(rows)} entries can be removed.", ""]
    return "\n".join(lines)


# ── EXPORT_SKIPS ─────────────────────────────────────────────────────────────


def first_commit_date(name: str, path: str = SKIPS_FILE, cwd: str = ROOT) -> str | None:
    """The date (YYYY-MM-DD) of the oldest commit that added or removed ``name`` in ``path``."""
    try:
        out = subprocess.run(["git", "log", "--format=%as", f"-S{name}", "--", path], cwd=cwd,
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    dates = out.split()
    return dates[-1] if dates else None


_CHANGE = re.compile(r"(?i)[.;,]?\s*\b(remove (?:this entry |it )?(?:when|once|after|if)\b.*|"
                     r"to remove (?:this|the) entry\b.*)$", re.S)


def split_reason(reason: str) -> tuple[str, str]:
    """``(cause, change)``: an EXPORT_SKIPS reason cut where it names the change that removes the
    entry ("... Remove when X"); without such a clause the change is unknown and the whole reason
    is the cause."""
    text = " ".join(reason.split())
    m = _CHANGE.search(text)
    if not m:
        return text, "(no removing change named in the reason)"
    return text[:m.start()].rstrip(" .;,"), m.group(1)


def skips_report(entries: Sequence[Any] | None = None, *, today: datetime.date | None = None,
                 date_of: Callable[[str], str | None] = first_commit_date) -> list[dict[str, Any]]:
    """EXPORT_SKIPS grouped by the change that removes them (``split_reason``):
    ``[{"change", "entries": [{cause, models, scope, since, age_days}]}]``, oldest groups first."""
    from skips import EXPORT_SKIPS

    entries = EXPORT_SKIPS if entries is None else entries
    today = today or datetime.date.today()
    groups: dict[str, list[dict[str, Any]]] = {}
    for index, entry in enumerate(entries):
        dates = [d for d in (date_of(m) for m in entry.models) if d]
        since = min(dates) if dates else None
        age = (today - datetime.date.fromisoformat(since)).days if since else None
        cause, change = split_reason(entry.reason)
        groups.setdefault(change, []).append({
            "index": index, "cause": cause, "models": list(entry.models), "backends": list(entry.backends),
            "variants": list(entry.variants), "stage": entry.stage, "upstream": entry.upstream,
            "since": since, "age_days": age})
    out = [{"change": change, "entries": rows} for change, rows in groups.items()]
    out.sort(key=lambda g: min((e["since"] or "9999") for e in g["entries"]))
    return out


def skips_markdown(groups: Sequence[dict[str, Any]], *, title: str = "EXPORT_SKIPS by the model-side change they ask for",
                   level: int = 1) -> str:
    """The groups as Markdown under a ``level``-deep ``title`` heading, one heading per change below it."""
    if not groups:
        return "EXPORT_SKIPS is empty: every model class is in the sweep, nothing to re-check.\n"
    lines = [f"{'#' * level} {title}", ""]
    for group in groups:
        lines += [f"{'#' * (level + 1)} {group['change']}", "",
                  "| entry | models | backends | variants | stage | since | upstream | cause |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for e in group["entries"]:
            since = f"{e['since']} ({e['age_days']} days)" if e["since"] else "not committed yet"
            cause = e["cause"].replace("|", "\\|")
            lines.append(f"| {e['index']} | {', '.join(e['models'])} | {', '.join(e['backends'])} | "
                         f"{', '.join(e['variants'])} | {e['stage'] or '-'} | {since} | {e['upstream'] or '-'} | {cause} |")
        lines.append("")
    total = sum(len(g["entries"]) for g in groups)
    lines.append(f"{total} entries in {len(groups)} group(s).")
    return "\n".join(lines) + "\n"


# ── command line ─────────────────────────────────────────────────────────────


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sweeps.recheck", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    w = sub.add_parser("workarounds", help="re-run the items each workaround fired for, without it")
    w.add_argument("--results", required=True, help="results.json, a --report-log JSONL or a JUnit XML")
    w.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="this workaround only (repeatable), e.g. patch:dynamo:torch.where")
    w.add_argument("--limit", type=int, default=None, metavar="N", help="re-run at most N items per workaround")
    w.add_argument("--include-failing", action="store_true",
                   help="also re-run items that did not pass with the workaround")
    o = sub.add_parser("onnx-optimize", help="re-export ONNX_DISABLE_OPTIMIZE classes with the optimizer on")
    s = sub.add_parser("skips", help="EXPORT_SKIPS entries with their age, grouped by reason")
    for p in (w, o, s):
        p.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    return parser


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.what == "workarounds":
        from exporters.utils import WorkaroundError
        from sweeps.report.load import load_any

        if args.limit is not None and args.limit < 1:
            print("--limit must be at least 1", file=sys.stderr)
            return 2
        try:
            results = load_any(args.results)
        except OSError as exc:
            print(f"cannot read results {args.results!r}: {exc}", file=sys.stderr)
            return 2
        try:
            checks = recheck_workarounds(results, only=args.only, limit=args.limit,
                                         include_failing=args.include_failing, progress=_progress)
        except WorkaroundError as exc:
            print(str(exc), file=sys.stderr)
            return 2
        text = (json.dumps({"results": args.results, "workarounds": [c.to_dict() for c in checks]}, indent=2)
                if args.json else workarounds_markdown(checks, args.results))
    elif args.what == "onnx-optimize":
        rows = recheck_onnx_optimize(progress=_progress)
        text = json.dumps({"onnx_disable_optimize": rows, "empty": not rows}, indent=2) if args.json \
            else onnx_optimize_markdown(rows)
    else:
        groups = skips_report()
        text = json.dumps({"export_skips": groups, "empty": not groups}, indent=2) if args.json \
            else skips_markdown(groups)
    print(text.rstrip("\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
