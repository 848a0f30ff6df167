"""Peer comparison: our sweep results against ``transformers.exporters`` on the same tiny models.

    python benchmarks/peer_compare.py --results results/dynamo-static.jsonl \\
        [--model PATTERN ...] [--limit N] [--backend B ...] [--variant V ...] \\
        [--jobs 1] [--timeout 600] [--json OUT] [--markdown OUT] [--match-onnx-optimize] \\
        [--rows ROWS.jsonl] [--resume] [--max-items-per-child 25]

Our side is read from a sweep log (pytest-reportlog JSONL, or the report's results.json), loaded
with ``sweeps.report.load.load_any``: our exporters are not re-run. Our outcome ``pass`` and
``xpass`` (the item passed) count as a pass; ``fail``, ``xfail`` (a known failure) and ``crash``
as a failure; ``skipped`` items are not compared.

The peer side is run now in spawned child processes (``--jobs`` at a time), each running up to
``--max-items-per-child`` items so torch and transformers are imported once per child, not per item;
a crash or a hang (``--timeout`` seconds per item) loses that item only, and the child is replaced.
Rows are appended to ``--rows`` (default ``<--json>.rows.jsonl``) as they arrive; ``--resume`` reruns
only the items not in it, so a long run can be stopped and continued. For each item, in the child:

1. build:   ``sweeps.zoo.build_tiny(entry, seed=0)``: the same tiny model and inputs as our sweep
            (``sweeps.runner.reference`` builds exactly this);
2. eager:   ``sweeps.zoo.run_eager``: the model's own outputs, computed before the export, as our sweep
            does (it switches to the input layout alternative the zoo validated where the generic
            inputs are refused, so the peer gets exactly our inputs);
3. export:  the peer's public API only: ``AutoHfExporter.from_config(cfg).export(model, inputs, cfg)``
            with ``DynamoConfig`` / ``OnnxConfig`` / ``ExecutorchConfig(dynamic=...)``. "dynamic" is
            the peer's own definition, ``dynamic=True`` with no ``dynamic_shapes``: every input axis
            ``Dim.AUTO``. ONNX keeps the peer's default ``optimize=True`` (``--match-onnx-optimize``
            turns it off where our sweep did, as recorded in our results);
4. run:     the returned ``ExportedModel`` called like the model (``exported(**inputs)``), i.e. the
            peer's runner: the ExportedProgram's ``.module()`` for dynamo, an ONNX Runtime session
            (CPU, ``intra_op_num_threads=1`` like ours) for onnx, the ExecuTorch runtime for executorch;
5. compare: both sides flattened with OUR ``exporters.utils.flatten_outputs`` and compared with OUR
            ``exporters.parity.compare(expected, actual, backend)``: the same rule and tolerance as
            our sweep. The peer's runners rebuild the model's own output type (a ModelOutput), so
            names line up; if a peer ever returns a flat list/tuple of tensors instead, its tensors
            are mapped positionally onto our eager output names (``list(expected)``) when the counts
            match. Both sides are flattened after the peer export, so both use the same pytree
            registration for cache objects (the peer registers its own cache nodes first).
6. shapes (dynamic only): the peer's dynamic input dims are read from its program (the
            ExportedProgram's symbolic placeholder shapes and range constraints for dynamo and
            ExecuTorch, the ONNX graph's symbolic input dims for onnx, which carry no bounds) and
            grouped by traced size with ``sweeps.shapes.size_groups``; inputs are resized with
            ``sweeps.shapes.resize_inputs``. A few fixed candidate shapes are tried (every dynamic
            group +1, every group doubled, each group +1 alone) until one is compared: eager
            rejecting a shape skips it, the artifact raising on a shape eager takes counts as a
            refusal, a mismatch fails, and a peer that refuses every shape eager takes fails (our
            rule). ASYMMETRY: our sweep compares at several Hypothesis-drawn shapes (any mismatch
            fails; only our InputError counts as a refusal), the peer at ONE shape, and any peer
            error at a new shape is a refusal, not a failure: this favours the peer.

Buckets per backend/variant: both pass, ours only (we pass, the peer fails), peer only (the peer
passes, we fail), both fail. An item that fails before the export on either side (build, eager:
the tiny model, not an exporter; or our results predate a zoo fix) is listed as not compared.
Failures show an error signature (``sweeps.signature.error_signature``
for the peer; our record's normalized error for ours).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# _flatten_actual, _ShapeView, peer_dynamic_dims and shape_candidates: tests/test_peer_compare.py reads them here
from peer_generate import GENERATE_VARIANTS, JUDGED_NOTE  # noqa: E402
from peer_side import PEER_CONFIGS, _flatten_actual, _ShapeView, peer_dynamic_dims, peer_item, shape_candidates  # noqa: E402, F401

from sweeps.report.summary import PEER_BUCKETS as BUCKETS  # noqa: E402
from sweeps.report.summary import PEER_OURS_FAIL as OURS_FAIL  # noqa: E402
from sweeps.report.summary import PEER_OURS_PASS as OURS_PASS  # noqa: E402
from sweeps.report.summary import ours_verdict  # noqa: E402
from sweeps.report.summary import peer_bucket as bucket_of  # noqa: E402

ASYMMETRY_NOTE = (
    "dynamic: the peer is compared at its traced shape and at ONE other shape (the first of a few fixed "
    "candidates that eager accepts and the peer runs); ours at several Hypothesis-drawn shapes, and a peer "
    "error at a new shape counts as a refusal, not a failure. This asymmetry favours the peer."
)


# ── our side ──────────────────────────────────────────────────────────────────

def ours_status(outcome: str) -> str | None:
    """``"pass"``, ``"fail"``, or None for an item that is not compared (skipped)."""
    if outcome in OURS_PASS:
        return "pass"
    if outcome in OURS_FAIL:
        return "fail"
    return None


def ours_row(record) -> dict[str, Any]:
    """Our side of a row, judged by ``sweeps.report.summary.ours_verdict`` (the report's rule): a failure
    before the export (build, eager) is not an exporter's verdict, and the peer's child rebuilds the
    model with today's zoo, so such items are not compared."""
    return {"ours": ours_verdict(record), "ours_outcome": record.outcome, "ours_stage": record.stage,
            "ours_error": _clean(record.error or record.reason)}


QUANTIZED_TEST = "test_quantized"
GENERATE_TEST = "test_generate"


def load_ours(path: str) -> dict[tuple[str, str, str], Any]:
    """``{(class, backend, variant): Result}`` of the sweep's main test, of test_quantized (variant "int8") and
    of test_generate (variants "generate-static", "generate-dynamic": ``peer_variant``); a later record wins."""
    from sweeps.report.load import MAIN_TEST, load_any
    from sweeps.report.summary import peer_variant

    ours = {}
    for r in load_any(path):
        if r.test not in (MAIN_TEST, "", QUANTIZED_TEST, GENERATE_TEST) or not (r.model_class and r.backend and r.variant):
            continue
        ours[(r.model_class, r.backend, peer_variant(r))] = r
    return ours


def select_items(ours: Mapping[tuple[str, str, str], Any], *, models: list[str] | None = None,
                 limit: int | None = None, backends: list[str] | None = None,
                 variants: list[str] | None = None) -> tuple[list[tuple[str, str, str]], list[str]]:
    """The (class, backend, variant) items to compare, and notes on classes left out.

    Classes come from ``--model`` patterns (``sweeps.zoo.resolve_models``) or, without any, from our
    results; ``limit`` keeps the first N classes in name order. Combos are the backend/variant
    pairs present in our results (filtered by ``backends``/``variants``)."""
    combos = sorted({(b, v) for (_, b, v) in ours
                     if (not backends or b in backends) and (not variants or v in variants)})
    notes: list[str] = []
    if models:
        from sweeps.zoo import resolve_models

        classes = sorted({e.class_name for e in resolve_models(models)})
    else:
        classes = sorted({c for (c, b, v) in ours if (b, v) in combos})
    if limit is not None:
        classes = classes[:limit]
    items = []
    for backend, variant in combos:
        for cls in classes:
            record = ours.get((cls, backend, variant))
            if record is None:
                notes.append(f"{backend}/{variant} {cls}: no result on our side, not compared")
            elif ours_row(record)["ours"] not in ("pass", "fail"):
                where = f" at {record.stage}" if record.outcome != "skipped" else ""
                notes.append(f"{backend}/{variant} {cls}: ours {record.outcome}{where}, not compared")
            else:
                items.append((cls, backend, variant))
    return items, notes


# ── bucketing ─────────────────────────────────────────────────────────────────

def tabulate(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Rows ``{class, backend, variant, ours, peer, ours_error, peer_error, ...}`` (ours/peer: "pass",
    "fail", or anything else for not compared) -> ``{"backend/variant": {bucket: [classes], ...}}``
    with ``"not compared"`` and per-class error signatures."""
    tables: dict[str, dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: (r["backend"], r["variant"], r["class"])):
        key = f"{row['backend']}/{row['variant']}"
        table = tables.setdefault(key, {**{b: [] for b in BUCKETS}, "not compared": [],
                                        "peer_errors": {}, "ours_errors": {}})
        if row["ours"] not in ("pass", "fail") or row["peer"] not in ("pass", "fail"):
            table["not compared"].append(row["class"])
            continue
        bucket = bucket_of(row["ours"] == "pass", row["peer"] == "pass")
        table[bucket].append(row["class"])
        if row["peer"] == "fail":
            table["peer_errors"][row["class"]] = row.get("peer_error") or "?"
        if row["ours"] == "fail":
            table["ours_errors"][row["class"]] = row.get("ours_error") or "?"
    return tables


def render_text(tables: Mapping[str, Mapping[str, Any]], rows: list[Mapping[str, Any]] | None = None) -> str:
    by_key = {(r["class"], f"{r['backend']}/{r['variant']}"): r for r in rows or []}
    out = []
    for key, table in tables.items():
        n = sum(len(table[b]) for b in BUCKETS)
        out.append(f"== {key}: {n} classes compared ==")
        out.append(f"  {'bucket':<10} {'count':>5}  classes")
        for b in BUCKETS:
            out.append(f"  {b:<10} {len(table[b]):>5}  {', '.join(table[b]) or '-'}")
        if table["not compared"]:
            out.append(f"  not compared ({len(table['not compared'])}): "
                       + ", ".join(f"{c} [{_why_not(by_key.get((c, key)))}]" for c in table["not compared"]))
        for title, bucket, side in (("ours only: the peer's error", "ours only", "peer_errors"),
                                    ("both fail: the peer's error", "both fail", "peer_errors"),
                                    ("peer only: our error", "peer only", "ours_errors")):
            if table[bucket]:
                out.append(f"  {title}:")
                for c in table[bucket]:
                    stage = (by_key.get((c, key)) or {}).get("peer_stage" if side == "peer_errors" else "ours_stage")
                    out.append(f"    {c}: {'[' + stage + '] ' if stage else ''}{table[side].get(c, '?')}")
        if key.endswith("/dynamic"):
            out.append(f"  note: {ASYMMETRY_NOTE}")
        if "/generate-" in key:
            out.append(f"  note: {JUDGED_NOTE}")
        out.append("")
    return "\n".join(out)


def _why_not(row: Mapping[str, Any] | None) -> str:
    if not row:
        return "?"
    if row["peer"] not in ("pass", "fail"):
        return f"peer {row['peer']}: {row.get('peer_error') or ''}".strip()
    return f"ours {row.get('ours_outcome') or row['ours']} at {row.get('ours_stage') or '?'}: {row.get('ours_error') or ''}"


def render_markdown(tables: Mapping[str, Mapping[str, Any]], meta: Mapping[str, Any]) -> str:
    out = ["# Ours vs transformers.exporters (peer)", "",
           f"Our results: `{meta.get('results')}`; peer: transformers {meta.get('transformers')}; "
           "parity: our `exporters.parity.compare` for both.", ""]
    for key, table in tables.items():
        out += [f"## {key}", "", "| bucket | count | classes |", "|---|---:|---|"]
        for b in BUCKETS:
            out.append(f"| {b} | {len(table[b])} | {', '.join(table[b]) or '-'} |")
        if table["not compared"]:
            out.append(f"| not compared | {len(table['not compared'])} | {', '.join(table['not compared'])} |")
        out.append("")
        failing = [(c, "peer", table["peer_errors"][c]) for c in table["ours only"] + table["both fail"]]
        failing += [(c, "ours", table["ours_errors"][c]) for c in table["peer only"]]
        if failing:
            out += ["| class | failing side | error signature |", "|---|---|---|"]
            out += [f"| {c} | {side} | `{str(err).replace('|', '/')}` |" for c, side, err in failing]
            out.append("")
        if key.endswith("/dynamic"):
            out += [f"> {ASYMMETRY_NOTE}", ""]
        if "/generate-" in key:
            out += [f"> {JUDGED_NOTE}", ""]
    return "\n".join(out)


# ── the peer's children (each runs peer_side.peer_item) ───────────────────────

def _child(conn, log_path, fn=None):
    """A worker: peer items in, rows out (``fn(*item)``, default ``peer_item``), until it gets None.
    Its output goes to ``log_path``."""
    fn = fn or peer_item
    if log_path:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    else:
        fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        while (args := conn.recv()) is not None:
            print(f"=== {args[1]}/{args[2]} {args[0]}", flush=True)
            conn.send(fn(*args))
    except EOFError:
        pass
    finally:
        conn.close()


class _Worker:
    """A spawned child that runs peer items one after another (torch and transformers are imported
    once per child, not once per item); it is replaced after ``max_items`` items, a crash or a timeout."""

    def __init__(self, ctx, log_dir: str | None, index: int, fn=None):
        self.conn, child = ctx.Pipe(duplex=True)
        log = os.path.join(log_dir, f"worker-{index}.log") if log_dir else None
        self.proc = ctx.Process(target=_child, args=(child, log, fn), daemon=True)
        self.proc.start()
        child.close()
        self.done = 0
        self.item = None
        self.started = 0.0

    def give(self, item) -> None:
        self.item, self.started = item, time.monotonic()
        self.conn.send(item)

    def stop(self, kill: bool = False) -> None:
        if not kill:
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                kill = True
            self.proc.join(30)
        if kill or self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


def run_items(items: list[tuple], *, jobs: int = 1, timeout: float = 600, log_dir: str | None = None,
              progress=None, max_items: int = 25, fn=None) -> list[dict[str, Any]]:
    """``peer_item(*item)`` for each item in spawned children, ``jobs`` at a time, each child running up
    to ``max_items`` items; an item whose child dies or runs past ``timeout`` seconds gives a "crash" /
    "timeout" row, and only that item is lost: the child is replaced and the rest go on."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    pending = list(items)
    workers: list[_Worker] = []
    rows = []
    spawned = 0
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)

    def finish(row):
        rows.append(row)
        if progress:
            progress(len(rows), len(items), row)

    try:
        while pending or any(w.item for w in workers):
            for w in list(workers):  # retire idle children that reached their quota
                if w.item is None and w.done >= max_items:
                    w.stop()
                    workers.remove(w)
            while pending and len(workers) < max(jobs, 1):
                spawned += 1
                workers.append(_Worker(ctx, log_dir, spawned, fn))
            for w in workers:
                if w.item is None and pending:
                    w.give(pending.pop(0))
            time.sleep(0.2)
            for w in list(workers):
                if w.item is None:
                    continue
                row = None
                if w.conn.poll():
                    try:
                        row = w.conn.recv()
                    except EOFError:
                        row = None
                    if row is None:
                        row = _dead_row(w.item, "crash", f"child exited with code {w.proc.exitcode}", w.started)
                        w.stop(kill=True)
                        workers.remove(w)
                    else:
                        w.item, w.done = None, w.done + 1
                elif not w.proc.is_alive():
                    row = _dead_row(w.item, "crash", f"child exited with code {w.proc.exitcode}", w.started)
                    w.stop(kill=True)
                    workers.remove(w)
                elif time.monotonic() - w.started > timeout:
                    row = _dead_row(w.item, "timeout", f"timed out after {timeout:g}s", w.started)
                    w.stop(kill=True)
                    workers.remove(w)
                else:
                    continue
                finish(row)
    finally:
        for w in workers:
            w.stop(kill=w.item is not None)
    return rows


_ANSI = re.compile(r"(\x1b)?\[[0-9;]*m")


def _clean(text: str | None) -> str | None:
    """A recorded error without terminal colours (torch.onnx prints them; a log may keep their remains)."""
    return _ANSI.sub("", text) if text else text


def _dead_row(item, stage, message, started) -> dict[str, Any]:
    cls, backend, variant = item[:3]
    return {"class": cls, "backend": backend, "variant": variant, "peer": "fail", "peer_stage": stage,
            "peer_error": f"{stage}: {message}", "peer_duration_s": round(time.monotonic() - started, 3)}


def read_rows(path: str, items: list[tuple]) -> list[dict[str, Any]]:
    """Peer rows already written to ``path`` (JSONL) for the selected items; a later row of the same
    item wins, a torn last line (the run was killed mid-write) is dropped."""
    wanted = set(items)
    rows: dict[tuple, dict] = {}
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            key = (row.get("class"), row.get("backend"), row.get("variant"))
            if key in wanted:
                rows[key] = {k: v for k, v in row.items() if not k.startswith("ours")}
    return list(rows.values())


# ── main ──────────────────────────────────────────────────────────────────────

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--results", required=True, help="our sweep log: reportlog JSONL or results.json")
    parser.add_argument("--model", action="append", default=[], help="class/family pattern (repeatable)")
    parser.add_argument("--limit", type=int, help="keep the first N classes (name order)")
    parser.add_argument("--backend", action="append", choices=sorted(PEER_CONFIGS), help="repeatable")
    parser.add_argument("--variant", action="append", choices=("static", "dynamic", "int8", *GENERATE_VARIANTS),
                        help="repeatable; int8: test_quantized's items, the peer with its PT2EQuantizer; "
                             "generate-static / generate-dynamic: test_generate's items, the peer's "
                             "export_for_generation (benchmarks/peer_generate.py)")
    parser.add_argument("--jobs", type=int, default=1, help="peer children at a time (default 1)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per peer item (default 600)")
    parser.add_argument("--match-onnx-optimize", action="store_true",
                        help="run the peer's ONNX export with optimize=False where our sweep did")
    parser.add_argument("--log-dir", help="keep each peer child's stdout/stderr here")
    parser.add_argument("--json", dest="json_out", help="write tables and per-item rows as JSON")
    parser.add_argument("--markdown", help="write the tables as Markdown")
    parser.add_argument("--rows", help="append each peer row to this JSONL as it arrives (default: JSON + "
                                       "'.rows.jsonl' when --json is given)")
    parser.add_argument("--resume", action="store_true",
                        help="take the rows already in the --rows file and run only the other items")
    parser.add_argument("--max-items-per-child", type=int, default=25,
                        help="peer items one child runs before it is replaced (default 25)")
    args = parser.parse_args(argv)
    rows_path = args.rows or (args.json_out + ".rows.jsonl" if args.json_out else None)
    if args.resume and not rows_path:
        parser.error("--resume needs --rows or --json (the rows file to resume from)")

    ours = load_ours(args.results)
    items, notes = select_items(ours, models=args.model or None, limit=args.limit,
                                backends=args.backend, variants=args.variant)
    if not items:
        print("nothing to compare" + ("".join(f"\n  {n}" for n in notes)), file=sys.stderr)
        return 1
    done_rows = read_rows(rows_path, items) if args.resume else []
    done = {(r["class"], r["backend"], r["variant"]) for r in done_rows}
    todo = [i for i in items if i not in done]
    if rows_path and not args.resume:
        open(rows_path, "w").close()
    print(f"comparing {len(items)} items against transformers.exporters ({args.jobs} at a time)"
          + (f"; {len(done_rows)} taken from {rows_path}" if done_rows else ""), file=sys.stderr)

    def progress(done, total, row):
        if rows_path:
            with open(rows_path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(row, default=str) + "\n")
        extra = f" {row.get('peer_error')}" if row["peer"] != "pass" else ""
        print(f"[{done}/{total}] {row['backend']}/{row['variant']} {row['class']}: peer {row['peer']} "
              f"({row.get('peer_duration_s', 0):.0f}s){extra}", file=sys.stderr, flush=True)

    peer_args = []
    for cls, backend, variant in todo:
        optimize = None
        if args.match_onnx_optimize and backend == "onnx":
            optimize = ours[(cls, backend, variant)].onnx_optimize
        peer_args.append((cls, backend, variant, optimize))
    rows = done_rows + run_items(peer_args, jobs=args.jobs, timeout=args.timeout, log_dir=args.log_dir,
                                 progress=progress, max_items=args.max_items_per_child)
    for row in rows:
        record = ours[(row["class"], row["backend"], row["variant"])]
        row.update(ours_row(record))
    rows.sort(key=lambda r: (r["backend"], r["variant"], r["class"]))
    tables = tabulate(rows)

    import transformers

    meta = {"results": args.results, "transformers": transformers.__version__, "items": len(rows),
            "peer_dynamic": "dynamic=True, no dynamic_shapes (Dim.AUTO on every input axis)",
            "peer_onnx_optimize": "as ours" if args.match_onnx_optimize else "peer default (True)",
            "dynamic_note": ASYMMETRY_NOTE, "notes": notes}
    if any(v in GENERATE_VARIANTS for _, _, v in items):
        meta["generate_note"] = JUDGED_NOTE
    print(render_text(tables, rows))
    for note in notes:
        print(f"note: {note}")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as handle:
            json.dump({"meta": meta, "tables": tables, "items": rows}, handle, indent=2, default=str)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as handle:
            handle.write(render_markdown(tables, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
