"""A/B of a region's boundaries in C++ (the replay module's RegionTurns,
plugin/torch/region_turns.h: the stage modules' pre-hook and the
sequencer's turns) against _apply._Region's Python twin, in one run,
alternating (the order swapped every run): bench/apply_overhead.py's 4-block
Stack staggered in 2 as one region of 8 segments, so that every call makes
14 turns (2 micro-batches x 8 segments, less each one's first). Everything
else of the planned call is the same in both (the twin is chosen when the
plan is attached, by leaving out _apply._native_region).

    DYNAFLOW_REPLAY_EXT=build/plugin/torch/_dynaflow_replay.so \\
      .venv/bin/python bench/region_turns_ab.py build/plugin/apply/libdynaflow_apply.so
"""

import os
import statistics
import sys
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "plugin", "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import apply_overhead  # noqa: E402
from dynaflow import _apply  # noqa: E402

RUNS = 9
CALLS = 1000


def main():
    torch.set_num_threads(1)
    lib = sys.argv[1]
    nets = {"C++": _apply.apply(apply_overhead.Stack(), apply_overhead.stack_plan(True),
                                runtime_lib=lib)}
    with mock.patch.object(_apply, "_native_region", lambda *_: None):
        nets["Python"] = _apply.apply(apply_overhead.Stack(), apply_overhead.stack_plan(True),
                                      runtime_lib=lib)
    for variant, net in nets.items():
        native = net._dynaflow_applier.forwards[0].regions[2].native
        if (native is not None) != (variant == "C++"):
            sys.exit(f"{variant}: the region's boundaries are not where this bench needs them "
                     f"(is DYNAFLOW_REPLAY_EXT set?)")
    x = torch.randn(8, 8)
    samples = {variant: [] for variant in nets}
    for run in range(RUNS):
        order = list(nets) if run % 2 == 0 else list(reversed(nets))
        for variant in order:
            samples[variant].append(apply_overhead.per_call_us(nets[variant], x, CALLS))
    for variant, net in nets.items():
        r = net._dynaflow_applier.report.regions["Stack"]
        if r["off_schedule_calls"]:
            sys.exit(f"{variant}: {r['off_schedule_calls']} calls off the schedule")
    c, p = statistics.median(samples["C++"]), statistics.median(samples["Python"])
    print(f"median of {RUNS} runs of {CALLS} calls, us per call of the staggered Stack: "
          f"C++ {c:.1f}  Python {p:.1f}  Python / C++ {p / c:.2f}x")


if __name__ == "__main__":
    main()
