"""A/B of a replayed planned call's host work (bench/graph_call_cost.py's
three modules, NullGraphs, timed inside the planned forwards) between an
earlier version of the dynaflow package and this checkout's, loaded side by
side in one process (the earlier one as `dynaflow_old`) and alternated, so
that load hits both alike.

    git archive REV plugin/python/dynaflow | tar -x -C /tmp/old
    .venv/bin/python bench/replay_ab.py /tmp/old/plugin/python/dynaflow \\
        build/plugin/apply/libdynaflow_apply.so
"""

import importlib.util
import os
import statistics
import sys

import torch

import graph_call_cost as gc

ROUNDS = 7


def load_old(path):
    """The package at `path` (a dynaflow folder) as `dynaflow_old`; its _apply."""
    spec = importlib.util.spec_from_file_location(
        "dynaflow_old", os.path.join(path, "__init__.py"), submodule_search_locations=[path])
    package = importlib.util.module_from_spec(spec)
    sys.modules["dynaflow_old"] = package
    spec.loader.exec_module(package)
    return importlib.import_module("dynaflow_old._apply")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: replay_ab.py OLD_DYNAFLOW_PACKAGE_DIR RUNTIME_LIB")
    versions = {"old": load_old(sys.argv[1]), "new": gc._apply}
    runtime = sys.argv[2]
    torch.set_num_threads(1)
    timers = {name: gc.InPlanned(apply_module) for name, apply_module in versions.items()}
    with torch.no_grad():
        for case, (make, units, x) in gc.cases().items():
            nets = {name: gc.variants(runtime, make, units, x, apply_module)["planned, replayed"]
                    for name, apply_module in versions.items()}
            samples = {name: [] for name in versions}
            for _ in range(ROUNDS):
                for name in versions:
                    samples[name].append(timers[name].per_call_us(nets[name], x))
            old, new = (statistics.median(samples[name]) for name in versions)
            print(f"{case} ({gc.CALLS} calls x {ROUNDS} rounds, median µs of host work per "
                  f"replayed call): old {old:.1f}, new {new:.1f}, new / old {new / old:.2f}")


if __name__ == "__main__":
    main()
