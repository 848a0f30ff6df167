"""Aggregate merged results into the tables the report shows.

Pure functions over :class:`~sweeps.report.load.Result` lists; no formatting here.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from collections import Counter, defaultdict
from collections.abc import Iterable

from sweeps.report.load import KNOWN_BACKENDS, KNOWN_VARIANTS, OUTCOMES, Result

VERSIONED_PACKAGES = ("torch", "transformers", "onnx", "onnxscript", "onnxruntime", "executorch")
FAILING = ("fail", "crash")


def package_versions(packages: Iterable[str] = VERSIONED_PACKAGES) -> dict[str, str]:
    versions = {}
    for name in packages:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def columns(results: Iterable[Result]) -> list[str]:
    """backend/variant columns present, in BACKENDS x (static, dynamic) order, unknowns last."""
    seen = {r.column for r in results}
    order = [f"{b}/{v}" for b in KNOWN_BACKENDS for v in KNOWN_VARIANTS]
    return [c for c in order if c in seen] + sorted(seen - set(order))


def builds(result: Result) -> bool:
    """Whether the item's tiny model was built (the denominator of the pass rate)."""
    if result.outcome == "skipped":
        return False
    return not (result.outcome in ("fail", "xfail") and result.stage == "build")


@dataclasses.dataclass
class SummaryRow:
    column: str
    counts: dict[str, int]
    total: int
    built: int

    @property
    def pass_pct(self) -> float | None:
        return None if not self.built else 100.0 * self.counts["pass"] / self.built


def summary_rows(results: list[Result]) -> list[SummaryRow]:
    """One row per backend/variant plus a final ``all`` row."""
    rows = []
    groups = [(c, [r for r in results if r.column == c]) for c in columns(results)]
    for column, items in groups + [("all", results)]:
        counts = Counter(r.outcome for r in items)
        rows.append(SummaryRow(column, {o: counts.get(o, 0) for o in OUTCOMES}, len(items),
                               sum(builds(r) for r in items)))
    return rows


@dataclasses.dataclass
class Signature:
    error: str
    count: int                     # items failing with it
    classes: list[str]             # distinct model classes, sorted
    stages: list[tuple[str, int]]  # most common first
    columns: list[str]             # backend/variant where it shows

    def examples(self, n: int = 5) -> list[str]:
        return self.classes[:n]


def failure_signatures(results: list[Result], top: int | None = None) -> list[Signature]:
    """Failure signatures (fail and crash) by how many items they block, most first."""
    groups: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        if r.outcome in FAILING:
            groups[r.error or "(no error recorded)"].append(r)
    signatures = [
        Signature(error=error, count=len(items),
                  classes=sorted({r.model_class or r.nodeid for r in items}),
                  stages=Counter(r.stage or "?" for r in items).most_common(),
                  columns=sorted({r.column for r in items}))
        for error, items in groups.items()
    ]
    signatures.sort(key=lambda s: (-s.count, -len(s.classes), s.error))
    return signatures if top is None else signatures[:top]


@dataclasses.dataclass
class WorkaroundRow:
    name: str
    classes: list[str]             # fired for these classes, in an item that passed
    columns: list[str]
    registered: bool | None        # None when no registry list was given
    failing: list[str] = dataclasses.field(default_factory=list)  # fired only in items that failed

    @property
    def status(self) -> str:
        if self.registered is False:
            return "not in the registered list"
        if self.classes:
            return "in use"
        if self.failing:
            return "unproven (fired only in items that fail later)"
        return "candidate for removal (fired for no class)"


def workaround_rows(results: list[Result], registered: Iterable[str] | None = None
                    ) -> list[WorkaroundRow]:
    """Each workaround seen (and each registered one): the classes it fired for in a passing item,
    and apart from them those it fired for only in items that failed at a later point."""
    fired: dict[str, set[str]] = defaultdict(set)
    failing: dict[str, set[str]] = defaultdict(set)
    where: dict[str, set[str]] = defaultdict(set)
    for r in results:
        for name in r.workarounds_fired:
            (fired if r.outcome in ("pass", "xpass") else failing)[name].add(r.model_class or r.nodeid)
            where[name].add(r.column)
    known = None if registered is None else set(registered)
    # a registered workaround can only be judged by a run of its backend ("dynamo" ones run under all)
    swept = {r.backend for r in results if r.backend}
    judged = {n for n in (known or ()) if n.split(":")[1:2] and (n.split(":")[1] == "dynamo" or n.split(":")[1] in swept)}
    names = set(fired) | set(failing) | judged
    rows = [WorkaroundRow(name, sorted(fired.get(name, ())), sorted(where.get(name, ())),
                          None if known is None else name in known,
                          sorted(failing.get(name, set()) - fired.get(name, set()))) for name in names]
    rows.sort(key=lambda w: (-len(w.classes), -len(w.failing), w.name))
    return rows


def matrix(results: list[Result]) -> tuple[list[str], list[tuple[str, str, dict[str, Result]]]]:
    """Columns and rows ``(model_class, family, {column: result})`` sorted by family, class."""
    cols = columns(results)
    by_class: dict[str, dict[str, Result]] = defaultdict(dict)
    family: dict[str, str] = {}
    for r in results:
        name = r.model_class or r.nodeid
        by_class[name][r.column] = r
        if r.model_type:
            family[name] = r.model_type
    rows = [(name, family.get(name, ""), cells) for name, cells in by_class.items()]
    rows.sort(key=lambda row: (row[1], row[0]))
    return cols, rows


def onnx_optimize_disabled(results: list[Result]) -> list[tuple[Result, str | None]]:
    """ONNX items run with optimize=False, with the ONNX_DISABLE_OPTIMIZE upstream link."""
    try:
        from skips import find_onnx_disable_optimize
    except ImportError:                                       # report usable on its own
        find_onnx_disable_optimize = None
    out = []
    for r in results:
        if r.onnx_optimize is False:
            entry = (find_onnx_disable_optimize(r.model_class, r.model_type, r.variant)
                     if find_onnx_disable_optimize and not r.onnx_optimize_upstream else None)
            out.append((r, r.onnx_optimize_upstream or (entry.upstream if entry else None)))
    return out


def cell_text(result: Result | None, limit: int = 70) -> str:
    """Short matrix cell: pass / xfail (reason) / fail (stage: error) / crash / skipped."""
    if result is None:
        return "–"

    def clip(text: str | None) -> str:
        text = (text or "").strip()
        return text if len(text) <= limit else text[: limit - 1] + "…"

    outcome = result.outcome
    if outcome == "pass":
        return "pass" if result.onnx_optimize is not False else "pass (optimize off)"
    if outcome in ("xfail", "xpass", "skipped"):
        label = "XPASS" if outcome == "xpass" else outcome
        return f"{label} ({clip(result.reason)})" if result.reason else label
    return f"{outcome} ({result.stage or '?'}: {clip(result.error)})"


PEER_BUCKETS = ("both pass", "ours only", "peer only", "both fail")
PEER_TITLE = "Ours vs transformers.exporters"  # the peer is named, never imported (see benchmarks/peer_compare.py)
PEER_NOTE = ("The peer run on the same tiny models and inputs, judged by our parity rule "
             "(`benchmarks/peer_compare.py`). Its dynamic exports are checked at one extra shape, "
             "ours at several Hypothesis-drawn shapes. Our side is judged from this report's merged results, "
             "so fixes merged after the peer run count.")


@dataclasses.dataclass
class PeerRow:
    """One backend/variant of a peer comparison (``benchmarks/peer_compare.py --json``)."""

    column: str
    source: str
    buckets: dict[str, list[str]]
    not_compared: list[str]
    errors: dict[tuple[str, str], str]  # (class, "ours" | "peer") -> error signature

    @property
    def compared(self) -> int:
        return sum(len(v) for v in self.buckets.values())


PEER_OURS_PASS = frozenset({"pass", "xpass"})     # the item passed
PEER_OURS_FAIL = frozenset({"fail", "xfail", "crash"})
PEER_PRE_EXPORT = ("build", "eager")  # a failure here is the tiny model's, not an exporter's verdict


def ours_verdict(result: Result) -> str:
    """Our side of a peer comparison: "pass", "fail", or "not compared" (skipped, or failed before any
    export: the peer rebuilds the model with today's zoo). benchmarks/peer_compare.py judges the same way."""
    if result.outcome in PEER_OURS_PASS:
        return "pass"
    if result.outcome in PEER_OURS_FAIL and result.stage not in PEER_PRE_EXPORT:
        return "fail"
    return "not compared"


def peer_bucket(ours_pass: bool, peer_pass: bool) -> str:
    """Which of PEER_BUCKETS an item compared on both sides falls in."""
    return PEER_BUCKETS[2 * (not ours_pass) + (not peer_pass)]


def peer_variant(result: Result) -> str:
    """The variant a peer comparison names ``result``'s item by: test_generate's are ``generate-<variant>`` (its
    static and dynamic are the main test's names too)."""
    return f"generate-{result.variant}" if result.test == "test_generate" else result.variant


def peer_rows(comparisons: Iterable[dict], results: Iterable[Result] = ()) -> list[PeerRow]:
    """Rows of the report's peer section, one per backend/variant; a later comparison wins.

    The peer's verdicts come from the comparison's per-item rows; OUR side is re-judged from the merged
    ``results`` where they hold the item, so a fix or re-run merged after the peer run moves the class
    to the right bucket (the comparison's own "ours" is a snapshot of the log it read). A file without
    per-item rows is taken as tabulated."""
    merged = {(r.model_class, r.backend, peer_variant(r)): r for r in results}
    rows: dict[str, PeerRow] = {}
    for data in comparisons:
        source = data.get("meta", {}).get("path", "")
        if not data.get("items"):
            for column, table in data["tables"].items():
                errors = {(c, "peer"): e for c, e in table.get("peer_errors", {}).items()}
                errors.update({(c, "ours"): e for c, e in table.get("ours_errors", {}).items()})
                rows[column] = PeerRow(column, source, {b: list(table.get(b, [])) for b in PEER_BUCKETS},
                                       list(table.get("not compared", [])), errors)
            continue
        tables: dict[str, PeerRow] = {}
        for item in sorted(data["items"], key=lambda i: (i["backend"], i["variant"], i["class"])):
            column, cls = f"{item['backend']}/{item['variant']}", item["class"]
            row = tables.setdefault(column, PeerRow(column, source, {b: [] for b in PEER_BUCKETS}, [], {}))
            result = merged.get((cls, item["backend"], item["variant"]))
            if result:
                ours, ours_error = ours_verdict(result), result.error or result.reason
            else:
                ours, ours_error = item.get("ours"), item.get("ours_error")
            peer = item.get("peer")
            if ours not in ("pass", "fail") or peer not in ("pass", "fail"):
                row.not_compared.append(cls)
                continue
            row.buckets[peer_bucket(ours == "pass", peer == "pass")].append(cls)
            if peer == "fail":
                row.errors[cls, "peer"] = item.get("peer_error") or "?"
            if ours == "fail":
                row.errors[cls, "ours"] = ours_error or "?"
        rows.update(tables)
    return [rows[k] for k in sorted(rows)]


# ── the runner and quantized sweeps' own sections ──


@dataclasses.dataclass
class TestRow:
    column: str                    # "test_runner onnx/genai", "test_quantized executorch/int8"
    counts: dict[str, int]
    built: int
    causes: list[Signature]        # the top failure signatures of this column's items
    # the strict xfails by cause: (count, the entry reason's first clause), largest first
    xfail_causes: list[tuple[int, str]] = dataclasses.field(default_factory=list)

    @property
    def pass_pct(self) -> float | None:
        return None if not self.built else 100.0 * self.counts["pass"] / self.built


def test_rows(results: list[Result], test: str, top: int = 5) -> list[TestRow]:
    """One row per column of ``test`` (``test_runner``, ``test_quantized``): its counts, the built
    classes' pass rate, and the top causes for the rest."""
    rows = []
    for column in columns(r for r in results if r.test == test):
        items = [r for r in results if r.column == column]
        counts = Counter(r.outcome for r in items)
        rows.append(TestRow(column, {o: counts.get(o, 0) for o in OUTCOMES}, sum(builds(r) for r in items),
                            failure_signatures(items, top), xfail_causes(items, top)))
    return rows


def xfail_causes(items: list[Result], top: int = 5) -> list[tuple[int, str]]:
    """The xfailed items grouped by their skip entry's cause: the reason up to its first ':', ';' or ' (' (an
    entry's reasons open with the cause and go on with the evidence), at most 100 characters."""
    heads = Counter()
    for r in items:
        if r.outcome == "xfail":
            reason = (r.reason or "no reason recorded").strip()
            cut = min((i for i in (reason.find(":"), reason.find(";"), reason.find(" (")) if i > 0), default=len(reason))
            heads[reason[:min(cut, 100)]] += 1
    return [(n, head) for head, n in heads.most_common(top)]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


@dataclasses.dataclass
class QuantizationRow:
    column: str
    measured: int                                  # items with an SQNR recorded
    quantiles: dict[str, float]                    # min, p10, median, p90, max of sqnr_db
    histogram: list[tuple[str, int]]               # SQNR bins, dB
    useless: list[str]                             # classes below the floor (sweeps.quantized.SQNR_FLOOR_DB)
    not_quantizable: list[str]                     # classes with no op the quantizer annotates
    worst_steps: float | None                      # largest steps_off among passing items
    # passing items farther than the fixed bound (exporters.parity.QUANT_STEPS) from their reference, allowed by
    # the reference's own spread under one-step rounding: (class, steps_off, rounding_spread_steps)
    past_fixed: list[tuple[str, float, float | None]] = dataclasses.field(default_factory=list)


SQNR_BINS = ((None, 10), (10, 20), (20, 30), (30, 40), (40, None))


def quantization_rows(results: list[Result]) -> list[QuantizationRow]:
    """Per test_quantized column, the quantization error itself: the quantized reference's SQNR against
    fp32 eager (distribution and bins), the classes below the floor, and those with nothing quantized."""
    from exporters.parity import QUANT_STEPS

    rows = []
    for column in columns(r for r in results if r.test == "test_quantized"):
        items = [r for r in results if r.column == column]
        sqnr = [(r.model_class, float(r.extra["sqnr_db"])) for r in items
                if isinstance(r.extra.get("sqnr_db"), (int, float))]
        values = [v for _, v in sqnr]
        bins = []
        for low, high in SQNR_BINS:
            label = f"< {high}" if low is None else (f">= {low}" if high is None else f"{low}-{high}")
            bins.append((label, sum(1 for v in values if (low is None or v >= low) and (high is None or v < high))))
        steps = [float(r.extra["steps_off"]) for r in items
                 if r.outcome == "pass" and isinstance(r.extra.get("steps_off"), (int, float))]
        rows.append(QuantizationRow(
            column, len(values),
            {q: round(_quantile(values, p), 1) for q, p in (("min", 0), ("p10", .1), ("median", .5), ("p90", .9), ("max", 1))}
            if values else {},
            bins,
            sorted(r.model_class for r in items if r.extra.get("useless") is True),
            sorted(r.model_class for r in items if r.extra.get("quantizable") is False),
            max(steps) if steps else None,
            sorted(((r.model_class, float(r.extra["steps_off"]), r.extra.get("rounding_spread_steps")) for r in items
                    if r.outcome == "pass" and isinstance(r.extra.get("steps_off"), (int, float))
                    and float(r.extra["steps_off"]) > QUANT_STEPS), key=lambda t: -t[1])))
    return rows
