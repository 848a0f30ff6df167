"""python -m sweeps.zoo [--model PAT ...] [--jobs 2] [--timeout 120] [--out results/zoo_build.json]

Builds every (selected) catalog class and runs one eager forward, each in its own forked
worker process with a timeout (a crash or hang loses that class only).  Prints totals,
blocked-by-package count, failures grouped by normalized exception signature, timing and
parameter statistics; writes per-class results as JSON (and JSON lines as it goes).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import statistics
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path


def _quiet():
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except Exception:
        pass


def _child(entry, seed, conn):
    try:
        import torch

        torch.set_num_threads(1)
        _quiet()
        import transformers

        from sweeps.zoo.build import BlockedByPackage, NoTensorForward, build_tiny

        rec = {"class_name": entry.class_name, "model_type": entry.model_type}
        t0 = time.perf_counter()
        try:
            getattr(transformers, entry.class_name)  # import the modeling module outside the timed part
        except Exception:
            pass
        rec["import_s"] = round(time.perf_counter() - t0, 4)
        t1 = time.perf_counter()
        try:
            tiny = build_tiny(entry, seed=seed)
            rec["seconds"] = round(time.perf_counter() - t1, 4)
            rec["status"] = "ok"
            rec["params"] = tiny.num_parameters
            rec["attn"] = tiny.attn_implementation
            # shapes; a non-tensor kwarg from an override's "values" (sample=False) as itself
            rec["inputs"] = {k: list(v.shape) if hasattr(v, "shape") else v for k, v in tiny.inputs.items()}
        except NoTensorForward as exc:
            rec["status"] = "untestable"
            rec["error"] = str(exc)[:500]
        except BlockedByPackage as exc:
            rec["status"] = "blocked"
            rec["error"] = str(exc)[:500]
        except BaseException as exc:  # noqa: BLE001 - report everything
            rec["seconds"] = round(time.perf_counter() - t1, 4)
            rec["status"] = "fail"
            rec["error_type"] = type(exc).__name__
            rec["error"] = str(exc)[:1000]
            tb = traceback.extract_tb(exc.__traceback__)
            rec["where"] = [f"{Path(f.filename).name}:{f.lineno}:{f.name}" for f in tb[-3:]]
        conn.send(rec)
    except BaseException as exc:  # noqa: BLE001
        conn.send({"class_name": entry.class_name, "model_type": entry.model_type, "status": "fail",
                   "error_type": type(exc).__name__, "error": str(exc)[:1000]})
    finally:
        conn.close()


_NUM = re.compile(r"\d+")
_LONG_QUOTED = re.compile(r"'[^']{41,}'|\"[^\"]{41,}\"|`[^`]{41,}`")


def signature(rec: dict) -> str:
    if rec["status"] in ("timeout", "crash"):
        return rec["status"]
    msg = (rec.get("error") or "").strip().splitlines()[0] if rec.get("error") else ""
    msg = msg.split(": ", 1)[1] if msg.startswith(rec["class_name"] + ":") else msg
    msg = _LONG_QUOTED.sub("'…'", msg)  # short quoted names (attributes, classes) stay: they name the cause
    msg = _NUM.sub("N", msg)
    return f"{rec.get('error_type', '?')}: {msg[:110]}"


def run(entries, jobs: int, timeout: float, seed: int, out: Path, progress: bool = True) -> list[dict]:
    ctx = mp.get_context("fork")
    out.parent.mkdir(parents=True, exist_ok=True)
    jsonl = out.with_suffix(".jsonl")
    results: list[dict] = []
    pending = list(entries)
    running: dict = {}
    with open(jsonl, "w") as jf:
        while pending or running:
            while pending and len(running) < jobs:
                e = pending.pop(0)
                parent, child = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_child, args=(e, seed, child), daemon=True)
                p.start()
                child.close()
                running[p] = (e, parent, time.monotonic())
            time.sleep(0.005)
            for p, (e, conn, t0) in list(running.items()):
                rec = None
                if conn.poll():
                    try:
                        rec = conn.recv()
                    except EOFError:
                        rec = None
                    p.join(5)
                    if p.is_alive():
                        p.kill()
                    if rec is None:
                        rec = {"class_name": e.class_name, "model_type": e.model_type, "status": "crash",
                               "error": f"worker died, exit code {p.exitcode}"}
                elif not p.is_alive():
                    rec = {"class_name": e.class_name, "model_type": e.model_type, "status": "crash",
                           "error": f"worker died, exit code {p.exitcode}"}
                elif time.monotonic() - t0 > timeout:
                    p.kill()
                    p.join(5)
                    rec = {"class_name": e.class_name, "model_type": e.model_type, "status": "timeout",
                           "error": f"no result after {timeout:.0f}s"}
                if rec is None:
                    continue
                conn.close()
                del running[p]
                rec["blocked_by"] = e.blocked_by
                if rec["status"] not in ("ok", "blocked", "untestable"):
                    rec["signature"] = signature(rec)
                results.append(rec)
                jf.write(json.dumps(rec) + "\n")
                jf.flush()
                if progress:
                    n = len(results)
                    ok = sum(r["status"] == "ok" for r in results)
                    print(f"[{n}/{n + len(pending) + len(running)}] {rec['status']:7s} {e.class_name}"
                          f"  (ok so far {ok})", file=sys.stderr, flush=True)
    results.sort(key=lambda r: r["class_name"])
    out.write_text(json.dumps(results, indent=1))
    return results


def _pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def summarize(results: list[dict], total_catalog: int, examples: int = 4) -> str:
    lines = []
    n = len(results)
    ok = [r for r in results if r["status"] == "ok"]
    blocked = [r for r in results if r["status"] == "blocked"]
    untestable = [r for r in results if r["status"] == "untestable"]
    failed = [r for r in results if r["status"] not in ("ok", "blocked", "untestable")]
    not_blocked = n - len(blocked) - len(untestable)
    lines.append(f"classes selected: {n} (catalog total {total_catalog})")
    lines.append(f"build + eager forward OK: {len(ok)}/{n} ({100 * len(ok) / max(n, 1):.1f}%); "
                 f"of the not-blocked (and not untestable): {len(ok)}/{not_blocked} ({100 * len(ok) / max(not_blocked, 1):.1f}%)")
    lines.append(f"blocked by a missing package: {len(blocked)}")
    lines.append(f"untestable for export (no tensor forward; listed in blocked.py): {len(untestable)}")
    if untestable:
        lines.append(f"        {', '.join(r['class_name'] for r in untestable)}")
    lines.append(f"failed: {len(failed)}")
    groups = defaultdict(list)
    for r in failed:
        groups[r.get("signature") or signature(r)].append(r["class_name"])
    for sig, names in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"  {len(names):4d}  {sig}")
        lines.append(f"        e.g. {', '.join(names[:examples])}")
    secs = [r["seconds"] for r in ok if "seconds" in r]
    imps = [r["import_s"] for r in ok if "import_s" in r]
    params = [r["params"] for r in ok if "params" in r]
    if secs:
        lines.append(f"build + forward seconds: median {statistics.median(secs):.3f}, p95 {_pct(secs, 0.95):.3f}, "
                     f"max {max(secs):.2f} (modeling-module import, not included: median {statistics.median(imps):.3f}, "
                     f"p95 {_pct(imps, 0.95):.3f})")
    if params:
        lines.append(f"parameters: median {int(statistics.median(params)):,}, max {max(params):,} "
                     f"({max(ok, key=lambda r: r.get('params', 0))['class_name']})")
    return "\n".join(lines)


def _warm_up() -> None:
    """Import torch/transformers' shared machinery and run one tiny model in the parent,
    so that each forked worker only imports its own modeling module."""
    import importlib

    import sweeps.zoo.build as build

    for mod in ("transformers.modeling_utils", "transformers.modeling_layers", "transformers.activations",
                "transformers.generation", "transformers.masking_utils", "transformers.integrations.sdpa_attention",
                "transformers.models.auto.modeling_auto", "transformers.models.bert.modeling_bert"):
        try:
            importlib.import_module(mod)
        except Exception:
            pass
    try:
        build.build_tiny("BertModel")
    except Exception:
        pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sweeps.zoo", description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", default=[], metavar="PAT",
                    help="model type, class name or glob (any case); repeatable. Default: the whole catalog")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per class before the worker is killed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/zoo_build.json", help="per-class JSON (a .jsonl is written as it goes)")
    ap.add_argument("--quiet", action="store_true", help="no per-class progress lines")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {args.jobs}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _quiet()
    from sweeps.zoo import UnknownModelError, catalog, resolve_models

    try:
        entries = resolve_models(args.model) if args.model else catalog()
    except UnknownModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _warm_up()

    t0 = time.time()
    results = run(entries, args.jobs, args.timeout, args.seed, Path(args.out), progress=not args.quiet)
    print(summarize(results, len(catalog())))
    print(f"wall time {time.time() - t0:.0f}s; results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
