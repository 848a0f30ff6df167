"""Parse sweep results (pytest-reportlog JSONL, JUnit XML, or our results.json) into records.

One :class:`Result` per sweep item. The sweep plugin records properties with
``record_property`` (model_class, model_type, backend, variant, stage, error,
onnx_optimize, skip_reason, workarounds_fired, repro, duration_s); pytest supplies the
outcome. Outcomes:

- ``pass``: passed; ``xfail``: failed as an EXPORT_SKIPS entry expects (strict xfail);
- ``xpass``: an xfail-marked item passed (strict XPASS is a failed report whose longrepr is
  ``[XPASS(strict)] reason``; non-strict is a passed report with ``wasxfail``): the entry
  should be removed;
- ``fail``: failed in setup, call or teardown; ``crash``: the xdist worker died
  ("worker 'gwN' crashed while running ..."), properties recorded before are lost;
- ``skipped``: skipped (e.g. a class blocked by a package we cannot install).

Items whose properties are missing (crashes, setup errors) fall back on the test id
``test_x[<backend>-<variant>-<ClassName>]``.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from sweeps.runner import RECIPES, RUNTIMES
from sweeps.signature import normalize_message

OUTCOMES: tuple[str, ...] = ("pass", "xfail", "xpass", "fail", "crash", "skipped")
KNOWN_BACKENDS = ("dynamo", "onnx", "executorch")
KNOWN_VARIANTS = ("static", "dynamic")
_CRASH = re.compile(r"worker '?[\w-]+'? crashed")
_XPASS_STRICT = "[XPASS(strict)]"
MAIN_TEST = "test_export"   # the sweep's main test; its items get plain backend/variant columns


@dataclasses.dataclass
class Result:
    """One sweep item, merged over its setup/call/teardown reports."""

    nodeid: str
    outcome: str                       # one of OUTCOMES
    model_class: str | None = None
    model_type: str | None = None      # the family
    backend: str | None = None
    variant: str | None = None
    stage: str | None = None           # last stage reached (build ... compare, shapes, done)
    error: str | None = None           # normalized failure signature (fail / crash / xpass)
    reason: str | None = None          # xfail / xpass / skip reason
    onnx_optimize: bool | None = None
    onnx_optimize_upstream: str | None = None   # the ONNX_DISABLE_OPTIMIZE entry's upstream bug
    workarounds_fired: list[str] = dataclasses.field(default_factory=list)
    repro: str | None = None
    duration_s: float | None = None
    source: str | None = None          # the log this record came from
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)   # other recorded properties

    @property
    def test(self) -> str:
        """The test function: ``test_export`` in ``path::test_export[...]``."""
        if "::" not in self.nodeid:
            return ""
        return self.nodeid.rsplit("::", 1)[-1].split("[", 1)[0]

    @property
    def column(self) -> str:
        """``backend/variant``; items of other sweep tests get the test name in front,
        so e.g. a shapes test does not overwrite the export cell of the same class."""
        column = f"{self.backend or '?'}/{self.variant or '?'}"
        return column if self.test in (MAIN_TEST, "") else f"{self.test} {column}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Result:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def normalize_error(text: str | None, limit: int = 200) -> str | None:
    """A short, stable signature: first non-empty line, addresses and gw ids blanked."""
    if not text:
        return None
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if not lines:
        return None
    line = lines[0]
    if line.startswith("E "):
        line = line[2:].strip()
    if _CRASH.search(line):
        return "worker crashed"
    # the same masking as the signatures recorded by the sweep (numbers, symbols, names, paths), so a
    # failure read from the test's text (a timeout) groups with the one recorded as a property
    return normalize_message(line, limit)


def parse_test_id(nodeid: str) -> dict[str, str]:
    """``...::test_export[onnx-dynamic-BertModel]`` (or ``test_generate[...]``) -> backend, variant,
    model_class ({} for any other test, including unit tests whose parameters quote a sweep id)."""
    test = nodeid.split("::", 1)[-1]
    if not test.startswith(("test_export[", "test_generate[", "test_runner[", "test_quantized[")):
        return {}
    match = re.search(r"\[([^\]]*)\]$", nodeid)
    if not match:
        return {}
    parts = match.group(1).split("-")
    if test.startswith("test_runner[") and len(parts) >= 3 and "-".join(parts[:2]) in RUNTIMES:
        backend, variant = RUNTIMES["-".join(parts[:2])]  # test_runner[<runtime>-<Class>]
        return {"backend": backend, "variant": variant, "model_class": "-".join(parts[2:])}
    if test.startswith("test_quantized[") and len(parts) >= 3 and parts[0] in KNOWN_BACKENDS and parts[1] in RECIPES:
        return {"backend": parts[0], "variant": parts[1], "model_class": "-".join(parts[2:])}  # <backend>-<recipe>-<Class>
    if len(parts) >= 3 and parts[0] in KNOWN_BACKENDS and parts[1] in KNOWN_VARIANTS:
        return {"backend": parts[0], "variant": parts[1], "model_class": "-".join(parts[2:])}
    return {}


def _as_bool(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    return None


def _as_list(value: Any) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            try:                       # JUnit writes str(list): "['patch:onnx:torch.where']"
                value = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def _as_float(value: Any) -> float | None:
    try:
        return None if value is None or value == "" else float(value)
    except (TypeError, ValueError):
        return None


_KNOWN_PROPERTIES = {"model_class", "model_type", "backend", "variant", "stage", "error",
                     "skip_reason", "onnx_optimize", "onnx_optimize_upstream",
                     "workarounds_fired", "repro", "duration_s"}


def _build(nodeid: str, outcome: str, props: dict[str, Any], *, error=None, reason=None,
           stage=None, duration=None, source=None) -> Result:
    ids = parse_test_id(nodeid)
    if outcome in ("fail", "crash", "xfail"):
        error = normalize_error(props.get("error")) or error
    return Result(
        nodeid=nodeid, outcome=outcome,
        model_class=props.get("model_class") or ids.get("model_class"),
        model_type=props.get("model_type"),
        backend=props.get("backend") or ids.get("backend"),
        variant=props.get("variant") or ids.get("variant"),
        stage=props.get("stage") or stage or ("done" if outcome == "pass" else None),
        error=error,
        reason=reason or props.get("skip_reason"),
        onnx_optimize=_as_bool(props.get("onnx_optimize")),
        onnx_optimize_upstream=props.get("onnx_optimize_upstream"),
        workarounds_fired=_as_list(props.get("workarounds_fired")),
        repro=props.get("repro"),
        duration_s=_as_float(props.get("duration_s")) if props.get("duration_s") is not None
        else duration,
        source=source,
        extra={k: v for k, v in props.items() if k not in _KNOWN_PROPERTIES},
    )


# ── pytest-reportlog ──


def _longrepr_text(longrepr: Any) -> str:
    if longrepr is None:
        return ""
    if isinstance(longrepr, str):
        return longrepr
    if isinstance(longrepr, (list, tuple)) and len(longrepr) == 3:      # skip: (path, line, msg)
        return str(longrepr[2])
    if isinstance(longrepr, dict):
        crash = longrepr.get("reprcrash") or {}
        if crash.get("message"):
            return crash["message"]
        return json.dumps(longrepr)[:500]
    return str(longrepr)


def _skip_message(longrepr: Any) -> str:
    text = _longrepr_text(longrepr)
    return text[len("Skipped: "):] if text.startswith("Skipped: ") else text


def _from_reports(nodeid: str, reports: list[dict], source: str) -> Result | None:
    """The item's result, or None for an item the run was stopped in (its setup passed, no call was reported:
    a sharded run stopped mid-item has no verdict for it)."""
    props: dict[str, Any] = {}
    for report in reports:
        props.update({k: v for k, v in report.get("user_properties") or []})
    duration = sum(r.get("duration") or 0.0 for r in reports) or None
    by_when = {r.get("when"): r for r in reports}
    build = lambda outcome, **kw: _build(nodeid, outcome, props, duration=duration,  # noqa: E731
                                         source=source, **kw)
    for report in reports:
        text = _longrepr_text(report.get("longrepr"))
        if report.get("outcome") == "failed" and (report.get("when") == "???" or _CRASH.search(text)):
            return build("crash", error="worker crashed")
    setup, call, teardown = by_when.get("setup"), by_when.get("call"), by_when.get("teardown")
    if call is None and setup is not None and setup.get("outcome") == "passed" and teardown is None:
        return None
    if call is not None:
        first = call
    elif setup is not None and setup.get("outcome") != "passed":
        first = setup
    else:
        first = teardown or setup or (reports[0] if reports else {})
    outcome, text = first.get("outcome"), _longrepr_text(first.get("longrepr"))
    if first.get("wasxfail") is not None:
        if outcome == "skipped":
            return build("xfail", reason=first["wasxfail"], error=normalize_error(text))
        return build("xpass", reason=first["wasxfail"], error="XPASS (non-strict)")
    if outcome == "failed":
        if text.startswith(_XPASS_STRICT):
            return build("xpass", reason=text[len(_XPASS_STRICT):].strip(), error="XPASS(strict)")
        when = first.get("when")
        return build("fail", error=normalize_error(text),
                     stage=when if when in ("setup", "teardown") else None)
    if outcome == "skipped":
        return build("skipped", reason=_skip_message(first.get("longrepr")))
    if teardown and teardown.get("outcome") == "failed":
        return build("fail", error=normalize_error(_longrepr_text(teardown.get("longrepr"))),
                     stage="teardown")
    return build("pass")


def load_reportlog(path: str | Path) -> list[Result]:
    """Parse a ``--report-log`` JSONL file; one Result per nodeid, in first-seen order."""
    grouped: dict[str, list[dict]] = {}
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not a JSON line ({exc})") from None
            if data.get("$report_type") == "TestReport":
                grouped.setdefault(data["nodeid"], []).append(data)
    results = (_from_reports(nodeid, reports, str(path)) for nodeid, reports in grouped.items())
    return [r for r in results if r is not None]


# ── JUnit XML ──


def _junit_nodeid(case: ET.Element) -> str:
    classname, name = case.get("classname", ""), case.get("name", "")
    if not classname:
        return name
    # pytest writes "dir.test_module" (plus ".Class" for class-based tests, which we cannot
    # tell apart here); the sweep has no test classes.
    return classname.replace(".", "/") + ".py::" + name


def _from_testcase(case: ET.Element, source: str) -> Result:
    nodeid = _junit_nodeid(case)
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    duration = _as_float(case.get("time"))
    build = lambda outcome, **kw: _build(nodeid, outcome, props, duration=duration,  # noqa: E731
                                         source=source, **kw)
    failure, error, skipped = case.find("failure"), case.find("error"), case.find("skipped")
    for element in (error, failure):
        if element is not None and _CRASH.search(element.get("message", "") + (element.text or "")):
            return build("crash", error="worker crashed")
    if failure is not None:
        message = failure.get("message", "") or (failure.text or "")
        if message.startswith(_XPASS_STRICT):
            return build("xpass", reason=message[len(_XPASS_STRICT):].strip(), error="XPASS(strict)")
        return build("fail", error=normalize_error(message))
    if error is not None:
        message = error.get("message", "") or (error.text or "")
        match = re.match(r'failed on (setup|teardown) with "(.*)"$', message, re.S)
        if match:
            return build("fail", error=normalize_error(match.group(2)), stage=match.group(1))
        return build("fail", error=normalize_error(message))
    if skipped is not None:
        message = skipped.get("message", "")
        if skipped.get("type") == "pytest.xfail":
            return build("xfail", reason=message)
        return build("skipped", reason=message)
    return build("pass")


def load_junit(path: str | Path) -> list[Result]:
    """Parse a ``--junitxml`` file (non-strict XPASS is indistinguishable from pass there)."""
    root = ET.parse(path).getroot()
    return [_from_testcase(case, str(path)) for case in root.iter("testcase")]


# ── results.json and dispatch ──


def load_results_json(path: str | Path) -> list[Result]:
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    return [Result.from_dict(item) for item in data["results"]]


def load_any(path: str | Path) -> list[Result]:
    """Sniff the format: XML -> JUnit, a JSON object with "results" -> results.json, else reportlog.

    Only sweep items are kept (those whose id or properties name a backend and variant): the log of
    a plain ``pytest`` run also holds the unit tests, which are not rows of the matrix."""
    with open(path, encoding="utf-8") as handle:
        head = handle.read(4096).lstrip()
    if head.startswith("<"):
        results = load_junit(path)
    elif head.startswith("{") and '"$report_type"' not in head.split("\n", 1)[0]:
        results = load_results_json(path)
    else:
        results = load_reportlog(path)
    return [r for r in results if r.backend and r.variant]


def merge(shards: list[list[Result]]) -> tuple[list[Result], list[dict[str, str]]]:
    """Merge shards; a nodeid seen again later replaces the earlier record.

    Returns the merged results sorted by nodeid and the list of replacements
    ``{"nodeid", "replaced", "by"}`` (sources), so the report can say so.
    """
    merged: dict[str, Result] = {}
    duplicates: list[dict[str, str]] = []
    for shard in shards:
        for result in shard:
            if result.nodeid in merged:
                duplicates.append({"nodeid": result.nodeid, "replaced": merged[result.nodeid].source
                                   or "?", "by": result.source or "?",
                                   "was": merged[result.nodeid].outcome, "now": result.outcome})
            merged[result.nodeid] = result
    results = sorted(merged.values(), key=lambda r: r.nodeid)
    fill_families(results)
    return results, duplicates


def fill_families(results: list[Result]) -> None:
    """Give items that lost their properties (crashes, setup errors) the family their class
    has elsewhere in the run, so family filters still find them."""
    family = {r.model_class: r.model_type for r in results if r.model_class and r.model_type}
    for r in results:
        if r.model_type is None and r.model_class in family:
            r.model_type = family[r.model_class]
