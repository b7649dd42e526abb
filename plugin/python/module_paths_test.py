"""Tests of dynaflow._module_paths.ModuleTracker with an in-memory stand-in
for the extension's C functions: which path each module call enters, and that
the per-thread stack stays balanced when forwards and other hooks raise."""

import importlib.util
import io
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

HAS_TORCH = importlib.util.find_spec("torch") is not None
if HAS_TORCH:
    import torch
    from torch import nn

    from dynaflow import _module_paths


class FakeExtension:
    """The C entry points ModuleTracker calls, keeping the entered paths."""

    def __init__(self):
        self.paths = {}  # pointer -> path
        self.stack = []
        self.entered = []

    def dynaflow_torch_intern_module_path(self, path):
        pointer = 1000 + len(self.paths)
        self.paths[pointer] = path.decode()
        return pointer

    def dynaflow_torch_enter_module(self, pointer):
        self.stack.append(self.paths[pointer])
        self.entered.append(self.paths[pointer])

    def dynaflow_torch_exit_module(self):
        self.stack.pop()


@unittest.skipUnless(HAS_TORCH, "this Python has no torch")
class ModuleTrackerTest(unittest.TestCase):
    def model(self):
        class Block(nn.Module):
            def __init__(self, shared):
                super().__init__()
                self.proj = nn.Linear(4, 4)
                self.shared = shared

            def forward(self, x):
                return self.shared(self.proj(x))

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                shared = nn.ReLU()
                self.layers = nn.ModuleList([Block(shared), Block(shared)])

            def forward(self, x):
                for layer in self.layers:
                    x = layer(x)
                return x

        return Net()

    def test_paths_follow_the_calls(self):
        lib = FakeExtension()
        net = self.model()
        handles = _module_paths.install_model_hooks(lib, net)
        net(torch.ones(1, 4))
        self.assertEqual(lib.entered, [
            "Net",
            "Net.layers.0", "Net.layers.0.proj", "Net.layers.0.shared",
            "Net.layers.1", "Net.layers.1.proj", "Net.layers.1.shared",
        ])
        self.assertEqual(lib.stack, [])
        handles.remove()
        net(torch.ones(1, 4))
        self.assertEqual(len(lib.entered), 7)

    def test_a_submodule_called_alone_is_its_own_root(self):
        lib = FakeExtension()
        net = self.model()
        _module_paths.install_model_hooks(lib, net)
        net.layers[1](torch.ones(1, 4))
        self.assertEqual(lib.entered, ["Block", "Block.proj", "Block.shared"])

    def test_a_module_called_but_not_registered_is_named_by_its_class(self):
        class Caller(nn.Module):
            def __init__(self, helper):
                super().__init__()
                self.inner = nn.Identity()
                self._helper = [helper]  # hidden from named_modules

            def forward(self, x):
                return self._helper[0](self.inner(x))

        lib = FakeExtension()
        helper = nn.Tanh()
        caller = Caller(helper)
        tracker = _module_paths.ModuleTracker(lib)
        for m in (caller, caller.inner, helper):
            m.register_forward_pre_hook(tracker.pre_hook)
            m.register_forward_hook(tracker.post_hook, always_call=True)
        caller(torch.ones(2))
        self.assertEqual(lib.entered, ["Caller", "Caller.inner", "Caller.Tanh"])

    def test_the_stack_stays_balanced_when_a_forward_raises(self):
        class Failing(nn.Module):
            def forward(self, x):
                raise RuntimeError("boom")

        lib = FakeExtension()
        net = nn.Sequential(nn.Identity(), Failing())
        _module_paths.install_model_hooks(lib, net)
        with self.assertRaisesRegex(RuntimeError, "boom"):
            net(torch.ones(1))
        self.assertEqual(lib.stack, [])
        net[0](torch.ones(1))
        self.assertEqual(lib.entered[-1], "Identity")  # a root again: the stack was empty

    def test_an_earlier_hook_that_raises_leaves_the_stack_balanced(self):
        lib = FakeExtension()
        outer = nn.Sequential(nn.Identity())

        def failing_pre_hook(module, args):
            raise RuntimeError("other tool")

        outer[0].register_forward_pre_hook(failing_pre_hook)
        _module_paths.install_model_hooks(lib, outer)
        with self.assertRaisesRegex(RuntimeError, "other tool"):
            outer(torch.ones(1))
        self.assertEqual(lib.stack, [])

    def test_torch_compile_traces_through_the_hooks_without_graph_breaks(self):
        lib = FakeExtension()
        net = self.model()
        handles = _module_paths.install_global_hooks(lib)
        try:
            compiled = torch.compile(net, backend="eager", fullgraph=True)
            out = compiled(torch.ones(1, 4))
        finally:
            handles.remove()
        self.assertEqual(out.shape, (1, 4))
        self.assertEqual(lib.stack, [])

    def test_a_hook_failure_is_reported_once_and_the_model_runs(self):
        class BrokenExtension(FakeExtension):
            def dynaflow_torch_enter_module(self, pointer):
                raise OSError("gone")

        lib = BrokenExtension()
        net = nn.Sequential(nn.Identity(), nn.Identity())
        _module_paths.install_model_hooks(lib, net)
        stderr = sys.stderr
        try:
            sys.stderr = io.StringIO()
            out = net(torch.ones(3))
            report = sys.stderr.getvalue()
        finally:
            sys.stderr = stderr
        self.assertEqual(out.tolist(), [1.0, 1.0, 1.0])
        self.assertEqual(report, "dynaflow: module paths may be incomplete after an error: "
                                 "OSError('gone')\n")


if __name__ == "__main__":
    unittest.main()
