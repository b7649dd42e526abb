"""The simulator against the GPU: scripts/device/predict_check.sh runs

    python3 scripts/device/predict_check.py --dynaflow build-device/cli/dynaflow --out $OUT

A decode step of a Llama-3-8B-shaped decoder (hidden 4096, 32 query and 8 KV
heads of 128, SwiGLU 14336, bf16) over a large batch with a long KV cache, so
decode attention (memory-bound) and the GEMMs (compute-bound) both weigh, is
run and timed (median of --iters CUDA-event-timed steps after warm-up) under:

  sequential       one stream, the whole batch;
  nanobatch x2     the batch split in two halves, each on its own stream, layer
                   by layer, so one half's attention can run beside the other's
                   GEMMs (NanoFlow's overlap, as two streams express it).

The sequential step is also profiled with torch.profiler (record_shapes, one
ProfilerStep per step); `dynaflow advise` reads that trace and predicts both
schedules (--force-strategy nanobatch_overlap --splits 2). Each prediction is
compared with its measurement: target |error| <= 10%.

Prints a table; writes predict_check.json and the trace to --out. Exit code 0
when both errors are within the target, 1 otherwise, 2 without a GPU.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 4096, 32, 8, 128, 14336


def make_layer(device, dtype):
    def w(*shape):
        return torch.randn(*shape, device=device, dtype=dtype) * 0.02
    return {
        "norm1": torch.ones(HIDDEN, device=device, dtype=dtype),
        "qkv": w(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM),
        "o": w(HEADS * HEAD_DIM, HIDDEN),
        "norm2": torch.ones(HIDDEN, device=device, dtype=dtype),
        "gate_up": w(HIDDEN, 2 * FFN),
        "down": w(FFN, HIDDEN),
    }


def rms_norm(x, weight):
    return F.rms_norm(x, (x.shape[-1],), weight, 1e-5)


def layer_forward(x, p, k_cache, v_cache):
    """x [b, hidden]; caches [b, kv_heads, ctx, head_dim] (read in place)."""
    b = x.shape[0]
    h = rms_norm(x, p["norm1"])
    qkv = torch.mm(h, p["qkv"])
    q = qkv[:, : HEADS * HEAD_DIM].view(b, HEADS, 1, HEAD_DIM)
    attn = F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)
    x = x + torch.mm(attn.reshape(b, HEADS * HEAD_DIM), p["o"])
    h = rms_norm(x, p["norm2"])
    gate, up = torch.mm(h, p["gate_up"]).chunk(2, dim=-1)
    return x + torch.mm(F.silu(gate) * up, p["down"])


def step_sequential(x, layers, caches):
    for p, (k, v) in zip(layers, caches):
        x = layer_forward(x, p, k, v)
    return x


def step_nanobatch(x, layers, caches, streams):
    """Two halves of the batch, each on its own stream, interleaved per layer."""
    half = x.shape[0] // 2
    parts = [x[:half], x[half:]]
    main = torch.cuda.current_stream()
    for s in streams:
        s.wait_stream(main)
    for p, (k, v) in zip(layers, caches):
        for i, s in enumerate(streams):
            with torch.cuda.stream(s):
                sl = slice(i * half, (i + 1) * half)
                parts[i] = layer_forward(parts[i], p, k[sl], v[sl])
    for s in streams:
        main.wait_stream(s)
    return torch.cat(parts)


def time_steps(fn, iters, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)  # us
    return statistics.median(times), times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dynaflow", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--target-pct", type=float, default=10.0)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("predict_check: torch sees no GPU: pending", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    layers = [make_layer(dev, dt) for _ in range(a.layers)]
    caches = [(torch.randn(a.batch, KV_HEADS, a.context, HEAD_DIM, device=dev, dtype=dt),
               torch.randn(a.batch, KV_HEADS, a.context, HEAD_DIM, device=dev, dtype=dt))
              for _ in range(a.layers)]
    x = torch.randn(a.batch, HIDDEN, device=dev, dtype=dt)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]

    with torch.inference_mode():
        seq_us, seq_all = time_steps(lambda: step_sequential(x, layers, caches), a.iters)
        nano_us, nano_all = time_steps(lambda: step_nanobatch(x, layers, caches, streams), a.iters)
        # The trace dynaflow advises on: the sequential step, profiled.
        trace_path = os.path.join(a.out, "sequential_trace.json")
        sched = torch.profiler.schedule(wait=1, warmup=2, active=5, repeat=1)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA],
                                    schedule=sched, record_shapes=True) as prof:
            for _ in range(8):
                step_sequential(x, layers, caches)
                torch.cuda.synchronize()
                prof.step()
        prof.export_chrome_trace(trace_path)

    report_path = os.path.join(a.out, "report.json")
    plan_path = os.path.join(a.out, "plan.json")
    cmd = [a.dynaflow, "advise", trace_path, "--format", "json", "-o", report_path,
           "--force-strategy", "nanobatch_overlap", "--splits", "2", "--plan", plan_path]
    subprocess.run(cmd, check=True)
    report = json.load(open(report_path))
    recs = {(r["strategy"], r["splits"]): r for r in report["recommendations"]}
    seq_pred = recs[("sequential", 1)]["predicted_step_us"]
    nano = recs.get(("nanobatch_overlap", 2))
    rows = []

    def row(name, predicted, measured):
        err = 100.0 * (predicted - measured) / measured
        rows.append({"schedule": name, "predicted_us": predicted, "measured_us": measured,
                     "error_pct": err, "ok": abs(err) <= a.target_pct})

    # The sequential prediction is the profiled step itself (profiler overhead
    # included): it checks that the trace's step matches the untraced one.
    row("sequential", seq_pred, seq_us)
    if nano is None:
        rows.append({"schedule": "nanobatch_overlap x2", "predicted_us": None,
                     "measured_us": nano_us, "error_pct": None, "ok": False})
    else:
        row("nanobatch_overlap x2", nano["predicted_step_us"], nano_us)
    summary = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "batch": a.batch, "context": a.context, "layers": a.layers,
               "rows": rows, "measured_speedup": seq_us / nano_us,
               "predicted_speedup": nano["predicted_speedup"] if nano else None,
               "replay_error_pct": report.get("simulation", {}).get("replay_error_pct"),
               "samples_us": {"sequential": seq_all, "nanobatch": nano_all}}
    json.dump(summary, open(os.path.join(a.out, "predict_check.json"), "w"), indent=2)
    print("%-22s %14s %14s %9s" % ("schedule", "predicted", "measured", "error"))
    for r in rows:
        pred = "%.1f us" % r["predicted_us"] if r["predicted_us"] else "-"
        err = "%+.1f%%" % r["error_pct"] if r["error_pct"] is not None else "-"
        print("%-22s %14s %14s %9s %s" % (r["schedule"], pred, "%.1f us" % r["measured_us"], err,
                                          "ok" if r["ok"] else "OVER %g%%" % a.target_pct))
    print("speedup: measured %.3fx, predicted %s" % (
        summary["measured_speedup"],
        "%.3fx" % summary["predicted_speedup"] if summary["predicted_speedup"] else "-"))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
