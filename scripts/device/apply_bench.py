"""The measurements of scripts/device/apply_bench.sh (see there).

For prefill and for long-context decode: traces one representative workload
of a Llama-8B-shaped decoder with `dynaflow trace`, asks `dynaflow advise`
for a plan, then times every workload three ways in one process:
baseline eager, baseline captured in one CUDA graph, and the plan applied
(dynaflow.apply) and captured in one CUDA graph (on the CPU: eager only).
Prints the predicted speedup of the plan's bucket beside the measured one,
and the plan run with apply's own graphs (dynaflow._graphs: each unit's
schedule captured once per shape), against the same reference.

The decoder (--model): transformers' LlamaForCausalLM, called as generate()
calls it with a static cache (the default: code nobody here wrote), or
examples/llama_decode.py's own (`example`).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "examples"), os.path.join(ROOT, "plugin", "python")]

import torch  # noqa: E402

import dynaflow  # noqa: E402
import llama_decode as ld  # noqa: E402

# Llama-3-8B's layer shape; fewer layers than its 32 keep the run short (the
# speedup is per layer).
SIZES = {
    "cuda": dict(model=["--layers", "8", "--hidden", "4096", "--heads", "32", "--kv-heads", "8",
                        "--intermediate", "14336", "--vocab", "32000", "--dtype", "bfloat16"],
                 seq=256, prefill=[256, 512, 1024, 2048, 4096, 8192], prefill_trace=2048,
                 context=4096, decode=[32, 64, 128, 256], decode_trace=128, iters=20),
    "cpu": dict(model=["--layers", "2", "--hidden", "256", "--heads", "8", "--kv-heads", "2",
                       "--vocab", "1024"],
                seq=16, prefill=[32, 64, 128], prefill_trace=64,
                context=64, decode=[4, 8], decode_trace=8, iters=3),
}
# transformers' LlamaConfig of the same shape.
HF_CONFIG = {
    "cuda": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                 num_key_value_heads=8, num_hidden_layers=8, vocab_size=32000),
    "cpu": dict(hidden_size=256, intermediate_size=512, num_attention_heads=8,
                num_key_value_heads=2, num_hidden_layers=2, vocab_size=1024),
}
GAIN = 1.03  # a bucket "predicts a gain" from this speedup on
TARGET_GAIN, TARGET_SEQUENTIAL = 1.15, 0.98


def model_args(device):
    parser = argparse.ArgumentParser()
    ld.add_model_args(parser)
    args = parser.parse_args(SIZES[device]["model"] + ["--device", device])
    ld.check_model_args(parser, args)
    return args


def workload(opts, kind, batch, length):
    """(model, step) of opts.model: `step` runs one forward, a prefill of
    [batch, length] tokens or one decode step of [batch, 1] after a cache of
    `length` positions, and returns what is compared (the logits)."""
    if opts.model == "hf":
        return hf_workload(opts.device, kind, batch, length)
    args = model_args(opts.device)
    model = ld.build_model(args, length + 1)
    return model, example_step(model, args, kind, batch, length)


def hf_workload(device, kind, batch, length):
    """transformers' LlamaForCausalLM (random weights, bfloat16 on CUDA) and
    one forward as generate() runs it on a static cache: a prefill, or a
    decode step after `length` positions of random keys and values (a real
    prefill of a long-context batch would need tens of GB for its MLP
    alone); the last position's logits (logits_to_keep=1). The cache counts
    its positions in a tensor that every forward advances: each step first
    sets it back to where the workload starts, on the device, so that
    repeated steps (and a CUDA graph's replays) compute the same step."""
    import transformers as tf

    config = tf.LlamaConfig(max_position_embeddings=length + 1, **HF_CONFIG[device])
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):  # initialised where it runs: 2 billion parameters
            model = tf.LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default)
    cache = tf.StaticCache(config=config, max_cache_len=length + 1)
    cache.early_initialization(batch, config.num_key_value_heads,
                               config.hidden_size // config.num_attention_heads, dtype,
                               torch.device(device))
    g = torch.Generator(device="cpu").manual_seed(1)
    start = 0 if kind == "prefill" else length
    tokens = torch.randint(config.vocab_size, (batch, length if kind == "prefill" else 1),
                           generator=g).to(device)
    if kind == "decode":
        for layer in cache.layers:
            layer.keys.normal_()
            layer.values.normal_()

    @torch.inference_mode()
    def step():
        for layer in cache.layers:
            layer.cumulative_length.fill_(start)
        return model(tokens, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
    return model, step


def example_step(model, args, kind, batch, length):
    """examples/llama_decode.py's model's step (workload)."""
    g = torch.Generator(device="cpu").manual_seed(1)
    positions = length + 1
    cache = ld.KVCache.empty(args.layers, batch, args.kv_heads, positions,
                             args.hidden // args.heads, args.dtype, args.device)
    if kind == "prefill":
        tokens = torch.randint(args.vocab, (batch, length), generator=g).to(args.device)
        start = 0
    else:
        for t in cache.k + cache.v:  # every layer's keys and values
            t.normal_()
        tokens = torch.randint(args.vocab, (batch, 1), generator=g).to(args.device)
        start = length

    @torch.inference_mode()
    def step():
        return model(tokens, start, cache)
    return step


def shape_of(kind, size, sizes):
    """(batch, length) of a workload of `size` (tokens for prefill, batch for decode)."""
    if kind == "prefill":
        return max(1, size // sizes["seq"]), sizes["seq"]
    return size, sizes["context"]


def time_ms(fn, iters, device):
    for _ in range(3):
        fn()
    samples = []
    for _ in range(iters):
        if device == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(begin.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t) * 1e3)
    return statistics.median(samples)


def graphed(step, capture_error_mode="global"):
    """`step` captured in one CUDA graph (after a warm-up on a side stream, as
    torch.cuda.graph expects); returns (replay, output of the capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode=capture_error_mode):
        out = step()
    return graph.replay, out


def replay_output(replay, static_out):
    """The output of one replay: the graph writes it into `static_out`, what
    the captured call returned."""
    replay()
    torch.cuda.synchronize()
    return static_out.clone()


def within_tolerance(out, base):
    """Whether `out` equals `base` within the dtype's tolerance, as
    `dynaflow apply --verify` judges (plugin/python/dynaflow/_apply.py)."""
    from dynaflow import _apply

    rtol, atol = _apply._tolerance(base.dtype)
    return bool(torch.allclose(out.float(), base.float(), rtol=rtol, atol=atol))


def graphed_plan(step, row):
    """The planned step in one CUDA graph, (replay, static output) as
    graphed() returns them, or None with the reason in
    row["planned_graph_error"]: under capture a staggered region's
    micro-batches issue their work from the capturing thread, onto streams
    forked from the capturing one, and allocate there (torch's graph pool
    takes allocations by the stream's capture); a dual-batch region's, from
    one host thread each, and in the "global" capture mode CUDA refuses
    another thread's unsafe calls (a new pool segment's cudaMalloc), so the
    capture is "thread_local". A capture that fails anyway is a finding to
    record, not a reason to lose the other rows."""
    try:
        return graphed(step, capture_error_mode="thread_local")
    except Exception as e:  # noqa: BLE001 (any capture failure is reported)
        row["planned_graph_error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        torch.cuda.synchronize()
        return None


def unit_graphs(model, plan, opts, step, row):
    """The plan applied with apply's own CUDA graphs (each unit's schedule
    captured once per shape, dynaflow._graphs): times it into
    row["planned_unit_graphs_ms"], with the graphs captured and replayed
    and why calls ran eagerly; returns its output, as a list."""
    model._dynaflow_applier.detach()
    dynaflow.apply(model, plan, runtime_lib=opts.runtime, graphs=True)
    report = model._dynaflow_applier.report
    row["planned_unit_graphs_ms"] = time_ms(step, SIZES[opts.device]["iters"], opts.device)
    out = step()
    row["unit_graphs"] = {"captured": report.graphs_captured, "replayed": report.graph_replays,
                          "eager_calls": dict(list(report.graph_eager_calls.items())[:3])}
    return [out]


def bucket_of(plan, tokens):
    for b in plan["buckets"]:
        top = b["max_tokens"]
        if tokens >= b["min_tokens"] and (top is None or tokens <= top):
            return b
    return plan["buckets"][-1]


def run_workload(opts):
    """Child mode, traced: a few steps of one workload."""
    batch, length = shape_of(opts.workload, opts.size, SIZES[opts.device])
    _, step = workload(opts, opts.workload, batch, length)
    for _ in range(5):
        step()
    if opts.device == "cuda":
        torch.cuda.synchronize()


def make_plan(opts, kind, size):
    db = os.path.join(opts.out, f"{kind}.db")
    plan = os.path.join(opts.out, f"{kind}_plan.json")
    subprocess.run([opts.dynaflow, "trace", "-o", db, "--", sys.executable, __file__,
                    "--workload", kind, "--size", str(size), "--device", opts.device,
                    "--model", opts.model],
                   check=True)
    subprocess.run([opts.dynaflow, "advise", db, "--plan", plan, "--format", "json", "-o",
                    os.path.join(opts.out, f"{kind}_report.json")], check=True)
    if opts.device == "cpu":  # no GPU activity to advise on: exercise the flow with a split
        subprocess.run([opts.dynaflow, "advise", db, "--plan", plan, "--force-strategy",
                        "nanobatch_overlap", "--splits", "2"], check=True, stdout=subprocess.DEVNULL)
    with open(plan, encoding="utf-8") as f:
        return json.load(f)


def measure(opts, kind, plan):
    sizes = SIZES[opts.device]
    rows = []
    for size in sizes[kind]:
        batch, length = shape_of(kind, size, sizes)
        model, step = workload(opts, kind, batch, length)
        row = {"workload": kind, "tokens": batch * (length if kind == "prefill" else 1),
               "batch": batch}
        row["eager_ms"] = time_ms(step, sizes["iters"], opts.device)
        base_out = step()
        if opts.device == "cuda":
            replay, _ = graphed(step)
            row["graph_ms"] = time_ms(replay, sizes["iters"], opts.device)
        dynaflow.apply(model, plan, runtime_lib=opts.runtime, graphs=False)
        row["units"] = len(model._dynaflow_applier.forwards)  # modules running the plan
        row["planned_eager_ms"] = time_ms(step, sizes["iters"], opts.device)
        planned_out = step()
        row["max_abs_diff"] = float((planned_out.float() - base_out.float()).abs().max())
        outputs = [planned_out]
        if opts.device == "cuda":
            graph = graphed_plan(step, row)
            if graph is not None:
                replay, static_out = graph
                row["planned_graph_ms"] = time_ms(replay, sizes["iters"], opts.device)
                outputs.append(replay_output(replay, static_out))
                row["planned_graph_max_abs_diff"] = float(
                    (outputs[-1].float() - base_out.float()).abs().max())
        if opts.device == "cuda":
            outputs += unit_graphs(model, plan, opts, step, row)
        row["outputs_ok"] = all(within_tolerance(o, base_out) for o in outputs)
        # Without the planned graph, eager against eager (said in the row).
        graph_pair = "graph_ms" in row and "planned_graph_ms" in row
        reference = row["graph_ms"] if graph_pair else row["eager_ms"]
        planned = row["planned_graph_ms"] if graph_pair else row["planned_eager_ms"]
        row["compared"] = "graph" if graph_pair else "eager"
        bucket = bucket_of(plan, row["tokens"])
        row.update(strategy=bucket["strategy"], splits=bucket["splits"],
                   predicted=bucket["predicted_speedup"], measured=reference / planned)
        gain = bucket["strategy"] != "sequential" and bucket["predicted_speedup"] >= GAIN
        row["target"] = TARGET_GAIN if gain else TARGET_SEQUENTIAL
        # A split bucket with no module to split measured nothing: a failure.
        splits_nothing = bucket["strategy"] != "sequential" and row["units"] == 0
        row["ran_ok"] = (not splits_nothing and "planned_graph_error" not in row
                         and row["outputs_ok"])
        row["met"] = row["measured"] >= row["target"] and row["ran_ok"]
        rows.append(row)
        print(json.dumps(row), flush=True)
        del model, step
        if opts.device == "cuda":
            torch.cuda.empty_cache()
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dynaflow")
    p.add_argument("--runtime")
    p.add_argument("--out", default=".")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--model", choices=["hf", "example"], default="hf",
                   help="transformers' LlamaForCausalLM (default) or examples/llama_decode.py's")
    p.add_argument("--workload", choices=["prefill", "decode"], help="child mode: one workload")
    p.add_argument("--size", type=int)
    for kind in ("prefill", "decode"):
        p.add_argument(f"--{kind}", metavar="N,N,...",
                       help=f"the {kind} sizes to time (default: all of SIZES)")
    opts = p.parse_args()
    for kind in ("prefill", "decode"):
        if getattr(opts, kind):
            SIZES[opts.device][kind] = [int(n) for n in getattr(opts, kind).split(",")]
    if opts.workload:
        run_workload(opts)
        return 0
    os.makedirs(opts.out, exist_ok=True)
    rows = []
    for kind in ("prefill", "decode"):
        plan = make_plan(opts, kind, SIZES[opts.device][f"{kind}_trace"])
        rows += measure(opts, kind, plan)
    device = torch.cuda.get_device_name() if opts.device == "cuda" else "cpu"
    lines = [f"apply_bench on {device}, torch {torch.__version__}, model {opts.model}; "
             f"reference = "
             + ("baseline in one CUDA graph" if opts.device == "cuda" else "baseline eager"),
             "workload tokens batch | eager ms | graph ms | planned ms | strategy x splits | "
             "modules | predicted | measured (compared) | target | met"]
    for r in rows:
        lines.append(f"{r['workload']} {r['tokens']} {r['batch']} | {r['eager_ms']:.3f} | "
                     f"{r.get('graph_ms', float('nan')):.3f} | "
                     f"{r.get('planned_graph_ms', r['planned_eager_ms']):.3f} | "
                     f"{r['strategy']} x{r['splits']} | {r['units']} | {r['predicted']:.3f} | "
                     f"{r['measured']:.3f} ({r['compared']}) | {r['target']} | "
                     f"{'yes' if r['met'] else 'NO'}")
        if "planned_graph_error" in r:
            lines.append(f"  the planned step was not captured: {r['planned_graph_error']}")
        if "planned_unit_graphs_ms" in r:
            lines.append(f"  apply's own graphs (one per unit and shape): "
                         f"{r['planned_unit_graphs_ms']:.3f} ms, {r['unit_graphs']}")
    if opts.device != "cuda":
        lines.append("a dry run: the targets are not judged on the CPU; the exit code says "
                     "whether every plan split its units with the unmodified outputs")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(opts.out, "summary.txt"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    with open(os.path.join(opts.out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump({"device": device, "rows": rows}, f, indent=1)
    judged = "met" if opts.device == "cuda" else "ran_ok"
    return 0 if all(r[judged] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
