"""Write the conformance report: conformance.md, conformance.html and results.json."""

from __future__ import annotations

import json
from pathlib import Path

from sweeps.recheck import skips_markdown, skips_report
from sweeps.report import summary as S
from sweeps.report.load import OUTCOMES, Result

SCHEMA_VERSION = 1


def _md(text: object) -> str:
    """Make text safe inside a Markdown table cell."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("`", "'")


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}%"


class Report:
    """Everything the renderers need, computed once from the merged results."""

    def __init__(self, results: list[Result], *, duplicates=(), sources=(), command: str = "",
                 date: str = "", versions: dict[str, str] | None = None,
                 registered: list[str] | None = None, top: int = 20, peer: list[dict] | None = None,
                 dropped: list[dict[str, str]] | None = None, tests: list[str] | None = None):
        self.results = results
        self.tests = list(tests or [])  # merge --test: only these tests' items were kept
        self.duplicates = list(duplicates)
        self.dropped = list(dropped or [])  # items left out by name (merge --drop): no longer collected
        self.sources = [str(s) for s in sources]
        self.command = command
        self.date = date
        self.versions = versions if versions is not None else S.package_versions()
        self.summary = S.summary_rows(results)
        self.signatures = S.failure_signatures(results)
        self.top = top
        self.workarounds = S.workaround_rows(results, registered)
        self.columns, self.matrix = S.matrix(results)
        self.onnx_disabled = S.onnx_optimize_disabled(results)
        self.skips = skips_report()  # the current EXPORT_SKIPS with their age from git
        self.peer = S.peer_rows(peer or [], results)
        self.runners = S.test_rows(results, "test_runner")
        self.quantized = S.test_rows(results, "test_quantized")
        self.quantization = S.quantization_rows(results)

    # ── Markdown ──

    def markdown(self) -> str:
        out = ["# Export conformance report", ""]
        out.append(f"Generated {self.date}" + (f" by `{self.command}`" if self.command else "") + ".")
        out.append("")
        out.append(" · ".join(f"{name} {version}" for name, version in self.versions.items()))
        out.append("")
        out.append(f"{len(self.results)} items from {len(self.sources)} result file(s).")
        if self.duplicates:
            out.append(f"{len(self.duplicates)} item(s) appeared in more than one file; the later "
                       "file's result was kept (see results.json `duplicates`).")
        if self.tests:
            out.append(f"Only the items of {', '.join(f'`{t}`' for t in self.tests)} were kept from those files.")
        if self.dropped:
            out.append(f"{len(self.dropped)} item(s) left out as no longer collected: "
                       + ", ".join(f"`{d['nodeid']}` ({d['outcome']} in {d['source']})" for d in self.dropped) + ".")
        out += ["", "## Summary by backend and variant", "",
                "| backend/variant | " + " | ".join(OUTCOMES) + " | total | pass % of built |",
                "|---|" + "---:|" * (len(OUTCOMES) + 2)]
        for row in self.summary:
            name = f"**{row.column}**" if row.column == "all" else row.column
            out.append(f"| {name} | " + " | ".join(str(row.counts[o]) for o in OUTCOMES)
                       + f" | {row.total} | {_pct(row.pass_pct)} |")
        out += ["", "pass % counts passes over items whose tiny model builds (not skipped, not "
                "failing at stage `build`). `xpass`: an EXPORT_SKIPS entry whose model now passes; "
                "remove the entry.", ""]
        out += self._md_peer() + self._md_tests() + self._md_quantization() + self._md_signatures()
        out += self._md_workarounds() + self._md_skips() + self._md_onnx() + self._md_matrix()
        return "\n".join(out) + "\n"

    def _md_peer(self) -> list[str]:
        if not self.peer:
            return []
        out = [f"## {S.PEER_TITLE}", "", S.PEER_NOTE, "",
               "| backend/variant | compared | both pass | ours only | peer only | both fail | not compared | source |",
               "|---|---:|---:|---:|---:|---:|---:|---|"]
        for row in self.peer:
            out.append(f"| {row.column} | {row.compared} | " + " | ".join(str(len(row.buckets[b])) for b in S.PEER_BUCKETS)
                       + f" | {len(row.not_compared)} | {_md(row.source)} |")
        out.append("")
        for row in self.peer:
            for bucket, side, why in (("ours only", "peer", "why the peer fails"), ("peer only", "ours", "why ours fails")):
                if row.buckets[bucket]:
                    out += [f"{row.column}, **{bucket}** ({why}):", ""]
                    out += [f"- {_md(c)}: `{_md(row.errors.get((c, side), '?'))}`" for c in row.buckets[bucket]]
                    out.append("")
        return out

    def _md_tests(self) -> list[str]:
        out = []
        for title, rows in (("Runners: the runtimes' own LLM runners", self.runners),
                            ("Quantized exports against PyTorch's quantized reference", self.quantized)):
            if not rows:
                continue
            out += [f"## {title}", "", "| where | passed | built | pass % of built | top causes for the rest |",
                    "|---|---:|---:|---:|---|"]
            for row in rows:
                causes = "; ".join([f"{sig.count}x `{_md(sig.error[:140])}`" for sig in row.causes]
                                   + [f"{n}x xfail: {_md(head)}" for n, head in row.xfail_causes]) or "–"
                out.append(f"| {row.column} | {row.counts['pass']} | {row.built} | {_pct(row.pass_pct)} | {causes} |")
            out.append("")
        return out

    def _md_quantization(self) -> list[str]:
        if not self.quantization:
            return []
        from sweeps.quantized import SQNR_FLOOR_DB

        out = ["## Quantization error (SQNR of the quantized reference against fp32 eager, dB)", "",
               f"The quantized reference is PyTorch's own int8 model; its SQNR measures the recipe, not the backend. "
               f"Below {SQNR_FLOOR_DB:g} dB it is reported as useless. `worst steps`: the largest distance of a "
               "passing artifact from its reference, in quantization steps.", "",
               "| where | measured | min | p10 | median | p90 | max | " + " | ".join(b for b, _ in self.quantization[0].histogram)
               + " | worst steps | not quantizable |",
               "|---|" + "---:|" * (7 + len(self.quantization[0].histogram)) + "---|"]
        for row in self.quantization:
            quantiles = " | ".join(str(row.quantiles.get(k, "–")) for k in ("min", "p10", "median", "p90", "max"))
            worst = "–" if row.worst_steps is None else round(row.worst_steps, 2)
            out.append(f"| {row.column} | {row.measured} | {quantiles} | " + " | ".join(str(n) for _, n in row.histogram)
                       + f" | {worst} | {_md(', '.join(row.not_quantizable) or '–')} |")
        out.append("")
        for row in self.quantization:
            if row.useless:
                out.append(f"{row.column}, below {SQNR_FLOOR_DB:g} dB: {_md(', '.join(row.useless))}")
        for row in self.quantization:
            if row.past_fixed:
                wide = ", ".join(f"{c} ({off:.1f} of {'–' if sp is None else round(sp, 1)})" for c, off, sp in row.past_fixed)
                out.append(f"{row.column}, passing past the fixed 8 steps within the reference's own rounding spread "
                           f"(steps off, of spread): {_md(wide)}")
        return out + [""]

    def _md_signatures(self) -> list[str]:
        shown = self.signatures[: self.top]
        out = [f"## Top failure signatures ({len(shown)} of {len(self.signatures)})", ""]
        if not shown:
            return out + ["No failures.", ""]
        out += ["Fixing the top signature (one workaround) would unblock the most items.", "",
                "| # | items | classes | stage | where | error | example classes |",
                "|---:|---:|---:|---|---|---|---|"]
        for i, sig in enumerate(shown, 1):
            stages = ", ".join(f"{s} ({n})" for s, n in sig.stages)
            more = f" +{len(sig.classes) - 5}" if len(sig.classes) > 5 else ""
            out.append(f"| {i} | {sig.count} | {len(sig.classes)} | {_md(stages)} | "
                       f"{_md(', '.join(sig.columns))} | `{_md(sig.error)}` | "
                       f"{_md(', '.join(sig.examples()))}{more} |")
        return out + [""]

    def _md_workarounds(self) -> list[str]:
        out = ["## Workarounds", ""]
        if not self.workarounds:
            return out + ["No workaround fired.", ""]
        out += ["`classes`: classes with a passing item the workaround fired in; `failing only`: classes "
                "whose items it fired in all failed later (they cannot tell whether it is needed).", "",
                "| workaround | classes | failing only | status | where | fired for |",
                "|---|---:|---:|---|---|---|"]
        for w in self.workarounds:
            shown = w.classes or w.failing
            names = ", ".join(shown[:8]) + (f" +{len(shown) - 8}" if len(shown) > 8 else "")
            out.append(f"| `{_md(w.name)}` | {len(w.classes)} | {len(w.failing)} | {w.status} | "
                       f"{_md(', '.join(w.columns))} | {_md(names)} |")
        return out + [""]

    def _md_skips(self) -> list[str]:
        """EXPORT_SKIPS as of the report's checkout, by the change that removes them, with age."""
        return skips_markdown(self.skips, title="EXPORT_SKIPS by the change that removes them", level=2).splitlines() + [""]

    def _md_onnx(self) -> list[str]:
        if not self.onnx_disabled:
            return []
        out = ["## ONNX optimization disabled", "", "| item | outcome | upstream |", "|---|---|---|"]
        for r, link in self.onnx_disabled:
            out.append(f"| {_md(r.model_class or r.nodeid)} ({r.column}) | {r.outcome} | "
                       f"{_md(link or r.reason or '–')} |")
        return out + [""]

    def _md_matrix(self) -> list[str]:
        out = ["## Matrix", "", "| model class | family | " + " | ".join(self.columns) + " |",
               "|---|---|" + "---|" * len(self.columns)]
        for name, family, cells in self.matrix:
            out.append(f"| {_md(name)} | {_md(family)} | "
                       + " | ".join(_md(S.cell_text(cells.get(c))) for c in self.columns) + " |")
        return out + [""]

    # ── HTML ──

    def html(self) -> str:
        import jinja2

        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
            autoescape=True, trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
        template = env.get_template("conformance.html.j2")
        return template.render(report=self, outcomes=OUTCOMES, cell_text=S.cell_text,
                               families=sorted({r.model_type for r in self.results if r.model_type}),
                               backends=sorted({r.backend for r in self.results if r.backend}),
                               variants=sorted({r.variant for r in self.results if r.variant}),
                               peer_buckets=S.PEER_BUCKETS, peer_title=S.PEER_TITLE, peer_note=S.PEER_NOTE)

    # ── JSON ──

    def json_data(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "generated": self.date,
            "command": self.command,
            "versions": self.versions,
            "sources": self.sources,
            "duplicates": self.duplicates,
            "dropped": self.dropped,
            "tests": self.tests,
            "peer": [{"column": r.column, "source": r.source, **{b: r.buckets[b] for b in S.PEER_BUCKETS},
                      "not compared": r.not_compared} for r in self.peer],
            "summary": {row.column: {**row.counts, "total": row.total, "built": row.built}
                        for row in self.summary},
            "results": [r.to_dict() for r in self.results],
        }

    def write(self, out_dir: str | Path) -> dict[str, Path]:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = {"md": out_dir / "conformance.md", "html": out_dir / "conformance.html",
                 "json": out_dir / "results.json"}
        paths["md"].write_text(self.markdown(), encoding="utf-8")
        paths["html"].write_text(self.html(), encoding="utf-8")
        paths["json"].write_text(json.dumps(self.json_data(), indent=1, sort_keys=False) + "\n",
                                 encoding="utf-8")
        return paths

