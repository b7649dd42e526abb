"""What the first call of each kind costs under `dynaflow apply`: that call
runs the original way under the row audit (plugin/python/dynaflow/_rows.py,
a torch dispatch mode that follows every operator), and then split on a copy
of its arguments, compared with its unsplit result
(_apply._PlannedForward._split_differs), once per kind; later calls of that
kind split. In one run, alternating, on fresh models each time: a
transformers Llama of 32 layers with tiny widths (its forward is Python and
operator bound, so the audit's per-operator cost shows at its largest),
unplanned, and under a plan that splits its decoder stack with the
comparison (the default) and without it (its copy limit set below any
call's size), under torch.no_grad() and under torch.inference_mode() (where
composite operators such as linear reach the audit undecomposed). Prints the
medians and their ratios to the original.

    .venv/bin/python bench/audit_cost.py build/plugin/apply/libdynaflow_apply.so
"""

import contextlib
import io
import os
import statistics
import sys
import time
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plugin",
                                "python"))

import torch  # noqa: E402
import transformers as tf  # noqa: E402

from dynaflow import _apply  # noqa: E402

RUNS = 7
LAYERS = 32


def llama():
    config = tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                            num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(config).eval()


def stack_plan():
    return {"schema": _apply.PLAN_SCHEMA, "device": {"name": ""},
            "partition_rules": [{"name": "s", "role": "split", "operators": [],
                                 "modules": ["LlamaForCausalLM.model"]}],
            "buckets": [{"min_tokens": 0, "max_tokens": None, "strategy": "nanobatch_overlap",
                         "splits": 2, "rules": ["s"], "streams": []}]}


def first_call_ms(model, ids, mode):
    with mode():
        t = time.perf_counter()
        model(ids)
        return (time.perf_counter() - t) * 1e3


def main():
    torch.set_num_threads(1)
    lib = sys.argv[1]
    ids = torch.randint(0, 128, (4, 32))
    modes = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}
    variants = {"audited": contextlib.nullcontext,
                "not compared": lambda: mock.patch.object(_apply, "_COMPARED_BYTES", -1)}
    samples = {(m, v): [] for m in modes for v in ("original", *variants)}
    for _ in range(RUNS):
        for name, mode in modes.items():
            # The original's second call: warm, as the audited call's model
            # ran nothing before it but its construction and the attach.
            model = llama()
            first_call_ms(model, ids, mode)
            samples[(name, "original")].append(first_call_ms(model, ids, mode))
            for variant, patch in variants.items():
                model = _apply.apply(llama(), stack_plan(), runtime_lib=lib)
                report = model._dynaflow_applier.report
                with patch(), contextlib.redirect_stderr(io.StringIO()) as said:
                    samples[(name, variant)].append(first_call_ms(model, ids, mode))
                assert report.unsplit and not report.refused and report.planned_calls == 0, \
                    (report.unsplit, report.refused)
                assert ("not also run split" in said.getvalue()) == (variant != "audited")
    print(f"transformers Llama, {LAYERS} layers, batch 4 x 32 tokens, median ms of {RUNS} "
          f"fresh models (ratio to the original):")
    for name in modes:
        original = statistics.median(samples[(name, "original")])
        line = f"  {name:15s} original {original:7.1f}"
        for variant in variants:
            ms = statistics.median(samples[(name, variant)])
            line += f"   {variant} first call {ms:7.1f} ({ms / original:4.1f}x)"
        print(line)


if __name__ == "__main__":
    main()
