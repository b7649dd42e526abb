#!/usr/bin/env python3
"""HTA (HolisticTraceAnalysis 0.5.0) reads dynaflow's export as it reads the original.

Usage: hta_export_test.py DYNAFLOW_BINARY

Two ranks from ../shared/traces/kineto/hta_a100_nccl_2ranks.json.gz: the file is
rank 0 of a two-rank NCCL run, and a copy whose distributedInfo.rank is 1 stands
for rank 1. `dynaflow export` writes both ranks; HTA's TraceAnalysis must find
ranks 0 and 1 in the export folder, with the same temporal breakdown (idle,
compute and non-compute time per rank) and the same comm/compute overlap as it
computes on the original files. Exit 77 (skipped) when HTA or the traces are
missing.
"""
import gzip
import json
import os
import subprocess
import sys
import tempfile

SKIP = 77
TRACE = "kineto/hta_a100_nccl_2ranks.json.gz"
# HTA sums microsecond doubles; the export keeps every nanosecond, so only
# floating-point summation order differs.
ABS_TOL_US = 0.01
PCT_TOL = 0.01


def traces_dir():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.environ.get("DYNAFLOW_TRACES",
                          os.path.join(here, "..", "..", "shared", "traces"))


def write_ranks(src, folder):
    """The original file as rank 0 and a copy as rank 1, in `folder`."""
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    os.makedirs(folder)
    paths = []
    for rank in (0, 1):
        doc["distributedInfo"]["rank"] = rank
        path = os.path.join(folder, f"rank{rank}.json")
        with open(path, "w") as f:
            json.dump(doc, f)
        paths.append(path)
    return paths


def analyse(folder):
    from hta.trace_analysis import TraceAnalysis

    analyzer = TraceAnalysis(trace_dir=folder)
    ranks = sorted(int(r) for r in analyzer.t.traces.keys())
    breakdown = analyzer.get_temporal_breakdown(visualize=False)
    overlap = analyzer.get_comm_comp_overlap(visualize=False)
    return ranks, breakdown, overlap


def rows(df, key="rank"):
    return {int(r[key]): r for _, r in df.iterrows()}


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    dynaflow = sys.argv[1]
    src = os.path.join(traces_dir(), TRACE)
    if not os.path.exists(src):
        print(f"SKIP: {src} is missing (../shared/traces)")
        return SKIP
    try:
        import hta  # noqa: F401
    except ImportError:
        print("SKIP: HolisticTraceAnalysis is not installed in this Python")
        return SKIP

    with tempfile.TemporaryDirectory() as tmp:
        orig = os.path.join(tmp, "orig")
        export = os.path.join(tmp, "export")
        paths = write_ranks(src, orig)
        os.makedirs(export)
        subprocess.run([dynaflow, "export", *paths, "--format", "perfetto",
                        "-o", os.path.join(export, "trace.json")], check=True)
        want_ranks, want, want_overlap = analyse(orig)
        got_ranks, got, got_overlap = analyse(export)

    failures = []
    if got_ranks != want_ranks:
        failures.append(f"ranks: export {got_ranks}, original {want_ranks}")
    want_rows, got_rows = rows(want), rows(got)
    for rank, w in sorted(want_rows.items()):
        g = got_rows.get(rank)
        if g is None:
            failures.append(f"rank {rank}: not in the export's temporal breakdown")
            continue
        for col in want.columns:
            if col == "rank":
                continue
            tol = PCT_TOL if "pctg" in col else ABS_TOL_US
            print(f"rank {rank} {col}: original {w[col]:.3f} export {g[col]:.3f}")
            if abs(float(w[col]) - float(g[col])) > tol:
                failures.append(f"rank {rank} {col}: export {g[col]}, original {w[col]}")
    want_ov, got_ov = rows(want_overlap), rows(got_overlap)
    for rank, w in sorted(want_ov.items()):
        g = got_ov.get(rank)
        col = "comp_comm_overlap_pctg"
        if g is None:
            failures.append(f"rank {rank}: not in the export's comm/compute overlap")
            continue
        print(f"rank {rank} {col}: original {w[col]:.3f} export {g[col]:.3f}")
        if abs(float(w[col]) - float(g[col])) > PCT_TOL:
            failures.append(f"rank {rank} {col}: export {g[col]}, original {w[col]}")
    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
