"""Compare two runs (results.json or raw logs) and print what changed, as Markdown.

Sections: new failures (regressions first), new passes, EXPORT_SKIPS entries whose model
now passes (xfail -> xpass/pass: remove the entry), changed failure signatures, and items
that appeared or disappeared.
"""

from __future__ import annotations

import dataclasses

from sweeps.report.load import Result

FAILING = ("fail", "crash")


@dataclasses.dataclass
class Diff:
    new_failures: list[tuple[Result | None, Result]]
    new_passes: list[tuple[Result | None, Result]]
    xfail_now_pass: list[tuple[Result | None, Result]]
    changed_signatures: list[tuple[Result, Result]]
    added: list[Result]
    removed: list[Result]

    @property
    def has_regressions(self) -> bool:
        return bool(self.new_failures)


def _sig(r: Result) -> tuple[str | None, str | None]:
    return (r.stage, r.error)


def compare(old: list[Result], new: list[Result]) -> Diff:
    before = {r.nodeid: r for r in old}
    after = {r.nodeid: r for r in new}
    d = Diff([], [], [], [], [], [])
    for nodeid, cur in sorted(after.items()):
        prev = before.get(nodeid)
        if prev is None:
            d.added.append(cur)
        was = prev.outcome if prev else None
        if cur.outcome in FAILING and was not in FAILING:
            d.new_failures.append((prev, cur))
        elif cur.outcome == "xpass" or (was == "xfail" and cur.outcome == "pass"):
            if was != "xpass":
                d.xfail_now_pass.append((prev, cur))
        elif cur.outcome == "pass" and was != "pass":
            d.new_passes.append((prev, cur))
        elif cur.outcome in FAILING and was in FAILING and _sig(prev) != _sig(cur):
            d.changed_signatures.append((prev, cur))
    d.removed = [r for nodeid, r in sorted(before.items()) if nodeid not in after]
    return d


def _name(r: Result) -> str:
    return f"{r.model_class or r.nodeid} ({r.column})"


def _detail(r: Result | None) -> str:
    if r is None:
        return "new item"
    if r.outcome in FAILING:
        return f"{r.outcome} ({r.stage or '?'}: {r.error or '?'})"
    if r.outcome in ("xfail", "xpass", "skipped") and r.reason:
        return f"{r.outcome} ({r.reason})"
    return r.outcome


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(d: Diff, old_label: str = "old", new_label: str = "new") -> str:
    out = [f"# Conformance diff: {old_label} -> {new_label}", "",
           f"{len(d.new_failures)} new failure(s), {len(d.new_passes)} new pass(es), "
           f"{len(d.xfail_now_pass)} xfail item(s) now passing, "
           f"{len(d.changed_signatures)} changed signature(s), "
           f"{len(d.added)} item(s) added, {len(d.removed)} removed.", ""]

    def table(title, pairs, hint=""):
        if not pairs:
            return
        out.extend([f"## {title} ({len(pairs)})", ""] + ([hint, ""] if hint else [])
                   + ["| item | before | after |", "|---|---|---|"])
        out.extend(f"| {_md(_name(cur))} | {_md(_detail(prev))} | {_md(_detail(cur))} |"
                   for prev, cur in pairs)
        out.append("")

    table("New failures", d.new_failures)
    table("New passes", d.new_passes)
    table("xfail entries that now pass", d.xfail_now_pass,
          "Remove these EXPORT_SKIPS entries: the model exports now.")
    table("Changed failure signatures", d.changed_signatures)
    if d.removed:
        out += [f"## Items no longer in the run ({len(d.removed)})", ""]
        out += [f"- {_md(_name(r))}: was {_md(_detail(r))}" for r in d.removed] + [""]
    return "\n".join(out) + "\n"
