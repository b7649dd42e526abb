"""What the per-call checks cost that run on every planned call before
anything is split: `_apply.traced` (a call recorded by torch.jit.trace,
torch.export or fake tensors runs the original way), `_apply.device_refusal`
(the call's device must be the executor's) and
`_apply.saved_tensor_hooks_refusal` (hooks other than save_on_cpu's keep the
call unsplit), on a [4, 8] CPU tensor: the best of 5 repetitions of 200,000
calls each, in microseconds per call.

    .venv/bin/python bench/refusal_checks.py
"""

import os
import sys
import timeit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plugin",
                                "python"))

import torch  # noqa: E402

from dynaflow import _apply  # noqa: E402

CALLS, REPEATS = 200_000, 5


def per_call_us(fn):
    return min(timeit.repeat(fn, number=CALLS, repeat=REPEATS)) / CALLS * 1e6


def main():
    x = torch.randn(4, 8)
    cpu = torch.device("cpu")
    checks = {
        "traced": lambda: _apply.traced(x),
        "device_refusal": lambda: _apply.device_refusal(x.device, cpu, None),
        "saved_tensor_hooks_refusal": _apply.saved_tensor_hooks_refusal,
    }
    checks["together"] = lambda: (_apply.traced(x), _apply.device_refusal(x.device, cpu, None),
                                  _apply.saved_tensor_hooks_refusal())
    for name, fn in checks.items():
        refusals = fn()
        assert not any(refusals) if isinstance(refusals, tuple) else not refusals, refusals
        print(f"{name}: {per_call_us(fn):.2f} us per call")


if __name__ == "__main__":
    main()
