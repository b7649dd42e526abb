"""Where a replayed planned call's host work goes, part by part: a tiny
transformers Llama's first decoder layer (graph_call_cost.py's third case,
NullGraphs), called with the arguments the model passes it, and each step
of its replayed call timed alone on those arguments (timeit, best of 5 x
5,000 calls, µs per call): the audit key (`_rows.audit_key`), the graph key
(`_graphs._key`: `flatten_inputs` and `_global_modes`), `check_module`, the
module snapshot's comparison, and the whole planned call.

    cd bench && ../.venv/bin/python replay_parts.py ../build/plugin/apply/libdynaflow_apply.so
"""

import sys
import timeit

import torch

import graph_call_cost as gc
from dynaflow import _apply, _graphs, _rows, _split


def best_us(fn):
    return min(timeit.repeat(fn, number=5000, repeat=5)) / 5000 * 1e6


def main():
    torch.set_num_threads(1)
    make, units, x = gc.cases()["transformers Llama, 2 decoder layers, 8 x 16 tokens"]
    with torch.no_grad():
        net = gc.variants(sys.argv[1], make, units, x)["planned, replayed"]
        first = net._dynaflow_applier.forwards[0]
        seen = []
        call = _apply._PlannedForward.__call__

        def keep(forward, *args, **kwargs):
            if forward is first and not seen:
                seen.append((args, kwargs))
            return call(forward, *args, **kwargs)

        _apply._PlannedForward.__call__ = keep
        net(x)
        _apply._PlannedForward.__call__ = call
        args, kwargs = seen[0]
        modules = _split.check_module(first.path, first.module)
        entry = next(e for e in first.graphs.entries.values() if isinstance(e, _graphs._Graph))
        rows = x.shape[0]
        parts = {
            "audit key": lambda: _rows.audit_key(first.module, args, kwargs, rows),
            "graph key": lambda: _graphs._key("kind", args, kwargs, rows, lambda p: True),
            "check_module": lambda: _split.check_module(first.path, first.module),
            "module snapshot compared": lambda: entry.snapshot.same(modules),
            "whole replayed call": lambda: first(*args, **kwargs),
        }
        print(f"{first.path}, {len(modules)} modules, {entry.snapshot.objects} objects and "
              f"{entry.snapshot.tensors} tensors compared (best of 5 x 5,000, µs per call):")
        for name, fn in parts.items():
            print(f"  {name:26s} {best_us(fn):6.1f}")


if __name__ == "__main__":
    main()
