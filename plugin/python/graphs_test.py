"""Tests of dynaflow._graphs: planned calls captured once per shape and
replayed, through the real runtime library (env DYNAFLOW_APPLY_LIB_BUILT),
compared with the original forwards. On the CPU (the default) the graphs
are a test double of CUDA graphs (FakeGraphs); with
DYNAFLOW_GRAPHS_DEVICE=cuda the same tests run on a GPU with torch's CUDA
graphs (scripts/device/gpu_truth.sh)."""

import dataclasses
import importlib.util
import io
import os
import sys
import unittest
from contextlib import redirect_stderr
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dynaflow import _apply, _graphs, _split  # noqa: E402 - after the path is set

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_TRANSFORMERS = HAS_TORCH and importlib.util.find_spec("transformers") is not None
RUNTIME = os.environ.get("DYNAFLOW_APPLY_LIB_BUILT", "")
# The replay module (_dynaflow_replay.so), which graphs need: found by
# _graphs through DYNAFLOW_REPLAY_EXT, as `dynaflow apply` sets it.
REPLAY = os.environ.get("DYNAFLOW_REPLAY_EXT_BUILT", "")
if REPLAY:
    os.environ["DYNAFLOW_REPLAY_EXT"] = REPLAY
DEVICE = os.environ.get("DYNAFLOW_GRAPHS_DEVICE", "cpu")
# Split GEMMs may take other kernels than the unsplit ones: on a GPU their
# float32 sums differ in the last bits.
TOLERANCE = dict(rtol=1e-5, atol=1e-6) if DEVICE == "cpu" else dict(rtol=1e-4, atol=1e-4)
if HAS_TORCH:
    import torch
    from torch import nn
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves, tree_map

    # Net's blocks write a `cache` argument in place; Holder calls one layer.
    from apply_test import DoubleAddmm, Holder, NegateLinear, Net  # noqa: E402

    # Operators that read a device value on the host: on CUDA they fail a
    # capture ("operation not permitted when stream is capturing").
    _HOST_READS = frozenset({"aten::_local_scalar_dense", "aten::nonzero",
                             "aten::masked_select", "aten::equal", "aten::is_nonzero",
                             "aten::unique_consecutive", "aten::_unique2", "aten::unique_dim"})

    class _Recorder(TorchDispatchMode):
        """The ATen operators a capture issues on its thread, with the
        tensors they were given. They run (the call needs their results to
        go on), but a capture on CUDA runs nothing: what they write in
        tensors made before the capture is put back afterwards (`undo`)."""

        def __init__(self):
            super().__init__()
            self.ops = []
            self.made = set()  # storages of the tensors the capture made
            self.saved = []    # (tensor written, its elements before), in order

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func._schema.name in _HOST_READS:
                raise RuntimeError(f"CUDA error: operation not permitted when stream is "
                                   f"capturing ({func._schema.name}, FakeGraphs)")
            for t in self._written(func, args, kwargs):
                if t.untyped_storage().data_ptr() not in self.made:
                    self.saved.append((t, t.clone()))
            out = func(*args, **kwargs)
            for o in tree_leaves(out):
                if isinstance(o, torch.Tensor) and not any(
                        o.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
                        for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)):
                    self.made.add(o.untyped_storage().data_ptr())
            self.ops.append((func, args, kwargs, out))
            return out

        @staticmethod
        def _written(func, args, kwargs):
            for k, a in enumerate(func._schema.arguments):
                value = args[k] if k < len(args) else kwargs.get(a.name)
                if a.alias_info is not None and a.alias_info.is_write and \
                        isinstance(value, torch.Tensor):
                    yield value

        def undo(self):
            with torch.no_grad():
                for t, before in reversed(self.saved):
                    t.copy_(before)

    class FakeGraphs:
        """A CUDA graph's contract on the CPU. Capture records the ATen
        operators the call issues, on the tensors they were given, leaving
        the memory that existed before it as it was; replay
        runs those operators again on the same tensors and writes each
        fresh result into the tensor the capture made, so a replay runs no
        Python of the call and reads only the memory the capture read: a
        value the call took from anywhere else stays baked in, as on CUDA.
        A host read fails the capture, as on CUDA."""

        def __init__(self):
            self.captures = 0
            self.replays = 0

        @staticmethod
        def accepts(_t):
            return True

        @staticmethod
        def in_capture():
            return False

        def capture(self, fn, _device):
            recorder = _Recorder()
            try:
                with recorder:
                    out = fn()
            finally:
                recorder.undo()
            self.captures += 1
            # A graph holds memory, not tensors: each operator's arguments
            # become aliases of the storage they had at capture, so that a
            # tensor given other memory later (`param.data = ...`) is not
            # followed.
            return [(func, tree_map(_alias, args), tree_map(_alias, kwargs), out)
                    for func, args, kwargs, out in recorder.ops], out

        def replay(self, ops, copy_in, copy_out):
            self.replays += 1
            copy_in()
            # Autocast decided the recorded operators' dtypes at capture.
            with torch.no_grad(), torch.autocast("cpu", enabled=False):
                for func, args, kwargs, out in ops:
                    fresh = func(*args, **kwargs)
                    for o, f in zip(tree_leaves(out), tree_leaves(fresh)):
                        if isinstance(o, torch.Tensor) and o is not f and \
                                o.untyped_storage().data_ptr() != f.untyped_storage().data_ptr():
                            o.copy_(f)  # a view of memory the graph owns is current already
            return copy_out()

    def _alias(t):
        """A new tensor on `t`'s storage, with its offset, sizes and strides."""
        if not isinstance(t, torch.Tensor):
            return t
        alias = torch.empty(0, dtype=t.dtype, device=t.device)
        with torch.no_grad():
            alias.set_(t.untyped_storage(), t.storage_offset(), t.size(), t.stride())
        return alias


def plan(units, splits=2, min_split_tokens=0, stages=None, segments=None):
    """A plan: sequential up to min_split_tokens tokens, then split (with
    `stages` and `segments`: a staggered region)."""
    split = {"min_tokens": min_split_tokens, "max_tokens": None, "strategy": "nanobatch_overlap",
             "splits": splits, "rules": ["split"], "streams": [{"id": 0, "role": "compute"}]}
    rules = [{"name": "split", "role": "split", "operators": [], "modules": units}]
    if stages:
        split["rules"].append("stage")
        split["segments"] = segments
        rules.append({"name": "stage", "role": "stage", "operators": [], "modules": stages})
    buckets = [split]
    if min_split_tokens > 0:
        buckets = [{"min_tokens": 0, "max_tokens": min_split_tokens, "strategy": "sequential",
                    "splits": 1, "rules": [], "streams": [{"id": 0, "role": "compute"}]}, split]
    return {"schema": _apply.PLAN_SCHEMA, "device": {"name": ""}, "partition_rules": rules,
            "buckets": buckets}


def graphed(model, the_plan):
    """The report of `model` with `the_plan` applied, on DEVICE; on the CPU
    FakeGraphs is its graph backend (on CUDA apply makes torch's)."""
    _apply.apply(model, the_plan, runtime_lib=RUNTIME)
    applier = model._dynaflow_applier
    if DEVICE == "cpu":
        applier.graph_backend = FakeGraphs()
    return applier.report


def graphed_twins(unit, calls):
    """(net, reference, inputs, report): Holder(unit()) on DEVICE, graphed
    under a plan that splits its layer; an unplanned Holder(unit()) with the
    same weights; `calls` inputs of 4 rows of 16; the net's report."""
    torch.manual_seed(0)
    net = Holder(unit()).to(DEVICE)
    reference = Holder(unit()).to(DEVICE)
    reference.load_state_dict(net.state_dict())
    inputs = [torch.randn(4, 16, device=DEVICE) for _ in range(calls)]
    return net, reference, inputs, graphed(net, plan(["Holder.layers.*"]))


def close(actual, expected):
    torch.testing.assert_close(actual, expected, **TOLERANCE)


def counts(report):
    return report.graphs_captured, report.graph_replays


def runnable():
    return HAS_TORCH and RUNTIME and REPLAY and (DEVICE == "cpu" or torch.cuda.is_available())


@unittest.skipUnless(runnable(), "needs torch, the runtime library, the replay module and "
                     "DYNAFLOW_GRAPHS_DEVICE")
class GraphsTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.net = Net().to(DEVICE)
        self.err = io.StringIO()
        self.quiet = redirect_stderr(self.err)
        self.quiet.__enter__()
        self.addCleanup(self.quiet.__exit__, None, None, None)

    def calls(self, model, inputs, **kwargs):
        """Runs `model` on each input under no_grad; returns the outputs and
        the original model's (the plan detached meanwhile)."""
        with torch.no_grad():
            return [model(x, **kwargs) for x in inputs]

    def expected(self, inputs, **kwargs):
        with torch.no_grad():
            return [self.net(x, **kwargs) for x in inputs]

    def test_each_kind_warms_up_then_is_captured_once_and_replayed_with_new_inputs(self):
        inputs = [torch.randn(8, 5, 16, device=DEVICE) for _ in range(5)]
        expected = self.expected(inputs)
        report = graphed(self.net, plan(["Net.blocks.*"]))
        actual = self.calls(self.net, inputs)
        for a, e in zip(actual, expected):
            close(a, e)
        # Per block: the audit (original), the warm-up (eager, planned), the
        # capture (then replayed), two replays.
        self.assertEqual(report.original_calls, 3)
        self.assertEqual(report.planned_calls, 12)
        self.assertEqual(counts(report), (3, 9))
        if DEVICE == "cpu":  # what the report counts is what the graphs did
            fake = self.net._dynaflow_applier.graph_backend
            self.assertEqual((fake.captures, fake.replays), (3, 9))
        self.assertEqual(report.graph_eager_calls, {})
        # The replayed outputs are the caller's own: the next replay leaves them.
        before = actual[-1].clone()
        self.calls(self.net, [torch.randn(8, 5, 16, device=DEVICE)])
        torch.testing.assert_close(actual[-1], before, rtol=0, atol=0)

    def test_rows_padded_to_a_power_of_two_share_one_graph(self):
        inputs = [torch.randn(rows, 5, 16, device=DEVICE) for rows in (6, 5, 7, 6, 3, 3, 3)]
        expected = self.expected(inputs)
        report = graphed(self.net, plan(["Net.blocks.*"]))
        actual = self.calls(self.net, inputs)
        for a, e in zip(actual, expected):
            self.assertEqual(a.shape, e.shape)
            close(a, e)
        # 6, 5, 7 and 6 rows are padded to 8: one kind (audit), its warm-up,
        # one capture per block; 3 rows are padded to 4: a second graph.
        graphs = self.net._dynaflow_applier.forwards[0].graphs
        padded = sorted(e.step.padded for e in graphs.entries.values() if isinstance(e, _graphs._Graph))
        self.assertEqual(padded, [4, 8])
        self.assertEqual((report.graphs_captured, report.graph_replays), (6, 12))
        self.assertEqual(report.graph_replays, 12)

    def test_padding_stays_inside_the_call_bucket(self):
        # Splits from 16 tokens (rows x 5): 3 rows padded to 4 would be 20
        # tokens, the same bucket; with the split starting at 16 tokens and
        # 3 rows = 15 tokens sequential, nothing is padded into it.
        rows = _graphs.padded_rows(5, lambda p: p * 5 <= 30)
        self.assertEqual(rows, 5)
        self.assertEqual(_graphs.padded_rows(5, lambda p: True), 8)
        self.assertEqual(_graphs.padded_rows(8, lambda p: True), 8)
        self.assertEqual(_graphs.padded_rows(1, lambda p: True), 1)

    def test_a_host_read_found_by_the_warm_up_keeps_the_unit_eager(self):
        class Gated(nn.Module):
            def __init__(self):
                super().__init__()
                self.gain = nn.Parameter(torch.tensor(2.0))
                self.lin = nn.Linear(16, 16)

            def forward(self, x):
                if self.gain.item() > 1:  # a host read of a device value
                    x = x * 2
                return self.lin(x)

        net = Holder(Gated()).to(DEVICE)
        inputs = [torch.randn(4, 16, device=DEVICE) for _ in range(4)]
        with torch.no_grad():
            expected = [net(x) for x in inputs]
        report = graphed(net, plan(["Holder.layers.*"]))
        actual = self.calls(net, inputs)
        for a, e in zip(actual, expected):
            close(a, e)
        self.assertEqual(report.graphs_captured, 0)
        # No capture is tried: the warm-up, and the two calls after it, ran eagerly.
        why = ("Holder.layers.0: it reads a device value on the host "
               "(aten::_local_scalar_dense), which a capture cannot")
        self.assertEqual(report.graph_eager_calls, {why: 3})
        self.assertEqual(self.err.getvalue().count("runs eagerly, not as a CUDA graph"), 1)
        self.assertEqual(report.planned_calls, 3)
        if DEVICE == "cpu":
            self.assertEqual(net._dynaflow_applier.graph_backend.captures, 0)

    def test_a_capture_that_fails_runs_eagerly_from_then_on(self):
        # A failure the warm-up could not foresee (here, raised by the
        # forward once a global flag is set): the call runs eagerly, once.
        fail = []

        class Flaky(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(16, 16)

            def forward(self, x):
                if fail:
                    raise RuntimeError("operation not permitted when stream is capturing")
                return self.lin(x)

        net = Holder(Flaky()).to(DEVICE)
        inputs = [torch.randn(4, 16, device=DEVICE) for _ in range(4)]
        with torch.no_grad():
            expected = [net(x) for x in inputs]
        report = graphed(net, plan(["Holder.layers.*"]))
        self.calls(net, inputs[:2])  # the audit, the warm-up
        fail.append(True)
        with self.assertRaisesRegex(RuntimeError, "operation not permitted"):
            self.calls(net, inputs[2:3])  # the capture fails; eagerly, so does the call
        fail.clear()
        actual = self.calls(net, inputs[3:])
        close(actual[0], expected[3])
        self.assertEqual(report.graphs_captured, 0)
        why = ("Holder.layers.0: its capture failed: RuntimeError: operation not permitted "
               "when stream is capturing")
        self.assertEqual(report.graph_eager_calls, {why: 2})
        if DEVICE == "cuda":  # the caching allocator is not left inside a capture
            torch.cuda.empty_cache()
            self.assertFalse(torch.cuda.is_current_stream_capturing())

    def test_an_inference_buffer_keeps_the_unit_eager(self):
        class Scaled(nn.Module):
            def __init__(self):
                super().__init__()
                with torch.inference_mode():  # no version counter
                    self.register_buffer("scale", torch.full((16,), 2.0, device=DEVICE))

            def forward(self, x):
                return x * self.scale

        net = Holder(Scaled())
        inputs = [torch.randn(4, 16, device=DEVICE) for _ in range(4)]
        report = graphed(net, plan(["Holder.layers.*"]))
        for out, x in zip(self.calls(net, inputs), inputs):
            close(out, x * 2)
        self.assertEqual(report.graphs_captured, 0)
        self.assertEqual(report.graph_eager_calls, {
            "Holder.layers.0: buffer scale " + _split._UNCHECKABLE: 2})

    def test_one_tensor_returned_at_two_places_keeps_the_unit_eager(self):
        # A replay copies each output out of the graph: two copies, where the
        # call returns one tensor twice.
        class Twice(nn.Module):
            def forward(self, x):
                h = x * 2
                return h, h

        net = Holder(Twice())
        inputs = [torch.randn(4, 16, device=DEVICE) for _ in range(4)]
        report = graphed(net, plan(["Holder.layers.*"]))
        for (a, b), x in zip(self.calls(net, inputs), inputs):
            self.assertIs(a, b)
            close(a, x * 2)
        self.assertEqual(report.graphs_captured, 0)
        self.assertEqual(report.graph_eager_calls, {
            "Holder.layers.0: the call returns one tensor at two places: a replay would return "
            "two copies": 3})  # every call after the audited first

    def test_an_output_viewing_another_keeps_the_unit_eager(self):
        # A vision model's pooled first token beside its hidden states: the
        # eager merge keeps it a view of the merged hidden states, a replay
        # would copy each out.
        class Pooled(nn.Module):
            def forward(self, x):
                h = x * 2
                return h, h[:, 0]

        net = Holder(Pooled())
        inputs = [torch.randn(4, 16, device=DEVICE) for _ in range(4)]
        report = graphed(net, plan(["Holder.layers.*"]))
        for (h, pooled), x in zip(self.calls(net, inputs), inputs):
            self.assertEqual(pooled.untyped_storage().data_ptr(), h.untyped_storage().data_ptr())
            close(pooled, x[:, 0] * 2)
        self.assertEqual(report.graphs_captured, 0)
        self.assertEqual(report.graph_eager_calls, {
            "Holder.layers.0: an output is a view of another (`h[:, 0]` beside `h`): a replay "
            "would return two copies": 3})

    def test_calls_under_autograd_run_eagerly_said_once(self):
        inputs = [torch.randn(4, 5, 16, device=DEVICE) for _ in range(3)]
        expected = [self.net(x) for x in inputs]
        report = graphed(self.net, plan(["Net.blocks.0"]))
        actual = [self.net(x) for x in inputs]
        for a, e in zip(actual, expected):
            close(a, e)
        self.assertTrue(actual[-1].requires_grad)
        self.assertEqual(report.graphs_captured, 0)
        self.assertEqual(list(report.graph_eager_calls.values()), [2])
        self.assertIn("autograd is recording", self.err.getvalue())
        self.assertEqual(self.err.getvalue().count("runs eagerly"), 1)

    def test_calls_under_a_torch_mode_run_eagerly_said_once(self):
        # A replay runs no operator a mode could see: it would compute what
        # the capture did, without the mode.
        inputs = [torch.randn(8, 5, 16, device=DEVICE) for _ in range(4)]
        with torch.no_grad(), NegateLinear():
            negated = self.net(inputs[-1])
        with torch.no_grad(), DoubleAddmm():
            doubled = self.net(inputs[-1])
        report = graphed(self.net, plan(["Net.blocks.0"]))
        self.calls(self.net, inputs)  # the audit, the warm-up, the capture, a replay
        self.assertEqual(counts(report), (1, 2))
        with NegateLinear():
            close(self.calls(self.net, inputs[-1:])[0], negated)
        with DoubleAddmm():
            close(self.calls(self.net, inputs[-1:])[0], doubled)
        self.assertEqual(counts(report), (1, 2))
        self.assertEqual(list(report.graph_eager_calls.values()), [1, 1])
        self.assertIn("a torch function mode is active (a TorchFunctionMode, torch.device), "
                      "which a replay would not see", self.err.getvalue())
        self.calls(self.net, inputs[-1:])  # without: replayed again
        self.assertEqual(counts(report), (1, 3))

    def test_an_argument_written_in_place_is_bound_not_copied(self):
        inputs = [torch.randn(4, 5, 16, device=DEVICE) for _ in range(4)]
        expected, cache = torch.zeros(4, 1, 16, device=DEVICE), torch.zeros(4, 1, 16, device=DEVICE)
        self.expected(inputs, cache=expected)
        report = graphed(self.net, plan(["Net.blocks.*"]))
        self.calls(self.net, inputs, cache=cache)
        # The replays wrote the program's cache itself.
        close(cache, expected)
        self.assertEqual(counts(report), (3, 6))
        self.assertEqual(report.graph_eager_calls, {})
        # Another cache tensor is other memory than the graph's: eager, said.
        other = torch.zeros(4, 1, 16, device=DEVICE)
        self.calls(self.net, inputs[:1], cache=other)
        close(other, self.expected_cache(inputs[0]))
        self.assertEqual(report.graph_replays, 6)
        self.assertIn("Net.blocks.0: argument cache, which the call writes in place, is not "
                      "the memory its graph was captured with", report.graph_eager_calls)

    def expected_cache(self, x):
        """The cache the unplanned net leaves after one call on `x`."""
        applier = self.net._dynaflow_applier
        applier.detach()
        cache = torch.zeros(x.shape[0], 1, 16, device=DEVICE)
        self.expected([x], cache=cache)
        return cache

    def test_a_graph_whose_modules_changed_is_captured_again(self):
        import copy

        reference = copy.deepcopy(self.net)
        inputs = [torch.randn(4, 5, 16, device=DEVICE) for _ in range(8)]
        report = graphed(self.net, plan(["Net.blocks.0"]))
        self.calls(self.net, inputs[:4])  # audit, warm-up, capture, replay
        self.assertEqual(counts(report), (1, 2))
        # A weight rebound: the graph holds the old one's memory.
        for net in (self.net, reference):
            with torch.no_grad():
                net.blocks[0].up.weight = nn.Parameter(net.blocks[0].up.weight * 2)
        with torch.no_grad():
            expected = [reference(x) for x in inputs[4:]]
        actual = self.calls(self.net, inputs[4:])
        for a, e in zip(actual, expected):
            close(a, e)
        why = ("Net.blocks.0: its modules changed since its graph was captured (a tensor rebound "
               "or moved, an attribute set): captured again")
        self.assertEqual(report.graph_eager_calls, {why: 1})
        # The stale call found it and ran as the warm-up; then a capture, two replays.
        self.assertEqual(counts(report), (2, 5))
        # A weight written in place: the graph reads its memory, and replays.
        for net in (self.net, reference):
            with torch.no_grad():
                net.blocks[0].up.weight.mul_(0.5)
        with torch.no_grad():
            close(self.calls(self.net, inputs[:1])[0], reference(inputs[0]))
        self.assertEqual(counts(report), (2, 6))
        # An attribute set: found at the next call; set again after that
        # call's warm-up, found before the capture.
        self.net.blocks[0].extra = "set"
        self.calls(self.net, inputs[:1])  # stale: the warm-up
        self.net.blocks[0].extra = "set again"
        self.calls(self.net, inputs[:3])  # the warm-up again, a capture, a replay
        self.assertEqual(report.graph_eager_calls, {why: 2})
        self.assertEqual(counts(report), (3, 8))

    def test_verify_compares_replays_and_a_stale_graph_is_dropped_too(self):
        inputs = [torch.randn(4, 5, 16, device=DEVICE) for _ in range(6)]
        _apply.apply(self.net, plan(["Net.blocks.0"]), verify=True, runtime_lib=RUNTIME)
        applier = self.net._dynaflow_applier
        if DEVICE == "cpu":
            applier.graph_backend = FakeGraphs()
        report = applier.report
        self.calls(self.net, inputs[:4])  # audit, warm-up, capture, replay: each verified
        self.assertEqual(counts(report), (1, 2))
        with torch.no_grad():
            self.net.blocks[0].down.bias.add_(1.0)  # in place: the graph reads it as it is
        self.calls(self.net, inputs[4:5])
        self.assertEqual(counts(report), (1, 3))
        self.net.blocks[0].down.bias = nn.Parameter(self.net.blocks[0].down.bias + 1)
        self.calls(self.net, inputs[5:])  # stale: the warm-up
        self.assertEqual(counts(report), (1, 3))
        self.assertEqual(len(report.graph_eager_calls), 1)
        self.assertEqual(report.verified_calls, 5)
        self.assertTrue(report.verify_ok, report.worst)

    def test_what_the_forward_reads_beside_its_arguments_is_checked(self):
        # A config's field, a parameter given other memory by `.data =`
        # (neither rebinds nor bumps a version), autocast's dtype: each
        # changes what the call computes, so a graph of the old one must go.
        class Config:
            def __init__(self):
                self.scale = 1.0
                self.rope = {"factors": [1.0]}  # read two levels down

        class Scaled(nn.Module):
            def __init__(self):
                super().__init__()
                self.config = Config()
                self.lin = nn.Linear(16, 16)

            def forward(self, x):
                return self.lin(x) * self.config.scale * self.config.rope["factors"][0]

        torch.manual_seed(0)
        net = Holder(Scaled()).to(DEVICE)
        reference = Holder(Scaled()).to(DEVICE)
        reference.load_state_dict(net.state_dict())
        x = torch.randn(4, 16, device=DEVICE)
        report = graphed(net, plan(["Holder.layers.*"]))
        self.calls(net, [x] * 4)  # audit, warm-up, capture, replay
        self.assertEqual(counts(report), (1, 2))

        def changed(change):
            """Four calls after `change`, each as the unplanned model's."""
            for model in (net, reference):
                change(model.layers[0])
            with torch.no_grad():
                for _ in range(4):
                    close(net(x), reference(x))

        changed(lambda m: setattr(m.config, "scale", 3.0))
        changed(lambda m: m.config.rope["factors"].__setitem__(0, 0.5))
        with torch.no_grad():
            changed(lambda m: setattr(m.lin.weight, "data", m.lin.weight.data * 2))
        # Each change found at the next call: dropped, warmed up, captured
        # again, replayed twice more.
        self.assertEqual(report.graph_eager_calls, {
            "Holder.layers.0: its modules changed since its graph was captured (a tensor "
            "rebound or moved, an attribute set): captured again": 3})
        self.assertEqual(counts(report), (4, 11))
        if DEVICE == "cpu":  # autocast's dtype is part of the key
            with torch.no_grad():
                for dtype in (torch.bfloat16, torch.float16):
                    with torch.autocast("cpu", dtype=dtype):
                        outs = [net(x) for _ in range(4)]
                    self.assertEqual({o.dtype for o in outs}, {dtype})

    def test_a_dataclass_output_that_reads_its_tensors_is_replayed(self):
        @dataclasses.dataclass
        class Out:
            x: torch.Tensor
            rows: int = dataclasses.field(init=False, default=0)

            def __post_init__(self):
                self.rows = self.x.shape[0]  # reads its tensor when built

        class Unit(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(16, 16)

            def forward(self, x):
                return Out(self.lin(x))

        net, reference, inputs, report = graphed_twins(Unit, 5)
        for out, x in zip(self.calls(net, inputs), inputs):
            with torch.no_grad():
                close(out.x, reference(x).x)
            self.assertEqual(out.rows, 4)
        self.assertEqual(counts(report), (1, 3))
        self.assertEqual(report.graph_eager_calls, {})

    def test_modules_whose_objects_cannot_be_read_run_eagerly(self):
        class Unreadable:
            """Kept as an attribute; reading its fields raises."""

            def __getattribute__(self, name):
                if name == "__dict__":
                    raise RuntimeError("no fields")
                return object.__getattribute__(self, name)

        class Odd(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(16, 16)
                self.odd = Unreadable()

            def forward(self, x):
                return self.lin(x)

        net, reference, inputs, report = graphed_twins(Odd, 4)
        for out, x in zip(self.calls(net, inputs), inputs):
            with torch.no_grad():
                close(out, reference(x))
        self.assertEqual(counts(report), (0, 0))
        # The audit, then the warm-up (which finds it) and two calls eager.
        self.assertEqual(report.graph_eager_calls, {
            "Holder.layers.0: its modules cannot be compared with a graph's (RuntimeError: no "
            "fields)": 3})

    def test_argument_writes_the_warm_up_cannot_see_are_written_back(self):
        # A write the warm-up's dispatch mode cannot see (on CUDA, a kernel
        # launched outside torch's dispatcher), played here by a watch that
        # sees none: the graph writes its own copy of the argument. Its
        # first replay finds that, writes it back, and the key runs eagerly.
        watch = _graphs._watch

        class Nothing(set):
            def add(self, _storage):
                pass

        def blind(accepts):
            mode = watch(accepts)
            mode.written = Nothing()
            return mode

        inputs = [torch.randn(4, 5, 16, device=DEVICE) for _ in range(5)]
        expected, cache = torch.zeros(4, 1, 16, device=DEVICE), torch.zeros(4, 1, 16, device=DEVICE)
        self.expected(inputs, cache=expected)
        report = graphed(self.net, plan(["Net.blocks.0"]))
        with mock.patch.object(_graphs, "_watch", blind):
            self.calls(self.net, inputs, cache=cache)
        close(cache, expected)
        why = ("Net.blocks.0: argument cache is written by the call outside torch's dispatcher, "
               "which a graph would write into its own copy")
        # The call whose replay found it, and the two after it.
        self.assertEqual(report.graph_eager_calls, {why: 3})
        self.assertEqual(counts(report), (1, 1))

    def test_calls_whose_keys_never_repeat_stop_warming_up(self):
        class Positioned(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("two", torch.tensor(2.0))  # puts the model on DEVICE

            def forward(self, x, start):
                return x * self.two + start

        net = Holder(Positioned()).to(DEVICE)
        report = graphed(net, plan(["Holder.layers.*"]))
        x = torch.randn(4, 3, device=DEVICE)
        with torch.no_grad():
            outs = [net(x, start) for start in range(12)]  # a Python int: a key per call
        close(outs[-1], x * 2 + 11)
        why = ("Holder.layers.0: its calls' shapes or plain values keep changing (8 kinds "
               "seen once and never again: a position passed as a Python int, say); from then "
               "on a kind is warmed up at its second call")
        self.assertEqual(report.graph_eager_calls, {why: 3})  # calls 10 to 12
        self.assertEqual(counts(report), (0, 0))
        # A kind that comes again is warmed up at its second call, then captured.
        with torch.no_grad():
            outs = [net(x, 100) for _ in range(4)]
        close(outs[-1], x * 2 + 100)
        self.assertEqual(report.graph_eager_calls, {why: 4})
        self.assertEqual(counts(report), (1, 2))

    def test_the_graph_count_per_unit_is_bounded(self):
        report = graphed(self.net, plan(["Net.blocks.0"]))
        with mock.patch.object(_graphs, "MAX_GRAPHS_PER_UNIT", 1):
            outs = self.calls(self.net, [torch.randn(rows, 5, 16, device=DEVICE)
                                         for rows in (4, 4, 4, 2, 2)])
        # 4 rows: the audit, the warm-up, the capture; 2 rows: past the bound.
        self.assertEqual(report.graphs_captured, 1)
        self.assertEqual(report.graph_eager_calls,
                         {"Net.blocks.0: more than 1 shapes of its calls": 2})
        self.assertEqual(outs[-1].shape, (2, 5, 4))

    def test_a_staggered_region_is_captured_from_one_thread(self):
        inputs = [torch.randn(4, 5, 16, device=DEVICE) for _ in range(4)]
        expected = self.expected(inputs)
        report = graphed(self.net, plan(["Net"], stages=["Net.blocks.*"], segments=3))
        actual = self.calls(self.net, inputs)
        for a, e in zip(actual, expected):
            close(a, e)
        self.assertEqual(counts(report), (1, 2))
        region = report.regions["Net"]
        # The warm-up and the capture were issued inline, from one thread;
        # replays issue nothing from the host.
        self.assertEqual((region["calls"], region["off_schedule_calls"],
                          region["calls_issued_by_micro_batch"]), (2, 0, 2))

    def test_a_cpu_argument_cannot_be_graphed_on_cuda(self):
        graphs = _graphs.UnitGraphs("M", _graphs.CudaGraphs(), _apply.Report(), lambda _m: None)
        x = torch.ones(4, 2)
        split = mock.Mock(states=[], bounds=[0, 2, 4], row_views={1: (x, 0), 2: (x, 1)})
        with torch.no_grad():
            self.assertIsNone(graphs.prepare("kind", split, (x,), {}, lambda p: True))
        self.assertEqual(graphs.report.graph_eager_calls,
                         {"M: argument 0 is on cpu: a graph would keep its first value": 1})

    def test_the_warm_up_watch_sees_writes_and_host_reads(self):
        x, y, out = torch.randn(3, 4), torch.randn(3, 4), torch.empty(3, 4)

        def watched(fn):
            watch = _graphs._watch(lambda t: True)
            with watch:
                fn()
            return watch

        storage = lambda t: t.untyped_storage().data_ptr()  # noqa: E731
        w = watched(lambda: (x[:1].add_(1), torch.add(x, 1, out=out), y * 2))
        self.assertEqual(w.written, {storage(x), storage(out)})  # not y: only read
        self.assertEqual(w.host_read, "")
        for fn, read in [(lambda: x.sum().item(), "aten::_local_scalar_dense"),
                         (lambda: torch.nonzero(x > 0), "aten::nonzero"),
                         (lambda: x.repeat_interleave(torch.tensor([1, 2, 1]), dim=0),
                          "aten::repeat_interleave"),
                         (lambda: x.repeat_interleave(2, dim=0), ""),
                         (lambda: x.repeat_interleave(torch.tensor([1, 2, 1]), dim=0,
                                                      output_size=4), "")]:
            self.assertEqual(watched(fn).host_read, read)
        # Only reads of the backend's tensors count (on CUDA: device tensors).
        watch = _graphs._watch(lambda t: False)
        with watch:
            x.sum().item()
        self.assertEqual(watch.host_read, "")
        # A higher-order operator runs, its body unseen (torch raised on it).
        w = watched(lambda: torch.cond(y.sum() > 0, lambda t: t.add_(1), lambda t: t.sub_(1),
                                       (x,)))
        self.assertEqual(w.unseen, "cond")

    def test_arguments_flatten_into_a_key_of_shapes_and_values(self):
        x, pos = torch.ones(3, 4), torch.arange(4)
        parts, leaves, stateful = _graphs.flatten_inputs(
            (x,), {"pos": pos, "scale": 0.5, "t": (x, None)}, 3)
        self.assertEqual([(tuple(leaf.tensor.shape), leaf.rows, leaf.where) for leaf in leaves],
                         [((3, 4), True, "argument 0"), ((4,), False, "argument pos"),
                          ((3, 4), True, "argument t[0]")])
        self.assertEqual(parts[0], (True, (4,), torch.float32, x.device))  # rows left out
        self.assertIn((float, 0.5), parts)
        self.assertFalse(stateful)
        with self.assertRaisesRegex(_graphs.NoGraph, r"argument cache is a object"):
            _graphs.flatten_inputs((), {"cache": object()}, 3)
        # 3 rows pad to 4 within the bucket; the key holds the padded count.
        key, _, padded = _graphs._key("kind", (x,), {}, 3, lambda p: True)
        self.assertEqual((key[0], key[2], padded), ("kind", 4, 4))


@unittest.skipUnless(HAS_TORCH and REPLAY, "needs torch and the replay module")
class ReplayModuleTest(unittest.TestCase):
    """The C++ side of a replay (plugin/torch/replay_module.cc) called as
    _graphs calls it: what a module snapshot sees change, and the copies."""

    def setUp(self):
        class Config:
            def __init__(self):
                self.scale = 1.0
                self.rope = {"factors": [1.0, 2.0]}
                self.deep = {"a": {"b": {"c": 1}}}  # c: four levels down

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.config = Config()
                self.lin = nn.Linear(4, 4)
                self.register_buffer("mask", torch.ones(4))
                self.order = [0, 1]

        self.block = Block()
        self.pairs = [("block", self.block), ("block.lin", self.block.lin)]

    def unchanged_after(self, change):
        snapshot = _graphs._snapshot(self.pairs)
        self.assertTrue(snapshot.same(self.pairs))
        change(self.block)
        return snapshot.same(self.pairs)

    def test_a_snapshot_counts_what_it_compares(self):
        snapshot = _graphs._snapshot(self.pairs)
        # Tensors: lin's weight and bias, the block's mask.
        self.assertEqual(snapshot.tensors, 3)
        block_attributes, lin_attributes = len(vars(self.block)), len(vars(self.block.lin))
        # Names and values of both modules' attributes, order's two items,
        # the config's fields (3 names, 3 values) and below: rope's key and
        # list and its 2 items, deep's a, b, c levels (key and value each).
        config = 6 + 2 + 2 + 2 + 2
        self.assertEqual(snapshot.objects, 2 * (block_attributes + lin_attributes) + 2 + config)

    def test_what_changes_a_snapshot(self):
        self.assertFalse(self.unchanged_after(lambda b: setattr(b, "extra", 1)))
        self.assertFalse(self.unchanged_after(lambda b: b.order.__setitem__(0, 5)))
        self.assertFalse(self.unchanged_after(lambda b: setattr(b.config, "scale", 2.0)))
        self.assertFalse(self.unchanged_after(lambda b: b.config.rope["factors"].append(3.0)))
        self.assertFalse(self.unchanged_after(lambda b: b.config.rope.__setitem__("x", 1)))
        self.assertFalse(self.unchanged_after(
            lambda b: setattr(b.lin.weight, "data", b.lin.weight.data.clone())))
        self.assertFalse(self.unchanged_after(lambda b: setattr(b, "mask", torch.zeros(4))))
        self.assertFalse(self.unchanged_after(
            lambda b: setattr(b.lin.weight, "data", b.lin.weight.data.t())))  # strides
        with torch.no_grad():
            self.assertFalse(self.unchanged_after(lambda b: b.mask.resize_(2)))  # shape

    def test_what_does_not_change_a_snapshot(self):
        # A graph reads the weights' memory: an in-place write needs no new
        # graph. A config's fourth level is beyond kDepth (documented).
        with torch.no_grad():
            self.assertTrue(self.unchanged_after(lambda b: b.lin.weight.mul_(2)))
        self.assertTrue(self.unchanged_after(
            lambda b: b.config.deep["a"]["b"].__setitem__("c", 2)))

    def test_objects_that_cannot_be_read_give_no_graph(self):
        class Unreadable:
            """An object kept as an attribute whose fields raise when read."""

            def __init__(self):
                self.fields = True

            def __getattribute__(self, name):
                if name == "__dict__" and object.__getattribute__(self, "fields") is None:
                    raise RuntimeError("fields withdrawn")
                return object.__getattribute__(self, name)

        self.block.config = Unreadable()
        snapshot = _graphs._snapshot(self.pairs)
        object.__setattr__(self.block.config, "fields", None)  # its __dict__ now raises
        self.assertFalse(_graphs._unchanged(snapshot, self.pairs))
        with self.assertRaisesRegex(_graphs.NoGraph, r"^its modules cannot be compared with a "
                                    r"graph's \(RuntimeError: fields withdrawn\)$"):
            _graphs._snapshot(self.pairs)

    def test_entries_moved_between_containers_change_a_snapshot(self):
        # The same objects in the same order, in other containers: the
        # containers' sizes tell them apart.
        y = object()
        self.block.order = ["extra", y]
        self.assertFalse(self.unchanged_after(lambda b: (b.order.clear(), setattr(b, "extra", y))))
        self.block.config.rope = {"factors": [1.0, 2.0], "factor": 2.0}
        self.assertFalse(self.unchanged_after(
            lambda b: setattr(b.config, "factor", b.config.rope.pop("factor"))))
        self.block.order, self.block.later = [1, 2], []
        self.assertFalse(self.unchanged_after(lambda b: b.later.append(b.order.pop())))

    def test_a_container_changed_while_walked_is_not_the_same(self):
        class Growing:
            """Reading its fields appends to `grow` (Python code the walk
            runs, as transformers' configs have a __getattribute__)."""

            grow = None

            def __init__(self):
                self.x = 1

            def __getattribute__(self, name):
                if name == "__dict__" and Growing.grow is not None:
                    Growing.grow.extend(Growing() for _ in range(1000))
                return object.__getattribute__(self, name)

        self.block.config.items = [Growing(), Growing()]
        snapshot = _graphs._snapshot(self.pairs)
        Growing.grow = self.block.config.items
        try:
            self.assertFalse(_graphs._unchanged(snapshot, self.pairs))
            with self.assertRaisesRegex(_graphs.NoGraph, r"\(RuntimeError: a container of the "
                                        r"modules changed while it was compared\)$"):
                _graphs._snapshot(self.pairs)
        finally:
            Growing.grow = None

    def test_other_modules_are_not_the_same(self):
        snapshot = _graphs._snapshot(self.pairs)
        self.assertFalse(snapshot.same(self.pairs[:1]))
        self.assertFalse(snapshot.same([("block", self.block), ("block.lin", nn.Linear(4, 4))]))
        with self.assertRaisesRegex(ValueError, "pairs"):
            snapshot.same([self.block])

    def test_without_the_module_graphs_are_off_with_the_reason(self):
        missing = "/nonexistent/_dynaflow_replay.so"
        for path, why in [("", r"^no replay module \(DYNAFLOW_REPLAY_EXT is not set"),
                          (missing, rf"^cannot load the replay module {missing}: "),
                          (__file__, rf"^cannot load the replay module {__file__}: ")]:
            with mock.patch.dict(os.environ), mock.patch.object(_graphs, "_NATIVE", []):
                os.environ["DYNAFLOW_REPLAY_EXT"] = path
                with self.assertRaisesRegex(_graphs.NoGraph, why):
                    _graphs.CudaGraphs()
        self.assertTrue(_graphs._NATIVE)  # the loaded module is kept

    def test_a_kind_out_of_range_is_an_error(self):
        native, _ = _graphs._native()
        kinds = native.TypeKinds(lambda t: 7)
        with self.assertRaisesRegex(ValueError, r"kind_of\(int\) gave 7"):
            kinds.of(1)
        with self.assertRaises(TypeError):  # a snapshot needs its kinds
            native.ModuleSnapshot(self.pairs, None, frozenset())
        self.assertEqual(native.TypeKinds(_graphs._kind).of([1]), _graphs._CONTAINER)

    def test_copies_into_padded_inputs_and_out_of_outputs(self):
        native, _ = _graphs._native()
        rows_static, fixed_static = torch.full((4, 2), -1.0), torch.zeros(3)
        bound = torch.zeros(4, 2)
        step = native.ReplayStep([rows_static, fixed_static, bound],
                                 [native.ReplayStep.ROWS, 0,
                                  native.ReplayStep.ROWS | native.ReplayStep.BOUND], 4)
        x, pos = torch.arange(6.0).reshape(3, 2), torch.tensor([1.0, 2.0, 3.0])
        step.copy_in([x, pos, torch.ones(3, 2)], 3)
        self.assertTrue(torch.equal(rows_static[:3], x))
        self.assertEqual(rows_static[3].tolist(), [-1.0, -1.0])  # the padding row kept
        self.assertTrue(torch.equal(fixed_static, pos))
        self.assertEqual(bound.sum().item(), 0.0)  # the program's tensor: not copied
        # Outputs: [rows, ...] and a flattened [rows * 2, ...].
        out, flat = torch.arange(8.0).reshape(4, 2), torch.arange(8.0)
        step.set_outputs([out, flat])
        copies = step.copy_out(3)
        self.assertEqual([c.shape[0] for c in copies], [3, 6])
        self.assertTrue(torch.equal(copies[1], flat[:6]))
        out.zero_()
        self.assertEqual(copies[0][2].tolist(), [4.0, 5.0])  # a copy, not a view
        with self.assertRaisesRegex(RuntimeError, "a call of 5 rows cannot replay a graph of 4"):
            step.copy_in([x, pos, x], 5)
        with self.assertRaisesRegex(RuntimeError, "2 leaves for a graph of 3"):
            step.copy_in([x, pos], 3)
        with self.assertRaisesRegex(RuntimeError, "output 0 does not hold a multiple of 4 rows"):
            step.set_outputs([torch.zeros(3)])


@unittest.skipUnless(runnable(), "needs torch, the runtime library, the replay module and "
                     "DYNAFLOW_GRAPHS_DEVICE")
class ExampleDecoderGraphsTest(unittest.TestCase):
    """examples/llama_decode.py's decoder: a stack called with a KV cache (a
    dataclass of per-layer lists of preallocated tensors) that each layer
    writes in place, under inference_mode, as a server's decode step."""

    def test_decode_steps_replay_into_the_program_cache(self):
        import argparse

        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                        "examples"))
        import llama_decode as ld

        parser = argparse.ArgumentParser()
        ld.add_model_args(parser)
        args = parser.parse_args(["--hidden", "64", "--heads", "4", "--kv-heads", "2",
                                  "--vocab", "128", "--device", DEVICE,
                                  "--dtype", "float32"])
        ld.check_model_args(parser, args)
        err = io.StringIO()

        def run(model, inference_cache):
            """A prefill of 6 positions, then 4 decode steps at position 6 (the same
            shape and cache each time); the logits of each call and the cache
            (made in inference mode, its tensors have no version counters)."""
            g = torch.Generator().manual_seed(1)
            with torch.inference_mode(inference_cache):
                cache = ld.KVCache.empty(args.layers, 4, args.kv_heads, 8, 16, args.dtype, DEVICE)
            with torch.inference_mode():
                logits = [model(torch.randint(128, (4, 6), generator=g).to(DEVICE), 0, cache)]
                logits += [model(torch.randint(128, (4, 1), generator=g).to(DEVICE), 6, cache)
                           for _ in range(4)]
            return logits, cache

        for inference_cache in (False, True):
            with self.subTest(inference_cache=inference_cache):
                expected, expected_cache = run(ld.build_model(args, 8), inference_cache)
                model = ld.build_model(args, 8)
                with redirect_stderr(err):
                    report = graphed(model, plan(["LlamaForCausalLM.model.layers.*"]))
                    actual, cache = run(model, inference_cache)
                for a, e in zip(actual, expected):
                    close(a, e)
                for a, e in zip(cache.k + cache.v, expected_cache.k + expected_cache.v):
                    close(a, e)
                # Per layer: the prefill and the first decode step audited, the
                # second the warm-up, the third captured and replayed, the
                # fourth replayed.
                self.assertEqual(counts(report), (2, 4))
                self.assertEqual(report.graph_eager_calls, {})
                self.assertEqual(report.refused, "")


@unittest.skipUnless(HAS_TRANSFORMERS and runnable(), "needs transformers, the runtime "
                     "library, the replay module and DYNAFLOW_GRAPHS_DEVICE")
class TransformersGraphsTest(unittest.TestCase):
    """A tiny transformers Llama (random weights, built from a config): its
    decoder layers graphed with attention masks and rotary embeddings as
    arguments; a KV cache keeps its calls eager."""

    def setUp(self):
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=64)
        self.model = LlamaForCausalLM(config).eval().to(DEVICE)
        self.err = io.StringIO()
        quiet = redirect_stderr(self.err)
        quiet.__enter__()
        self.addCleanup(quiet.__exit__, None, None, None)

    def test_decoder_layers_replay_with_the_unmodified_logits(self):
        inputs = [torch.randint(0, 128, (rows, 12), device=DEVICE) for rows in (4, 4, 3, 4, 3)]
        with torch.no_grad():
            expected = [self.model(ids, use_cache=False).logits for ids in inputs]
        report = graphed(self.model, plan(["LlamaForCausalLM.model.layers.*"]))
        with torch.no_grad():
            actual = [self.model(ids, use_cache=False).logits for ids in inputs]
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)
        self.assertEqual(report.refused, "")
        self.assertEqual(report.graph_eager_calls, {})
        # 3 rows pad to 4: one graph per layer; calls 3 to 5 replay.
        self.assertEqual(counts(report), (2, 6))

    def test_static_cache_decode_replays_into_the_cache(self):
        from transformers import StaticCache

        def run(model):
            """A prefill of 6 positions into a StaticCache, then 6 greedy decode
            steps: the logits of each call, and the cache's keys."""
            g = torch.Generator().manual_seed(2)
            ids = torch.randint(0, 128, (4, 6), generator=g).to(DEVICE)
            cache = StaticCache(config=model.config, max_cache_len=16)
            logits = []
            with torch.no_grad():
                for step in range(7):
                    start = 0 if step == 0 else 5 + step
                    positions = torch.arange(start, start + ids.shape[1], device=DEVICE)
                    out = model(ids, past_key_values=cache, cache_position=positions,
                                use_cache=True)
                    logits.append(out.logits)
                    ids = out.logits[:, -1:].argmax(-1)
            return logits, [layer.keys for layer in cache.layers]

        expected, expected_keys = run(self.model)
        report = graphed(self.model, plan(["LlamaForCausalLM.model.layers.*"]))
        actual, keys = run(self.model)
        for a, e in zip(actual, expected):
            close(a, e)
        for a, e in zip(keys, expected_keys):
            close(a, e)
        self.assertEqual(report.refused, "")
        self.assertEqual(report.graph_eager_calls, {})
        # Per layer: the prefill and the first decode step audited, the second
        # the warm-up, the third captured; three more replayed.
        self.assertEqual(counts(report), (2, 8))

    def test_generate_with_a_static_cache_gives_the_unmodified_tokens(self):
        ids = torch.randint(0, 128, (4, 6), generator=torch.Generator().manual_seed(3))
        ids = ids.to(DEVICE)

        def generate():
            return [self.model.generate(ids, max_new_tokens=8, do_sample=False,
                                        cache_implementation="static", pad_token_id=0)
                    for _ in range(2)]

        expected = generate()
        report = graphed(self.model, plan(["LlamaForCausalLM.model.layers.*"]))
        for a, e in zip(generate(), expected):
            self.assertTrue(torch.equal(a, e))
        self.assertEqual(report.refused, "")
        # The first generate's decode steps replay after the audit and the
        # warm-up; the second makes a new StaticCache, which is other memory
        # than the graphs': its steps run eagerly, said. A prefill, whose cache
        # allocates its tensors in Python, is never graphed.
        self.assertEqual(counts(report), (2, 10))
        # (The first generate's prefill was the audited call.)
        self.assertEqual(report.graph_eager_calls, {
            f"LlamaForCausalLM.model.layers.{k}: " + why: calls for k in (0, 1)
            for why, calls in [
                ("argument past_key_values.layers[0].keys, which the call writes in place, is "
                 "not the memory its graph was captured with", 7),
                (f"argument past_key_values is a StaticCache that layer {k} allocates its keys "
                 f"and values at its first update (in Python): a replay would skip what the "
                 f"call does to it on the host", 1)]})

    def test_a_static_cache_per_request_gives_the_unmodified_logits(self):
        # A server making a new StaticCache per request: the prefill that
        # allocates it is never graphed; each request's decode steps run
        # eagerly on its new memory or replay on the graph's.
        from transformers import StaticCache

        g = torch.Generator().manual_seed(3)
        prompts = [torch.randint(0, 128, (4, 6), generator=g).to(DEVICE) for _ in range(5)]

        def request(ids):
            cache = StaticCache(config=self.model.config, max_cache_len=16)
            logits = []
            with torch.no_grad():
                for step in range(4):
                    start = 0 if step == 0 else 5 + step
                    positions = torch.arange(start, start + ids.shape[1], device=DEVICE)
                    out = self.model(ids, past_key_values=cache, cache_position=positions,
                                     use_cache=True)
                    logits.append(out.logits)
                    ids = out.logits[:, -1:].argmax(-1)
            return logits

        expected = [request(p) for p in prompts]
        report = graphed(self.model, plan(["LlamaForCausalLM.model.layers.*"]))
        for p, e in zip(prompts, expected):
            for a, b in zip(request(p), e):
                close(a, b)
        self.assertEqual(report.refused, "")

    def test_inference_mode_layers_replay_with_the_unmodified_logits(self):
        # Shared inference tensors (rotary cos and sin of one row,
        # cache_position) are compared by their bytes after an eager call:
        # dynaflow's own host read, not the call's, which the graph skips.
        inputs = [torch.randint(0, 128, (4, 12), device=DEVICE) for _ in range(4)]
        with torch.inference_mode():
            expected = [self.model(ids, use_cache=False).logits for ids in inputs]
            report = graphed(self.model, plan(["LlamaForCausalLM.model.layers.*"]))
            actual = [self.model(ids, use_cache=False).logits for ids in inputs]
        for a, e in zip(actual, expected):
            close(a, e)
        self.assertEqual(report.graph_eager_calls, {})
        self.assertEqual(counts(report), (2, 4))

    def test_a_kv_cache_keeps_the_calls_eager(self):
        ids = torch.randint(0, 128, (4, 8), device=DEVICE)
        report = graphed(self.model, plan(["LlamaForCausalLM.model"]))
        with torch.no_grad():
            for _ in range(3):
                self.model(ids)  # builds a DynamicCache per call
        self.assertEqual(report.graphs_captured, 0)
        self.assertEqual(report.refused, "")
        self.assertTrue(any("DynamicCache" in why for why in report.graph_eager_calls),
                        report.graph_eager_calls)


if __name__ == "__main__":
    unittest.main()
