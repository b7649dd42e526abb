"""What `dynaflow apply` adds to a module call on the CPU, in one run:
the original forward, the planned forward in a sequential bucket (the policy
lookup alone), and a planned call split in 2 and 4 micro-batches through the
runtime (its dispatch: the split proved safe, views, two worker threads, the
merge), on a module so small that the overhead dominates; the same split with
the arguments a Hugging Face decoder layer gets (a (cos, sin) tuple, a mask,
a DynamicCache, cache_position: what the split and merge walk), when
transformers is installed; a 4-block stack split in 2 as one unit, its
micro-batches side by side and staggered (8 segments each: the sequencer's
turns at every attention and MLP call); a 32-layer stack of 418 modules
split in 2 (the per-call checks of the unit's modules: hooks, tensors,
Python state); a module with a 1 MiB output split in
2, merged by one concatenation at the end (the CPU default) against merged
into preallocated slices as each micro-batch finishes (`_split.SliceMerge`,
CUDA's way);
and the runtime alone, running no-op Python tasks (ctypes, worker threads, the
GIL) per call.

    .venv/bin/python bench/apply_overhead.py build/plugin/apply/libdynaflow_apply.so
"""

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plugin",
                                "python"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from dynaflow import _apply  # noqa: E402

CALLS, RUNS = 2000, 7
DEEP_CALLS = 200  # calls of the 418-module variants (milliseconds each)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(8, 8)])

    def forward(self, x):
        return self.blocks[0](x)


class WideNet(nn.Module):
    """64 rows in, a 64 x 4096 float32 output (1 MiB): a merge worth measuring."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(64, 4096)])

    def forward(self, x):
        return self.blocks[0](x)


class Slices:
    """Runs a planned call with its outputs merged into slices on the CPU too
    (`_apply.SLICES_ON_CPU`; by default only CUDA does)."""

    def __init__(self, net):
        self.net = net

    def __call__(self, x):
        _apply.SLICES_ON_CPU = True
        try:
            return self.net(x)
        finally:
            _apply.SLICES_ON_CPU = False


class HfLikeNet(nn.Module):
    """Calls its layer the way a transformers decoder calls a decoder layer."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([HfLikeLayer()])
        from transformers import DynamicCache

        self.cache = DynamicCache()
        g = torch.Generator().manual_seed(0)
        for layer in range(2):  # a cache already holding 16 positions
            self.cache.update(torch.randn(8, 2, 16, 4, generator=g),
                              torch.randn(8, 2, 16, 4, generator=g), layer)

    def forward(self, x):
        rows = x.shape[0]
        cos_sin = (torch.ones(rows, 1, 4), torch.zeros(rows, 1, 4))
        mask = torch.ones(rows, 1, 1, 17, dtype=torch.bool)
        return self.blocks[0](x, attention_mask=mask, position_embeddings=cos_sin,
                              past_key_values=self.cache, cache_position=torch.tensor([16]),
                              use_cache=True)


class HfLikeLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, attention_mask=None, position_embeddings=None, past_key_values=None,
                cache_position=None, use_cache=False):
        return self.proj(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(8, 8)
        self.mlp = nn.Linear(8, 8)

    def forward(self, x):
        return x + self.mlp(x + self.attn(x))


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(4)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


class DeepBlock(nn.Module):
    """A decoder layer's module count: attention with four projections and a
    norm, an MLP with three and a norm, an activation (13 modules)."""

    def __init__(self):
        super().__init__()
        self.attn = nn.ModuleDict({k: nn.Linear(8, 8) for k in ("q", "k", "v", "o")})
        self.attn_norm = nn.LayerNorm(8)
        self.mlp = nn.ModuleDict({k: nn.Linear(8, 8) for k in ("gate", "up", "down")})
        self.act = nn.SiLU()
        self.mlp_norm = nn.LayerNorm(8)

    def forward(self, x):
        h = self.attn_norm(x)
        x = x + self.attn["o"](self.attn["q"](h) + self.attn["k"](h) + self.attn["v"](h))
        h = self.mlp_norm(x)
        return x + self.mlp["down"](self.act(self.mlp["gate"](h)) * self.mlp["up"](h))


class Deep(nn.Module):
    """32 such layers (418 modules, 32-layer Llama has 421), split in 2 as
    one unit: what checking the unit's modules on every call costs."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([DeepBlock() for _ in range(32)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def stack_plan(staggered):
    p = plan(2, False)
    p["partition_rules"][0]["modules"] = ["Stack"]
    if staggered:
        p["partition_rules"].append({"name": "t", "role": "stage", "operators": [],
                                     "modules": ["Stack.blocks.*.attn", "Stack.blocks.*.mlp"]})
        p["buckets"][0]["rules"].append("t")
        p["buckets"][0]["segments"] = 8
    return p


def plan(splits, sequential):
    strategy = "sequential" if sequential else "nanobatch_overlap"
    return {"schema": _apply.PLAN_SCHEMA, "device": {"name": ""},
            "partition_rules": [{"name": "s", "role": "split", "operators": [],
                                 "modules": ["Net.blocks.*"]}],
            "buckets": [{"min_tokens": 0, "max_tokens": None, "strategy": strategy,
                         "splits": splits, "rules": ["s"], "streams": []}]}


def per_call_us(net, x, calls=CALLS):
    with torch.inference_mode():
        for _ in range(calls // 20):
            net(x)
        t = time.perf_counter()
        for _ in range(calls):
            net(x)
        return (time.perf_counter() - t) / calls * 1e6


def main():
    torch.set_num_threads(1)
    lib = sys.argv[1]
    x = torch.randn(8, 8)
    wide_x = torch.randn(64, 64)
    nets = {"original": Net()}
    for name, p in [("sequential bucket", plan(2, True)), ("split 2", plan(2, False)),
                    ("split 4", plan(4, False))]:
        nets[name] = _apply.apply(Net(), p, runtime_lib=lib)
    nets["stack, original"] = Stack()
    nets["stack, split 2"] = _apply.apply(Stack(), stack_plan(False), runtime_lib=lib)
    nets["stack, staggered 2"] = _apply.apply(Stack(), stack_plan(True), runtime_lib=lib)
    deep_plan = stack_plan(False)
    deep_plan["partition_rules"][0]["modules"] = ["Deep"]
    nets["deep, original"] = Deep()
    nets["deep, split 2"] = _apply.apply(Deep(), deep_plan, runtime_lib=lib)
    wide_plan = plan(2, False)
    wide_plan["partition_rules"][0]["modules"] = ["WideNet.blocks.*"]
    nets["wide, original"] = WideNet()
    nets["wide, split 2 cat"] = _apply.apply(WideNet(), wide_plan, runtime_lib=lib)
    nets["wide, split 2 slices"] = Slices(_apply.apply(WideNet(), wide_plan, runtime_lib=lib))
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("transformers is not installed: no HF-argument variants")
    else:
        nets["HF args, original"] = HfLikeNet()
        hf_plan = plan(2, False)
        hf_plan["partition_rules"][0]["modules"] = ["HfLikeNet.blocks.*"]
        nets["HF args, split 2"] = _apply.apply(HfLikeNet(), hf_plan, runtime_lib=lib)
    samples = {name: [] for name in nets}
    for _ in range(RUNS):  # alternating, so load changes hit every variant alike
        for name, net in nets.items():
            calls = DEEP_CALLS if name.startswith("deep") else CALLS
            samples[name].append(per_call_us(net, wide_x if name.startswith("wide") else x, calls))
    print(f"{CALLS} calls x {RUNS} runs, median us per module call (added over its original):")
    for name, s in samples.items():
        base = statistics.median(samples[name.split(",")[0] + ", original" if "," in name
                                         else "original"])
        m = statistics.median(s)
        print(f"  {name:20s} {m:8.2f} us  (+{m - base:.2f} us)")
    print("the runtime alone, no-op Python tasks, median us per call:")
    runtime = _apply._Runtime(lib)
    for splits in (1, 2, 4):
        print(f"  {splits} tasks on {splits} streams {runtime_call_us(runtime, splits):8.2f} us")


def runtime_call_us(runtime, splits):
    executor = runtime.executor(False, splits)
    task = _apply._Runtime.TASK_FN(lambda _user, _task, _mb, _stream: 0)
    schedule = runtime.micro_batch_schedule("noop", splits, task)
    runs = []
    for _ in range(RUNS):
        t = time.perf_counter()
        for _ in range(CALLS):
            runtime.run(executor, schedule, 0, True)
        runs.append((time.perf_counter() - t) / CALLS * 1e6)
    return statistics.median(runs)


if __name__ == "__main__":
    main()
