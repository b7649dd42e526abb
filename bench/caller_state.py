"""What carrying the caller's torch state into a micro-batch costs, per
micro-batch, on the CPU: `_apply._PlannedForward._task` run on the calling
thread for an identity module, with the replay module's CallerState (captured
once per call, set around the task: every per-thread torch state) against the
fallback without it (grad or inference mode and autocast entered one by one),
in inference mode. Each variant includes the task's own work (its flag, the
module call, the copy of the caller's context it runs in), which is the same
for both. And what a planned call of 2 micro-batches spends on the caller's
context variables beside the tasks' copies: the ContextState made before and
each micro-batch's context checked against it, with the one variable
transformers' models set (its output collector) in the context.

    .venv/bin/python bench/caller_state.py build/plugin/apply/libdynaflow_apply.so \\
        build/plugin/torch/_dynaflow_replay.so
"""

import contextvars
import os
import statistics
import sys
import time
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plugin",
                                "python"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

CALLS, RUNS = 20000, 7


class Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Identity()])

    def forward(self, x):
        return self.layers[0](x)


def main():
    os.environ["DYNAFLOW_REPLAY_EXT"] = sys.argv[2]
    from dynaflow import _apply, _split

    plan = {"schema": _apply.PLAN_SCHEMA, "device": {"name": ""},
            "partition_rules": [{"name": "s", "role": "split", "operators": [],
                                 "modules": ["Holder.layers.*"]}],
            "buckets": [{"min_tokens": 0, "max_tokens": None, "strategy": "nanobatch_overlap",
                         "splits": 2, "rules": ["s"], "streams": []}]}
    net = _apply.apply(Holder(), plan, runtime_lib=sys.argv[1])
    applier = net._dynaflow_applier
    forward = applier.forwards[0]
    x = torch.randn(4, 8)
    split = types.SimpleNamespace(args=[(x,)], kwargs=[{}], slices=None)

    def per_task_us(caller_state):
        state = {"split": split, "results": [None], "error": None, "region": None,
                 "carried": None, "modes": (True, False, []),
                 "context": contextvars.copy_context(), "contexts": [None]}
        t = time.perf_counter()
        for _ in range(CALLS):
            if caller_state is not None:
                state["carried"] = caller_state()
            if forward._task(state, 0, 0) != 0:
                raise state["error"]
        return (time.perf_counter() - t) / CALLS * 1e6

    collector = contextvars.ContextVar("output_collector", default=None)

    def context_checks_us():
        t = time.perf_counter()
        for _ in range(CALLS):
            context = contextvars.copy_context()
            before = _split.ContextState(context)
            for mb in (context.copy(), context.copy()):
                before.check(mb)
        return (time.perf_counter() - t) / CALLS * 1e6

    context_name = "context checks, per call of 2 (not a task)"
    samples = {"CallerState": [], "grad/inference/autocast one by one": [], context_name: []}
    collector.set({})
    with torch.inference_mode():
        for _ in range(RUNS):  # alternating, so load changes hit both alike
            samples["CallerState"].append(per_task_us(applier.caller_state))
            samples["grad/inference/autocast one by one"].append(per_task_us(None))
            samples[context_name].append(context_checks_us())
    print(f"{CALLS} tasks x {RUNS} runs, median us per micro-batch task:")
    for name, s in samples.items():
        print(f"  {name:44s} {statistics.median(s):6.2f} us  "
              f"({', '.join(f'{v:.2f}' for v in s)})")


if __name__ == "__main__":
    main()
