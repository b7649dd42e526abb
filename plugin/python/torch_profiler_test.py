"""Tests of dynaflow._torch_profiler with stand-ins for the tracer's lend and
reclaim: a torch.profiler schedule lends CUPTI before Kineto prepares and
takes it back after each stop, annotation profilers leave it alone, and the
originals come back on restore."""

import importlib.util
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

HAS_TORCH = importlib.util.find_spec("torch") is not None
if HAS_TORCH:
    import torch
    import torch.autograd.profiler as autograd_profiler

    from dynaflow import _torch_profiler


@unittest.skipUnless(HAS_TORCH, "this Python has no torch")
class WatchTorchProfilerTest(unittest.TestCase):
    def setUp(self):
        self.calls = []
        # Kineto's own entry points, seen from inside the wrappers: the log
        # tells whether lend came before and reclaim after them.
        self.kineto = {n: getattr(autograd_profiler, n)
                       for n in ("_prepare_profiler", "_enable_profiler", "_disable_profiler")}
        for name, original in self.kineto.items():
            setattr(autograd_profiler, name, self.logged(name, original))
        self.restore = _torch_profiler.watch_torch_profiler(
            lend=lambda: self.calls.append("lend"), reclaim=lambda: self.calls.append("reclaim"))
        self.addCleanup(self.restore_all)

    def logged(self, name, original):
        def call(*args, **kwargs):
            self.calls.append(name)
            return original(*args, **kwargs)

        return call

    def restore_all(self):
        if self.restore is not None:
            self.restore()
        for name, original in self.kineto.items():
            setattr(autograd_profiler, name, original)

    def test_a_schedule_lends_before_kineto_prepares_and_reclaims_after_each_stop(self):
        x = torch.ones(4, 4)
        schedule = torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=2)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    schedule=schedule) as prof:
            for _ in range(8):
                (x @ x).relu()
                prof.step()
        window = ["lend", "_prepare_profiler", "lend", "_enable_profiler", "_disable_profiler",
                  "reclaim"]
        self.assertEqual(self.calls, window * 2)

    def test_the_profiler_still_records_its_operators(self):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            torch.ones(3).softmax(0)
        self.assertIn("aten::softmax", [e.name for e in prof.events()])
        self.assertEqual(self.calls[-1], "reclaim")

    def test_annotation_profilers_leave_cupti_alone(self):
        with torch.autograd.profiler.emit_itt():
            torch.ones(2).relu()
        self.assertNotIn("lend", self.calls)

    def test_restore_puts_the_originals_back(self):
        wrapped = autograd_profiler._disable_profiler
        self.restore()
        self.restore = None
        self.assertIsNot(autograd_profiler._disable_profiler, wrapped)
        self.assertEqual(autograd_profiler._disable_profiler.__name__, "call")

    def test_without_a_tracer_nothing_is_wrapped(self):
        # This test process has no libdynaflow_preload: the C functions are absent.
        self.assertIsNone(_torch_profiler.watch_torch_profiler())


if __name__ == "__main__":
    unittest.main()
