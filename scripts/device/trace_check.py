"""The measurements of scripts/device/trace_check.sh, which builds dynaflow on the
GPU machine and then runs:

    python3 scripts/device/trace_check.py --dynaflow build-device/cli/dynaflow --out $OUT

(a) accuracy: the kernels `dynaflow trace` records for an examples/llama_decode.py
    workload against torch.profiler's on the same workload, in separate processes
    (both use CUPTI): kernel count and total kernel time within --tolerance (2%);
(b) overhead: the workload's time untraced, traced with operators, traced with
    --ops off and under torch.profiler: medians of --reps interleaved runs, both
    of the measured region (steady state) and of the whole process (start-up,
    writing and merging the trace);
(c) small traces of llama_decode and train_step, for tests/data;
(d) integrity of the traced run of (a), each a failure (issue "The tracer on first
    contact with real programs", item 7): CUPTI enabled in the metadata; no record
    dropped or unreadable; no kernel with start <= 0, end < start, an empty name or
    a zero grid; the device an H200 with 132 SMs; >= 95% of the region's kernels
    linked to an operator, none starting before its launch call; and the
    overhead of (b): <= 3% with operators on, <= 1% with them off, both below
    torch.profiler's. On --device cpu only what the CPU run has is checked;
(e) CUDA graphs, NVTX and exit (item 7's remaining failures), on a small MLP
    traced once: its eager step, a CUDA graph of it replayed --replays times
    and a last eager step the program exits after without synchronising, each
    under an NVTX range (kept as --out/graph_replay_h200.db, for tests/data).
    Fails when a range is missing; when the replays do
    not give --replays launches of as many graph kernels each as the eager
    step has kernels, all linked to operators recorded during the capture
    (operators.in_graph_capture) and none to others; when operators outside
    the capture are marked; or when the last step's kernels are missing. On
    --device cpu the workload runs (no graph, no kernels, and no NVTX: CUPTI
    never starts) and only "no operator outside the capture marked" applies.

The workload (one child process): build the model, decode once to warm up
(kernel selection, allocator, lazy initialisation), synchronise, then decode
--iters times between two host timestamps taken 50 ms clear of any GPU work.
The tracer's timestamps are CLOCK_REALTIME nanoseconds, so its kernels in the
region are those that start between the two. With --device cpu (a dry run on a
machine without a GPU) there are no kernels to compare and (a) is skipped.

Prints a summary table last; writes summary.json and summary.txt to --out, and
the trace.db of any traced child that failed as failed-NAME.db.
Exit code 0 when every check passes, 1 otherwise.
"""

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")
GUARD_S = 0.05  # idle time around the measured region

# Sizes: a launch-bound decode on the GPU (where a tracer's per-launch cost
# shows most), seconds on a CPU for the dry run.
GPU_MODEL = ["--layers", "4", "--hidden", "2048", "--heads", "16", "--kv-heads", "4",
             "--vocab", "32000", "--batch", "8", "--prompt-len", "512", "--decode-steps", "32"]
CPU_MODEL = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
             "--vocab", "128",  # the first ten: the model; then the workload
             "--batch", "1", "--prompt-len", "8", "--decode-steps", "4"]
# (c): a few thousand kernels each, a few MB of trace.db.
SMALL_TRACES = {
    "cuda": {
        "llama_decode": ["llama_decode.py", "--layers", "2", "--hidden", "1024", "--heads", "8",
                         "--kv-heads", "2", "--vocab", "8192", "--batch", "4",
                         "--prompt-len", "128", "--decode-steps", "8"],
        "train_step": ["train_step.py", "--layers", "2", "--hidden", "1024", "--heads", "8",
                       "--kv-heads", "2", "--vocab", "8192", "--batch", "4", "--seq-len", "128",
                       "--steps", "2"],
    },
    "cpu": {
        "llama_decode": ["llama_decode.py", *CPU_MODEL[:10], "--batch", "1",
                         "--prompt-len", "8", "--decode-steps", "2"],
        "train_step": ["train_step.py", *CPU_MODEL[:10], "--batch", "1", "--seq-len", "8",
                       "--steps", "1"],
    },
}
OUT_FILE_LIMIT = 16 << 20  # what the device tool brings back per file


def workload(argv):
    """Child process: the measured decode; writes its marks as JSON."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--marks", required=True)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--profiler-json", help="run the region under torch.profiler")
    sys.path.insert(0, EXAMPLES)
    import torch
    import llama_decode as L

    L.add_model_args(parser)
    parser.add_argument("--prompt-len", type=int, required=True)
    parser.add_argument("--decode-steps", type=int, required=True)
    args = parser.parse_args(argv)
    L.check_model_args(parser, args)

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    model = L.build_model(args, args.prompt_len + args.decode_steps)
    prompt = L.random_prompt(args, args.prompt_len)
    L.generate(model, args, prompt, args.decode_steps)
    sync()
    profiler = None
    if args.profiler_json:
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU]
        if args.device == "cuda":
            activities.append(ProfilerActivity.CUDA)
        profiler = profile(activities=activities, record_shapes=True)
    time.sleep(GUARD_S)
    t0_ns = time.time_ns()
    start = time.perf_counter()
    if profiler:
        profiler.start()
    for _ in range(args.iters):
        L.generate(model, args, prompt, args.decode_steps)
    sync()
    if profiler:
        profiler.stop()
    region_s = time.perf_counter() - start
    t1_ns = time.time_ns()
    time.sleep(GUARD_S)
    if profiler:
        profiler.export_chrome_trace(args.profiler_json)
    with open(args.marks, "w") as f:
        json.dump({"region_s": region_s, "t0_ns": t0_ns, "t1_ns": t1_ns}, f)


GRAPH_RANGES = ("dynaflow-check/eager", "dynaflow-check/replay", "dynaflow-check/last")


def graph_workload(argv):
    """Child process of (e): an MLP's eager step, its CUDA graph replayed,
    and a last eager step left unsynchronised at exit, each under an NVTX
    range (GRAPH_RANGES)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--replays", type=int, default=5)
    args = parser.parse_args(argv)
    import torch

    nvtx = torch.cuda.nvtx
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                              torch.nn.Linear(1024, 256)).to(args.device)
    x = torch.randn(64, 256, device=args.device)
    cuda = args.device == "cuda"
    with torch.no_grad():
        nvtx.range_push(GRAPH_RANGES[0])
        net(x)
        nvtx.range_pop()
        if cuda:
            torch.cuda.synchronize()
            side = torch.cuda.Stream()  # warm-up off the default stream, as torch's docs do
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    net(x)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                net(x)
        for _ in range(args.replays):
            nvtx.range_push(GRAPH_RANGES[1])
            if cuda:
                graph.replay()
            nvtx.range_pop()
        if cuda:
            torch.cuda.synchronize()
        nvtx.range_push(GRAPH_RANGES[2])
        net(x)  # not synchronised: the tracer's exit flush must keep these kernels
        nvtx.range_pop()


class Checker:
    def __init__(self, args):
        self.args = args
        self.python = sys.executable
        self.model = (CPU_MODEL if args.device == "cpu" else GPU_MODEL) + ["--device", args.device]
        # Per-run traces and profiles stay out of --out: only a few files come back.
        self.work = tempfile.mkdtemp(prefix="trace-check-")
        self.log = open(os.path.join(args.out, "trace_check.log"), "a")
        self.results = {"device": args.device, "model": self.model, "iters": args.iters}
        self.failures = []

    def say(self, text):
        print(text, flush=True)
        self.log.write(text + "\n")
        self.log.flush()

    def run(self, command, name):
        """Runs a child, logs its output; returns its wall time in seconds."""
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        wall = time.perf_counter() - start
        self.log.write(f"$ {' '.join(command)}\n{done.stdout}{done.stderr}"
                       f"[{name}: exit {done.returncode}, {wall:.2f} s]\n")
        self.log.flush()
        if done.returncode != 0:
            self.keep_store_of(command, name)
            raise RuntimeError(f"{name} failed (exit {done.returncode}): {done.stderr[-2000:]}")
        return wall

    def keep_store_of(self, command, name):
        """A traced child that failed: its trace.db into --out (failed-NAME.db),
        for reading afterwards (what it recorded, its metadata)."""
        if "-o" not in command:
            return
        db = command[command.index("-o") + 1]
        if os.path.exists(db):
            shutil.copy(db, os.path.join(self.args.out, "failed-%s.db" % name.replace(" ", "_")))

    def workload_command(self, marks, profiler_json=None):
        command = [self.python, os.path.abspath(__file__), "workload", "--marks", marks,
                   "--iters", str(self.args.iters), *self.model]
        return command + (["--profiler-json", profiler_json] if profiler_json else [])

    def traced(self, command, db, ops="on"):
        return [self.args.dynaflow, "trace", "--ops", ops, "-o", db, "--", *command]

    def run_mode(self, mode, tag):
        """One workload run in `mode`; (process wall s, marks, trace or profile path)."""
        marks = os.path.join(self.work, f"{mode}-{tag}.marks.json")
        artifact = None
        if mode == "plain":
            command = self.workload_command(marks)
        elif mode == "profiler":
            artifact = os.path.join(self.work, f"{mode}-{tag}.json")
            command = self.workload_command(marks, artifact)
        else:
            artifact = os.path.join(self.work, f"{mode}-{tag}.db")
            command = self.traced(self.workload_command(marks), artifact,
                                  "on" if mode == "ops_on" else "off")
        wall = self.run(command, f"{mode} {tag}")
        with open(marks) as f:
            return wall, json.load(f), artifact

    # (a)
    def accuracy(self):
        _, marks, db = self.run_mode("ops_on", "accuracy")
        _, _, profile_json = self.run_mode("profiler", "accuracy")
        with sqlite3.connect(db) as c:
            ours_n, ours_ns = c.execute(
                "SELECT count(*), coalesce(sum(end_ns - start_ns), 0) FROM kernels "
                "WHERE start_ns >= ? AND start_ns < ?", (marks["t0_ns"], marks["t1_ns"])).fetchone()
            ops = c.execute("SELECT count(*) FROM operators WHERE start_ns >= ? AND start_ns < ?",
                            (marks["t0_ns"], marks["t1_ns"])).fetchone()[0]
            linked = c.execute(
                "SELECT count(*) FROM kernels k WHERE k.start_ns >= ? AND k.start_ns < ? AND "
                "EXISTS (SELECT 1 FROM operators o WHERE o.external_id = k.external_id)",
                (marks["t0_ns"], marks["t1_ns"])).fetchone()[0]
        with open(profile_json) as f:
            kernels = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"]
        ref_n = len(kernels)
        ref_ns = round(sum(float(e["dur"]) for e in kernels) * 1000)
        a = {"dynaflow_kernels": ours_n, "profiler_kernels": ref_n,
             "dynaflow_kernel_ms": ours_ns / 1e6, "profiler_kernel_ms": ref_ns / 1e6,
             "operators": ops, "kernels_linked_to_operators": linked}
        if ref_n == 0 and ours_n == 0:
            a["status"] = "skipped: no kernels (no GPU)"
        else:
            a["count_diff_pct"] = 100.0 * abs(ours_n - ref_n) / max(ref_n, 1)
            a["time_diff_pct"] = 100.0 * abs(ours_ns - ref_ns) / max(ref_ns, 1)
            ok = max(a["count_diff_pct"], a["time_diff_pct"]) <= self.args.tolerance
            a["status"] = "pass" if ok else "FAIL"
            if not ok:
                self.failures.append("accuracy")
        self.results["accuracy"] = a
        self.integrity(db, marks, ours_n, linked)

    # (d), on the trace of (a)
    def integrity(self, db, marks, kernels, linked):
        cuda = self.args.device == "cuda"
        checks = {}
        with sqlite3.connect(db) as c:
            meta = dict(c.execute("SELECT key, value FROM meta").fetchall())
            # None: not applicable to a CPU run.
            checks["cupti enabled"] = meta.get("cupti", "").startswith("enabled") if cuda else None
            losses = c.execute("SELECT name, count FROM import_stats "
                               "WHERE severity != 'info'").fetchall()
            checks["nothing dropped or unreadable"] = (meta.get("dropped_records") == "0"
                                                      and not losses)
            bad = c.execute(
                "SELECT count(*) FROM kernels k JOIN strings s ON s.id = k.name_id "
                "WHERE k.start_ns <= 0 OR k.end_ns < k.start_ns OR s.value = '' "
                "OR k.grid_x * k.grid_y * k.grid_z = 0").fetchone()[0]
            checks["every kernel well formed"] = bad == 0
            devices = c.execute("SELECT name, sm_count FROM devices").fetchall()
            checks["an H200 with 132 SMs"] = any(
                "H200" in name and sms == 132 for name, sms in devices) if cuda else None
            early = c.execute(
                "SELECT count(*) FROM kernels k JOIN api_calls a ON a.correlation = k.correlation "
                "AND a.kind != 'sync' WHERE k.start_ns >= ? AND k.start_ns < ? "
                "AND k.start_ns < a.start_ns", (marks["t0_ns"], marks["t1_ns"])).fetchone()[0]
            checks["no kernel before its launch"] = early == 0
        checks["95% of kernels linked"] = (kernels > 0 and linked >= 0.95 * kernels) if cuda else None
        self.results["integrity"] = {"checks": checks, "losses": losses, "devices": devices,
                                     "kernels_before_launch": early, "bad_kernels": bad}
        self.failures += [f"integrity: {name}" for name, ok in checks.items() if ok is False]

    def overhead_targets(self):
        """(d): the overhead targets of (b), on the GPU."""
        o = self.results.get("overhead")
        if not o or self.args.device != "cuda":
            return
        on, off, prof = (o[m]["region_overhead_pct"] for m in ("ops_on", "ops_off", "profiler"))
        if on > 3.0 or on >= prof:
            self.failures.append(f"overhead with operators {on:+.1f}% (target <= 3%, below "
                                 f"torch.profiler's {prof:+.1f}%)")
        if off > 1.0 or off >= prof:
            self.failures.append(f"overhead without operators {off:+.1f}% (target <= 1%)")

    # (b)
    def overhead(self):
        modes = ["plain", "ops_on", "ops_off", "profiler"]
        wall = {m: [] for m in modes}
        region = {m: [] for m in modes}
        for rep in range(self.args.reps):
            for mode in modes:  # interleaved: drifts hit every mode alike
                w, marks, _ = self.run_mode(mode, f"rep{rep}")
                wall[mode].append(w)
                region[mode].append(marks["region_s"])
        rows = {}
        for mode in modes:
            rows[mode] = {"region_s": statistics.median(region[mode]),
                          "process_s": statistics.median(wall[mode]),
                          "region_runs": region[mode], "process_runs": wall[mode]}
        base = rows["plain"]
        for row in rows.values():
            for what in ("region", "process"):
                row[f"{what}_overhead_pct"] = 100.0 * (row[f"{what}_s"] / base[f"{what}_s"] - 1)
        self.results["overhead"] = rows
        self.overhead_targets()

    # (c)
    def small_traces(self):
        suffix = "h200" if self.args.device == "cuda" else "cpu"
        copied = {}
        for name, (script, *sizes) in SMALL_TRACES[self.args.device].items():
            db = os.path.join(self.args.out, f"{name}_{suffix}.db")
            command = [self.python, os.path.join(EXAMPLES, script), *sizes,
                       "--device", self.args.device]
            self.run(self.traced(command, db), f"small trace {name}")
            size = os.path.getsize(db)
            if size > OUT_FILE_LIMIT:
                self.failures.append(f"{name} trace too large to bring back")
            with sqlite3.connect(db) as c:
                counts = {t: c.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                          for t in ("kernels", "operators", "memcpy", "api_calls")}
            copied[os.path.basename(db)] = {"bytes": size, **counts}
        self.results["small_traces"] = copied

    # (e)
    def graphs_nvtx_exit(self):
        cuda = self.args.device == "cuda"
        # Kept in --out beside (c)'s traces: a fixture for graph attribution.
        db = os.path.join(self.args.out, "graph_replay_%s.db" % ("h200" if cuda else "cpu"))
        command = [self.python, os.path.abspath(__file__), "graph-workload",
                   "--device", self.args.device, "--replays", str(self.args.replays)]
        self.run(self.traced(command, db), "graph workload")
        checks = {}
        with sqlite3.connect(db) as c:
            ranges = {name: c.execute("SELECT start_ns, end_ns FROM ranges_named WHERE name = ? "
                                      "ORDER BY start_ns", (name,)).fetchall()
                      for name in GRAPH_RANGES}

            def launched_in(window):  # kernels whose launch call lies in a host range
                return c.execute(
                    "SELECT count(*) FROM kernels k JOIN api_calls a ON a.correlation = "
                    "k.correlation AND a.pid = k.pid WHERE a.start_ns >= ? AND a.start_ns < ?",
                    window).fetchone()[0]

            expected = (1, self.args.replays, 1)
            # NVTX reaches the tracer through CUPTI, which a CPU run never starts.
            checks["every NVTX range recorded"] = all(
                len(ranges[name]) == n for name, n in zip(GRAPH_RANGES, expected)) if cuda else None
            eager = launched_in(ranges[GRAPH_RANGES[0]][0]) if ranges[GRAPH_RANGES[0]] else 0
            last = launched_in(ranges[GRAPH_RANGES[2]][0]) if ranges[GRAPH_RANGES[2]] else 0
            replays = c.execute("SELECT correlation, count(*) FROM kernels "
                                "WHERE graph_id IS NOT NULL GROUP BY correlation").fetchall()
            unlinked, unmarked = c.execute(
                "SELECT sum(o.external_id IS NULL), sum(coalesce(o.in_graph_capture, 0) = 0) "
                "FROM kernels k LEFT JOIN operators o ON o.external_id = k.external_id "
                "AND o.pid = k.pid WHERE k.graph_id IS NOT NULL").fetchone()
            marked_outside = c.execute(
                "SELECT count(*) FROM operators o WHERE o.in_graph_capture = 1 AND "
                "(o.start_ns < ? OR o.start_ns >= ?)",
                (ranges[GRAPH_RANGES[0]][0][1] if ranges[GRAPH_RANGES[0]] else 0,
                 ranges[GRAPH_RANGES[1]][0][0] if ranges[GRAPH_RANGES[1]] else 0)).fetchone()[0]
        counts = [n for _, n in replays]
        checks["eager step has kernels"] = eager > 0 if cuda else None
        checks["each replay gives the eager step's kernels"] = (
            len(replays) == self.args.replays and all(n == eager for n in counts)) if cuda else None
        checks["replayed kernels linked to capture-time operators"] = (
            bool(replays) and not unlinked and not unmarked) if cuda else None
        checks["no operator outside the capture marked"] = marked_outside == 0
        checks["last step's kernels kept at exit"] = (last == eager) if cuda else None
        self.results["graphs_nvtx_exit"] = {
            "checks": checks, "eager_kernels": eager, "last_step_kernels": last,
            "replay_launches": len(replays), "kernels_per_replay": counts,
            "replayed_unlinked": unlinked or 0, "replayed_linked_unmarked": unmarked or 0,
            "marked_outside_capture": marked_outside}
        self.failures += [f"graphs: {name}" for name, ok in checks.items() if ok is False]

    def table(self):
        lines = [f"dynaflow trace check on {self.args.device}; workload: llama_decode "
                 f"{' '.join(self.model)}, {self.args.iters} decodes per region"]
        a = self.results.get("accuracy")
        if a:
            lines.append("(a) kernels in the region    dynaflow    torch.profiler   diff")
            if "count_diff_pct" in a:
                lines.append(f"    count                    {a['dynaflow_kernels']:>8}    "
                             f"{a['profiler_kernels']:>14}   {a['count_diff_pct']:.2f}%")
                lines.append(f"    total kernel time (ms)   {a['dynaflow_kernel_ms']:>8.3f}    "
                             f"{a['profiler_kernel_ms']:>14.3f}   {a['time_diff_pct']:.2f}%")
            lines.append(f"    operators {a['operators']}, kernels linked to an operator "
                         f"{a['kernels_linked_to_operators']}; {a['status']}")
        o = self.results.get("overhead")
        if o:
            lines.append(f"(b) overhead, median of {self.args.reps}   region s   vs plain   "
                         f"process s   vs plain")
            for mode, r in o.items():
                lines.append(f"    {mode:<24} {r['region_s']:>9.4f}   "
                             f"{r['region_overhead_pct']:>+7.1f}%   {r['process_s']:>9.2f}   "
                             f"{r['process_overhead_pct']:>+7.1f}%")
        i = self.results.get("integrity")
        if i:
            verdict = {True: "ok", False: "NO", None: "n/a"}
            lines.append("(d) " + ", ".join(f"{k}: {verdict[v]}" for k, v in i["checks"].items()))
        g = self.results.get("graphs_nvtx_exit")
        if g:
            verdict = {True: "ok", False: "NO", None: "n/a"}
            lines.append(f"(e) eager {g['eager_kernels']} kernels, {g['replay_launches']} replays "
                         f"of {g['kernels_per_replay']}, last step {g['last_step_kernels']}: " +
                         ", ".join(f"{k}: {verdict[v]}" for k, v in g["checks"].items()))
        for name, info in self.results.get("small_traces", {}).items():
            lines.append(f"(c) {name}: {info['bytes'] / 1e6:.2f} MB, {info['kernels']} kernels, "
                         f"{info['operators']} operators, {info['memcpy']} memcpy")
        verdict = "FAIL: " + ", ".join(self.failures) if self.failures else "pass"
        lines.append("result: " + verdict)
        return "\n".join(lines)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "workload":
        workload(sys.argv[2:])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "graph-workload":
        graph_workload(sys.argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dynaflow", required=True, help="the dynaflow binary to check")
    parser.add_argument("--out", required=True, help="where results and small traces go")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--tolerance", type=float, default=2.0, help="percent, for (a)")
    parser.add_argument("--replays", type=int, default=5, help="CUDA graph replays, for (e)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    checker = Checker(args)
    for step in (checker.accuracy, checker.graphs_nvtx_exit, checker.overhead,
                 checker.small_traces):
        try:
            step()
        except Exception as e:  # noqa: BLE001 - report it and go on with the others
            checker.failures.append(f"{step.__name__}: {e}")
            checker.say(f"{step.__name__} failed: {e}")
    shutil.rmtree(checker.work, ignore_errors=True)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({**checker.results, "failures": checker.failures}, f, indent=2)
    table = checker.table()
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write(table + "\n")
    checker.say(table)
    return 0 if not checker.failures else 1


if __name__ == "__main__":
    sys.exit(main())
