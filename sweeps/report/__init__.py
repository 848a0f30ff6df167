"""The conformance report: merge sweep result logs, render Markdown / HTML / JSON, diff runs.

    python -m sweeps.report merge shard1.jsonl shard2.xml --out docs/conformance \
        --command "pytest sweeps -n auto --report-log=shard1.jsonl" [--registered names.txt]
    python -m sweeps.report diff docs/conformance/results.json new.jsonl

Also installed as the ``conformance-report`` console script.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

__all__ = ["main"]


def _read_registered(path: str) -> list[str]:
    text = Path(path).read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        return [str(name) for name in json.loads(text)]
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def _installed_workarounds() -> list[str] | None:
    """Every workaround the installed exporters register (default for --registered); None if the
    library cannot be imported here (e.g. a report-only install)."""
    try:
        from exporters.inventory import list_workarounds
    except ImportError:
        return None
    return [w["name"] for w in list_workarounds()]


def _read_peer(path: str) -> dict:
    """A ``benchmarks/peer_compare.py --json`` output: ``{"meta", "tables", "items"}``."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--peer {path}: cannot read it as JSON ({exc}); pass the file written by "
                         "benchmarks/peer_compare.py --json") from exc
    if not isinstance(data, dict) or not isinstance(data.get("tables"), dict):
        raise SystemExit(f"--peer {path}: no 'tables' object; pass the file written by "
                         "benchmarks/peer_compare.py --json")
    data.setdefault("meta", {})["path"] = path
    return data


def _merge(args: argparse.Namespace) -> int:
    from sweeps.report.load import load_any, merge
    from sweeps.report.render import Report

    results, duplicates = merge([load_any(path) for path in args.results])
    if args.test:  # one catalog per test: a log that ran several tests gives each its own
        known = sorted({r.test for r in results if r.test})
        unknown = [t for t in args.test if t not in known]
        if unknown:
            print(f"--test {unknown}: no merged item is of that test; the logs hold {known}", file=sys.stderr)
            return 2
        results = [r for r in results if r.test in args.test]
        duplicates = [d for d in duplicates if d["nodeid"] in {r.nodeid for r in results}]
    unknown = [d for d in args.drop if d not in {r.nodeid for r in results}]
    if unknown:
        print(f"--drop names no merged item: {unknown}", file=sys.stderr)
        return 2
    dropped = [{"nodeid": r.nodeid, "outcome": r.outcome, "source": r.source or "?"} for r in results
               if r.nodeid in args.drop]
    results = [r for r in results if r.nodeid not in args.drop]
    for d in dropped:
        print(f"dropped {d['nodeid']} ({d['outcome']} in {d['source']})", file=sys.stderr)
    for dup in duplicates:
        print(f"duplicate {dup['nodeid']}: {dup['by']} ({dup['now']}) replaces "
              f"{dup['replaced']} ({dup['was']})", file=sys.stderr)
    registered = _read_registered(args.registered) if args.registered else _installed_workarounds()
    date = args.date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    peer = [_read_peer(path) for path in args.peer]
    report = Report(results, duplicates=duplicates, sources=args.results, command=args.command,
                    date=date, registered=registered, top=args.top, peer=peer, dropped=dropped, tests=args.test)
    paths = report.write(args.out)
    all_row = report.summary[-1]
    print(f"{len(results)} items ({', '.join(f'{k} {v}' for k, v in all_row.counts.items() if v)})"
          f"; {len(duplicates)} duplicate(s) replaced; wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def _diff(args: argparse.Namespace) -> int:
    from sweeps.report.diff import compare, to_markdown
    from sweeps.report.load import load_any

    d = compare(load_any(args.old), load_any(args.new))
    text = to_markdown(d, args.old, args.new)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 1 if args.fail_on_regression and d.has_regressions else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="conformance-report", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command_name", required=True)
    m = sub.add_parser("merge", help="merge result logs and write conformance.md/.html and results.json")
    m.add_argument("results", nargs="+", help="pytest --report-log JSONL, --junitxml XML or results.json;"
                   " a nodeid seen in a later file replaces the earlier one")
    m.add_argument("--out", required=True, help="output folder, e.g. docs/conformance")
    m.add_argument("--command", default="", help="the command line that produced the logs, for the header")
    m.add_argument("--registered", help="file listing every registered workaround name (one a line or "
                   "a JSON list); those that fired for no class are flagged as candidates for removal "
                   "(default: the workarounds the installed exporters register)")
    m.add_argument("--top", type=int, default=20, help="failure signatures to list (default 20)")
    m.add_argument("--date", help="override the date stamp (reproducible output)")
    m.add_argument("--peer", action="append", default=[], metavar="JSON",
                   help="a benchmarks/peer_compare.py --json output to add as the peer comparison "
                   "section (repeatable; a later file's backend/variant wins)")
    m.add_argument("--drop", action="append", default=[], metavar="NODEID",
                   help="leave out this item (exact nodeid): one whose test is no longer collected, e.g. a class "
                   "since excluded from the test; listed in the report and in results.json `dropped` (repeatable)")
    m.add_argument("--test", action="append", default=[], metavar="TEST",
                   help="keep only the items of this sweep test (e.g. test_generate), where the logs ran several; "
                   "recorded in results.json `tests` (repeatable)")
    m.set_defaults(func=_merge)
    d = sub.add_parser("diff", help="compare two runs (results.json or logs) and print Markdown")
    d.add_argument("old")
    d.add_argument("new")
    d.add_argument("--out", help="write the Markdown here instead of stdout")
    d.add_argument("--fail-on-regression", action="store_true", help="exit 1 if there are new failures")
    d.set_defaults(func=_diff)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
