"""Tests of dynaflow._apply: plan matching, and planned forwards run through
the real runtime library (libdynaflow_apply.so, env DYNAFLOW_APPLY_LIB_BUILT)
on the CPU backend, compared with the original forwards."""

import ast
import contextlib
import copy
import functools
import contextvars
import importlib.util
import inspect
import io
import json
import os
import re
import sys
import tempfile
import threading
import time
import unittest
import warnings
from contextlib import redirect_stderr
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dynaflow import _apply, _split  # noqa: E402 - after the path is set

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_TRANSFORMERS = HAS_TORCH and importlib.util.find_spec("transformers") is not None
RUNTIME = os.environ.get("DYNAFLOW_APPLY_LIB_BUILT", "")
# The replay module, which carries the caller's torch state into the
# micro-batches (CallerState), as `dynaflow apply` passes it.
REPLAY = os.environ.get("DYNAFLOW_REPLAY_EXT_BUILT", "")
if REPLAY:
    os.environ["DYNAFLOW_REPLAY_EXT"] = REPLAY
if HAS_TORCH:
    import torch
    from torch import nn
    from torch.utils._python_dispatch import TorchDispatchMode

    class Block(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.up = nn.Linear(width, 2 * width)
            self.down = nn.Linear(2 * width, width)

        def forward(self, x, scale=1.0, cache=None):
            if cache is not None:
                cache.copy_(x[:, :1])  # in place through the micro-batch's rows
            return x + scale * self.down(torch.relu(self.up(x)))

    class Net(nn.Module):
        def __init__(self, width=16, blocks=3):
            super().__init__()
            self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
            self.head = nn.Linear(width, 4)

        def forward(self, x, cache=None):
            for b in self.blocks:
                x = b(x, scale=0.5, cache=cache)
            return self.head(x)

    def scaled_block_forward(block, x, scale=1.0, cache=None):
        """A patch of a Block's forward (as libraries assign module.forward),
        at module level so that pickle saves it."""
        return Block.forward(block, x, scale=3 * scale, cache=cache)

    class Holder(nn.Module):
        """Calls `layer`, the unit a test's plan splits ("Holder.layers.*")."""

        def __init__(self, layer):
            super().__init__()
            self.layers = nn.ModuleList([layer])

        def forward(self, *args, **kwargs):
            return self.layers[0](*args, **kwargs)

    class Positioned(nn.Module):
        """No tensors of its own: its calls run where their arguments are."""

        def forward(self, x, start):
            return x * 2 + start

    class NegateLinear(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            return -out if func is torch.nn.functional.linear else out

    class DoubleAddmm(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            return out * 2 if func is torch.ops.aten.addmm.default else out

    class SumBlock(nn.Module):
        """Returns a scalar: its output has no batch dimension to merge."""

        def forward(self, x):
            return x.sum()

    class SumNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([SumBlock()])

        def forward(self, x):
            return self.layers[0](x)


    class ReducingLayer(nn.Module):
        """Sums its doubled input over the ranks (all_reduce), then adds the
        last row of `extra`: (1, width) is shared by the micro-batches, (3,
        width) cannot be split or shared (its first dimension is neither 1
        nor the batch), and both give the same audit key."""

        def __init__(self):
            super().__init__()
            self.inner = nn.Identity()

        def forward(self, x, extra):
            y = self.inner(x * 2)
            torch.distributed.all_reduce(y)
            return y + extra[-1]

    class ReducingNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([ReducingLayer(), ReducingLayer()])


def plan(units, splits=2, min_split_tokens=0, device=""):
    """A plan: sequential up to min_split_tokens tokens, then split."""
    split = {"min_tokens": min_split_tokens, "max_tokens": None, "strategy": "nanobatch_overlap",
             "splits": splits, "rules": ["nanobatch_overlap.split"],
             "streams": [{"id": 0, "role": "compute"}]}
    buckets = [split]
    if min_split_tokens > 0:
        buckets = [{"min_tokens": 0, "max_tokens": min_split_tokens, "strategy": "sequential",
                    "splits": 1, "rules": [], "streams": [{"id": 0, "role": "compute"}]}, split]
    return {"schema": _apply.PLAN_SCHEMA, "device": {"name": device},
            "partition_rules": [{"name": "nanobatch_overlap.split", "role": "split",
                                 "operators": [], "modules": units}],
            "buckets": buckets}


def staggered_plan():
    """Net split in 2 and staggered by its blocks, 3 segments."""
    p = plan(["Net"])
    p["partition_rules"].append({"name": "stage", "role": "stage", "operators": [],
                                 "modules": ["Net.blocks.*"]})
    p["buckets"][0]["rules"].append("stage")
    p["buckets"][0]["segments"] = 3
    return p


def staggered_net(test, native):
    """Net of 3 blocks under staggered_plan, detached at `test`'s cleanup,
    its stage hooks the replay module's (`native`) or the Python twin's;
    its input and its unplanned output."""
    torch.manual_seed(0)
    net, x = Net(blocks=3), torch.randn(8, 16)
    with torch.no_grad():
        want = net(x)
    with contextlib.ExitStack() as stack:
        if not native:
            stack.enter_context(mock.patch.object(_apply, "_native_region", lambda *_: None))
        _apply.apply(net, staggered_plan(), runtime_lib=RUNTIME)
    test.addCleanup(net._dynaflow_applier.detach)
    return net, x, want


def planned_holder(layer):
    """Holder(layer) with a plan that splits its layer applied."""
    net = Holder(layer)
    _apply.apply(net, plan(["Holder.layers.*"]), runtime_lib=RUNTIME)
    return net


class _FakeCuda:
    """torch.cuda's streams, events and per-thread current stream, recorded:
    what _Region issues on CUDA, checked on a machine without a GPU (as
    runtime/cuda/fake_cuda_api.h does for the C++ executor)."""

    def __init__(self):
        self.log = []  # (thread's micro-batch, call, stream id, event id)
        self.lock = threading.Lock()
        self.local = threading.local()
        self.recorded = set()
        fake = self

        class Stream:
            count = 0

            def __init__(self):
                Stream.count += 1
                self.id = Stream.count

            def wait_event(self, event):
                fake._add("wait", self, event)

        class Event:
            count = 0

            def __init__(self):
                Event.count += 1
                self.id = Event.count

            def record(self, stream=None):
                stream = stream or fake.current_stream()
                fake._add("record", stream, self)
                with fake.lock:
                    fake.recorded.add(self.id)

        self.Stream, self.Event = Stream, Event
        self.caller = Stream()

    def _add(self, call, stream, event):
        with self.lock:
            self.log.append((getattr(self.local, "mb", None), call, stream.id, event.id))

    def current_stream(self):
        return getattr(self.local, "stream", self.caller)

    def set_stream(self, stream):
        self.local.stream = stream


@unittest.skipUnless(HAS_TORCH and RUNTIME, "needs torch and the built runtime library")
class RegionOnCudaTest(unittest.TestCase):
    """A region's CUDA orchestration against a fake torch.cuda: each task
    issued on its schedule stream, every wait on an event recorded earlier in
    the call, by the task the schedule names."""

    def run_region(self, kind, stages, n, body, inline=False):
        """Runs one call of a 2-micro-batch region of `kind` with torch.cuda
        faked, each micro-batch running body(region, fake, mb) between begin
        and end: on a thread per micro-batch (started in reverse order, so
        that the sequencer decides), or with `inline` (as _PlannedForward
        does under a CUDA graph capture) micro-batch after micro-batch on
        this thread. Returns (region, fake)."""
        from unittest import mock

        fake = _FakeCuda()
        # The Python twin: the C++ one (RegionTurns) has its own test against
        # a fake device (plugin/torch/region_turns_test.cc).
        with mock.patch.object(torch.cuda, "Stream", fake.Stream), \
                mock.patch.object(torch.cuda, "Event", fake.Event), \
                mock.patch.object(torch.cuda, "set_stream", fake.set_stream), \
                mock.patch.object(_apply, "_native_region", lambda *_: None):
            region = _apply._Region(_apply._Runtime(RUNTIME), "M", kind, stages, n, 2, cuda=True)
            try:
                region.start_call(fake.caller, inline)

                def micro_batch(mb):
                    fake.local.mb = mb
                    try:
                        region.begin(mb)
                        body(region, fake, mb)
                    finally:
                        region.end(mb)

                if region.inline:
                    for mb in (0, 1):
                        micro_batch(mb)
                    fake.local.mb = None
                else:
                    threads = [threading.Thread(target=micro_batch, args=(mb,)) for mb in (1, 0)]
                    for t in threads:
                        t.start()
                    for t in threads:
                        t.join()
                region.end_call(fake.caller)
                self.report = _apply.Report()
                region.account(self.report)
            finally:
                region.free()
        return region, fake

    def test_segments_wait_for_the_events_the_schedule_names(self):
        # Turned threads (eager), and inline (under capture): the same waits.
        for inline in (False, True):
            with self.subTest(inline=inline):
                self.check_segments_wait(inline)

    def check_segments_wait(self, inline):
        stages = [nn.Identity(), nn.Identity()]  # 2 stages x 1 layer
        work = []

        def body(_region, fake, mb):
            for stage in stages:
                stage(torch.zeros(1))  # the pre-hook cuts segments
                work.append((mb, fake.current_stream().id))

        region, fake = self.run_region(_apply.STAGGERED, stages, 2, body, inline)
        self.assertEqual(region.inline, inline)
        streams = {mb: region.streams[mb].id for mb in (0, 1)}
        # Each micro-batch's work ran on its own stream.
        self.assertEqual(sorted(set(work)), [(0, streams[0]), (1, streams[1])])
        # Tasks: seg0/mb0 (event 0), seg0/mb1, seg1/mb0 (event 2), seg1/mb1.
        events = [e.id for e in region.events]
        records = [(mb, stream, ev) for mb, call, stream, ev in fake.log if call == "record"]
        waits = [(mb, stream, ev) for mb, call, stream, ev in fake.log if call == "wait"]
        # mb1's segments wait for mb0's same segment, on mb1's stream.
        self.assertIn((1, streams[1], events[0]), waits)
        self.assertIn((1, streams[1], events[2]), waits)
        self.assertIn((0, streams[0], events[0]), records)
        self.assertIn((0, streams[0], events[2]), records)
        # Every wait on a task's event comes after that event's record.
        for i, (mb, call, stream, ev) in enumerate(fake.log):
            if call == "wait" and ev in events:
                self.assertIn(("record", ev), [(c, e) for _, c, _, e in fake.log[:i]])
        # Both streams first wait for the caller (fork); the caller waits for both (join).
        fork = region.fork.id
        self.assertIn((0, streams[0], fork), waits)
        self.assertIn((1, streams[1], fork), waits)
        joins = [ev for mb, call, stream, ev in fake.log if call == "wait" and stream == fake.caller.id]
        self.assertEqual(sorted(joins), sorted(e.id for e in region.ends))
        # Issued in the schedule's order, or inline micro-batch by micro-batch
        # (seg0/mb0, seg1/mb0, seg0/mb1, seg1/mb1); every task once, nothing
        # off the schedule.
        r = self.report.regions["M"]
        self.assertEqual(r["executed"], [[0, 0, 0], [1, 0, 0], [0, 1, 1], [1, 1, 1]] if inline
                         else [[0, 0, 0], [0, 1, 1], [1, 0, 0], [1, 1, 1]])
        self.assertEqual((r["calls"], r["off_schedule_calls"], r["calls_issued_by_micro_batch"]),
                         (1, 0, int(inline)))

    def test_inline_a_micro_batch_past_its_last_segment_is_off_schedule(self):
        # A model that calls its stage modules more often than the plan's
        # segments: the extra boundaries stay in the last segment, counted.
        stages = [nn.Identity(), nn.Identity()]

        def body(_region, _fake, _mb):
            for stage in stages + stages:
                stage(torch.zeros(1))

        region, fake = self.run_region(_apply.STAGGERED, stages, 2, body, inline=True)
        self.assertEqual(region.extra, 4)  # 2 extra boundaries per micro-batch
        self.assertEqual(self.report.regions["M"]["off_schedule_calls"], 1)

    def test_dual_batch_collectives_run_on_the_communication_stream(self):
        seen = []

        def body(region, fake, mb):
            def collective(_t):
                seen.append(("collective", mb, fake.current_stream().id))

            seen.append(("compute", mb, fake.current_stream().id))
            region.collective(mb, collective, (torch.zeros(1),), {})
            seen.append(("compute", mb, fake.current_stream().id))

        region, fake = self.run_region(_apply.DUAL_BATCH, [], 1, body)
        compute, comm = region.streams[0].id, region.streams[1].id
        # The sequencer's order: C0/mb0, C0/mb1, X0/mb0, X0/mb1, C1/mb0, C1/mb1.
        self.assertEqual(seen, [("compute", 0, compute), ("compute", 1, compute),
                                ("collective", 0, comm), ("collective", 1, comm),
                                ("compute", 0, compute), ("compute", 1, compute)])
        # X0/mb0 waits for C0/mb0; C1/mb0 waits for X0/mb0.
        waits = {(stream, ev) for _, call, stream, ev in fake.log if call == "wait"}
        self.assertIn((comm, region.events[0].id), waits)
        self.assertIn((compute, region.events[2].id), waits)

@unittest.skipUnless(HAS_TORCH and RUNTIME and REPLAY,
                     "needs torch, the built runtime library and the replay module")
class RegionOnCpuTest(unittest.TestCase):
    """A staggered region's boundaries in C++ (RegionTurns) and in their
    Python twin, on the CPU: both turn the micro-batches' threads through
    the schedule's issue order and give the unplanned outputs."""

    def run_net(self, native):
        net, x, want = staggered_net(self, native)
        region = net._dynaflow_applier.forwards[0].regions[2]
        with torch.no_grad():
            got = [net(x) for _ in range(4)]
        return net, x, region, want, got, net._dynaflow_applier.report.regions["Net"]

    def test_native_and_twin_run_the_predicted_order(self):
        for native in (True, False):
            with self.subTest(native=native):
                _, _, region, want, got, r = self.run_net(native)
                self.assertEqual(region.native is not None, native)
                for out in got:
                    torch.testing.assert_close(out, want)
                # The first call's split run, compared with its unsplit
                # result, is not counted.
                self.assertEqual((r["calls"], r["off_schedule_calls"]), (3, 0))
                self.assertEqual(r["executed"], r["issue_order"])
                # Segment by segment: (segment, micro-batch, stream).
                self.assertEqual(r["issue_order"], [[0, 0, 0], [0, 1, 1], [1, 0, 0], [1, 1, 1],
                                                    [2, 0, 0], [2, 1, 1]])

    def test_a_stage_called_outside_a_micro_batch_cuts_nothing(self):
        # The pre-hook turns only a thread that runs a micro-batch of its
        # region: called anywhere else it returns at once (a turn here would
        # wait forever), and the next call still runs as predicted.
        net, x, region, want, _, r = self.run_net(True)
        calls = r["calls"]
        self.assertIsNone(region.native.stage_hook(nn.Identity(), (torch.zeros(1),)))
        with torch.no_grad():
            net(torch.zeros(1, 16))  # a call too small to split: its stages run unturned
            torch.testing.assert_close(net(x), want)
        self.assertEqual((r["calls"], r["off_schedule_calls"]), (calls + 1, 0))

    def test_a_freed_regions_turns_refuse_every_call(self):
        # Whoever still holds the C++ turns after the region is freed (a hook
        # dict copied elsewhere) gets an error, not a freed sequencer.
        _, _, region, _, _, _ = self.run_net(True)
        native = region.native
        region.free()
        self.assertIsNone(region.native)
        with self.assertRaisesRegex(RuntimeError, "the region was freed"):
            native.begin(0)
        with self.assertRaisesRegex(RuntimeError, "the region was freed"):
            native.start_call(False, None)

    def test_a_failed_micro_batch_aborts_the_regions_waiting_turns(self):
        # The executor skips the micro-batches it has not started once one
        # failed: they never end their tasks, so a micro-batch waiting for a
        # turn after theirs would wait forever. The failure aborts the
        # region's call instead, and the first error is the one kept.
        net, _, region, _, _, _ = self.run_net(True)
        forward = net._dynaflow_applier.forwards[0]
        aborted = []
        state = {"contexts": [None, None], "context": contextvars.copy_context(),
                 "carried": None, "modes": (False, False, []), "region": region,
                 "error": None}
        with mock.patch.object(forward, "_micro_batch", side_effect=ValueError("it broke")), \
                mock.patch.object(region, "abort", aborted.append):
            self.assertEqual(forward._task(state, 1, 0), 1)
        self.assertEqual(aborted, ["micro-batch 1 failed: it broke"])
        self.assertIsInstance(state["error"], ValueError)
        # The real abort: a turn waiting in this call fails at once.
        region.start_call(None)
        region.abort("micro-batch 1 failed: it broke")
        with self.assertRaisesRegex(RuntimeError, "micro-batch 1 failed: it broke"):
            region.begin(0)
        region.end(0)
        region.end(1)

    def test_a_region_call_without_its_stages_is_off_schedule(self):
        # A micro-batch that ends before its last segment: the rest skipped,
        # the call counted off the schedule, nothing waits forever.
        for native in (True, False):
            with self.subTest(native=native):
                self.check_call_without_its_stages(native)

    def check_call_without_its_stages(self, native):
        _, _, region, _, _, _ = self.run_net(native)
        region.start_call(None)
        results = []

        def micro_batch(mb):
            try:
                region.begin(mb)
                results.append(mb)
            finally:
                region.end(mb)

        threads = [threading.Thread(target=micro_batch, args=(mb,)) for mb in (1, 0)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        self.assertEqual(sorted(results), [0, 1])
        report = _apply.Report()
        region.account(report)
        r = report.regions["Net"]
        self.assertEqual(r["off_schedule_calls"], 1)
        self.assertEqual(r["executed"], [[0, 0, 0], [0, 1, 1]])


@unittest.skipUnless(HAS_TORCH and RUNTIME, "needs torch and the built runtime library")
class CompileTest(unittest.TestCase):
    """torch.compile and torch.export of a model with planned units. A
    planned call is a graph break; where one would raise (fullgraph=True,
    error_on_graph_break, a strict export), dynamo traces the unit's
    original forward instead."""

    WHOLE = ("dynaflow apply: plan refused: Net: {} traces it into one graph, where a planned "
             "call cannot run (it runs between graphs): the compiled program runs it the "
             "original way; the program runs unmodified")

    def setUp(self):
        torch._dynamo.reset()

    def test_a_graph_to_compile_whole_traces_the_original_and_refuses_in_one_line(self):
        # torch's Unsupported was raised at the planned call's graph break.
        cases = (("torch.compile(fullgraph=True)", True, contextlib.nullcontext),
                 ("torch.compile under torch._dynamo.error_on_graph_break", False,
                  lambda: torch._dynamo.error_on_graph_break(True)))
        for native in (True, False):
            for how, fullgraph, context in cases:
                with self.subTest(native=native, how=how):
                    torch._dynamo.reset()
                    net, x, want = staggered_net(self, native)
                    self.assertEqual([len(b._forward_pre_hooks) for b in net.blocks], [1, 1, 1])
                    compiled = torch.compile(net, backend="eager", fullgraph=fullgraph)
                    err = io.StringIO()
                    with torch.no_grad(), redirect_stderr(err), context():
                        for _ in range(2):
                            torch.testing.assert_close(compiled(x), want)
                    self.assertEqual(err.getvalue().splitlines(), [self.WHOLE.format(how)])
                    report = net._dynaflow_applier.report
                    self.assertEqual((report.planned_calls, report.original_calls), (0, 0))
                    # Eagerly, the installed forward runs the original until
                    # detach puts that back and removes the stage hooks.
                    with torch.no_grad():
                        torch.testing.assert_close(net(x), want)
                    self.assertEqual(report.planned_calls, 0)
                    self.assertIn("forward", vars(net))
                    net._dynaflow_applier.detach()
                    self.assertNotIn("forward", vars(net))
                    self.assertEqual([len(b._forward_pre_hooks) for b in net.blocks], [0, 0, 0])

    def test_an_export_records_the_original_and_the_plan_goes_on(self):
        # A strict export raised torch's Unsupported; a non-strict one
        # records the original operators (traced).
        net, x, want = staggered_net(self, True)
        with torch.no_grad():
            for strict in (True, False):
                torch.testing.assert_close(
                    torch.export.export(net, (x,), strict=strict).module()(x), want)
            report = net._dynaflow_applier.report
            self.assertEqual(list(report.unsplit),
                             ["Net: torch.export records it, the original way"])
            self.assertEqual(report.refused, "")
            for _ in range(2):
                torch.testing.assert_close(net(x), want)
        self.assertEqual(report.planned_calls, 1)  # after the audited first call

    def test_a_compile_with_graph_breaks_runs_the_plan(self):
        net, x, want = staggered_net(self, True)
        compiled = torch.compile(net, backend="eager")
        with torch.no_grad():
            for _ in range(3):
                torch.testing.assert_close(compiled(x), want)
        report = net._dynaflow_applier.report
        self.assertEqual((report.planned_calls, report.refused), (2, ""))
        self.assertEqual(report.regions["Net"]["off_schedule_calls"], 0)

    def test_stages_compiled_inside_the_unit_keep_their_turns(self):
        # Compiled with graph breaks, a stage's pre-hook runs at one, and the
        # micro-batches still turn at every stage: also where the graph was
        # first compiled outside a micro-batch (a call of one row runs the
        # original on the caller's thread), which dynamo reuses in them.
        class CompiledBlocks(Net):
            def __init__(self):
                super().__init__(blocks=3)
                self.run_blocks = torch.compile(self.blocks_eagerly, backend="eager")

            def blocks_eagerly(self, x):
                for b in self.blocks:
                    x = b(x, scale=0.5)
                return x

            def forward(self, x):
                return self.head(self.run_blocks(x))

        torch.manual_seed(0)
        net, x = CompiledBlocks(), torch.randn(8, 16)
        with torch.no_grad():
            want = net.head(net.blocks_eagerly(x))
        p = staggered_plan()
        p["partition_rules"][0]["modules"] = ["CompiledBlocks"]
        p["partition_rules"][1]["modules"] = ["CompiledBlocks.blocks.*"]
        _apply.apply(net, p, runtime_lib=RUNTIME)
        self.addCleanup(net._dynaflow_applier.detach)
        with torch.no_grad():
            torch.testing.assert_close(net(x[:1]), want[:1])
            for _ in range(4):  # micro-batches of one row: the graph of the call of one
                torch.testing.assert_close(net(x[:2]), want[:2])
        r = net._dynaflow_applier.report.regions["CompiledBlocks"]
        self.assertEqual((r["calls"], r["off_schedule_calls"]), (3, 0))
        self.assertEqual(r["executed"], r["issue_order"])

    def test_a_compiled_copy_runs_unplanned_and_the_model_planned(self):
        # A deep copy runs unplanned: compiled whole, dynamo traces its
        # forward. Compiled with graph breaks, the graph the copy's call made
        # (dynamo reuses it for the model: no guard tells them apart) holds
        # the graph break, whose eager call runs the model's plan; once it
        # held the copy's forward, and the model lost its plan, unsaid.
        for fullgraph in (True, False):
            with self.subTest(fullgraph=fullgraph):
                torch._dynamo.reset()
                net, x, want = staggered_net(self, True)
                twin = copy.deepcopy(net)
                with torch.no_grad():
                    torch.testing.assert_close(
                        torch.compile(twin, backend="eager", fullgraph=fullgraph)(x), want)
                    for _ in range(3):
                        torch.testing.assert_close(
                            net(x) if fullgraph else torch.compile(net, backend="eager")(x), want)
                report = net._dynaflow_applier.report
                self.assertEqual((report.planned_calls, report.refused), (2, ""))


@unittest.skipUnless(HAS_TORCH and RUNTIME, "needs torch and the built runtime library")
class BootstrapUnderCompileTest(unittest.TestCase):
    """`dynaflow apply`'s bootstrap (_FromEnvironment) attaches the plan at
    the root module's first call, in a global forward pre-hook, which dynamo
    traces when that call is compiled."""

    def install(self):
        torch._dynamo.reset()
        with open(os.path.join(self.enterContext(tempfile.TemporaryDirectory()), "plan.json"),
                  "w") as f:
            json.dump(plan(["Net.blocks.*"]), f)
        self.enterContext(mock.patch.dict(os.environ, {"DYNAFLOW_PLAN": f.name,
                                                       "DYNAFLOW_APPLY_LIB": RUNTIME}))
        env = _apply._FromEnvironment()
        env.install()
        self.addCleanup(lambda: env.applier and env.applier.detach())
        self.addCleanup(env.hook.remove)
        torch.manual_seed(0)
        net, x = Net(), torch.randn(4, 16)
        with torch.no_grad():
            want = Net.forward(net, x)  # the class's forward: no module call, no hook
        return env, net, x, want

    def test_a_fullgraph_compile_of_the_first_call_refuses_in_one_line(self):
        # torch's Unsupported was raised at the attach's graph break.
        env, net, x, want = self.install()
        err = io.StringIO()
        with torch.no_grad(), redirect_stderr(err):
            torch.testing.assert_close(torch.compile(net, backend="eager", fullgraph=True)(x),
                                       want)
            torch.testing.assert_close(net(x), want)  # eagerly too: not attached
        said = [line for line in err.getvalue().splitlines() if line.startswith("dynaflow")]
        self.assertEqual(said, [  # beside torch's warning of a compile under global hooks
            "dynaflow apply: plan refused: Net: torch.compile(fullgraph=True) traces it into one "
            "graph, where a planned call cannot run (it runs between graphs): the compiled "
            "program runs it the original way; the program runs unmodified"])
        self.assertIsNone(env.applier)

    def test_an_export_records_the_original_before_and_after_the_attach(self):
        # A non-strict export (torch's default) runs the code: the plan
        # attaches in it, and the export records the original operators. A
        # strict one, after the attach removed the global hook, too (torch
        # 2.11's strict export fails with any global module hook).
        env, net, x, want = self.install()
        with torch.no_grad(), redirect_stderr(io.StringIO()):
            torch.testing.assert_close(torch.export.export(net, (x,)).module()(x), want)
            for _ in range(3):
                torch.testing.assert_close(net(x), want)
            torch.testing.assert_close(
                torch.export.export(net, (x,), strict=True).module()(x), want)
        report = env.applier.report
        self.assertEqual(report.refused, "")
        self.assertEqual(report.planned_calls, 6)  # 3 blocks, each audited first
        self.assertEqual(report.unsplit["Net.blocks.0: torch.export records it, the original way"],
                         2)

    def test_a_compile_with_graph_breaks_attaches_at_its_first_call(self):
        env, net, x, want = self.install()
        compiled = torch.compile(net, backend="eager")
        with torch.no_grad(), redirect_stderr(io.StringIO()):
            for _ in range(3):
                torch.testing.assert_close(compiled(x), want)
        self.assertEqual(env.applier.report.planned_calls, 6)


class PureFunctionsTest(unittest.TestCase):
    def test_a_star_matches_one_layer_index(self):
        self.assertTrue(_apply.matches("M.layers.*", "M.layers.12"))
        self.assertFalse(_apply.matches("M.layers.*", "M.layers.x"))
        self.assertFalse(_apply.matches("M.layers.*", "M.layers.1.mlp"))
        self.assertTrue(_apply.matches("M.head", "M.head"))

    @unittest.skipUnless(HAS_TRANSFORMERS, "needs transformers")
    def test_the_tensors_of_cache_views_are_those_of_the_layers_read(self):
        # The views' tensors recorded on the caller's stream after a call
        # (_record_on) are those of the layers the micro-batches read: the
        # walk makes no view of the others.
        from transformers import DynamicCache

        cache = DynamicCache()
        for layer in range(3):
            cache.update(torch.zeros(4, 1, 2, 2), torch.ones(4, 1, 2, 2), layer)
        s = _split.split_call("M", None, (torch.zeros(4, 1),), {"past_key_values": cache}, 4,
                              [0, 2, 4])
        views = [s.kwargs[i]["past_key_values"] for i in range(2)]
        read = views[1].layers[2]
        found = {id(t) for t in _apply._tensors_in(views)}
        self.assertEqual(found, {id(read.keys), id(read.values)})
        self.assertEqual([_split._LazyLayers.made(v.layers, k) for v in views for k in range(3)],
                         [False, False, False, False, False, True])

    @unittest.skipUnless(HAS_TORCH, "needs torch")
    def test_a_first_calls_comparison_passes_equal_tensors_in_one_pass(self):
        x = torch.randn(3, 4)
        self.assertTrue(_apply._identical(x, x.clone()))
        off = x.clone()
        off[1, 2] += 1
        self.assertFalse(_apply._identical(x, off))
        nan = x.clone()
        nan[0, 0] = float("nan")
        self.assertFalse(_apply._identical(nan, nan.clone()))  # _difference judges NaNs
        self.assertFalse(_apply._identical(x.to_sparse(), x.to_sparse()))
        differs = _apply._PlannedForward._differs
        self.assertEqual(differs("h", (x, nan), (x.clone(), nan.clone()), (), {}, (), {}), "")
        self.assertRegex(differs("h", (x, nan), (off, nan.clone()), (), {}, (), {}),
                         r"^h computed another result \(output\[0\]")

    @unittest.skipUnless(HAS_TORCH, "needs torch")
    def test_the_batch_tensor_of_a_call_by_keywords(self):
        ids, mask = torch.zeros(4, 7, dtype=torch.long), torch.ones(4, 7)
        x = _apply.first_tensor((), {"cache_position": torch.arange(7), "input_ids": ids,
                                     "attention_mask": mask})
        self.assertIs(x, ids)
        self.assertEqual(_apply.tokens_of(x), 28)  # token ids: one token per element
        self.assertEqual(_apply.tokens_of(torch.zeros(4, 7, 16)), 28)  # one per vector
        self.assertIsNone(_apply.first_tensor((), {"cache_position": torch.arange(7)}))

    @unittest.skipUnless(HAS_TORCH, "needs torch")
    def test_a_calls_phase_as_the_advisor_tells_steps_apart(self):
        class Cache:  # the Hugging Face Cache protocol
            def __init__(self, length):
                self.length = length

            def get_seq_length(self):
                return self.length

        m = nn.Linear(2, 2).eval()
        one, many = torch.zeros(4, 1, dtype=torch.long), torch.zeros(4, 7, dtype=torch.long)
        phase = _apply.call_phase
        self.assertEqual(phase(m, (), {"past_key_values": Cache(9)}, one, False), "decode")
        self.assertEqual(phase(m, (one, Cache(9)), {}, one, False), "decode")
        self.assertEqual(phase(m, (), {"past_key_values": Cache(0)}, one, False), "prefill")
        self.assertEqual(phase(m, (), {"past_key_values": Cache(9)}, many, False), "prefill")
        self.assertEqual(phase(m, (), {}, one, False), "prefill")
        self.assertEqual(phase(m, (), {"past_key_values": Cache(torch.tensor(9))}, one, False),
                         "decode")  # a static cache's length, on the CPU
        on_device = Cache(torch.empty((), dtype=torch.long, device="meta"))
        self.assertEqual(phase(m, (), {"past_key_values": on_device}, one, False), "unknown")
        self.assertEqual(phase(m, (), {}, torch.zeros(7, dtype=torch.long), False), "unknown")
        m.train()  # a model built from a config trains by default
        self.assertEqual(phase(m, (), {}, many, False), "prefill")
        self.assertEqual(phase(m, (), {}, many, True), "training")
        with torch.no_grad():
            self.assertEqual(phase(m, (), {}, many, True), "prefill")

    def test_even_bounds_match_the_runtime_row_split(self):
        self.assertEqual(_apply.even_bounds(7, 3), [0, 3, 5, 7])
        self.assertEqual(_apply.even_bounds(4, 2), [0, 2, 4])

    def test_bucket_table_gives_one_schedule_per_split_count(self):
        p = plan(["M.b.*"], splits=4, min_split_tokens=256)
        self.assertEqual(_apply.bucket_table(p), ({"": ([256, _apply.INT64_MAX], [-1, 0])}, [4]))
        self.assertEqual(_apply.split_units(p), ["M.b.*"])
        self.assertEqual(_apply.root_class(p), "M")

    def test_unsupported_strategies_are_named(self):
        p = plan(["M.b.*"])
        p["buckets"][0]["strategy"] = "fusion"
        with self.assertRaisesRegex(_apply.PlanMismatch, "fusion"):
            _apply.check_strategies(p)

    def test_split_units_deduplicates_in_plan_order_in_linear_time(self):
        p = plan(["M.b.*", "M.a", "M.b.*"])
        p["partition_rules"][0]["modules"] += [f"M.x{i % 1000}" for i in range(2_000_000)]
        start = time.monotonic()
        units = _apply.split_units(p)
        self.assertLess(time.monotonic() - start, 5.0)  # quadratic: did not finish in minutes
        self.assertEqual(units[:3], ["M.b.*", "M.a", "M.x0"])
        self.assertEqual(len(units), 1002)

    def test_bucket_table_refuses_more_splits_than_the_schema_allows(self):
        self.assertEqual(_apply.bucket_table(plan(["M.b.*"], splits=16))[1], [16])
        with self.assertRaisesRegex(_apply.PlanMismatch, "splits 100000 ways; at most 16"):
            _apply.bucket_table(plan(["M.b.*"], splits=100000))

    def test_long_names_are_cut_in_messages(self):
        self.assertEqual(_apply._cut("M.a"), "M.a")
        long_name = "M." + "n" * 10_000_000

        class M:  # a model without torch: only named_modules is used
            def named_modules(self):
                return [("", self), ("a", None)]

        with self.assertRaises(_apply.PlanMismatch) as cm:
            _apply.resolve_units(M(), plan([long_name]))
        message = str(cm.exception)
        self.assertLess(len(message), 400)
        self.assertIn(f"unknown module {long_name[:200]}... (10000002 characters)", message)


@unittest.skipUnless(HAS_TORCH, "needs torch")
class CommOverlapTest(unittest.TestCase):
    """comm_overlap's waits, with a collective whose work lands only when
    waited for (as gloo's and NCCL's asynchronous works do)."""

    def setUp(self):
        self.events = []

        class Work:
            def __init__(work, t):
                work.t = t

            def wait(work):
                self.events.append("wait")
                work.t.add_(10)  # the reduction lands

        def all_reduce(t, op=None, group=None, async_op=False):
            self.events.append(f"launch async_op={async_op}")
            return Work(t)

        self.all_reduce = all_reduce

    def test_a_collective_is_waited_for_just_before_its_first_use(self):
        overlap = _apply._CommOverlap()
        t, other = torch.zeros(3), torch.ones(3)
        with _apply._wait_before_use(overlap):
            self.assertIsNone(overlap.launch(self.all_reduce, (t,), {}))
            y = other * 2  # independent work runs beside the collective
            self.events.append("independent")
            z = t + 1      # the consumer waits first
        self.assertEqual(self.events, ["launch async_op=True", "independent", "wait"])
        self.assertEqual(z.tolist(), [11.0] * 3)
        self.assertEqual(y.tolist(), [2.0] * 3)
        self.assertEqual(overlap.pending, {})
        self.assertEqual(overlap.launched, 1)
        # Read in the compute part after its launch, one operator (the
        # multiplication) beside it.
        self.assertEqual(overlap.consumers, [1])
        self.assertEqual(overlap.beside_ops, [1])

    def test_a_higher_order_operator_waits_for_every_collective(self):
        # Its body reads what it likes, unseen (torch raised into the
        # program before: no rule for a higher-order operator).
        overlap = _apply._CommOverlap()
        t, other = torch.zeros(3), torch.ones(3)
        with _apply._wait_before_use(overlap):
            overlap.launch(self.all_reduce, (t,), {})
            y = torch.cond(other.sum() > 0, lambda o: o + t, lambda o: o - t, (other,))
        self.assertEqual(self.events, ["launch async_op=True", "wait"])
        self.assertEqual(y.tolist(), [11.0] * 3)
        self.assertEqual(overlap.pending, {})

    def test_views_and_in_place_writes_wait_too_and_the_rest_at_the_end(self):
        overlap = _apply._CommOverlap()
        a, b = torch.zeros(4), torch.zeros(2)
        with _apply._wait_before_use(overlap):
            overlap.launch(self.all_reduce, (a,), {})
            overlap.launch(self.all_reduce, (b,), {})
            a[1:].mul_(2)  # a view of a, written in place: waits for a's collective only
        self.assertEqual(self.events.count("wait"), 1)
        self.assertEqual(a.tolist(), [10.0, 20.0, 20.0, 20.0])
        overlap.wait_all()  # the planned call's end: b's collective lands
        self.assertEqual(b.tolist(), [10.0, 10.0])
        self.assertEqual(overlap.pending, {})
        # a read after both launches (part 2), by the view, with nothing
        # beside it; b only at the end (part 3), beside the view and the write.
        self.assertEqual(overlap.consumers, [2, 3])
        self.assertEqual(overlap.beside_ops, [0, 2])

    @unittest.skipUnless(RUNTIME, "needs the built runtime library")
    def test_the_report_counts_the_schedule_that_ran(self):
        overlap = _apply._CommOverlap()
        a, b, c = torch.zeros(2), torch.zeros(2), torch.zeros(2)
        with _apply._wait_before_use(overlap):
            overlap.launch(self.all_reduce, (a,), {})
            torch.ones(1) * 3           # two operators beside a
            overlap.launch(self.all_reduce, (b,), {})
            a + b                       # reads a and b: both read by part 2
            overlap.launch(self.all_reduce, (c,), {})
            torch.ones(1) * 5           # two beside c, which only the end reads
        overlap.wait_all()
        self.assertEqual(overlap.consumers, [2, 2, 4])
        self.assertEqual(overlap.beside_ops, [2, 0, 2])
        report = _apply.Report()
        report.comm_overlap_call(overlap, _apply._Runtime(RUNTIME))
        out = report.as_json(verify=False)
        # runtime::BuildCommOverlapRegion({2, 2, 4}): C1 beside X0, C3 beside X2.
        self.assertEqual(out["comm_overlap"], {"collectives": 3, "read_in_call": 2,
                                               "ops_beside": 4, "parts_beside": 2})
        # X1 read before its launch: no such schedule; said, never raised.
        overlap.consumers = [1, 1, 4]
        report.comm_overlap_call(overlap, _apply._Runtime(RUNTIME))
        self.assertIn("collective X1 is read by compute part C1",
                      report.as_json(verify=False)["comm_overlap"]["error"])

    def test_host_reads_without_an_operator_wait_too(self):
        original = torch.Tensor.tolist
        cuts = _apply._CollectiveCuts()
        try:
            overlap = _apply._CommOverlap()
            counts = torch.zeros(2)
            overlap.launch(self.all_reduce, (counts,), {})
            _apply._ON_THREAD.overlap = overlap
            try:
                self.assertEqual(counts.tolist(), [10.0, 10.0])  # waited: the result landed
            finally:
                _apply._ON_THREAD.overlap = None
            self.assertEqual(overlap.consumers, [1])
        finally:
            cuts.restore()
        self.assertIs(torch.Tensor.tolist, original)

    def test_a_caller_that_asks_for_its_own_work_keeps_it(self):
        overlap = _apply._CommOverlap()
        work = overlap.launch(self.all_reduce, (torch.zeros(1),), {"async_op": True})
        self.assertIsNotNone(work)
        self.assertEqual(overlap.launched, 0)
        self.assertEqual(overlap.pending, {})


@unittest.skipUnless(HAS_TORCH and RUNTIME, "needs torch and the built runtime library")
class ApplyTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.net = Net()
        self.x = torch.randn(6, 5, 16)

    def audited_holder(self, layer, *args):
        """planned_holder(layer), its first call (on `args`) audited: its
        later calls of that kind split."""
        net = planned_holder(layer)
        self.audit(net, *args, units=1)
        return net

    def audit(self, net, *args, units=3):
        """The first call of a kind runs the original way, each unit's
        operators proved to keep the rows apart (_rows); later ones split."""
        report = net._dynaflow_applier.report
        planned, original = report.planned_calls, report.original_calls
        out = net(*args)
        self.assertEqual((report.planned_calls, report.original_calls),
                         (planned, original + units))
        self.assertEqual(report.refused, "")
        return out

    def applied(self, units, audited=3):
        """self.net with a plan that splits `units` applied, its first call
        audited on a [6, 5, 16] input: (that input, the unplanned output)."""
        x = torch.randn(6, 5, 16)
        want = self.net(x)
        _apply.apply(self.net, plan(units), runtime_lib=RUNTIME)
        self.audit(self.net, x, units=audited)
        return x, want

    def test_planned_output_equals_the_original(self):
        expected = self.net(self.x)
        _apply.apply(self.net, plan(["Net.blocks.*"], splits=3), verify=True, runtime_lib=RUNTIME)
        applier = self.net._dynaflow_applier
        self.assertEqual(applier.report.units, ["Net.blocks.0", "Net.blocks.1", "Net.blocks.2"])
        torch.testing.assert_close(self.audit(self.net, self.x), expected, rtol=0, atol=0)
        self.assertEqual(applier.report.unsplit, {
            f"Net.blocks.{k}: the first call of its kind, run the original way to prove that "
            f"its operators keep the rows apart": 1 for k in range(3)})
        actual = self.net(self.x)
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
        self.assertEqual(applier.report.planned_calls, 3)
        self.assertEqual(applier.report.verified_calls, 3)
        self.assertTrue(applier.report.verify_ok)
        self.assertLess(applier.report.max_abs_diff, 1e-5)

    def test_a_rank_of_torch_distributed_hands_the_gil_to_torchs_threads_at_exit(self):
        # _let_collectives_finish_at_exit: once per process, and only in a
        # rank of several, an exit handler sleeps so that gloo's threads can
        # release the last collective's tensors before finalization.
        def sleeps_registered(ranks):
            _apply._let_collectives_finish_at_exit.cache_clear()
            self.addCleanup(_apply._let_collectives_finish_at_exit.cache_clear)
            with mock.patch.object(_apply.atexit, "register") as register, \
                    mock.patch.object(_apply, "_distributed", return_value=ranks):
                for _ in range(2):
                    net = _apply.apply(Net(), plan(["Net.blocks.*"]), runtime_lib=RUNTIME)
                    self.addCleanup(net._dynaflow_applier.detach)
            return [c.args for c in register.call_args_list if c.args[0] is time.sleep]

        self.assertEqual(sleeps_registered(False), [])
        self.assertEqual(sleeps_registered(True), [(time.sleep, 0.02)])

    def test_outputs_merged_into_slices_equal_the_original(self):
        # CUDA's merge (each micro-batch copies its rows into one output as it
        # finishes), run here on the CPU workers; with grad off, or it would
        # leave outputs that require grad to the concatenation.
        from unittest import mock

        expected = self.net(self.x)
        _apply.apply(self.net, plan(["Net.blocks.*"], splits=3), runtime_lib=RUNTIME)
        with torch.no_grad():
            self.audit(self.net, self.x)
        merges = []
        block_outputs = []
        self.net.blocks[2].register_forward_hook(lambda _m, _a, out: block_outputs.append(out))
        put = _split.SliceMerge.put

        def recorded(merge, mb, result):
            merges.append(merge)
            put(merge, mb, result)

        with mock.patch.object(_apply, "SLICES_ON_CPU", True), \
                mock.patch.object(_split.SliceMerge, "put", recorded), torch.no_grad():
            actual = self.net(self.x)
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
        self.assertEqual(len(merges), 9)  # 3 blocks x 3 micro-batches
        # The last block's merged output is the one its micro-batches wrote.
        last = merges[-1]
        self.assertEqual(sorted(last.taken), [("output", 0), ("output", 1), ("output", 2)])
        self.assertIs(block_outputs[-1], last.outputs["output"])

    def test_tensor_keyword_arguments_are_split_and_written_in_place(self):
        cache = torch.zeros(6, 1, 16)
        self.net(self.x, cache=cache)
        expected = cache.clone()
        cache.zero_()
        _apply.apply(self.net, plan(["Net.blocks.*"]), runtime_lib=RUNTIME)
        self.net(self.x, cache=cache)
        torch.testing.assert_close(cache, expected)

    def refused_at_second_call(self, net, x, message):
        """The audited first call of `net` changed its modules' state, so its
        second is audited too: it changes it again, and the plan is refused
        with `message`, both calls run the original way (split, each
        micro-batch would change that state once)."""
        report = net._dynaflow_applier.report
        self.audit(net, x, units=1)
        err = io.StringIO()
        with redirect_stderr(err):
            out = net(x)
        torch.testing.assert_close(out, x * 2, rtol=0, atol=0)
        self.assertRegex(err.getvalue(), rf"plan refused: Holder\.layers\.0: {re.escape(message)}"
                                         rf".* \(found in two unsplit calls of its kind: none "
                                         rf"ran split\)")
        self.assertNotIn("forward", net.layers[0].__dict__)  # restored
        self.assertEqual((report.planned_calls, report.original_calls), (0, 2))

    def test_a_module_that_writes_its_own_buffers_is_refused_before_it_runs_split(self):
        # Each micro-batch would count once where the unsplit call counts
        # once in all (it once failed after the micro-batches ran).
        class Counting(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("calls", torch.zeros(()))

            def forward(self, x):
                self.calls.add_(1)
                return x * 2

        net = planned_holder(Counting())
        self.refused_at_second_call(net, torch.ones(4, 3), "buffer calls is shared by the "
                                    "micro-batches and was modified in place")
        net(torch.ones(4, 3))
        self.assertEqual(net.layers[0].calls.item(), 3)  # once per call, as unmodified

    def test_a_module_that_changes_its_python_state_is_refused_before_it_runs_split(self):
        # A Python counter, a list appended to, a dict entry replaced, an
        # attribute set to the output: each micro-batch would do it again.
        later = {"on": False}

        class Counting(nn.Module):
            def __init__(self, how):
                super().__init__()
                self.how = how
                self.calls = 0
                self.seen = []
                self.slots = {"last": None}

            def forward(self, x):
                if self.how == "count":
                    self.calls += 1
                elif self.how == "append":
                    self.seen.append(x.shape[0])
                elif self.how == "keep":  # a tensor attribute made by the call
                    self.last = x * 2
                elif self.how == "keep tuple":
                    self.seen = (x,)
                elif self.how == "replace entry":  # a hand-written cache's slot
                    self.slots["last"] = x * 2
                elif self.how == "reset":  # deleted and set again: no change
                    calls = self.calls
                    del self.calls
                    self.calls = calls
                elif self.how == "later":  # only once the program says so
                    if later["on"]:
                        self.calls += 1
                elif not hasattr(self, "scale"):
                    self.register_buffer("scale", torch.ones(()))
                return x * 2

        x = torch.ones(4, 3)
        net = self.audited_holder(Counting("reset"), x)
        net(x)
        self.assertEqual(net._dynaflow_applier.report.planned_calls, 1)
        # A buffer made on the first call: that call changed the module, so
        # the second is audited too; it changes nothing, and the third splits.
        net = self.audited_holder(Counting("buffer"), x)
        self.audit(net, x, units=1)
        net(x)
        self.assertEqual(net._dynaflow_applier.report.planned_calls, 1)
        changed = "of the module was changed by the call, once per micro-batch"
        for how, message in [("count", f"attribute calls {changed}"),
                             ("append", f"attribute seen {changed}"),
                             ("keep", "attribute last is shared by the micro-batches and was "
                                      "replaced"),
                             ("keep tuple", f"attribute seen {changed}"),
                             ("replace entry", f"attribute slots {changed}")]:
            with self.subTest(how=how):
                net = planned_holder(Counting(how))
                self.refused_at_second_call(net, x, message)
                if how == "count":
                    net(x)
                    self.assertEqual(net.layers[0].calls, 3)  # once per call, as unmodified
        # A change that the audited calls did not make, split, is still
        # caught after the micro-batches ran: loud, and refused from then on.
        net = self.audited_holder(Counting("later"), x)
        later["on"] = True
        with self.assertRaisesRegex(RuntimeError, rf"Holder\.layers\.0: attribute calls "
                                                  rf"{changed}"):
            net(x)
        self.assertNotIn("forward", net.layers[0].__dict__)

    def test_the_callers_context_variables_hold_in_the_micro_batches(self):
        # A micro-batch on a runtime worker read the worker's own context
        # before: the default scale, 1.0.
        scale = contextvars.ContextVar("scale", default=1.0)

        class Scaled(nn.Module):
            def forward(self, x):
                return x * scale.get()

        net, x = Holder(Scaled()), torch.ones(4, 3)
        _apply.apply(net, plan(["Holder.layers.*"]), runtime_lib=RUNTIME)
        token = scale.set(3.0)
        try:
            self.audit(net, x, units=1)
            out = net(x)
        finally:
            scale.reset(token)
        self.assertEqual(net._dynaflow_applier.report.planned_calls, 1)
        torch.testing.assert_close(out, x * 3, rtol=0, atol=0)

    def test_a_call_that_sets_a_context_variable_is_refused_before_it_runs_split(self):
        # Split, each micro-batch would set it in its own copy of the
        # caller's context, and the caller would see none of them; a list it
        # holds, shared by the copies, would be appended to once per
        # micro-batch.
        last = contextvars.ContextVar("last_rows", default=0)
        seen = contextvars.ContextVar("seen_rows")
        later = {"on": False}

        class Setting(nn.Module):
            def __init__(self, how):
                super().__init__()
                self.how = how

            def forward(self, x):
                if self.how == "set" or later["on"]:
                    last.set(x.shape[0] + last.get())
                elif self.how == "append":
                    seen.get().append(x.shape[0])
                elif self.how == "set and reset":  # a context manager's pattern: no change
                    last.reset(last.set(x.shape[0]))
                return x * 2

        x = torch.ones(4, 3)
        net = self.audited_holder(Setting("set and reset"), x)
        net(x)
        self.assertEqual(net._dynaflow_applier.report.planned_calls, 1)
        changed = "was changed by the call, once per micro-batch"
        for how, var in [("set", last), ("append", seen)]:
            with self.subTest(how=how):
                net = planned_holder(Setting(how))
                context = contextvars.copy_context()  # the test's own stays as it was
                context.run(seen.set, [])
                context.run(self.refused_at_second_call, net, x,
                            f"context variable {var.name} {changed}")
                # Once per call, as unmodified.
                self.assertEqual(context[var], 8 if how == "set" else [4, 4])
        # A set that the audited call did not make, split, is caught after
        # the micro-batches ran: loud, and refused from then on.
        net = self.audited_holder(Setting("later"), x)
        later["on"] = True
        err = io.StringIO()
        with self.assertRaisesRegex(RuntimeError, r"Holder\.layers\.0: context variable "
                                                  r"last_rows was changed by the call"), \
                redirect_stderr(err):
            contextvars.copy_context().run(net, x)
        self.assertNotIn("forward", net.layers[0].__dict__)
        self.assertRegex(err.getvalue(), r"; this call raises \(its micro-batches ran\), and the "
                                         r"program runs unmodified after it\n$")

    def test_an_output_sharing_memory_it_would_not_share_merged_is_refused_at_its_first_call(self):
        # Merged, each was a tensor of its own: the caller's in-place write
        # to the output no longer reached the argument (or the other output)
        # it is a view of, and the program computed otherwise (exit 0).
        class Layer(nn.Module):
            def __init__(self, how):
                super().__init__()
                self.how = how

            def forward(self, x):
                h = x * 2
                if self.how == "view of argument":
                    return x[:, :2]
                if self.how == "view of output":  # the last token's row beside the whole
                    return h, h[:, -1]
                if self.how == "overlapping views":  # neither holds the other's rows
                    return h[:, :2], h[:, 1:]
                if self.how == "argument itself":
                    return x.mul_(2)
                return h, h  # one tensor at two places

        for how, where, of in [("view of argument", "the output", "x"),
                               ("overlapping views", "the output[1]", "the output[0]")]:
            with self.subTest(how=how):
                net = planned_holder(Layer(how))
                x = torch.ones(4, 3)
                err = io.StringIO()
                with redirect_stderr(err):
                    out = net(x)
                self.assertIn(f"plan refused: Holder.layers.0: {where} shares memory with {of} "
                              f"(a view): merged from the micro-batches it would be a tensor of "
                              f"its own", err.getvalue())
                self.assertNotIn("forward", net.layers[0].__dict__)
                torch.testing.assert_close(net(x), out)
        for how in ["argument itself", "one tensor twice", "view of output"]:
            with self.subTest(how=how):
                net = self.audited_holder(Layer(how), torch.ones(4, 3))
                x = torch.ones(4, 3)
                out = net(x)
                self.assertEqual(net._dynaflow_applier.report.planned_calls, 1)
                if how == "argument itself":
                    self.assertIs(out, x)
                elif how == "view of output":
                    # Merged as a view of the merged output, as the unsplit
                    # call's: the caller's write through one reaches the other.
                    torch.testing.assert_close(out[1], x[:, -1] * 2, rtol=0, atol=0)
                    out[0][:, -1] = 7.0
                    self.assertEqual(out[1].tolist(), [7.0] * 4)
                else:
                    self.assertIs(out[0], out[1])  # merged once, as the unsplit call's
                    torch.testing.assert_close(out[0], x * 2, rtol=0, atol=0)

        # A fused residual add: the argument returned is itself, although
        # the other argument shares its memory (it was refused).
        class Residual(nn.Module):
            def forward(self, h, residual):
                return residual.add_(h)

        net = planned_holder(Residual())
        buf = torch.ones(4, 6)
        self.audit(net, buf[:, :3], buf[:, 3:], units=1)
        h, residual = buf[:, :3], buf[:, 3:]
        self.assertIs(net(h, residual), residual)
        self.assertEqual(net._dynaflow_applier.report.planned_calls, 1)
        torch.testing.assert_close(buf[:, 3:], torch.full((4, 3), 3.0), rtol=0, atol=0)

    def test_a_nested_batch_refuses_the_plan_and_its_forward_is_put_back(self):
        # A nested tensor's sizes raised from the planned call before; and
        # a refused unit's own forward (an instance attribute, as
        # torch.compile and accelerate set) was deleted, not put back.
        layer = nn.Identity()
        layer.forward = lambda x: x + 1
        net = planned_holder(layer)
        for layout in (torch.strided, torch.jagged):
            with self.subTest(layout=layout):
                x = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)],
                                               layout=layout)
                err = io.StringIO()
                with redirect_stderr(err):
                    out = net(x)
                torch.testing.assert_close(out.unbind()[0], torch.full((2, 3), 2.0))
                if layout == torch.strided:
                    self.assertIn("plan refused: Holder.layers.0: its batch argument of type "
                                  "Tensor has layout torch.strided (nested)", err.getvalue())
        torch.testing.assert_close(net(torch.ones(4, 3)), torch.full((4, 3), 2.0))

    def test_an_output_the_merge_could_not_stack_is_refused_at_its_first_call(self):
        # Each once passed the audit and failed after the micro-batches of
        # the next call ran: a 0-d value, the rows flattened with the tokens,
        # a parameter returned. The audited call runs the original way.
        class Layer(nn.Module):
            def __init__(self, how):
                super().__init__()
                self.how = how
                self.pos = nn.Parameter(torch.randn(1, 5, 3))

            def forward(self, x):
                if self.how == "0-d":
                    return x * 2, torch.zeros(())
                if self.how == "flattened":
                    return (x * 2).reshape(-1, x.shape[-1])
                return x + self.pos, self.pos

        x = torch.randn(4, 5, 3)
        for how, where, shape in (("0-d", "[1]", "()"), ("flattened", "", "(20, 3)"),
                                  ("parameter", "[1]", "(1, 5, 3)")):
            with self.subTest(how=how):
                net = Holder(Layer(how))
                expected = net(x)
                _apply.apply(net, plan(["Holder.layers.*"]), runtime_lib=RUNTIME)
                err = io.StringIO()
                with redirect_stderr(err):
                    actual = [net(x), net(x)]
                for a in actual:
                    torch.testing.assert_close(a, expected, rtol=0, atol=0)
                self.assertIn(f"plan refused: Holder.layers.0: the output{where} is a tensor of "
                              f"shape {shape}, not 4 rows", err.getvalue())
                self.assertEqual(net._dynaflow_applier.report.planned_calls, 0)

    def test_a_call_that_draws_random_numbers_is_refused_at_its_first_call(self):
        # Dropout in training: split, each micro-batch would draw its own mask
        # (on the CPU they can even match, when the micro-batches happen to
        # draw in order; no split can promise it). The audited first call ran
        # the original way, so the program's result is the unmodified one.
        class DropNet(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))])

            def forward(self, x):
                return self.layers[0](x)

        torch.manual_seed(0)
        net, x = DropNet(), torch.randn(8, 8)
        torch.manual_seed(3)
        expected = [net(x), net(x)]
        _apply.apply(net, plan(["DropNet.layers.*"]), runtime_lib=RUNTIME)
        err = io.StringIO()
        torch.manual_seed(3)
        with redirect_stderr(err):
            actual = [net(x), net(x)]
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a, e, rtol=0, atol=0)
        self.assertIn("plan refused: DropNet.layers.0: the call draws random numbers (dropout in "
                      "training, say): split, each micro-batch would draw its own",
                      err.getvalue())
        self.assertNotIn("forward", net.layers[0].__dict__)  # restored
        self.assertEqual(net._dynaflow_applier.report.planned_calls, 0)
        # In eval mode nothing is drawn: the same net splits.
        net.eval()
        _apply.apply(net, plan(["DropNet.layers.*"]), runtime_lib=RUNTIME)
        self.audit(net, x, units=1)
        torch.testing.assert_close(net(x), net.layers[0][0](x))
        self.assertEqual(net._dynaflow_applier.report.planned_calls, 1)

    def test_a_split_call_that_draws_random_numbers_is_a_loud_error(self):
        # Noise on a branch its audited first call did not take: known only
        # once the micro-batches drew their own, so loud, and refused from then on.
        noisy = [False]

        class Noise(nn.Module):
            def forward(self, x):
                return x + torch.rand(x.shape[1]) if noisy[0] else x

        class NoiseNet(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), Noise())])

            def forward(self, x):
                return self.layers[0](x)

        net = NoiseNet()
        _apply.apply(net, plan(["NoiseNet.layers.*"]), runtime_lib=RUNTIME)
        self.audit(net, torch.randn(8, 8), units=1)
        noisy[0] = True
        with redirect_stderr(io.StringIO()) as err, \
                self.assertRaisesRegex(RuntimeError, r"NoiseNet\.layers\.0: the call drew random "
                                                     r"numbers, which the first call of its kind "
                                                     r"did not"):
            net(torch.randn(8, 8))
        self.assertIn("plan refused: NoiseNet.layers.0: the call drew random numbers",
                      err.getvalue())
        self.assertNotIn("forward", net.layers[0].__dict__)  # refused from then on

    def test_a_lazy_modules_first_call_runs_unsplit_and_later_ones_split(self):
        # Its first call infers its parameters (a hook, new parameters): that
        # call runs the original way, and the plan stays.
        class LazyNet(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.ModuleList([nn.Sequential(nn.LazyLinear(3), nn.ReLU())])

            def forward(self, x):
                return self.layers[0](x)

        net = LazyNet()
        _apply.apply(net, plan(["LazyNet.layers.*"]), runtime_lib=RUNTIME)
        report = net._dynaflow_applier.report
        x = torch.randn(4, 5)
        first = net(x)
        self.assertEqual((report.planned_calls, report.original_calls), (0, 1))
        self.assertEqual(report.unsplit, {"LazyNet.layers.0.0: LazyLinear infers its parameters "
                                          "on its first call": 1})
        self.audit(net, x, units=1)
        torch.testing.assert_close(net(x), first)
        self.assertEqual((report.planned_calls, report.original_calls), (1, 2))
        self.assertEqual(report.refused, "")

    def test_a_unit_called_from_inside_a_planned_unit_runs_as_its_micro_batch_calls_it(self):
        class Shared(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(3, 3)

            def forward(self, x):
                return self.lin(x)

        class UsesShared(nn.Module):
            def __init__(self, shared):
                super().__init__()
                self.shared = [shared]  # a reference, not a submodule

            def forward(self, x):
                return x + self.shared[0](x)

        class Top(nn.Module):
            def __init__(self):
                super().__init__()
                shared = Shared()
                self.layers = nn.ModuleList([UsesShared(shared), shared])

            def forward(self, x):
                return self.layers[1](self.layers[0](x))

        net, x = Top(), torch.randn(4, 3)
        expected = net(x)
        # Both layers are units; the first calls the second from its micro-
        # batches, which used to wait for the executor its own call held.
        _apply.apply(net, plan(["Top.layers.*"]), runtime_lib=RUNTIME)
        # The first call: layers.0 audited, its original calling layers.1
        # (inside the audit, which covers it), then layers.1 audited on its own.
        torch.testing.assert_close(self.audit(net, x, units=3), expected, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(net(x), expected, rtol=1e-6, atol=1e-6)
        report = net._dynaflow_applier.report
        # Then both split, layers.0's micro-batches calling layers.1 each.
        self.assertEqual((report.planned_calls, report.original_calls), (2, 5))

    @unittest.skipUnless(importlib.util.find_spec("transformers") is not None,
                         "needs transformers")
    def test_a_vision_model_returning_its_pooled_token_as_a_view_splits_whole(self):
        # Dinov2Model's pooler_output is `last_hidden_state[:, 0, :]`: it was
        # refused as an output sharing memory with another (the encoder alone
        # split). Merged as a row view of the merged hidden states it is the
        # unsplit call's, view and all.
        from transformers import Dinov2Config, Dinov2Model

        torch.manual_seed(0)
        model = Dinov2Model(Dinov2Config(hidden_size=32, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=64,
                                         image_size=28, patch_size=14)).eval()
        pixels = torch.randn(4, 3, 28, 28)
        with torch.no_grad():
            expected = model(pixels)
            _apply.apply(model, plan(["Dinov2Model"]), runtime_lib=RUNTIME)
            err = io.StringIO()
            with redirect_stderr(err):
                outs = [model(pixels) for _ in range(3)]
        self.assertNotIn("refused", err.getvalue())
        report = model._dynaflow_applier.report
        self.assertEqual((report.planned_calls, report.original_calls), (2, 1))
        for out in outs:
            torch.testing.assert_close(out.last_hidden_state, expected.last_hidden_state)
            torch.testing.assert_close(out.pooler_output, expected.pooler_output)
        got = outs[-1]
        self.assertEqual(got.pooler_output.data_ptr(), got.last_hidden_state[:, 0].data_ptr())
        self.assertEqual(got.pooler_output.stride(), expected.pooler_output.stride())

    @unittest.skipUnless(importlib.util.find_spec("transformers") is not None,
                         "needs transformers")
    def test_encoders_nobody_here_wrote_split_their_layers_with_the_same_outputs(self):
        # Text encoders with padding masks, a vision transformer and a
        # shifted-window one, and speech encoders (mel features; raw audio
        # through a convolutional front end): each layer list split in 2, its
        # first call audited, the later ones planned.
        import transformers as tf

        ids = torch.randint(3, 100, (4, 10), generator=torch.Generator().manual_seed(1))
        mask = torch.ones(4, 10, dtype=torch.long)
        mask[1, 7:] = 0
        mask[3, 4:] = 0
        text = dict(input_ids=ids, attention_mask=mask)
        small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64)
        cases = [
            (lambda: tf.BertModel(tf.BertConfig(vocab_size=100, **small)),
             "BertModel.encoder.layer.*", text),
            (lambda: tf.DebertaV2Model(tf.DebertaV2Config(vocab_size=100, **small)),
             "DebertaV2Model.encoder.layer.*", text),
            (lambda: tf.ViTModel(tf.ViTConfig(image_size=32, patch_size=8, **small)),
             "ViTModel.layers.*", dict(pixel_values=torch.randn(4, 3, 32, 32))),
            (lambda: tf.SwinModel(tf.SwinConfig(image_size=32, patch_size=4, embed_dim=16,
                                                depths=[1, 1], num_heads=[2, 2], window_size=4)),
             "SwinModel.encoder.layers.*", dict(pixel_values=torch.randn(4, 3, 32, 32))),
            (lambda: tf.WhisperModel(tf.WhisperConfig(
                vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=1,
                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=30,
                max_target_positions=40, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                decoder_start_token_id=1)).get_encoder(),
             "WhisperEncoder.layers.*", dict(input_features=torch.randn(4, 16, 60))),
            (lambda: tf.Wav2Vec2Model(tf.Wav2Vec2Config(
                conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, **small)),
             "Wav2Vec2Model.encoder.layers.*", dict(input_values=torch.randn(4, 400))),
        ]
        for make, unit, inputs in cases:
            with self.subTest(unit=unit):
                torch.manual_seed(0)
                model = make().eval()
                with torch.no_grad():
                    expected = model(**inputs).last_hidden_state
                    _apply.apply(model, plan([unit]), runtime_lib=RUNTIME)
                    err = io.StringIO()
                    with redirect_stderr(err):
                        outs = [model(**inputs).last_hidden_state for _ in range(3)]
                self.assertNotIn("refused", err.getvalue())
                report = model._dynaflow_applier.report
                self.assertEqual((report.planned_calls, report.original_calls), (4, 2))
                for out in outs:
                    torch.testing.assert_close(out, expected)
                model._dynaflow_applier.detach()

    def test_a_refused_compiled_flex_attention_runs_on_unmodified(self):
        # transformers' attn_implementation="flex_attention" calls a
        # torch.compile'd flex_attention. Its higher-order operator refuses
        # the plan at the audited call; the program's next call, unmodified,
        # raised torch._dynamo.exc.Unsupported before (dynamo had first run
        # it under the audit's dispatch mode).
        from torch.nn.attention.flex_attention import flex_attention

        attend = torch.compile(flex_attention, backend="eager")

        class Attention(nn.Module):
            def forward(self, q):
                return attend(q, q * 2, q * 3)

        net, q = Holder(Attention()), torch.randn(4, 2, 16, 8)
        with torch.no_grad():
            expected = net(q)
            _apply.apply(net, plan(["Holder.layers.*"]), runtime_lib=RUNTIME)
            err = io.StringIO()
            with redirect_stderr(err):
                torch.testing.assert_close(net(q), expected)
            self.assertIn("plan refused: Holder.layers.0: flex_attention is a higher-order "
                          "operator, whose body the audit does not follow", err.getvalue())
            torch.testing.assert_close(net(q), expected)

    def test_a_compiled_submodule_inside_a_unit_is_audited_and_splits(self):
        # Compiled code runs eagerly in the audited call (its operators are
        # seen: no graph of the whole batch's 4 rows is compiled then), and
        # is compiled for the micro-batches' 2 rows when they first run (the
        # audited call's comparison). Before, dynamo first ran it under the
        # audit's dispatch mode and never compiled it again; then, compiled
        # in a micro-batch, its `_vt_active_calls` (set on first use) was
        # taken for a change of the caller's context.
        for compiled_before in (False, True):
            with self.subTest(compiled_before=compiled_before):
                torch._dynamo.reset()  # else the first subtest's calls make shapes dynamic
                graphs = []

                def count(gm, inputs):
                    graphs.append(inputs[-1].shape[0])  # its input's rows
                    return gm.forward

                inner = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
                net = nn.Sequential(nn.Sequential(torch.compile(inner, backend=count)))
                x = torch.randn(4, 8)
                expected = net(x) if compiled_before else inner(x)
                _apply.apply(net, plan(["Sequential.*"]), runtime_lib=RUNTIME)
                torch.testing.assert_close(self.audit(net, x, units=1), expected)
                self.assertEqual(graphs.count(4), int(compiled_before))
                self.assertGreaterEqual(graphs.count(2), 1)
                for _ in range(2):
                    torch.testing.assert_close(net(x), expected)
                self.assertEqual(net._dynaflow_applier.report.planned_calls, 2)
                self.assertEqual(graphs.count(4), int(compiled_before))

    def test_compiled_code_runs_eagerly_until_the_last_watching_thread_leaves(self):
        # The stance is the process's: two threads entering and leaving in
        # turn left it at force_eager for good before (nothing compiled).
        from torch._dynamo import eval_frame

        entered, left = threading.Event(), threading.Event()
        stances = []

        def first():
            with _split.watching(contextlib.nullcontext()):
                entered.set()
                left.wait()
            stances.append(eval_frame._stance.stance)

        thread = threading.Thread(target=first)
        thread.start()
        entered.wait()
        with _split.watching(contextlib.nullcontext()):
            left.set()
            thread.join()
            stances.append(eval_frame._stance.stance)
        stances.append(eval_frame._stance.stance)
        self.assertEqual(stances, ["force_eager", "force_eager", "default"])

    def test_a_child_forked_while_another_thread_watches_compiles_again(self):
        # The watching thread is the parent's and never leaves in the child:
        # its share kept the child's torch.compile'd code eager for good.
        # The forking thread's own share holds until it leaves.
        from torch._dynamo import eval_frame

        entered, leave = threading.Event(), threading.Event()

        def watch():
            with _split.watching(contextlib.nullcontext()):
                entered.set()
                leave.wait()

        thread = threading.Thread(target=watch)
        thread.start()
        entered.wait()
        read, write = os.pipe()
        stances = []
        with _split.watching(contextlib.nullcontext()):
            pid = os.fork()
            if pid == 0:
                stances.append(eval_frame._stance.stance)
        if pid == 0:  # the child
            try:
                stances.append(eval_frame._stance.stance)
                os.write(write, repr(stances).encode())
            finally:
                os._exit(0)
        os.close(write)
        self.assertEqual(os.waitpid(pid, 0)[1], 0)
        with os.fdopen(read) as f:
            self.assertEqual(ast.literal_eval(f.read()), ["force_eager", "default"])
        self.assertEqual(eval_frame._stance.stance, "force_eager")  # the thread's, here
        leave.set()
        thread.join()
        self.assertEqual(eval_frame._stance.stance, "default")

    def test_autocast_holds_in_the_micro_batches(self):
        net, x = nn.Sequential(nn.Linear(3, 3)), torch.randn(4, 3)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            expected = net(x)
        _apply.apply(net, plan(["Sequential.*"]), runtime_lib=RUNTIME)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            self.audit(net, x, units=1)
            out = net(x)
        self.assertEqual(net._dynaflow_applier.report.planned_calls, 1)
        self.assertEqual(out.dtype, torch.bfloat16)
        torch.testing.assert_close(out, expected)

    def modes_net(self):
        """A one-layer net, the input, and the net's unplanned outputs under
        neither mode, under a function mode that negates linear layers and
        under a dispatch mode that doubles addmm; the net planned and
        audited."""
        net, x = nn.Sequential(nn.Linear(3, 3)), torch.randn(4, 3)
        plain = net(x)
        with NegateLinear():
            negated = net(x)
        with DoubleAddmm():
            doubled = net(x)
        _apply.apply(net, plan(["Sequential.*"]), runtime_lib=RUNTIME)
        self.audit(net, x, units=1)
        return net, x, plain, negated, doubled

    @unittest.skipUnless(REPLAY, "the replay module is not built (DYNAFLOW_REPLAY_EXT_BUILT)")
    def test_the_callers_torch_modes_hold_in_the_micro_batches(self):
        # Each computed otherwise on the worker threads before CallerState.
        net, x, _, negated, doubled = self.modes_net()
        report = net._dynaflow_applier.report
        with NegateLinear():
            torch.testing.assert_close(net(x), negated, rtol=0, atol=0)
        with DoubleAddmm():
            torch.testing.assert_close(net(x), doubled, rtol=0, atol=0)
        self.assertEqual(report.planned_calls, 2)

    @unittest.skipUnless(REPLAY, "the replay module is not built (DYNAFLOW_REPLAY_EXT_BUILT)")
    def test_torch_func_grad_and_saved_tensor_hooks_hold_in_the_micro_batches(self):
        net = Holder(nn.Sequential(nn.Linear(3, 3), nn.Tanh()))
        x = torch.randn(4, 3)
        expected = torch.func.grad(lambda y: net(y).square().sum())(x)
        _apply.apply(net, plan(["Holder.layers.*"]), runtime_lib=RUNTIME)
        report = net._dynaflow_applier.report
        self.audit(net, x, units=1)
        # A gradient of 1.3 off before: the transform did not reach the workers.
        torch.testing.assert_close(torch.func.grad(lambda y: net(y).square().sum())(x),
                                   expected)
        x = x.clone().requires_grad_(True)
        expected = torch.autograd.grad(net(x).square().sum(), x)[0]
        self.assertEqual(report.planned_calls, 2)
        # save_on_cpu's hooks move each saved tensor by itself: they hold in
        # the micro-batches (their saves, 2 of the 4 rows each, went through
        # no hook before).
        with mock.patch.object(torch.Tensor, "pin_memory", lambda t: t):  # no GPU here
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                out = net(x)
        self.assertEqual(report.planned_calls, 3)
        torch.testing.assert_close(torch.autograd.grad(out.square().sum(), x)[0], expected)
        # Other hooks may count or match what is saved (a split saves other
        # shapes, in its threads' order): the call runs unsplit.
        packed = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t,
                                                      lambda t: t):
            out = net(x)
        self.assertEqual(report.planned_calls, 3)
        # The unsplit call's saves: the input and weight, tanh's output.
        self.assertEqual([tuple(t.shape) for t in packed], [(4, 3), (3, 3), (4, 3)])
        self.assertEqual(len(report.unsplit), 2)  # the audit's, and the hooks'

    @unittest.skipUnless(REPLAY, "the replay module is not built (DYNAFLOW_REPLAY_EXT_BUILT)")
    def test_forward_mode_tangents_and_a_vmapped_ensemble_hold_in_the_micro_batches(self):
        # Forward-mode AD (dual tensors, torch.func.jvp) and a model ensemble
        # (stack_module_state, functional_call under vmap): the tangents and
        # the stacked parameters reach each micro-batch, and the merge keeps
        # the tangents.
        import torch.autograd.forward_ad as fwAD
        from torch.func import functional_call, jvp, stack_module_state, vmap

        tangent = torch.randn(6, 5, 16)
        params, buffers = stack_module_state([self.net, copy.deepcopy(self.net)])

        def ensemble(x):
            return vmap(lambda p, b: functional_call(self.net, (p, b), (x,)))(params, buffers)

        def tangents(x):
            with fwAD.dual_level():
                out = fwAD.unpack_dual(self.net(fwAD.make_dual(x, tangent)))
                return out.primal.clone(), out.tangent.clone()

        x = torch.randn(6, 5, 16)
        want = {"dual": tangents(x), "jvp": jvp(self.net, (x,), (tangent,)),
                "ensemble": ensemble(x)}
        self.applied(["Net.blocks.*"])
        report = self.net._dynaflow_applier.report
        got = {"dual": tangents(x), "jvp": jvp(self.net, (x,), (tangent,)),
               "ensemble": ensemble(x)}
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        self.assertEqual(report.planned_calls, 9)
        self.assertEqual(len(report.unsplit), 3)  # the audited calls only

    @unittest.skipUnless(REPLAY, "the replay module is not built (DYNAFLOW_REPLAY_EXT_BUILT)")
    def test_a_first_call_under_a_transform_runs_unsplit_and_the_kind_is_audited_later(self):
        # The audit follows neither a torch.func transform's wrapped tensors
        # nor forward-mode tangents: it refused the whole plan when the
        # first call of a kind came under one. Such a call now runs the
        # original way; the first plain call audits the kind, and the
        # transformed calls split from then on.
        import torch.autograd.forward_ad as fwAD
        from torch.func import functional_call, grad, jvp, stack_module_state, vmap

        x, tangent = torch.randn(6, 5, 16), torch.randn(6, 5, 16)

        def dual(net):
            with fwAD.dual_level():
                out = fwAD.unpack_dual(net(fwAD.make_dual(x, tangent)))
                return out.primal.clone(), out.tangent.clone()

        def ensemble(net):
            params, buffers = stack_module_state([net, copy.deepcopy(net)])
            return vmap(lambda p, b: functional_call(net, (p, b), (x,)))(params, buffers)

        calls = {"jvp": (lambda net: jvp(net, (x,), (tangent,)), "a torch.func transform"),
                 "dual": (dual, "a forward-mode AD level"),
                 "ensemble": (ensemble, "a torch.func transform"),
                 "grad": (lambda net: grad(lambda y: net(y).sum())(x), "a torch.func transform")}
        for name, (call, what) in calls.items():
            with self.subTest(name):
                torch.manual_seed(0)
                net = Net()
                want = call(net)
                _apply.apply(net, plan(["Net.blocks.*"]), runtime_lib=RUNTIME)
                report = net._dynaflow_applier.report
                torch.testing.assert_close(call(net), want, rtol=0, atol=0)
                self.assertEqual((report.refused, report.planned_calls), ("", 0))
                self.assertEqual(report.unsplit, {
                    f"Net.blocks.{k}: {what} is {'open' if name == 'dual' else 'active'}, and "
                    f"the first call of a kind is audited without one": 1 for k in range(3)})
                self.audit(net, x)
                torch.testing.assert_close(call(net), want, rtol=1e-5, atol=1e-6)
                self.assertEqual((report.refused, report.planned_calls), ("", 3))

    @unittest.skipUnless(REPLAY, "the replay module is not built (DYNAFLOW_REPLAY_EXT_BUILT)")
    def test_torch_profiler_sees_the_micro_batches_operators(self):
        net, x = Holder(nn.Linear(3, 3)), torch.randn(4, 3)
        _apply.apply(net, plan(["Holder.layers.*"]), runtime_lib=RUNTIME)
        self.audit(net, x, units=1)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            net(x)
        self.assertEqual(net._dynaflow_applier.report.planned_calls, 1)
        # One per micro-batch; none before: the profiler's callbacks are the
        # caller thread's.
        self.assertEqual({e.key: e.count for e in prof.key_averages()}.get("aten::addmm"), 2)

    def test_without_the_replay_module_calls_under_torch_modes_run_unsplit(self):
        net, x, plain, negated, doubled = self.modes_net()
        applier = net._dynaflow_applier
        applier.caller_state, applier.no_caller_state = None, "not loaded here"
        with NegateLinear():
            torch.testing.assert_close(net(x), negated, rtol=0, atol=0)
        with DoubleAddmm():
            torch.testing.assert_close(net(x), doubled, rtol=0, atol=0)
        with torch.autograd.graph.save_on_cpu():  # hooks the replay module would carry
            net(x)
        torch.func.grad(lambda y: net(y).sum())(x)
        self.assertEqual(applier.report.planned_calls, 0)
        carried = "which only the replay module carries into the micro-batches (not loaded here)"
        self.assertEqual({k: v for k, v in applier.report.unsplit.items() if "replay" in k}, {
            f"Sequential.0: a torch function mode is active (a TorchFunctionMode, torch.device), "
            f"{carried}": 1,
            f"Sequential.0: a torch dispatch mode is active, {carried}": 1,
            f"Sequential.0: saved-tensor hooks are active, {carried}": 1,
            f"Sequential.0: a torch.func transform is active, {carried}": 1})
        torch.testing.assert_close(net(x), plain)  # no mode: it splits
        self.assertEqual(applier.report.planned_calls, 1)

    def test_verify_puts_the_module_buffers_back_after_the_baseline(self):
        torch.manual_seed(0)
        block = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))  # training: updates its stats
        block[1].running_mean.normal_()
        before = block[1].running_mean.clone()
        base = _apply._Baseline(block, block.forward, (torch.randn(4, 3),), {})
        torch.testing.assert_close(block[1].running_mean, before, rtol=0, atol=0)
        self.assertFalse(torch.equal(base.buffers["1.running_mean"], before))
        self.assertEqual(set(base.buffers), {"1.running_mean", "1.running_var",
                                             "1.num_batches_tracked"})

    def test_verify_puts_every_random_state_back_after_the_baseline(self):
        import random

        import numpy

        class Draws(nn.Module):
            def forward(self, x):
                return x * (torch.rand(1) + random.random() + numpy.random.rand())

        def states():
            return (torch.get_rng_state(), random.getstate(), str(numpy.random.get_state()))

        x = torch.randn(4, 3)
        before = states()
        _apply._Baseline(Draws(), Draws().forward, (x,), {})
        after = states()
        self.assertTrue(torch.equal(after[0], before[0]))
        self.assertEqual(after[1:], before[1:])

    def test_a_tensor_without_storage_in_the_arguments_counts_nothing_for_the_copy(self):
        net = planned_holder(nn.Linear(3, 3))
        forward = net._dynaflow_applier.forwards[0]
        sparse = torch.eye(4).to_sparse()
        args, kwargs = forward._copy_for_comparison((torch.randn(4, 3),), {"mask": sparse})
        self.assertTrue(torch.equal(kwargs["mask"].to_dense(), torch.eye(4)))
        self.assertEqual(len(args), 1)

    def test_small_steps_and_small_batches_run_the_original_forward(self):
        _apply.apply(self.net, plan(["Net.blocks.*"], splits=2, min_split_tokens=64),
                     runtime_lib=RUNTIME)
        report = self.net._dynaflow_applier.report
        self.net(torch.randn(2, 8, 16))  # 16 tokens: the sequential bucket
        self.assertEqual((report.planned_calls, report.original_calls), (0, 3))
        self.net(torch.randn(1, 100, 16))  # 100 tokens, one row: nothing to split
        self.assertEqual((report.planned_calls, report.original_calls), (0, 6))
        self.audit(self.net, torch.randn(4, 100, 16))
        self.net(torch.randn(4, 100, 16))
        self.assertEqual((report.planned_calls, report.original_calls), (3, 9))

    def test_gradients_flow_through_planned_calls(self):
        x = self.x.clone().requires_grad_(True)
        self.net(x).sum().backward()
        expected = [p.grad.clone() for p in self.net.parameters()]
        expected_x = x.grad.clone()
        self.net.zero_grad()
        x.grad = None
        _apply.apply(self.net, plan(["Net.blocks.*"]), runtime_lib=RUNTIME)
        self.net(x).sum().backward()
        for p, g in zip(self.net.parameters(), expected):
            torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(x.grad, expected_x, rtol=1e-5, atol=1e-6)

    def test_inference_mode_holds_on_the_worker_threads(self):
        _apply.apply(self.net, plan(["Net.blocks.*"]), runtime_lib=RUNTIME)
        with torch.inference_mode():
            out = self.net(self.x)
        self.assertTrue(out.is_inference())

    def test_an_error_in_a_micro_batch_reaches_the_caller(self):
        _apply.apply(self.net, plan(["Net.blocks.*"]), runtime_lib=RUNTIME)
        with self.assertRaisesRegex(RuntimeError, "shapes cannot be multiplied"):
            self.net(torch.randn(4, 5, 7))

    def test_units_resolve_to_the_outermost_matching_modules(self):
        found = _apply.resolve_units(self.net, plan(["Net.head", "Net.blocks.*"]))
        self.assertEqual([path for path, _ in found],
                         ["Net.blocks.0", "Net.blocks.1", "Net.blocks.2", "Net.head"])
        self.assertIs(found[3][1], self.net.head)
        inner = _apply.resolve_units(self.net, plan(["Net.blocks.*.up"]))
        self.assertEqual([m for _, m in inner], [b.up for b in self.net.blocks])
        # A unit inside another one that is split already matches nothing.
        with self.assertRaisesRegex(_apply.PlanMismatch, r"unknown module Net\.blocks\.\*\.up"):
            _apply.resolve_units(self.net, plan(["Net.blocks.*", "Net.blocks.*.up"]))

    def test_unknown_modules_and_operators_are_refused_unchanged(self):
        with self.assertRaisesRegex(_apply.PlanMismatch, r"unknown module Net\.layers\.\*"):
            _apply.apply(self.net, plan(["Net.layers.*"]), runtime_lib=RUNTIME)
        with self.assertRaisesRegex(_apply.PlanMismatch, "operators"):
            _apply.apply(self.net, plan(["aten::linear"]), runtime_lib=RUNTIME)
        self.assertNotIn("forward", self.net.blocks[0].__dict__)

    def test_a_plan_for_a_gpu_is_refused_on_the_cpu(self):
        with self.assertRaisesRegex(_apply.PlanMismatch, "NVIDIA H200.*cpu"):
            _apply.apply(self.net, plan(["Net.blocks.*"], device="NVIDIA H200"),
                         runtime_lib=RUNTIME)

    def test_an_applied_forward_keeps_the_original_parameters(self):
        # Callers read them: transformers' generate() passes position_ids
        # (made from the padding mask) only to a forward that takes them,
        # so with (*args, **kwargs) GPT-2 generated other tokens.
        class Layer(nn.Module):
            def forward(self, x, position_ids=None, *, scale=1.0):
                return x * scale

        net = planned_holder(Layer())
        self.assertEqual(str(inspect.signature(net.layers[0].forward)),
                         "(x, position_ids=None, *, scale=1.0)")
        net._dynaflow_applier.detach()
        self.assertEqual(str(inspect.signature(net.layers[0].forward)),
                         "(x, position_ids=None, *, scale=1.0)")

    def test_a_copy_of_an_applied_model_is_a_model_of_its_own_unplanned(self):
        # copy.deepcopy (a reference or EMA model) and pickle (torch.save of
        # the whole model): a unit's copy shared the planned forward, and ran
        # the original's weights; the model's copy raised on the applier.
        x, want = self.applied(["Net.blocks.*"])
        report = self.net._dynaflow_applier.report
        buffer = io.BytesIO()
        torch.save(self.net, buffer)
        buffer.seek(0)
        for twin in (copy.deepcopy(self.net), torch.load(buffer, weights_only=False)):
            self.assertIsNone(twin._dynaflow_applier)
            torch.testing.assert_close(twin(x), want, rtol=0, atol=0)
            with torch.no_grad():
                for p in twin.parameters():
                    p.zero_()
            self.assertEqual(twin(x).abs().max().item(), 0.0)  # its own weights
        block = copy.deepcopy(self.net.blocks[0])
        with torch.no_grad():
            for p in block.parameters():
                p.zero_()
        torch.testing.assert_close(block(x), x, rtol=0, atol=0)  # x + 0: its own weights
        self.assertEqual(report.planned_calls, 0)  # no copy ran the plan
        torch.testing.assert_close(self.net(x), want, rtol=1e-5, atol=1e-6)
        self.assertEqual(report.planned_calls, 3)

    def test_a_copy_of_a_unit_with_a_forward_of_its_own_keeps_that_forward(self):
        # A unit whose forward was assigned to the instance before apply: its
        # pickled copy loaded the installed forward by name, as its class's,
        # and computed without the patch (a max difference of 4 here).
        for block in self.net.blocks:
            block.forward = functools.partial(scaled_block_forward, block)
        x, want = self.applied(["Net.blocks.*"])
        buffer = io.BytesIO()
        torch.save(self.net, buffer)
        buffer.seek(0)
        for twin in (torch.load(buffer, weights_only=False), copy.deepcopy(self.net)):
            torch.testing.assert_close(twin(x), want, rtol=0, atol=0)
            for block in twin.blocks:
                self.assertNotIn("__getstate__", block.__dict__)
                self.assertIs(block.forward.args[0], block)  # bound to the copy
        self.assertEqual(self.net._dynaflow_applier.report.planned_calls, 0)
        torch.testing.assert_close(self.net(x), want, rtol=1e-5, atol=1e-6)
        self.net._dynaflow_applier.detach()
        for block in self.net.blocks:
            self.assertIs(block.forward.func, scaled_block_forward)
            self.assertNotIn("__getstate__", block.__dict__)
        # An instance __getstate__ of the program's own stays, through apply and detach.
        net = Net()
        block = net.blocks[0]
        block.forward = functools.partial(scaled_block_forward, block)
        mine = block.__dict__["__getstate__"] = functools.partial(nn.Module.__getstate__, block)
        _apply.apply(net, plan(["Net.blocks.*"]), runtime_lib=RUNTIME)
        self.assertIs(block.__dict__["__getstate__"], mine)
        net._dynaflow_applier.detach()
        self.assertIs(block.__dict__["__getstate__"], mine)

    def test_a_traced_call_records_the_original_operators_and_the_plan_stays(self):
        # A tracer records only its own thread's operators, with one call's
        # row counts: torch.jit.trace raised in the split (its row count is
        # a traced tensor), make_fx's graph lacked the micro-batches' work,
        # and export's fake tensors refused the plan for the real calls.
        from torch.fx.experimental.proxy_tensor import make_fx

        x, want = self.applied(["Net.blocks.*"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracers' own warnings
            graphs = {"jit": torch.jit.trace(self.net, x, check_trace=False),
                      "make_fx": make_fx(self.net)(x),
                      "export": torch.export.export(self.net, (x,)).module()}
        for how, graph in graphs.items():
            with self.subTest(how):
                torch.testing.assert_close(graph(x), want, rtol=1e-5, atol=1e-6)
        report = self.net._dynaflow_applier.report
        self.assertEqual(report.refused, "")
        for why in ("torch.jit.trace records it", "a tracer records it on fake tensors",
                    "torch.export records it"):
            self.assertEqual(report.unsplit[f"Net.blocks.0: {why}, the original way"], 1)
        self.assertEqual(report.planned_calls, 0)
        torch.testing.assert_close(self.net(x), want, rtol=1e-5, atol=1e-6)
        self.assertEqual(report.planned_calls, 3)

    def test_the_model_as_its_own_unit_exports_and_copies_as_a_model(self):
        # The installed forward is a method of the module, as the original:
        # torch.export reads its __code__, copies bind their own module.
        x, want = self.applied(["Net"], audited=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exported = torch.export.export(self.net, (x,)).module()
        torch.testing.assert_close(exported(x), want, rtol=1e-5, atol=1e-6)
        twin = copy.deepcopy(self.net)
        self.assertIs(twin.forward.__self__, twin)
        with torch.no_grad():
            twin.head.bias.fill_(1.0)
            twin.head.weight.zero_()
        self.assertTrue(torch.equal(twin(x), torch.ones(6, 5, 4)))
        report = self.net._dynaflow_applier.report
        self.assertEqual(report.planned_calls, 0)
        torch.testing.assert_close(self.net(x), want, rtol=1e-5, atol=1e-6)
        self.assertEqual((report.planned_calls, report.refused), (1, ""))

    def test_a_unit_inside_torchs_checkpoint_trains_as_unsplit(self):
        # torch.utils.checkpoint without reentrancy matches the tensors its
        # recomputation saves with the forward's, by count and order: split,
        # its recomputation raised (or, in another order, would have matched
        # one micro-batch's tensors with the other's).
        from torch.utils.checkpoint import checkpoint

        class Checkpointed(nn.Module):
            def __init__(self, layer):
                super().__init__()
                self.layers = nn.ModuleList([layer])

            def forward(self, x):
                return checkpoint(self.layers[0], x, use_reentrant=False)

        torch.manual_seed(0)
        net = Checkpointed(nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)))
        x = torch.randn(6, 8)
        expected = torch.autograd.grad(net(x).square().sum(), list(net.parameters()))
        _apply.apply(net, plan(["Checkpointed.layers.*"]), runtime_lib=RUNTIME)
        for _ in range(3):
            got = torch.autograd.grad(net(x).square().sum(), list(net.parameters()))
            for g, e in zip(got, expected):
                torch.testing.assert_close(g, e)
        report = net._dynaflow_applier.report
        self.assertEqual((report.planned_calls, report.refused), (0, ""))
        why, = [w for w in report.unsplit if "_checkpoint_hook" in w]
        self.assertTrue(why.startswith("Checkpointed.layers.0: saved-tensor hooks are active "
                                       "(torch.utils.checkpoint._checkpoint_hook."), why)

    def test_a_forked_child_runs_the_model_unplanned_and_exits(self):
        # A server that warms its model up and then forks its workers: the
        # runtime's threads stay in the parent, and a child's planned call
        # waited for them forever (as did its exit, joining them).
        x, want = self.applied(["Net.blocks.*"])
        self.net(x)
        report = self.net._dynaflow_applier.report
        self.assertEqual(report.planned_calls, 3)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its answer on the pipe, then the exit's detach
            torch.set_num_threads(1)  # OpenMP's pool, once used, is not the child's
            try:
                same = torch.equal(self.net(x), want)
                counts = (report.planned_calls, report.original_calls, len(report.unsplit))
                self.net._dynaflow_applier.detach()
                os.write(write, repr((same, counts, list(report.unsplit))).encode())
            finally:
                os._exit(0)
        os.close(write)
        deadline = time.monotonic() + 30
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                self.fail("the forked child hung")
            time.sleep(0.05)
        with os.fdopen(read) as f:
            same, counts, reasons = ast.literal_eval(f.read())
        self.assertTrue(same)
        self.assertEqual(counts, (0, 3, 3))  # its own calls only, the units' each once
        self.assertEqual(reasons[0], f"Net.blocks.0: {_apply._FORKED}")
        torch.testing.assert_close(self.net(x), want, rtol=1e-5, atol=1e-6)
        self.assertEqual(report.planned_calls, 6)  # the parent's plan goes on

    def test_a_child_forked_while_the_plan_attaches_is_told(self):
        # Another thread's fork just after the executor's threads started
        # left a child that was never told (it waited for them forever):
        # the applier joined the ones told of a fork only once attached.
        applier = _apply.Applier(plan(["Holder.layers.*"]), RUNTIME, False)
        self.addCleanup(applier.detach)
        told = []
        executor = applier.runtime.executor

        def forking(*args):
            made = executor(*args)
            told.append(applier in _apply._ATTACHED_APPLIERS)  # what a fork here would tell
            return made

        with mock.patch.object(applier.runtime, "executor", forking):
            applier.attach(Holder(Block(16)))
        self.assertEqual(told, [True])

    def test_a_forked_child_gets_torch_distributed_back(self):
        # A plan that overlaps collectives wraps torch.distributed's and some
        # tensor reads (_CollectiveCuts); a child (a server's worker) runs
        # every call the original way, and its own collectives unwrapped.
        import torch.distributed as dist

        originals = dist.all_reduce, torch.Tensor.tolist
        overlap = plan(["Holder.layers.*"])
        overlap["buckets"][0].update(strategy="comm_overlap", splits=1)
        overlap["partition_rules"][0]["role"] = "side_stream"
        applier = _apply.apply(Holder(Block(16)), overlap, runtime_lib=RUNTIME)._dynaflow_applier
        self.addCleanup(applier.detach)
        self.assertIsNot(dist.all_reduce, originals[0])
        self.assertIsNot(torch.Tensor.tolist, originals[1])
        executor = applier.executor
        applier._forked()  # what a child's at-fork handler runs (_after_fork_in_child)
        applier.runtime.lib.dynaflow_apply_executor_free(executor)  # the parent's threads
        self.assertIs(dist.all_reduce, originals[0])
        self.assertIs(torch.Tensor.tolist, originals[1])

    def test_the_models_device_is_its_parameters_else_its_buffers(self):
        # A model of buffers alone (on the GPU, its executor streams) was
        # taken for a CPU model; one without tensors is told per call.
        class Buffered(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("scale", torch.ones(16, device="meta"))

        self.assertEqual(_apply.model_device(self.net), torch.device("cpu"))
        self.assertEqual(_apply.model_device(Holder(Buffered())), torch.device("meta"))
        self.assertIsNone(_apply.model_device(Holder(Positioned())))
        with self.assertRaisesRegex(_apply.PlanMismatch, "NVIDIA H200.*meta"):
            _apply.apply(Holder(Buffered()), plan(["Holder.layers.*"], device="NVIDIA H200"),
                         runtime_lib=RUNTIME)
        # Without tensors the device is unknown: the calls' arguments say.
        _apply.apply(Holder(Positioned()), plan(["Holder.layers.*"], device="NVIDIA H200"),
                     runtime_lib=RUNTIME)

    def test_a_call_on_another_device_than_the_executors_runs_unsplit(self):
        # A model without tensors, applied with a CPU executor, called on
        # another device: its micro-batches would not be issued for that
        # device (on CUDA: the default stream, beside the caller's).
        net = planned_holder(Positioned())
        x = torch.randn(4, 3)
        self.audit(net, x, 1, units=1)
        torch.testing.assert_close(net(x, 1), x * 2 + 1, rtol=0, atol=0)
        report = net._dynaflow_applier.report
        self.assertEqual(report.planned_calls, 1)
        out = net(x.to("meta"), 1)
        self.assertEqual((out.device.type, out.shape), ("meta", (4, 3)))
        self.assertEqual(report.planned_calls, 1)
        self.assertEqual(report.unsplit["Holder.layers.0: its arguments are on meta, the plan's "
                                        "executor issues on cpu (the device of the model's "
                                        "parameters or buffers at apply)"], 1)

    def test_a_cuda_call_runs_split_only_on_the_executors_device_made_current(self):
        # The executor's streams are made on the device current at apply;
        # on another one its kernels would go to that device's default
        # stream, unordered with the caller's.
        cuda0, cuda1 = torch.device("cuda", 0), torch.device("cuda", 1)
        self.assertEqual(_apply.device_refusal(cuda1, cuda1, 1), "")
        self.assertEqual(_apply.device_refusal(torch.device("cpu"), torch.device("cpu"), None), "")
        self.assertEqual(_apply.device_refusal(cuda1, cuda0, 0),
                         "its arguments are on cuda:1, the plan's executor issues on cuda:0 (the "
                         "device of the model's parameters or buffers at apply)")
        self.assertEqual(_apply.device_refusal(cuda0, cuda0, 1),
                         "the current CUDA device is 1, the plan's executor issues on cuda:0, "
                         "where the model is")
        self.assertIn("on cpu, the plan's executor issues on cuda:0",
                      _apply.device_refusal(torch.device("cpu"), cuda0, 0))

    def test_an_output_reduced_over_the_rows_is_refused_at_the_first_call(self):
        # x.sum() adds every row: the audit of the first call refuses the
        # plan, and that call ran once, the original way.
        net = SumNet()
        calls = []
        net.layers[0].register_forward_pre_hook(lambda m, a: calls.append(1))
        _apply.apply(net, plan(["SumNet.layers.*"]), runtime_lib=RUNTIME)
        x = torch.randn(4, 3)
        err = io.StringIO()
        with redirect_stderr(err):
            out = net(x)
        torch.testing.assert_close(out, x.sum())
        self.assertEqual(len(calls), 1)
        self.assertRegex(err.getvalue(), r"plan refused: SumNet\.layers\.0: the call returns a "
                                         r"value reduced over the rows \(by aten::sum at "
                                         r"apply_test\.py:\d+ forward\)")
        self.assertNotIn("forward", net.layers[0].__dict__)  # restored

    def test_an_output_that_cannot_be_merged_is_refused_at_its_first_call(self):
        # Each micro-batch returns its row count, which no operator computed:
        # the audited call's comparison finds the outputs cannot be merged,
        # and the call returns its unsplit result.
        class RowCount(nn.Module):
            def forward(self, x):
                return x.shape[0]

        net = nn.Sequential(RowCount())
        _apply.apply(net, plan(["Sequential.*"]), runtime_lib=RUNTIME)
        err = io.StringIO()
        with redirect_stderr(err):
            self.assertEqual(net(torch.randn(4, 3)), 4)
        self.assertIn("plan refused: Sequential.0: the first call of its kind, run split in 2 "
                      "on a copy of its arguments, could not be merged: output: each "
                      "micro-batch returns its own row count", err.getvalue())
        self.assertEqual(net(torch.randn(4, 3)), 4)

    def test_an_output_that_cannot_be_merged_later_is_a_loud_error_and_runs_once(self):
        # A later call returns what the first did not (its row count, here
        # as a global tells it to): the micro-batches have run (and could
        # have written state) when their outputs turn out unmergeable, and
        # running the original again would run the module twice, so the
        # call fails loudly instead.
        count = {"rows": False}

        class RowCount(nn.Module):
            def forward(self, x):
                return x.shape[0] if count["rows"] else x * 2

        net = nn.Sequential(RowCount())
        calls = []
        net[0].register_forward_pre_hook(lambda m, a: calls.append(1))
        _apply.apply(net, plan(["Sequential.*"]), runtime_lib=RUNTIME)
        self.audit(net, torch.randn(4, 3), units=1)
        count["rows"] = True
        with self.assertRaisesRegex(RuntimeError, r"Sequential\.0: output: each micro-batch "
                                                  r"returns its own row count"):
            net(torch.randn(4, 3))
        self.assertEqual(len(calls), 2)

    def refused_at_first_call(self, layer, args, message):
        """Holder(layer) planned: its first call, on `args`, returns what the
        unmodified layer returns, and the plan is refused with `message`
        (a regex); a second call returns it again, the original way."""
        expected = [layer(*args) for _ in range(2)]
        net = planned_holder(layer)
        report = net._dynaflow_applier.report
        err = io.StringIO()
        with redirect_stderr(err):
            torch.testing.assert_close(net(*args), expected[0])
        self.assertRegex(err.getvalue(), "plan refused: Holder.layers.0: the first call of its "
                                         "kind, run split in 2 on a copy of its arguments, "
                                         + message)
        torch.testing.assert_close(net(*args), expected[1])
        self.assertEqual((report.planned_calls, report.original_calls), (0, 1))
        self.assertRegex(report.refused, "^Holder.layers.0: the first call of its kind, run "
                                         "split in 2")  # the report says it too
        self.assertNotIn("forward", net.layers[0].__dict__)  # restored

    def test_the_batch_size_as_a_number_is_refused_at_the_first_call(self):
        # Each operator keeps the rows apart; the scale is the batch size,
        # read by Python. Split in 2, each micro-batch divided by 2, not 4.
        class ByBatch(nn.Module):
            def forward(self, x):
                return x * (1.0 / x.shape[0])

        class ByBatchTensor(nn.Module):
            def forward(self, x):
                return x / torch.tensor([float(x.shape[0])])

        for layer in (ByBatch(), ByBatchTensor()):
            with self.subTest(layer=type(layer).__name__):
                self.refused_at_first_call(
                    layer, (torch.randn(4, 3),),
                    r"computed another result \(output: torch.float32 differs beyond "
                    r"rtol=0.0001 atol=1e-05 \(max abs [0-9.e-]+\)\): its forward uses the "
                    r"batch size as a number \(`x / x.shape\[0\]`\) or reads state dynaflow "
                    r"does not see \(a global, a closure\); the program runs unmodified")

    def test_a_global_changed_by_each_call_is_refused_at_the_first_call(self):
        calls = {"n": 0}

        class Counted(nn.Module):
            def forward(self, x):
                calls["n"] += 1
                return x * calls["n"]

        x = torch.randn(4, 3)
        net = planned_holder(Counted())
        err = io.StringIO()
        with redirect_stderr(err):
            torch.testing.assert_close(net(x), x)  # the unsplit call's: the first
        self.assertIn("computed another result (output: torch.float32", err.getvalue())
        self.assertEqual(calls["n"], 3)  # the audited call, then each micro-batch on the copy

    def test_a_forward_that_raises_on_a_micro_batch_is_refused_at_the_first_call(self):
        class FixedBatch(nn.Module):
            def forward(self, x):
                return x.view(4, 3, 2).sum(-1)

        self.refused_at_first_call(FixedBatch(), (torch.randn(4, 6),),
                                   r"raised RuntimeError: shape '\[4, 3, 2\]' is invalid for "
                                   r"input of size 12; the program runs unmodified")

    def test_an_argument_holding_itself_is_refused_in_one_line(self):
        # Its kind cannot be keyed (the walk would not end): before, the
        # RecursionError of that walk reached the program.
        class Ignores(nn.Module):
            def forward(self, x, extra):
                return x * 2

        loop = [torch.ones(1)]
        loop.append(loop)
        net = planned_holder(Ignores())
        x = torch.randn(4, 3)
        err = io.StringIO()
        with redirect_stderr(err):
            torch.testing.assert_close(net(x, loop), x * 2)
        self.assertEqual(err.getvalue().strip(), "dynaflow apply: plan refused: Holder.layers.0: "
                         "an argument is nested too deep to split, or holds itself; the program "
                         "runs unmodified")
        self.assertFalse(net._dynaflow_applier.forwards)  # detached

    def test_state_written_by_the_batch_size_is_refused_at_the_first_call(self):
        # The output is right; the argument it accumulates into is not.
        class Accumulate(nn.Module):
            def forward(self, x, total):
                total.add_(x * (1.0 / x.shape[0]))
                return x * 2

        x = torch.randn(4, 3)
        totals = [torch.zeros(4, 3), torch.zeros(4, 3)]
        Accumulate()(x, totals[0])
        net = planned_holder(Accumulate())
        err = io.StringIO()
        with redirect_stderr(err):
            torch.testing.assert_close(net(x, totals[1]), x * 2)
        self.assertIn("computed another result (args[1]: torch.float32 differs", err.getvalue())
        torch.testing.assert_close(totals[1], totals[0])

    def test_random_draws_of_the_comparison_are_put_back(self):
        # Only micro-batches draw here: the comparison refuses the plan, and
        # the program's random stream is where the unmodified program's is.
        class DrawsWhenSmall(nn.Module):
            def forward(self, x):
                return x + torch.rand(1) if x.shape[0] < 4 else x

        x = torch.randn(4, 3)
        torch.manual_seed(1)
        DrawsWhenSmall()(x)
        expected = torch.rand(3)
        net = planned_holder(DrawsWhenSmall())
        torch.manual_seed(1)
        err = io.StringIO()
        with redirect_stderr(err):
            torch.testing.assert_close(net(x), x)
        torch.testing.assert_close(torch.rand(3), expected)
        self.assertIn("could not be merged: the call drew random numbers, which the first call "
                      "of its kind did not", err.getvalue())

    def test_a_call_whose_arguments_are_too_large_to_copy_is_said_and_splits(self):
        x, layer = torch.randn(4, 3), nn.Linear(3, 3)
        expected = layer(x)
        net = planned_holder(layer)
        report = net._dynaflow_applier.report
        err = io.StringIO()
        with mock.patch.object(_apply, "_COMPARED_BYTES", 16), redirect_stderr(err):
            for _ in range(3):
                torch.testing.assert_close(net(x), expected)
        self.assertEqual(err.getvalue().count("was not also run split and compared"), 1)
        self.assertIn("Holder.layers.0: the first call of its kind was not also run split and "
                      "compared with its unsplit result, so what its forward does with the "
                      "batch size as a number, or with a global, is not checked (its arguments "
                      "hold 0 MiB, more than the 0 MiB dynaflow copies for it)", err.getvalue())
        self.assertEqual((report.planned_calls, report.original_calls, report.refused), (2, 1, ""))

    def test_a_view_into_a_larger_memory_counts_that_memory(self):
        # The copy takes each tensor's whole memory: the limit counts it.
        pool = torch.randn(4, 1000)
        layer = nn.Linear(2, 2)
        net = planned_holder(layer)
        err = io.StringIO()
        with mock.patch.object(_apply, "_COMPARED_BYTES", 8000), redirect_stderr(err):
            torch.testing.assert_close(net(pool[:, :2]), layer(pool[:, :2]))
        self.assertIn("was not also run split and compared", err.getvalue())
        with mock.patch.object(_apply, "_COMPARED_BYTES", 16000), redirect_stderr(err):
            net(pool[:, :2].clone())
        self.assertEqual(err.getvalue().count("was not also run split and compared"), 1)

    def test_arguments_that_are_views_of_one_memory_stay_so_in_the_copy(self):
        # Copied apart, the write through y would not reach x in the
        # comparison, which would then refuse a split that is right.
        class WritesThroughAView(nn.Module):
            def forward(self, x, y):
                y.mul_(2)
                return x + 1

        net = planned_holder(WritesThroughAView())
        report = net._dynaflow_applier.report
        for _ in range(2):
            x = torch.randn(4, 3)
            x2 = x.clone()
            torch.testing.assert_close(net(x, x[:]), WritesThroughAView()(x2, x2[:]))
            torch.testing.assert_close(x, x2)
        self.assertEqual((report.planned_calls, report.refused), (1, ""))

    def test_the_comparison_runs_without_grad(self):
        # The audited call's autograd graph is the program's; a second
        # forward's saved activations would only take memory.
        layer = nn.Linear(3, 3)
        x = torch.randn(4, 3, requires_grad=True)
        saved = []

        def pack(t):
            saved.append(tuple(t.shape))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            layer(x).sum().backward()
        expected, grad = list(saved), x.grad.clone()
        saved.clear()
        x.grad = None
        net = planned_holder(layer)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            net(x).sum().backward()
        self.assertEqual(saved, expected)  # none of the comparison's micro-batches
        torch.testing.assert_close(x.grad, grad)
        self.assertEqual(net._dynaflow_applier.report.refused, "")

    def test_python_and_numpy_random_draws_of_the_comparison_are_put_back(self):
        import random

        import numpy

        class PythonRandom(nn.Module):
            def forward(self, x):
                return x * (random.random() + numpy.random.rand())

        x = torch.randn(4, 3)
        random.seed(3)
        numpy.random.seed(3)
        expected = PythonRandom()(x)
        next_draws = (random.random(), numpy.random.rand())
        net = planned_holder(PythonRandom())
        random.seed(3)
        numpy.random.seed(3)
        err = io.StringIO()
        with redirect_stderr(err):
            torch.testing.assert_close(net(x), expected)
        self.assertEqual((random.random(), numpy.random.rand()), next_draws)
        self.assertIn("computed another result (output:", err.getvalue())

    def test_a_plan_refused_by_another_threads_first_call_is_not_run(self):
        # Thread A's comparison refuses the plan (detach frees the executor)
        # while thread B's first call waits to compare: B runs nothing on
        # the freed executor (it hung, or crashed, before).
        class SlowByBatch(nn.Module):
            def forward(self, x):
                time.sleep(0.1)
                return x * (1.0 / x.shape[0])

        x = torch.randn(4, 3)
        net = planned_holder(SlowByBatch())
        start, results = threading.Barrier(2), {}

        def call(k):
            start.wait()
            results[k] = net(x)

        threads = [threading.Thread(target=call, args=(k,), daemon=True) for k in range(2)]
        with redirect_stderr(io.StringIO()) as err:
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
        self.assertFalse(any(t.is_alive() for t in threads))
        for k in range(2):
            torch.testing.assert_close(results[k], x / 4)
        self.assertIn("plan refused: Holder.layers.0: the first call of its kind", err.getvalue())

    def test_complex_and_integer_differences(self):
        self.assertEqual(_apply._tolerance(torch.complex64), _apply._tolerance(torch.float32))
        e = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
        self.assertFalse(_apply._difference(e, e + 1e-6)[2])  # within float32's tolerance
        self.assertTrue(_apply._difference(e, e + 0.25j)[2])  # the imaginary part counts
        big = torch.tensor([2 ** 60])
        self.assertTrue(_apply._difference(big, big + 1)[2])  # not equal through float64
        self.assertFalse(_apply._difference(big, big.clone())[2])

    def test_differences_count_nan_and_infinities(self):
        e = torch.tensor([1.0, float("nan"), float("inf"), float("inf"), 2.0])
        cases = [([1.0, float("nan"), float("inf"), float("inf"), 2.0], False),
                 ([1.0, 0.0, float("inf"), float("inf"), 2.0], True),
                 ([1.0, float("nan"), float("-inf"), float("inf"), 2.0], True),
                 ([1.0, float("nan"), float("inf"), 5.0, 2.0], True),
                 ([1.0, float("nan"), float("inf"), float("inf"), float("nan")], True),
                 ([1.0, float("nan"), float("inf"), float("inf"), 2.00001], False)]
        for values, bad in cases:
            with self.subTest(values=values):
                abs_max, _, differs = _apply._difference(e, torch.tensor(values))
                self.assertEqual(differs, bad)
                self.assertEqual(abs_max == float("inf"), bad)
        with mock.patch.object(_apply, "_COMPARE_CHUNK", 2):  # the worst of every chunk
            self.assertEqual(_apply._difference(torch.arange(5.0), torch.tensor(
                [0.0, 1.0, 2.0, 3.0, 4.5]))[:2], (0.5, 0.125))

    def test_an_argument_that_cannot_be_split_refuses_before_anything_runs(self):
        class Ctx:
            pass

        class CtxBlock(nn.Module):
            def __init__(self):
                super().__init__()
                self.runs = 0

            def forward(self, x, ctx):
                self.runs += 1
                return x * 2

        class CtxNet(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.ModuleList([CtxBlock(), CtxBlock()])

            def forward(self, x):
                for layer in self.layers:
                    x = layer(x, Ctx())
                return x

        net = CtxNet()
        _apply.apply(net, plan(["CtxNet.layers.*"]), runtime_lib=RUNTIME)
        report = net._dynaflow_applier.report
        err = io.StringIO()
        with redirect_stderr(err):
            out = net(torch.ones(4, 3))
        torch.testing.assert_close(out, torch.full((4, 3), 4.0))
        self.assertEqual([b.runs for b in net.layers], [1, 1])  # once each, original way
        # The refused call ran the original; the plan is then detached.
        self.assertEqual((report.planned_calls, report.original_calls), (0, 1))
        self.assertEqual(err.getvalue().count("\n"), 1)
        self.assertRegex(err.getvalue(), r"plan refused: CtxNet\.layers\.0: argument ctx of "
                                         r"type \S*Ctx cannot be split or shared safely")
        self.assertNotIn("forward", net.layers[0].__dict__)  # restored


def _agree_in_chained_groups(rank, port, queue):
    """A rank of AgreementTest's world: rank 0 in groups {0, 1} and {0, 2},
    rank 1 in the first only, rank 2 in the second only; rank 2 refuses."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=3)
    try:
        first, second = dist.new_group([0, 1]), dist.new_group([0, 2])
        groups = {0: [first, second], 1: [first], 2: [second]}[rank]
        own = _apply._REFUSE if rank == 2 else _apply._COMPARE
        queue.put((rank, _apply._agreed(groups, own)))
    finally:
        dist.destroy_process_group()


def _refusals_at_collective_units(rank, port, queue):
    """A rank of AgreementTest's world of two, applying a plan to
    ReducingNet's layers. Rank 1 alone hooks layers.0's submodule for its
    first call (a hook that would run once per micro-batch); layers.1 splits
    on both ranks; rank 0 alone hooks
    layers.1's submodule for two calls of new kinds; both ranks then give
    layers.1 the argument that cannot be split (a kind of its own: its first
    dimension is neither the rows nor 1); then rank 1 alone hooks it for a
    call of the kind they split."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    said, got = [], {}
    try:
        net = _apply.apply(ReducingNet(), plan(["ReducingNet.layers.*"]), runtime_lib=RUNTIME)
        net._dynaflow_applier.on_refuse = lambda message, outcome: said.append(message)
        g = torch.Generator().manual_seed(0)
        x, shared, odd = (torch.randn(*shape, generator=g) for shape in ((8, 4), (1, 4), (3, 4)))
        hook = net.layers[0].inner.register_forward_hook(lambda *_: None) if rank == 1 else None
        first = net.layers[0](x, shared)
        if hook is not None:
            hook.remove()
        second = net.layers[0](x, shared)
        got["layers.0 as unsplit"] = [torch.equal(first, 4 * x + shared[-1]),
                                      torch.equal(second, 4 * x + shared[-1])]
        for _ in range(2):
            out = net.layers[1](x, shared)
        got["layers.1 as unsplit"] = torch.allclose(out, 4 * x + shared[-1])
        hook = net.layers[1].inner.register_forward_hook(lambda *_: None) if rank == 0 else None
        hooked = [net.layers[1](y, shared) for y in (x.view(8, 1, 4), x.view(8, 4, 1))]
        got["hooked kinds as unsplit"] = [torch.equal(h, 4 * y + shared[-1])
                                          for h, y in zip(hooked, (x.view(8, 1, 4),
                                                                   x.view(8, 4, 1)))]
        if hook is not None:
            hook.remove()
        out = net.layers[1](x, shared)  # the kind they agreed to split, split
        got["layers.1 as unsplit again"] = torch.allclose(out, 4 * x + shared[-1])
        got["planned"] = net._dynaflow_applier.report.planned_calls
        got["odd as unsplit"] = torch.equal(net.layers[1](x, odd), 4 * x + odd[-1])
        got["layers.1 kinds refused"] = sum(
            bool(why) for f in net._dynaflow_applier.forwards if f.path.endswith("layers.1")
            for why in f.audited.values())
        if rank == 1:
            net.layers[1].inner.register_forward_hook(lambda *_: None)
            try:
                net.layers[1](x, shared)
            except RuntimeError as e:
                got["raised"] = str(e)
        got["said"] = said
        queue.put((rank, got))
    finally:
        dist.destroy_process_group()


def _ranks(fn, world):
    """{rank: what it put on the queue}: fn(rank, port, queue) run by `world`
    gloo ranks, spawned."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(fn, args=(port, queue), nprocs=world)
    return dict(queue.get() for _ in range(world))


@unittest.skipUnless(HAS_TORCH, "needs torch")
class AgreementTest(unittest.TestCase):
    @unittest.skipUnless(RUNTIME, "needs the built runtime library")
    def test_ranks_refuse_a_collective_unit_alike_and_split_the_rest(self):
        # Rank 1 refuses layers.0's first call before anything runs (its
        # hook would run once per micro-batch): it runs it under an audit
        # that notes its all_reduce and agrees with rank 0 (which audited
        # it) on the refusal, so both run that kind unsplit;
        # layers.1 splits on both. Rank 0's hook refuses two new kinds of
        # layers.1 on both ranks (before, the first made every later kind
        # on rank 0 skip the agreement rank 1 made: gloo aborted), and the
        # kind they split goes on splitting. An argument that cannot be
        # split, given by both, is a kind of its own, refused alike (before
        # the key told its first dimension apart, both raised). A later call
        # of the kind they split that rank 1 alone cannot split (its hook)
        # raises: run whole, its one all_reduce would meet rank 0's two.
        got = _ranks(_refusals_at_collective_units, 2)
        for rank in (0, 1):
            self.assertEqual(got[rank]["layers.0 as unsplit"], [True, True], rank)
            self.assertTrue(got[rank]["layers.1 as unsplit"], rank)
            self.assertEqual(got[rank]["hooked kinds as unsplit"], [True, True], rank)
            self.assertTrue(got[rank]["layers.1 as unsplit again"], rank)
            self.assertEqual(got[rank]["planned"], 2, rank)  # layers.1's second and fifth calls
            self.assertTrue(got[rank]["odd as unsplit"], rank)
            self.assertEqual(got[rank]["layers.1 kinds refused"], 3, rank)
            self.assertEqual(len(got[rank]["said"]), 3, got[rank]["said"])  # each message once
        self.assertTrue(got[1]["said"][0].startswith("ReducingNet.layers.0.inner: forward hook"),
                        got[1]["said"])
        self.assertTrue(got[0]["said"][0].startswith(
            "ReducingNet.layers.0: another rank of its process group refused the plan"),
            got[0]["said"])
        self.assertTrue(got[0]["said"][1].startswith("ReducingNet.layers.1.inner: forward hook"),
                        got[0]["said"])
        self.assertTrue(got[1]["said"][1].startswith("ReducingNet.layers.1: another rank"),
                        got[1]["said"])
        for rank in (0, 1):  # each its own refusal of the argument
            self.assertRegex(got[rank]["said"][2], r"^ReducingNet\.layers\.1: .*extra.* has first "
                                                   r"dimension 3, not the batch \(8\) or 1")
        self.assertNotIn("raised", got[0])
        self.assertRegex(got[1]["raised"], r"^dynaflow apply: ReducingNet\.layers\.1\.inner: "
                                           r"forward hook .*; the other ranks of its process "
                                           r"group split its calls of this kind")

    def test_a_refusal_reaches_ranks_through_a_chain_of_groups(self):
        # Rank 1 shares no group with rank 2: one all-reduce per group left
        # it splitting while rank 0 refused, and their group's next
        # collectives no longer paired.
        agreed = _ranks(_agree_in_chained_groups, 3)
        self.assertEqual(agreed, {0: _apply._REFUSE, 1: _apply._REFUSE, 2: _apply._REFUSE})


if __name__ == "__main__":
    unittest.main()
