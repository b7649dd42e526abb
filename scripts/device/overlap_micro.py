"""Two-stream microbenchmark for the simulator's sharing model (analysis/sim/model.h):
what two kernels cost side by side on two streams against one after the other.

    python3 scripts/device/overlap_micro.py --out DIR [--device cuda|cpu]

Pairs (bf16 on the GPU):
  gemm+stream    an 8192^3 GEMM (compute-bound) beside a 2 GiB streaming add
                 (bandwidth-bound): the overlap NanoFlow counts on;
  stream+stream  two 2 GiB streaming adds, each alone near the HBM peak: the
                 sharing model says they gain nothing side by side;
  gemm+gemm      two 8192^3 GEMMs, each filling the SMs.
For each pair: each kernel alone, the two back to back on one stream, and the
two launched together on two streams (median of --iters CUDA-event-timed
runs). overlap = back-to-back / side-by-side: 1.0 means no gain, 2.0 perfect.
The figures are what the model's constants (sm_memory, hbm_*, interference)
are to be sourced from; written to DIR/overlap_micro.json. Each pair is then run
once more under torch.profiler (one ProfilerStep per pair: back to back, then
side by side), into DIR/overlap_micro_trace.json, so that the simulator's
prediction for the same kernels (launch configurations, bytes) can be computed
afterwards without a GPU.

--device cpu is a dry run of the flow at tiny sizes (CPU ops are synchronous:
the overlap is 1 by construction and means nothing).
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch


def timer(device):
    if device == "cuda":
        def run(fn, iters):
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            out = []
            for _ in range(iters):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                out.append(a.elapsed_time(b) * 1000.0)
            return statistics.median(out)
    else:
        def run(fn, iters):
            fn()
            out = []
            for _ in range(iters):
                t = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t) * 1e6)
            return statistics.median(out)
    return run


def kernels(device, tiny):
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    n = 256 if tiny else 8192
    elems = (1 << 16) if tiny else (1 << 30)  # 2 GiB of bf16 per operand
    a, b = torch.randn(n, n, device=device, dtype=dt), torch.randn(n, n, device=device, dtype=dt)
    c, d = torch.randn(n, n, device=device, dtype=dt), torch.randn(n, n, device=device, dtype=dt)
    x, y = torch.randn(elems, device=device, dtype=dt), torch.randn(elems, device=device, dtype=dt)
    u, v = torch.randn(elems, device=device, dtype=dt), torch.randn(elems, device=device, dtype=dt)
    out = {"gemm": torch.empty(n, n, device=device, dtype=dt),
           "gemm2": torch.empty(n, n, device=device, dtype=dt),
           "stream": torch.empty(elems, device=device, dtype=dt),
           "stream2": torch.empty(elems, device=device, dtype=dt)}
    return {
        "gemm": lambda: torch.mm(a, b, out=out["gemm"]),
        "gemm2": lambda: torch.mm(c, d, out=out["gemm2"]),
        "stream": lambda: torch.add(x, y, out=out["stream"]),
        "stream2": lambda: torch.add(u, v, out=out["stream2"]),
    }


def side_by_side(f, g, streams):
    if streams is None:
        f()
        g()
        return
    main = torch.cuda.current_stream()
    for s in streams:
        s.wait_stream(main)
    with torch.cuda.stream(streams[0]):
        f()
    with torch.cuda.stream(streams[1]):
        g()
    for s in streams:
        main.wait_stream(s)


PAIRS = {"gemm+stream": ("gemm", "stream"), "stream+stream": ("stream", "stream2"),
         "gemm+gemm": ("gemm", "gemm2")}


def profile_pairs(k, pairs, streams, device, path):
    """One profiler step per pair: its two kernels back to back, then side by side."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities, record_shapes=True, acc_events=True) as prof:
        for f, g in pairs.values():
            k[f]()
            k[g]()
            side_by_side(k[f], k[g], streams)
            if device == "cuda":
                torch.cuda.synchronize()
            prof.step()
    prof.export_chrome_trace(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("overlap_micro: torch sees no GPU: pending", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    k = kernels(a.device, tiny=a.device != "cuda")
    run = timer(a.device)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()] if a.device == "cuda" else None
    rows = []
    with torch.inference_mode():
        alone = {name: run(fn, a.iters) for name, fn in k.items()}
        for name, (f, g) in PAIRS.items():
            serial = run(lambda: (k[f](), k[g]()), a.iters)
            together = run(lambda: side_by_side(k[f], k[g], streams), a.iters)
            rows.append({"pair": name, "alone_us": [alone[f], alone[g]], "serial_us": serial,
                         "side_by_side_us": together, "overlap": serial / together})
        profile_pairs(k, PAIRS, streams, a.device, os.path.join(a.out, "overlap_micro_trace.json"))
    summary = {"device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
               "torch": torch.__version__, "iters": a.iters, "rows": rows}
    json.dump(summary, open(os.path.join(a.out, "overlap_micro.json"), "w"), indent=2)
    print("%-14s %12s %12s %14s %14s %8s" % ("pair", "alone 1", "alone 2", "back to back",
                                             "side by side", "overlap"))
    for r in rows:
        print("%-14s %9.1f us %9.1f us %11.1f us %11.1f us %7.3fx" % (
            r["pair"], r["alone_us"][0], r["alone_us"][1], r["serial_us"], r["side_by_side_us"],
            r["overlap"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
