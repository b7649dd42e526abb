"""The simulator against the GPU: scripts/device/predict_check.sh (or
scripts/device/gpu_truth.sh) runs

    python3 scripts/device/predict_check.py --dynaflow build-device/cli/dynaflow --out $OUT \
        --workload decode --batch 64 --context 4096

A step of a Llama-3-8B-shaped decoder (hidden 4096, 32 query and 8 KV heads of
128, SwiGLU 14336, bf16; --layers of them) is run and timed (median of --iters
CUDA-event-timed steps after warm-up) under:

  sequential       one stream, the whole batch;
  nanobatch x2     the batch split in two halves, each on its own stream, layer
                   by layer, so one half's attention can run beside the other's
                   GEMMs (NanoFlow's overlap, as two streams express it).

Workloads: decode (one new token per sequence, attention over a --context KV
cache: memory-bound attention beside the GEMMs) and prefill (--seq tokens per
sequence, causal attention over them). The sequential step is also profiled
with torch.profiler (record_shapes, one ProfilerStep per step); `dynaflow
advise` reads that trace, replays the sequential step and predicts both
schedules (advise --splits 2: nano-batches in two). Each prediction is
compared with its measurement: target |error| <= 10%.

--device cpu is a dry run of the flow at tiny sizes in float32 (no GPU kernels:
advise has nothing to predict; the figures mean nothing).

Prints a table; writes predict_check_<workload>.json, the trace and the report to --out.
Exit code 0 when both errors are within the target (or, on the CPU, when the
flow ran), 1 otherwise, 2 without a GPU.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

import time

import torch
import torch.nn.functional as F

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 4096, 32, 8, 128, 14336


def use_tiny_shapes():
    """The CPU dry run's shapes: the same structure, small enough for a CPU."""
    global HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN
    HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 256, 4, 2, 64, 512


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
    """Decode when the caches are given: x [b, hidden], caches [b, kv_heads,
    ctx, head_dim] (read in place). Prefill when they are None: x [b, seq,
    hidden], causal attention over its own keys and values."""
    h = rms_norm(x, p["norm1"])
    qkv = torch.matmul(h, p["qkv"])
    lead = x.shape[:-1]
    if k_cache is None:
        b, seq = lead
        q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
        heads = lambda t, n: t.view(b, seq, n, HEAD_DIM).transpose(1, 2)  # noqa: E731
        attn = F.scaled_dot_product_attention(heads(q, HEADS), heads(k, KV_HEADS),
                                              heads(v, KV_HEADS), is_causal=True, enable_gqa=True)
        attn = attn.transpose(1, 2)
    else:
        q = qkv[:, : HEADS * HEAD_DIM].view(lead[0], HEADS, 1, HEAD_DIM)
        attn = F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)
    x = x + torch.matmul(attn.reshape(*lead, HEADS * HEAD_DIM), p["o"])
    h = rms_norm(x, p["norm2"])
    gate, up = torch.matmul(h, p["gate_up"]).chunk(2, dim=-1)
    return x + torch.matmul(F.silu(gate) * up, p["down"])


def step_sequential(x, layers, caches):
    for p, (k, v) in zip(layers, caches):
        x = layer_forward(x, p, k, v)
    return x


def step_nanobatch(x, layers, caches, streams):
    """Two halves of the batch, each on its own stream, interleaved per layer
    (one after the other when `streams` is None: the CPU dry run)."""
    half = x.shape[0] // 2
    parts = [x[:half], x[half:]]
    main = torch.cuda.current_stream() if streams else None
    for s in streams or ():
        s.wait_stream(main)
    for p, (k, v) in zip(layers, caches):
        for i in range(2):
            sl = slice(i * half, (i + 1) * half)
            with torch.cuda.stream(streams[i]) if streams else torch.inference_mode():
                parts[i] = layer_forward(parts[i], p, None if k is None else k[sl],
                                         None if v is None else v[sl])
    for s in streams or ():
        main.wait_stream(s)
    return torch.cat(parts)


def time_steps(fn, iters, warmup=5):
    if not torch.cuda.is_available():
        fn()
        times = []
        for _ in range(iters):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e6)
        return statistics.median(times), times
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
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--workload", choices=["decode", "prefill"], default="decode")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=4096, help="decode: KV cache length")
    ap.add_argument("--seq", type=int, default=512, help="prefill: tokens per sequence")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--target-pct", type=float, default=10.0)
    a = ap.parse_args()
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("predict_check: torch sees no GPU: pending", file=sys.stderr)
        return 2
    if not cuda:
        use_tiny_shapes()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    dev, dt = a.device, torch.bfloat16 if cuda else torch.float32
    layers = [make_layer(dev, dt) for _ in range(a.layers)]
    if a.workload == "decode":
        caches = [(torch.randn(a.batch, KV_HEADS, a.context, HEAD_DIM, device=dev, dtype=dt),
                   torch.randn(a.batch, KV_HEADS, a.context, HEAD_DIM, device=dev, dtype=dt))
                  for _ in range(a.layers)]
        x = torch.randn(a.batch, HIDDEN, device=dev, dtype=dt)
        shape = f"decode batch {a.batch} context {a.context}"
    else:
        caches = [(None, None)] * a.layers
        x = torch.randn(a.batch, a.seq, HIDDEN, device=dev, dtype=dt)
        shape = f"prefill batch {a.batch} x {a.seq} tokens"
    streams = [torch.cuda.Stream(), torch.cuda.Stream()] if cuda else None
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    with torch.inference_mode():
        seq_us, seq_all = time_steps(lambda: step_sequential(x, layers, caches), a.iters)
        nano_us, nano_all = time_steps(lambda: step_nanobatch(x, layers, caches, streams), a.iters)
        # The trace dynaflow advises on: the sequential step, profiled.
        trace_path = os.path.join(a.out, f"sequential_{a.workload}.json")
        sched = torch.profiler.schedule(wait=1, warmup=2, active=5, repeat=1)
        with torch.profiler.profile(activities=activities, schedule=sched,
                                    record_shapes=True) as prof:
            for _ in range(8):
                step_sequential(x, layers, caches)
                sync()
                prof.step()
        prof.export_chrome_trace(trace_path)

    # The report predicts every candidate (nano-batches in 2 only); no plan: the
    # trace names no nn.Module for `apply` to split.
    report_path = os.path.join(a.out, f"report_{a.workload}.json")
    cmd = [a.dynaflow, "advise", trace_path, "--format", "json", "-o", report_path,
           "--splits", "2"]
    advised = subprocess.run(cmd)
    report = json.load(open(report_path)) if os.path.exists(report_path) else {}
    recs = {(r["strategy"], r["splits"]): r for r in report.get("recommendations", [])}
    seq = recs.get(("sequential", 1))
    nano = recs.get(("nanobatch_overlap", 2))
    rows = []

    def row(name, rec, measured):
        predicted = rec["predicted_step_us"] if rec else None
        err = 100.0 * (predicted - measured) / measured if predicted else None
        rows.append({"schedule": name, "predicted_us": predicted, "measured_us": measured,
                     "error_pct": err, "ok": err is not None and abs(err) <= a.target_pct})

    # The sequential prediction is the replayed, profiled step (profiler
    # overhead included): it checks that the trace's step matches the untraced one.
    row("sequential", seq, seq_us)
    row("nanobatch_overlap x2", nano, nano_us)
    summary = {"device": torch.cuda.get_device_name() if cuda else "cpu",
               "torch": torch.__version__, "workload": shape, "layers": a.layers,
               "rows": rows, "measured_speedup": seq_us / nano_us,
               "predicted_speedup": nano["predicted_speedup"] if nano else None,
               "replay_error_pct": report.get("simulation", {}).get("replay_error_pct"),
               "advise_exit_code": advised.returncode,
               "samples_us": {"sequential": seq_all, "nanobatch": nano_all}}
    json.dump(summary, open(os.path.join(a.out, f"predict_check_{a.workload}.json"), "w"),
              indent=2)
    print(f"predict_check: {summary['device']}, {shape}, {a.layers} layers")
    print("%-22s %14s %14s %9s" % ("schedule", "predicted", "measured", "error"))
    for r in rows:
        pred = "%.1f us" % r["predicted_us"] if r["predicted_us"] else "-"
        err = "%+.1f%%" % r["error_pct"] if r["error_pct"] is not None else "-"
        print("%-22s %14s %14s %9s %s" % (r["schedule"], pred, "%.1f us" % r["measured_us"], err,
                                          "ok" if r["ok"] else "OVER %g%%" % a.target_pct))
    print("speedup: measured %.3fx, predicted %s" % (
        summary["measured_speedup"],
        "%.3fx" % summary["predicted_speedup"] if summary["predicted_speedup"] else "-"))
    if not cuda:
        return 0 if report else 1  # the flow ran; no GPU figures
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
