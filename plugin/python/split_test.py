"""Tests of dynaflow._split: what a planned call may split, share or must
refuse, and that merged outputs and state equal the unsplit call's. The cache
cases use the installed transformers' own Cache classes (skipped without it)."""

import collections
import contextlib
import contextvars
import dataclasses
import decimal
import enum
import gc
import importlib.util
import os
import re
import sys
import unittest
import unittest.mock
import weakref

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# With the replay module built, split_call walks in C++ (call_split.h), as
# under `dynaflow apply`; NativeSplitTest compares that walk with Python's.
REPLAY = os.environ.get("DYNAFLOW_REPLAY_EXT_BUILT", "")
if REPLAY:
    os.environ["DYNAFLOW_REPLAY_EXT"] = REPLAY

from dynaflow import _graphs, _rows, _split  # noqa: E402 - after the path is set

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_TRANSFORMERS = HAS_TORCH and importlib.util.find_spec("transformers") is not None
if HAS_TORCH:
    import torch

    class Tagged(torch.Tensor):
        """A tensor subclass, as libraries define them."""

Pair = collections.namedtuple("Pair", "a b")


@dataclasses.dataclass
class Inputs:
    hidden: object
    mask: object
    note: str = "x"


class Opaque:
    pass


def split(args=(), kwargs=None, batch=4, parts=2):
    bounds = [batch * i // parts for i in range(parts + 1)]
    return _split.split_call("M.layers.3", None, args, kwargs or {}, batch, bounds)


@unittest.skipUnless(HAS_TORCH, "needs torch")
class SplitTest(unittest.TestCase):
    def test_batch_tensors_become_row_views_and_the_rest_is_shared(self):
        x = torch.arange(4 * 3.0).reshape(4, 3)
        one = torch.ones(1, 3)
        s = split((x, 2.5), {"one": one, "cache_position": torch.arange(4), "flag": True})
        self.assertEqual(s.parts, 2)
        self.assertEqual(s.args[1][0].data_ptr(), x[2].data_ptr())  # a view, not a copy
        torch.testing.assert_close(s.args[1][0], x[2:])
        self.assertEqual(s.args[0][1], 2.5)
        self.assertIs(s.kwargs[1]["one"], one)
        self.assertEqual(s.kwargs[0]["cache_position"].tolist(), [0, 1, 2, 3])
        self.assertIs(s.kwargs[1]["flag"], True)

    def test_containers_are_rebuilt_with_their_types(self):
        x, cos = torch.randn(4, 5), torch.randn(4, 2, 3)
        s = split((Pair(x, 1), [cos, (cos,)], Inputs(x, {"m": cos})))
        pair, lst, inputs = s.args[1]
        self.assertIsInstance(pair, Pair)
        torch.testing.assert_close(pair.a, x[2:])
        self.assertIsInstance(lst, list)
        torch.testing.assert_close(lst[1][0], cos[2:])
        self.assertIsInstance(inputs, Inputs)
        torch.testing.assert_close(inputs.mask["m"], cos[2:])
        self.assertEqual(inputs.note, "x")

    def test_an_unknown_object_refuses_naming_module_argument_and_type(self):
        with self.assertRaisesRegex(_split.Refusal,
                                    r"^M\.layers\.3: argument extra\['k'\] of type Opaque "):
            split((torch.randn(4, 2),), {"extra": {"k": Opaque()}})

    def test_positional_arguments_are_named_from_the_signature(self):
        import inspect

        def forward(hidden_states, helper):
            pass

        with self.assertRaisesRegex(_split.Refusal, "argument helper of type Opaque"):
            _split.split_call("M", inspect.signature(forward), (torch.randn(4, 2), Opaque()),
                              {}, 4, [0, 2, 4])

    def test_a_1d_tensor_as_long_as_the_batch_is_ambiguous(self):
        with self.assertRaisesRegex(_split.Refusal, "argument ids of type Tensor is 1-D"):
            split((torch.randn(4, 2),), {"ids": torch.arange(4)})

    def test_multimodal_position_ids_refuse_whatever_their_first_dimension(self):
        # Qwen2-VL's [4 sections, batch, seq]: at batch 4, dimension 0 would pass.
        with self.assertRaisesRegex(_split.Refusal, "position_ids of type Tensor has 3 dimensions"):
            split((), {"hidden_states": torch.randn(4, 5, 2),
                       "position_ids": torch.zeros(4, 4, 5, dtype=torch.long)})

    def test_nested_sparse_and_subclassed_tensors_are_refused(self):
        # narrow() raised on a nested tensor, into the program, before.
        nested = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(1, 3)] * 2,
                                            layout=torch.jagged)
        for value, why in [
            (nested, "of type NestedTensor has layout torch.jagged (nested): only strided"),
            (torch.randn(4, 3).to_sparse(), "of type Tensor has layout torch.sparse_coo"),
            (torch.randn(4, 3).as_subclass(Tagged), "of type Tagged is a tensor subclass"),
        ]:
            with self.assertRaisesRegex(_split.Refusal,
                                        rf"^M\.layers\.3: argument x {re.escape(why)}"):
                split((), {"x": value})

    def test_a_tensor_of_another_length_is_refused(self):
        with self.assertRaisesRegex(_split.Refusal, "first dimension 3, not the batch"):
            split((torch.randn(4, 2), torch.randn(3, 2)))

    def test_a_write_to_a_shared_tensor_is_detected(self):
        shared = torch.zeros(1, 3)
        s = split((torch.randn(4, 3), shared))
        s.check_shared_unmodified()
        s.args[0][1].add_(1)
        with self.assertRaisesRegex(_split.MergeError, "args\\[1\\] is shared .* modified"):
            s.check_shared_unmodified()

    def test_a_write_to_a_shared_inference_tensor_is_detected(self):
        # Inference tensors have no version counter: compared by their bytes.
        with torch.inference_mode():
            shared = torch.tensor([[float("nan"), 1.0]])
            s = split((torch.randn(4, 2), shared))
            s.check_shared_unmodified()  # NaN equals itself, byte for byte
            s.args[1][1][0, 1] = 2.0
        with self.assertRaisesRegex(_split.MergeError, "args\\[1\\] is shared"):
            s.check_shared_unmodified()

    def test_writes_to_the_modules_own_tensors_are_detected(self):
        from torch import nn

        block = nn.Linear(3, 3)
        block.cache_k = torch.zeros(8, 3)  # a hand-written KV cache, a plain attribute
        block.register_buffer("n", torch.zeros(1))

        @torch.no_grad()
        def step_weight():  # an update inside forward
            block.weight.add_(1)

        cases = [
            (lambda: block.cache_k[:2].copy_(torch.ones(2, 3)),
             "attribute cache_k is shared by the micro-batches and was modified in place"),
            (step_weight, "parameter weight is shared by the micro-batches and was modified in place"),
            (lambda: setattr(block, "n", block.n + 1),
             "buffer n is shared by the micro-batches and was replaced"),
        ]
        for write, message in cases:
            s = split((torch.randn(4, 3),))
            s.share_buffers(list(block.named_modules()))
            s.check_shared_unmodified()
            write()
            with self.assertRaisesRegex(_split.MergeError, message):
                s.check_shared_unmodified()

    def test_a_context_variable_the_call_changed_is_named(self):
        a, b = contextvars.ContextVar("a"), contextvars.ContextVar("b", default=0)
        before = contextvars.Context()
        before.run(a.set, [1])
        state = _split.ContextState(before)
        self.assertIsNone(state.change(before.copy()))
        cases = [
            (lambda: a.reset(a.set(2)), None),  # set and reset: no change
            (lambda: b.set(0), "b"),            # first set, even to its default
            (lambda: a.set((1,)), "a"),         # another object, compared by identity
            (lambda: a.set([1]), None),         # a list of the same entries, as attributes
        ]
        for change, name in cases:
            after = before.copy()
            after.run(change)
            self.assertEqual(state.change(after), name)
        # A library's default, made on its first use in a context: the
        # decimal module's, torch.compile's empty set; not a full one.
        lazily = contextvars.ContextVar("lazily", default=None)
        for made, name in [(decimal.getcontext, None), (lambda: lazily.set(set()), None),
                           (lambda: lazily.set({1}), "lazily")]:
            empty = contextvars.Context()
            after = empty.copy()
            after.run(made)
            self.assertEqual(len(after), 1)
            self.assertEqual(_split.ContextState(empty).change(after), name)
        # A tensor written in place, which every copy shares.
        steps = contextvars.ContextVar("steps")
        counted = contextvars.Context()
        counted.run(steps.set, torch.zeros(()))
        counted_state = _split.ContextState(counted)
        after = counted.copy()
        after.run(lambda: steps.get().add_(1))
        self.assertEqual(counted_state.change(after), "steps")
        # An entry appended to the list the variable holds, which every
        # copy of the context shares.
        before[a].append(2)
        self.assertEqual(state.change(before.copy()), "a")

    def test_under_capture_a_shared_inference_tensor_refuses_before_it_runs(self):
        # While a CUDA graph is captured nothing runs: bytes cannot be compared.
        from unittest import mock

        with torch.inference_mode():
            shared, rows = torch.zeros(1, 2), torch.randn(4, 2)
        # The patch makes a CPU tensor look captured, which only Python's walk
        # asks (C++ leaves a CUDA tensor's case to it: call_split.h).
        with mock.patch.object(_split, "_capturing", lambda t: True), \
                mock.patch.object(_split, "_native_splitter", lambda: None):
            with self.assertRaisesRegex(_split.Refusal, r"^M\.layers\.3: argument args\[1\] of type "
                                                        r"Tensor is an inference tensor shared"):
                split((rows, shared))
            split((rows, torch.zeros(1, 2)))  # a version counter shows writes: split
        split((rows, shared))  # not capturing: its bytes are compared afterwards

    def test_an_argument_updated_in_place_and_returned_is_returned_itself(self):
        x = torch.zeros(4, 3)
        s = split((x,), parts=2)
        # The audited unsplit call returned x there.
        s.aliases = _split.OutputAliases(returned=frozenset({"output"}))
        parts = [a[0].add_(1) for a in s.args]  # each micro-batch returns its own rows
        self.assertIs(_split.merge_outputs(s, parts, []), x)
        self.assertEqual(x.sum().item(), 12.0)
        swapped = _split.merge_outputs(s, parts[::-1], [])  # not the rows' order: merged
        self.assertIsNot(swapped, x)

    def test_row_views_returned_where_the_unsplit_call_made_a_tensor_are_merged(self):
        # x.contiguous() of a padded buffer: the unsplit call copies, each
        # one-row micro-batch returns its view itself. Returned as x, the
        # caller's write to the output reached x (and a later read of x).
        x = torch.zeros(2, 9, 3)[:, :5]
        s = split((x,), batch=2, parts=2)
        parts = [a[0].contiguous() for a in s.args]
        self.assertIs(parts[0], s.args[0][0])
        out = _split.merge_outputs(s, parts, [])
        self.assertIsNot(out, x)
        out.add_(1)
        self.assertEqual(x.sum().item(), 0.0)

    def test_a_returned_batch_size_is_not_taken_for_the_whole_batch(self):
        s = split((torch.randn(4, 3),), parts=2)
        with self.assertRaisesRegex(_split.MergeError, r"output\[1\]: each micro-batch returns "
                                                       r"its own row count \(2\)"):
            _split.merge_outputs(s, [(torch.zeros(2, 1), 2), (torch.zeros(2, 1), 2)], [])
        with self.assertRaisesRegex(_split.MergeError, "own row count"):  # x.shape
            _split.merge_outputs(s, [torch.Size([2, 3]), torch.Size([2, 3])], [])
        out = _split.merge_outputs(s, [(torch.zeros(2, 1), 7), (torch.zeros(2, 1), 7)], [])
        self.assertEqual(out[1], 7)

    def test_outputs_merge_by_rows_and_immutables_must_agree(self):
        s = split((torch.randn(4, 3),), parts=2)
        out = _split.merge_outputs(s, [(torch.ones(2, 3), 7), (torch.zeros(2, 3), 7)], [])
        self.assertEqual(out[0].tolist(), [[1.0] * 3] * 2 + [[0.0] * 3] * 2)
        self.assertEqual(out[1], 7)
        with self.assertRaisesRegex(_split.MergeError, r"output\[1\]: .* different values"):
            _split.merge_outputs(s, [(torch.ones(2, 3), 7), (torch.ones(2, 3), 8)], [])
        with self.assertRaisesRegex(_split.MergeError, "micro-batch 0 returns \\(\\), not 2 rows"):
            _split.merge_outputs(s, [torch.tensor(1.0), torch.tensor(2.0)], [])

    def test_what_an_unsplit_calls_output_shares(self):
        x, h = torch.zeros(4, 3), torch.zeros(4, 5, 3)
        self.assertEqual(_split.output_aliases((h, x, h), (x,), {}),
                         _split.OutputAliases(frozenset({"output[1]"}), False))
        self.assertEqual(_split.output_aliases({"h": h, "first": h[:, 0]}, (x,), {}),
                         _split.OutputAliases(frozenset(), True))

    def test_row_views_of_another_output_merge_as_views_of_it(self):
        s = split((torch.randn(4, 3),), parts=2)
        s.aliases = _split.OutputAliases(viewed=True)  # as the audit found
        hs = [torch.full((2, 5, 3), float(i)) + torch.arange(3.0) for i in range(2)]
        results = [{"h": h, "first": h[:, 0], "last": h[:, -1, 1:]} for h in hs]
        out = _split.merge_outputs(s, results, [])
        self.assertEqual(out["h"].shape, (4, 5, 3))
        for name, view in (("first", out["h"][:, 0]), ("last", out["h"][:, -1, 1:])):
            self.assertEqual((out[name].data_ptr(), out[name].shape, out[name].stride()),
                             (view.data_ptr(), view.shape, view.stride()), name)
        self.assertEqual(out["first"][:, 0].tolist(), [0.0, 0.0, 1.0, 1.0])

    def test_a_view_that_differs_between_micro_batches_fails_the_merge(self):
        s = split((torch.randn(4, 3),), parts=2)
        s.aliases = _split.OutputAliases(viewed=True)
        hs = [torch.zeros(2, 5, 3), torch.zeros(2, 5, 3)]
        with self.assertRaisesRegex(_split.MergeError, r"^output\[1\]: micro-batch 1 returns "
                                                       r"another view of output\[0\]"):
            _split.merge_outputs(s, [(hs[0], hs[0][:, 0]), (hs[1], hs[1][:, 1])], [])
        with self.assertRaisesRegex(_split.MergeError, "missing from another micro-batch"):
            _split.merge_outputs(s, [(hs[0], hs[0][:, 0]), (hs[1],)], [])
        # Not a view in micro-batch 1: not the view micro-batch 0 returned.
        with self.assertRaisesRegex(_split.MergeError, "micro-batch 1 returns another view"):
            _split.merge_outputs(s, [(hs[0], hs[0][:, 0]), (hs[1], torch.zeros(2, 3))], [])

    def test_which_outputs_are_row_views(self):
        h = torch.zeros(4, 5, 3)
        self.assertEqual(_split._row_view(h[:, 2], h), (6, (3,), (1,)))
        self.assertEqual(_split._row_view(h.view(4, 15), h), (0, (15,), (1,)))
        # One row of a padded buffer: its row stride is the buffer's, not its own size.
        one = torch.zeros(1, 9, 3)[:, :5]
        self.assertEqual(_split._row_view(one[:, 1], one), (3, (3,), (1,)))
        # To autograd a detached copy is no view: merged as one, its
        # gradient would flow (or not) where the unsplit call's does not.
        x = torch.ones(4, 5, 3, requires_grad=True)
        g = x * 2
        self.assertEqual(_split._row_view(g[:, 0], g), (0, (3,), (1,)))
        for other, base in ((g.detach(), g), (g[:, 0], g.detach()),
                            (g.detach().requires_grad_(), g)):
            self.assertIsNone(_split._row_view(other, base))
        with torch.no_grad():
            self.assertIsNone(_split._row_view(g[:, 0], g))
        for other in (h.view(-1)[:4],          # rows 0 and 1
                      h[:2],                   # two rows
                      h.transpose(1, 2)[:, :, :1].view(torch.int32),  # another dtype
                      h.clone()[:, 0]):        # other memory
            self.assertIsNone(_split._row_view(other, h))
        self.assertIsNone(_split._row_view(h, h[:, :, :2]))  # a base that is not contiguous
        self.assertIsNone(_split._row_view_base([("a", h[:, 0]), ("b", h.view(-1)[:4])]))
        self.assertEqual(_split._row_view_base([("a", h[:, 0]), ("b", h), ("c", h[:, 1])]), 1)

    @unittest.skipUnless(HAS_TRANSFORMERS, "needs transformers")
    def test_router_logits_merge_per_token(self):
        # transformers' MoE output: router logits [rows x tokens, experts] per
        # layer, batch-major; micro-batches of 1 and 3 rows, 5 tokens each.
        from transformers.modeling_outputs import MoeModelOutputWithPast

        s = _split.split_call("M.layers.3", None, (torch.randn(4, 5),), {}, 4, [0, 1, 4])
        whole = torch.randn(4 * 5, 8)
        parts = [MoeModelOutputWithPast(last_hidden_state=torch.zeros(n, 5, 2),
                                        router_logits=(whole[5 * a:5 * b],))
                 for a, b, n in ((0, 1, 1), (1, 4, 3))]
        out = _split.merge_outputs(s, parts, [])
        self.assertTrue(torch.equal(out.router_logits[0], whole))
        self.assertEqual(tuple(out.last_hidden_state.shape), (4, 5, 2))
        parts[1].router_logits = (torch.randn(3 * 4, 8),)  # 4 tokens per row, not 5
        with self.assertRaisesRegex(_split.MergeError, r"output\.router_logits\[0\]: the "
                                                       r"micro-batches return \[4, 5\] tokens"):
            _split.merge_outputs(s, parts, [])
        parts[1].router_logits = (torch.randn(7, 8),)
        with self.assertRaisesRegex(_split.MergeError, "not one row per token of its 3 rows"):
            _split.merge_outputs(s, parts, [])
        # The same field of any other class is merged by rows.
        other = [dataclasses.make_dataclass("Out", ["router_logits"])(whole[:5]) for _ in "ab"]
        with self.assertRaisesRegex(_split.MergeError, "returns \\(5, 8\\), not 1 rows"):
            _split.merge_outputs(s, other, [])

    def test_outputs_put_as_micro_batches_finish_are_merged_without_concatenation(self):
        s = split((torch.randn(4, 3),), parts=2)
        s.slices = _split.SliceMerge(s)
        parts = [Inputs(hidden=(torch.full((2, 3), float(i)), torch.arange(2) + 2 * i),
                        mask={"m": torch.ones(2, 1) * i}) for i in range(2)]
        for i in (1, 0):  # in any order
            s.slices.put(i, parts[i])
        whole = s.slices.outputs["output.hidden[0]"]
        out = _split.merge_outputs(s, parts, [])
        self.assertIs(out.hidden[0], whole)
        self.assertEqual(whole.tolist(), [[0.0] * 3] * 2 + [[1.0] * 3] * 2)
        self.assertIs(out.hidden[1], s.slices.outputs["output.hidden[1]"])
        self.assertEqual(out.hidden[1].tolist(), [0, 1, 2, 3])
        self.assertEqual(out.mask["m"].tolist(), [[0.0]] * 2 + [[1.0]] * 2)

    def test_what_was_not_put_whole_is_concatenated(self):
        s = split((torch.randn(4, 3),), parts=2)
        s.slices = _split.SliceMerge(s)
        a, b = torch.ones(2, 3), torch.zeros(2, 3)
        s.slices.put(0, (a,))  # micro-batch 1 put nothing
        out = _split.merge_outputs(s, [(a,), (b,)], [])
        self.assertIsNot(out[0], s.slices.outputs["output[0]"])
        self.assertEqual(out[0].tolist(), [[1.0] * 3] * 2 + [[0.0] * 3] * 2)
        # A tensor other than the one put, a transposed one, one of another
        # dtype, one that requires grad: concatenated.
        t = torch.ones(3, 2).t()
        g = torch.ones(2, 3, requires_grad=True)
        s.slices.put(0, (t, torch.ones(2, 3, dtype=torch.float64), g))
        s.slices.put(1, (t.contiguous(), torch.ones(2, 3), g.detach().clone().requires_grad_()))
        self.assertEqual(sorted(s.slices.taken), [("output[0]", 0), ("output[0]", 1),
                                                  ("output[1]", 0)])
        out = _split.merge_outputs(s, [(t, torch.ones(2, 3, dtype=torch.float64), g),
                                       (torch.ones(2, 3), torch.ones(2, 3), g)], [])
        self.assertIsNot(out[0], s.slices.outputs["output[0]"])
        self.assertEqual(out[0].tolist(), [[1.0] * 3] * 4)
        self.assertEqual(out[1].dtype, torch.float64)
        self.assertTrue(out[2].requires_grad)


class Mode(enum.IntEnum):
    FAST = 1


class SameValues:
    """assert_same: two walks' results alike, value for value, tensors by
    their memory (or values), state views by their adapter's tensors."""

    tensors_by_memory = True

    def assert_same(self, native, python, where="call"):
        self.assertIs(type(native), type(python), where)
        if isinstance(python, torch.Tensor):
            self.assertEqual((native.shape, native.stride(), native.dtype),
                             (python.shape, python.stride(), python.dtype), where)
            if self.tensors_by_memory:
                self.assertEqual(native.data_ptr(), python.data_ptr(), where)
            else:
                self.assertTrue(torch.equal(native, python), where)
        elif isinstance(python, dict):
            self.assertEqual(list(native), list(python), where)
            for k in python:
                self.assert_same(native[k], python[k], f"{where}[{k!r}]")
        elif isinstance(python, (tuple, list)):
            self.assertEqual(len(native), len(python), where)
            for k, (n, p) in enumerate(zip(native, python)):
                self.assert_same(n, p, f"{where}[{k}]")
        elif dataclasses.is_dataclass(python):
            self.assert_same(_fields(native), _fields(python), where)
        elif _split.state_adapter(python) is not None:  # a view made by its adapter
            adapter = _split.state_adapter(python)
            self.assert_same(adapter.row_tensors(native), adapter.row_tensors(python), where)
        else:
            self.assertEqual(native, python, where)


@unittest.skipUnless(HAS_TORCH and REPLAY, "needs torch and the replay module "
                                           "(DYNAFLOW_REPLAY_EXT_BUILT)")
class NativeSplitTest(SameValues, unittest.TestCase):
    """The C++ walk (plugin/torch/call_split.h) against the Python one
    (_split._Splitter), call for call: the same values, views of the same
    memory, the same row views and shared tensors, the same refusals."""

    def both(self, args, kwargs, batch=4, parts=2):
        """(native, python): each a CallSplit, or the Refusal's message."""
        self.assertIsNotNone(_split._native_splitter())
        got = []
        for native in (True, False):
            with contextlib.nullcontext() if native else \
                    unittest.mock.patch.object(_split, "_native_splitter", lambda: None):
                try:
                    got.append(split(args, kwargs, batch, parts))
                except _split.Refusal as e:
                    got.append(str(e))
        return got

    def assert_same_split(self, args, kwargs=None, batch=4, parts=2):
        native, python = self.both(args, kwargs or {}, batch, parts)
        if isinstance(python, str):
            self.assertEqual(native, python)
            return python
        self.assert_same(native.args, python.args, "args")
        self.assert_same(native.kwargs, python.kwargs, "kwargs")
        # The row views: the same arguments' rows, by the views' positions.
        def rows(s):
            return sorted((id(t), mb, v.data_ptr(), v.shape[0])
                          for (t, mb), v in ((s.row_views[id(v)], v) for v in _views(s)))
        self.assertEqual(rows(native), rows(python))
        self.assertEqual(len(native.row_views), len(python.row_views))
        self.assertEqual([(w, id(t)) for w, t, _ in native.shared],
                         [(w, id(t)) for w, t, _ in python.shared])
        self.assertEqual(len(native.states), len(python.states))
        return native

    def test_tensors_scalars_and_containers(self):
        x, one = torch.arange(12.0).reshape(4, 3), torch.ones(1, 3)
        s = self.assert_same_split(
            (x, 2.5, [x, (one, None)], (), Pair(x, one), Inputs(x, {"m": x})),
            {"cache_position": torch.arange(4), "flag": True, "mode": Mode.FAST,
             "dtype": torch.float16, "size": torch.Size([4, 3]), "scalar": torch.tensor(3.0),
             "d": {"k": x, 3: one, ("t",): [one]}, "e": ..., "b": b"x", "c": 1j,
             "w": torch.nn.Parameter(torch.randn(4, 2))}, parts=3)
        self.assertIsInstance(s.kwargs[2]["d"], dict)
        self.assertEqual(s.args[1][0].tolist(), [[3.0, 4.0, 5.0]])

    def test_inference_tensors_and_uneven_rows(self):
        with torch.inference_mode():
            x, mask = torch.randn(5, 2), torch.ones(1, 1, 5, dtype=torch.bool)
            self.assert_same_split((x,), {"attention_mask": mask, "pos": torch.arange(7)},
                                   batch=5, parts=2)

    def test_refusals_keep_their_messages(self):
        x = torch.randn(4, 2)
        nested = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(1, 3)] * 2,
                                            layout=torch.jagged)
        for kwargs in [{"extra": {"k": [x, Opaque()]}},
                       {"ids": torch.arange(4)},
                       {"deep": [(torch.arange(4),)]},
                       {"position_ids": torch.zeros(4, 4, 5, dtype=torch.long)},
                       {"other": (x, torch.randn(3, 2))},
                       {"x": nested},
                       {"x": torch.randn(4, 3).to_sparse()},
                       {"x": [torch.randn(4, 3).as_subclass(Tagged)]}]:
            with self.subTest(kwargs=list(kwargs)):
                message = self.assert_same_split((x,), kwargs)
                self.assertIsInstance(message, str)
                self.assertTrue(message.startswith("M.layers.3: argument "), message)

    def test_values_nested_too_deep_or_holding_themselves_refuse(self):
        # The C++ walk overflowed the C stack on a list holding itself.
        looped = [torch.randn(4, 2)]
        looped.append(looped)
        deep = torch.randn(4, 2)
        for _ in range(5000):
            deep = [deep]
        for value in (looped, deep):
            message = self.assert_same_split((torch.randn(4, 2),), {"extra": value})
            self.assertEqual(message, "M.layers.3: an argument is nested too deep to split, or "
                                      "holds itself")
        s = split((torch.randn(4, 2),))
        outputs = [[torch.randn(2, 2)], [torch.randn(2, 2)]]  # each micro-batch's rows
        for out in outputs:
            out.append(out)
        for results in (outputs, [deep, deep]):
            native, python = NativeMergeTest.both(self, s, results)
            self.assertEqual(native, "the output is nested too deep to merge, or holds itself")
            self.assertEqual(native, python)

    def test_a_value_whose_own_code_raises_refuses_in_one_line(self):
        # A dict key whose repr raises: Python names it at once, C++ only
        # for a refusal; either way the program got the ValueError before.
        class Key:
            def __repr__(self):
                raise ValueError("no repr")

        message = "M.layers.3: its arguments could not be walked to split them: ValueError: " \
                  "no repr"
        # Under a value it refuses anyway, C++ names the key too.
        self.assertEqual(self.both((torch.randn(4, 2),), {"extra": {Key(): Opaque()}}),
                         [message, message])
        # Under a value both split, C++ never names it: it splits.
        native, python = self.both((torch.randn(4, 2),), {"extra": {Key(): 1}})
        self.assertEqual(python, message)
        self.assertIsInstance(native, _split.CallSplit)

    @unittest.skipUnless(HAS_TRANSFORMERS, "needs transformers")
    def test_a_cache_goes_through_its_adapter(self):
        from transformers import DynamicCache

        cache = DynamicCache()
        cache.update(torch.randn(4, 2, 3, 8), torch.randn(4, 2, 3, 8), 0)
        s = self.assert_same_split((torch.randn(4, 8),),
                                   {"past_key_values": cache, "cos_sin": (torch.ones(4, 1, 8),) * 2})
        self.assertEqual(len(s.states), 1)


def _native_and_python(fn, natives):
    """[fn() with the replay module's walks, fn() with each (module, getter)
    of `natives` patched to return None, as without the module]: each a
    result, or its exception's type and message."""
    got = []
    for native in (True, False):
        with contextlib.ExitStack() as stack:
            if not native:
                for module, getter in natives:
                    stack.enter_context(unittest.mock.patch.object(module, getter, lambda: None))
            try:
                got.append(fn())
            except Exception as e:  # noqa: BLE001 - compared
                got.append((type(e), str(e)))
    return got


@unittest.skipUnless(HAS_TORCH and REPLAY, "needs torch and the replay module "
                                           "(DYNAFLOW_REPLAY_EXT_BUILT)")
class NativeKeysTest(unittest.TestCase):
    """The C++ walks that key a planned call (plugin/torch/call_keys.h)
    against the Python ones (_rows._walk_into, _graphs._Flattening), call for
    call: equal audit keys; the same graph key parts, the same tensors named
    alike; the same errors."""

    def both(self, fn):
        """(native, python): fn()'s result, or its exception's type and message."""
        self.assertIsNotNone(_rows.native_keys())
        return _native_and_python(fn, [(_rows, "native_keys"), (_graphs, "native_keys")])

    def values(self):
        x, one = torch.arange(12.0).reshape(4, 3), torch.ones(1, 3)
        with torch.inference_mode():
            frozen = torch.ones(4, 2)
        nested = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(1, 3)] * 2,
                                            layout=torch.jagged)
        args = (x, 2.5, 3, True, None, "s", [x, (one, None)], (), Pair(x, one),
                Inputs(x, {"m": x}), torch.Size([4, 3]), Opaque(), Mode.FAST, torch.float16,
                torch.device("cpu"), b"x", 1j, ..., x.as_subclass(Tagged),
                torch.nn.Parameter(torch.randn(4, 1, 2)), torch.tensor(3.0), frozen,
                torch.ones(4, 3).to_sparse(), nested, decimal.Decimal(1))
        kwargs = {"attention_mask": torch.ones(4, 1, 1, 5, dtype=torch.bool),
                  "d": {"k": x, 3: one, ("t",): [one]},
                  "ordered": collections.OrderedDict(a=x), "use_cache": False,
                  "mode": Mode.FAST, "i": True}
        return args, kwargs

    def test_audit_keys_are_equal(self):
        m = torch.nn.Linear(2, 2)
        args, kwargs = self.values()
        native, python = self.both(lambda: _rows.audit_key(m, args, kwargs, 4))
        self.assertEqual(native, python)
        self.assertEqual(hash(native), hash(python))
        self.assertEqual([type(v) for v in native], [type(v) for v in python])
        # Each value alone, so that no difference hides behind another.
        for k, v in enumerate(args + tuple(kwargs.values())):
            for batch in (4, 1, 3):  # a first dimension of the rows, 1, or another
                native, python = self.both(lambda: _rows.audit_key(m, (v,), {"v": [v]}, batch))
                self.assertEqual(native, python, (k, batch))
        # A decode step and a prefill differ; two decode steps do not.
        step = self.both(lambda: _rows.audit_key(m, (torch.randn(4, 1, 8),), {}, 4))
        self.assertEqual(step[0], step[1])
        self.assertNotEqual(step[0], _rows.audit_key(m, (torch.randn(4, 6, 8),), {}, 4))
        self.assertEqual(step[0], _rows.audit_key(m, (torch.randn(2, 1, 8),), {}, 2))

    @unittest.skipUnless(HAS_TRANSFORMERS, "needs transformers")
    def test_audit_keys_of_caches_are_equal(self):
        from transformers import DynamicCache

        m = torch.nn.Linear(2, 2)
        cache = DynamicCache()
        cache.update(torch.randn(4, 2, 3, 5), torch.randn(4, 2, 3, 5), 0)
        native, python = self.both(lambda: _rows.audit_key(m, (torch.ones(4, 2),),
                                                           {"past_key_values": cache}, 4))
        self.assertEqual(native, python)

    def test_a_value_holding_itself_raises_alike(self):
        m = torch.nn.Linear(2, 2)
        loop = [torch.ones(2)]
        loop.append(loop)
        native, python = self.both(lambda: _rows.audit_key(m, (loop,), {}, 4))
        self.assertEqual(native[0], RecursionError)
        self.assertEqual(python[0], RecursionError)
        native, python = self.both(lambda: _graphs.flatten_inputs((loop,), {}, 4))
        self.assertEqual((native[0], python[0]), (RecursionError, RecursionError))

    def flattened(self, args, kwargs, batch=4):
        native, python = self.both(lambda: _graphs.flatten_inputs(args, kwargs, batch))
        if isinstance(python[0], type):  # an exception
            self.assertEqual(native, python)
            return python
        self.assertEqual(native[0], python[0])
        self.assertEqual(native[2], python[2])

        def leaves(flat):
            return [(id(leaf.tensor), leaf.rows, leaf.where, leaf.state) for leaf in flat[1]]

        self.assertEqual(leaves(native), leaves(python))
        self.assertTrue(all(type(leaf) is _graphs.Leaf for leaf in native[1]))
        return native

    def test_graph_keys_and_leaves_are_the_same(self):
        x, one = torch.arange(12.0).reshape(4, 3), torch.ones(1, 3)
        flat = self.flattened(
            (x, 0.5, [x, (one, None)], (), torch.Size([4, 3]), Mode.FAST, torch.float16, ...,
             Inputs(x, {"m": x}), x.as_subclass(Tagged), torch.nn.Parameter(torch.randn(4, 2))),
            {"pos": torch.arange(4), "t": (x, None), "d": {"k": x, 3: one, ("t",): [one]},
             "scalar": torch.tensor(2.0), "flag": True})
        self.assertIn("argument d[('t',)][0]", [leaf.where for leaf in flat[1]])
        self.assertEqual(flat[0][0], (True, (3,), torch.float32, x.device))
        # What a replay cannot take is refused alike, named alike.
        for value in (Pair(x, one), Opaque(), collections.OrderedDict(a=x), [1, {"o": Opaque()}]):
            native_or_python = self.flattened((x,), {"v": value})
            self.assertEqual(native_or_python[0], _graphs.NoGraph)

    @unittest.skipUnless(HAS_TRANSFORMERS, "needs transformers")
    def test_graph_keys_of_a_static_cache_are_the_same(self):
        from transformers import LlamaConfig, StaticCache

        config = LlamaConfig(hidden_size=16, num_attention_heads=2, num_key_value_heads=2,
                             num_hidden_layers=1)
        cache = StaticCache(config=config, max_cache_len=8)
        cache.early_initialization(4, 2, 8, torch.float32, torch.device("cpu"))
        flat = self.flattened((torch.ones(4, 1, 16),), {"past_key_values": cache,
                                                        "cache_position": torch.arange(1)})
        self.assertTrue(flat[2])  # stateful: the cache's tensors are leaves of their own
        self.assertIn("argument past_key_values.", [leaf.where[:25] for leaf in flat[1]])


@unittest.skipUnless(HAS_TORCH and REPLAY, "needs torch and the replay module "
                                           "(DYNAFLOW_REPLAY_EXT_BUILT)")
class NativeMergeTest(SameValues, unittest.TestCase):
    """merge_outputs in C++ (call_split.h) against Python's _merge."""

    tensors_by_memory = False  # each merge concatenates anew

    def both(self, s, results):
        """(native, python): each the merged output, or the MergeError's message."""
        got = []
        for native in (True, False):
            with contextlib.nullcontext() if native else \
                    unittest.mock.patch.object(_split, "_native_splitter", lambda: None):
                try:
                    got.append(_split.merge_outputs(s, results, s.states))
                except _split.MergeError as e:
                    got.append(str(e))
        return got

    def assert_same_merge(self, s, results):
        native, python = self.both(s, results)
        if isinstance(python, str):
            self.assertEqual(native, python)
        else:
            self.assert_same(_values(native), _values(python))
        return native

    def test_containers_tensors_and_values(self):
        s = split((torch.randn(4, 3),), parts=2)
        results = [(torch.full((2, 3), float(i)), None, [True, 7, "x"],
                    {"a": torch.arange(2) + 2 * i, 3: (None,)}, Pair(torch.zeros(2), 1),
                    Inputs(torch.ones(2, 1), torch.ones(2)))
                   for i in range(2)]
        for r in results:  # one tensor at two places is merged once
            r[2].append(r[0])
        out = self.assert_same_merge(s, results)
        self.assertIs(out[2][3], out[0])
        self.assertEqual(out[0][:, 0].tolist(), [0.0, 0.0, 1.0, 1.0])
        self.assertEqual(out[3]["a"].tolist(), [0, 1, 2, 3])

    def test_errors_keep_their_messages(self):
        s = split((torch.randn(4, 3),), parts=2)
        t = torch.zeros(2, 3)
        for results in [[(t, 1), (t, 2)],           # different values
                        [(t, 2), (t, 2)],           # the batch size
                        [[t], [t, t]],              # lengths
                        [{"a": t}, {"b": t}],       # keys
                        [(t,), [t]],                # types
                        [(torch.zeros(3, 3),), (t,)],  # rows
                        [(torch.tensor(1.0),), (torch.tensor(2.0),)],
                        [(Opaque(),), (Opaque(),)]]:
            with self.subTest(results=results):
                self.assertIsInstance(self.assert_same_merge(s, results), str)

    def test_an_argument_updated_in_place_is_returned_itself(self):
        x = torch.zeros(4, 3)
        s = split((x,), parts=2)
        s.aliases = _split.OutputAliases(returned=frozenset({"output['out']"}))
        out = self.assert_same_merge(s, [{"out": s.args[i][0].add_(i)} for i in range(2)])
        self.assertIs(out["out"], x)


@unittest.skipUnless(HAS_TORCH and REPLAY, "needs torch and the replay module "
                                           "(DYNAFLOW_REPLAY_EXT_BUILT)")
class NativeModuleStateTest(unittest.TestCase):
    """ModuleState in C++ (plugin/torch/module_state.h) against the Python
    one, change for change: the same first change named, or none."""

    def both(self, modules, change):
        """(native, python): the message each gives after `change`, or ""."""
        native = _split._native_module_state()(modules, _split._module_tables(),
                                               _split.Unchanged)
        python = _split.ModuleState(modules)
        change()
        try:
            python.check()
            said = ""
        except _split.MergeError as e:
            said = str(e)
        return native.check(), said

    def test_every_kind_of_change_is_named_alike(self):
        from torch import nn

        def block():
            b = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3))
            b[0].calls, b[0].scale, b[0].nan = 0, 1.5, float("nan")
            b[0].seen, b[0].table, b[0].ids = [1, 2], {"a": 1}, {3}
            b[0].ordered = collections.OrderedDict(x=1, z=2)
            b[0].cache_k = torch.zeros(4, 3)
            b[0].config = Opaque()
            b[1].register_buffer("n", torch.zeros(1))
            return b

        def reset(m):  # deleted and set again to the same value: only the order moves
            value = m.calls
            del m.calls
            m.calls = value

        @torch.no_grad()
        def write_weight(m):
            m[0].weight.add_(1)

        changes = {
            "nothing": lambda m: None,
            "counter": lambda m: setattr(m[0], "calls", 1),
            # A module whose attributes hold no entries: compared in place.
            "plain module's number": lambda m: setattr(m[1], "eps", 0.5),
            "plain module's attribute rebound": lambda m: setattr(m[1], "weight",
                                                                  nn.Parameter(m[1].weight)),
            "float": lambda m: setattr(m[0], "scale", 2.5),
            "list appended": lambda m: m[0].seen.append(3),
            "list entry replaced": lambda m: m[0].seen.__setitem__(0, 7),
            "dict entry replaced": lambda m: m[0].table.__setitem__("a", object()),
            "dict key added": lambda m: m[0].table.__setitem__("b", 1),
            "set added to": lambda m: m[0].ids.add(4),
            "ordered dict": lambda m: m[0].ordered.move_to_end("x") or
            m[0].ordered.__setitem__("y", 2),
            "ordered dict reordered": lambda m: m[0].ordered.move_to_end("x"),
            "attribute added": lambda m: setattr(m[1], "last", torch.zeros(1)),
            "attribute deleted": lambda m: delattr(m[0], "scale"),
            "order only": lambda m: reset(m[0]),
            "config field": lambda m: setattr(m[0].config, "x", 1),
            "tensor attribute written": lambda m: m[0].cache_k.add_(1),
            "tensor attribute rebound": lambda m: setattr(m[0], "cache_k", torch.zeros(4, 3)),
            "weight written": write_weight,
            "buffer replaced": lambda m: setattr(m[1], "n", m[1].n + 1),
            "buffer written": lambda m: m[1].n.add_(1),
            "hook added": lambda m: m[0].register_forward_hook(lambda *a: None),
        }
        for name, change in changes.items():
            with self.subTest(change=name):
                m = block()
                native, python = self.both(list(m.named_modules()), lambda: change(m))
                self.assertEqual(native, python)
                self.assertEqual(bool(python), name not in ("nothing", "order only",
                                                            "config field"), python)

    def test_an_inference_buffer_is_compared_by_its_bytes(self):
        from torch import nn

        with torch.inference_mode():
            m = nn.Linear(2, 2)
            m.register_buffer("table", torch.zeros(3))
        def write():
            with torch.inference_mode():
                m.table[0] = 1.0

        native, python = self.both([("m", m)], write)
        self.assertEqual(native, python)
        self.assertIn("buffer m.table is shared by the micro-batches and was modified", native)

    @unittest.skipUnless(HAS_TRANSFORMERS, "needs transformers")
    def test_a_decoder_layer_takes_what_python_takes(self):
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer

        layer = LlamaDecoderLayer(LlamaConfig(hidden_size=32, intermediate_size=64,
                                              num_attention_heads=4, num_key_value_heads=2), 0)
        modules = list(layer.named_modules())
        native = _split._native_module_state()(modules, _split._module_tables(),
                                               _split.Unchanged)
        python = _split.ModuleState(modules)
        self.assertEqual(native.attributes, len(python.state) // 3)
        self.assertEqual(native.tensors, len(python.tensors))
        self.assertEqual(native.check(), "")


def _values(value):
    """`value` with tensors as they are and everything else compared by value."""
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*map(_values, value))
    if isinstance(value, (tuple, list)):
        return type(value)(map(_values, value))
    if isinstance(value, dict):
        return {k: _values(v) for k, v in value.items()}
    return value


def _fields(value):
    """A dataclass's field values (dataclasses.astuple would copy them)."""
    return tuple(getattr(value, f.name) for f in dataclasses.fields(value))


def _views(s):
    """Every tensor in a split's micro-batch arguments that is a row view."""
    out = []

    def walk(v):
        if isinstance(v, torch.Tensor):
            if id(v) in s.row_views:
                out.append(v)
        elif isinstance(v, dict):
            for item in v.values():
                walk(item)
        elif isinstance(v, (tuple, list)):
            for item in v:
                walk(item)
        elif dataclasses.is_dataclass(v):
            walk(_fields(v))

    walk((s.args, s.kwargs))
    return out


@unittest.skipUnless(HAS_TORCH, "needs torch")
@unittest.skipUnless(HAS_TORCH and REPLAY, "needs torch and the replay module "
                                           "(DYNAFLOW_REPLAY_EXT_BUILT)")
class NativeGuardsTest(unittest.TestCase):
    """check_module's walk and the graph key's global modes in C++
    (plugin/torch/call_guards.h) against Python's: the same modules listed,
    the same refusals; keys that tell apart the same settings."""

    def both(self, fn):
        """(native, python): fn()'s result, or its exception's type and message."""
        self.assertIsNotNone(_split._native_unit_walk())
        return _native_and_python(fn, [(_split, "_native_unit_walk")])

    def units(self):
        """Units whose walks differ in each way named_modules can."""
        from torch import nn

        shared = nn.Linear(2, 2)
        twice = nn.Sequential(shared, nn.ReLU(), shared, nn.Sequential(shared))
        holes = nn.Sequential(nn.Linear(2, 2))
        holes.register_module("gap", None)
        holes.add_module("after", nn.ModuleDict({"a": nn.Tanh(), "b": nn.ModuleList([nn.GELU()])}))
        hooked = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), nn.Linear(2, 2)))
        hooked[1][1].register_forward_pre_hook(lambda m, a: None)
        hooked.register_forward_hook(lambda m, a, o: None)  # the unit's own: not looked at
        units = {"twice": twice, "holes": holes, "hooked": hooked,
                 "batch norm": nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)),
                 "lazy": nn.Sequential(nn.LazyLinear(3)),
                 "seq first": nn.TransformerEncoderLayer(4, 2),
                 "lstm": nn.Sequential(nn.LSTM(4, 4, batch_first=True)),
                 "instance norm": nn.InstanceNorm1d(4, track_running_stats=True),
                 "backward": nn.Sequential(nn.Linear(2, 2)),
                 # torch.compile's wrapper holds the module as _orig_mod.
                 "compiled": torch.compile(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))}
        units["backward"][0].register_full_backward_hook(lambda m, gi, go: None)
        if HAS_TRANSFORMERS:
            import transformers as tf

            config = tf.LlamaConfig(vocab_size=32, hidden_size=16, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=32)
            llama = tf.LlamaForCausalLM(config)
            llama.activation_checkpointing_enable()  # a hook known to act per row
            units["llama"] = llama
        return units

    def test_walks_list_the_same_modules_and_refuse_alike(self):
        walk = _split._native_unit_walk()
        for name, unit in self.units().items():
            walked = walk.walk(unit)
            self.assertIsNotNone(walked, name)
            pairs, flagged = walked
            expected = list(unit.named_modules())
            self.assertEqual([n for n, _ in pairs], [n for n, _ in expected], name)
            self.assertTrue(all(a is b for (_, a), (_, b) in zip(pairs, expected)), name)
            native, python = self.both(lambda u=unit: _split.check_module("U", u))
            if isinstance(python, list):
                self.assertEqual([n for n, _ in native], [n for n, _ in python], name)
            else:
                self.assertEqual(native, python, name)
        # What each unit flags: only what could refuse.
        flagged = {}
        for name, unit in self.units().items():
            pairs, indices = walk.walk(unit)
            flagged[name] = [pairs[i][0] for i in indices]
        self.assertEqual(flagged["twice"], [])
        self.assertEqual(flagged["holes"], [])
        self.assertEqual(flagged["hooked"], ["1.1"])
        self.assertEqual(flagged["batch norm"], ["1"])
        self.assertEqual(flagged["lazy"], ["0"])
        self.assertEqual(flagged["seq first"], ["self_attn"])
        self.assertEqual(flagged["lstm"], ["0"])
        self.assertEqual(flagged["instance norm"], [""])
        self.assertEqual(flagged["backward"], ["0"])
        self.assertEqual(flagged["compiled"], ["_orig_mod.1"])
        if HAS_TRANSFORMERS:
            self.assertEqual(flagged["llama"], ["model.embed_tokens"])

    def test_what_named_modules_might_list_otherwise_is_left_to_python(self):
        from torch import nn

        class OwnWalk(nn.Sequential):
            def named_modules(self, memo=None, prefix="", remove_duplicate=True):
                yield prefix, self

        class ByValue(nn.Linear):
            def __eq__(self, other):
                return isinstance(other, ByValue)

            __hash__ = None

        class OwnAttributes(nn.Sequential):
            def __getattribute__(self, name):  # may answer _modules its own way
                return super().__getattribute__(name)

        class Key(str):
            pass

        class NoClass:
            @property
            def __class__(self):
                raise ValueError("no class")

        def hooked():
            m = nn.Linear(2, 2)
            m.register_forward_hook(lambda m, a, o: None)
            return m

        walk = _split._native_unit_walk()
        odd = nn.Sequential(nn.Linear(2, 2))
        odd._modules["x"] = 3  # not a module: named_modules raises
        no_class = nn.Sequential(nn.Linear(2, 2))
        no_class._modules["x"] = NoClass()
        keyed = nn.Sequential()
        keyed._modules[Key("a")] = nn.Linear(2, 2)
        # A named_modules set on the instance, listing one more (hooked) module.
        listed = nn.Sequential(nn.Linear(2, 2))
        extra, inner = hooked(), listed[0]

        def listing(memo=None, prefix="", remove_duplicate=True):
            yield from nn.Module.named_modules(inner, memo, prefix, remove_duplicate)
            yield prefix + ".extra", extra

        inner.named_modules = listing
        scripted = torch.jit.script(nn.Sequential(nn.Linear(2, 2)))  # its _modules: not a dict
        for unit in (scripted, OwnWalk(nn.ReLU()), nn.Sequential(nn.ReLU(), OwnWalk()),
                     nn.Sequential(ByValue(2, 2)), odd, no_class, keyed, listed,
                     nn.Sequential(OwnAttributes(hooked()))):
            self.assertIsNone(walk.walk(unit), unit)
            native, python = self.both(lambda u=unit: _split.check_module("U", u))
            if isinstance(python, list):
                self.assertEqual([(n, type(n)) for n, _ in native],
                                 [(n, type(n)) for n, _ in python])
            else:
                self.assertEqual(native, python)
        self.assertEqual([n for n, _ in _split.check_module("U", OwnWalk(nn.ReLU()))], [""])
        with self.assertRaisesRegex(_split.Refusal, r"^U\.0\.extra: forward hook"):
            _split.check_module("U", listed)

    def test_no_code_of_the_model_runs_in_the_walk(self):
        from torch import nn

        class Odd(nn.Linear):
            @property
            def __class__(self):
                raise ValueError("no class")

        hooked = nn.Linear(2, 2)
        hooked.register_forward_hook(lambda m, a, o: None)
        unit = nn.Sequential(hooked, Odd(2, 2))
        self.assertEqual(_split._native_unit_walk().walk(unit)[1], [1, 2])  # left to Python
        native, python = self.both(lambda: _split.check_module("U", unit))
        self.assertEqual(native, python)
        self.assertEqual(native[0], _split.Refusal)
        # A child named "" (set around add_module, which refuses the name) is
        # not the unit: its hooks refuse.
        unit = nn.Sequential(nn.ReLU())
        unit._modules[""] = hooked
        native, python = self.both(lambda: _split.check_module("U", unit))
        self.assertEqual(native, python)
        self.assertEqual(native[0], _split.Refusal)

    def test_a_module_holding_itself_raises_recursion_error(self):
        from torch import nn

        def chain(depth):
            top = inner = nn.Sequential()
            for _ in range(depth):
                inner.add_module("n", nn.Sequential())
                inner = inner.n
            return top

        deep = chain(sys.getrecursionlimit() + 10)
        native, python = self.both(lambda: _split.check_module("U", deep))
        self.assertEqual(native[0], RecursionError)
        self.assertEqual(python[0], RecursionError)
        # Where Python's walk first raises, C++'s does too; and it walks what
        # Python walks but the deepest level.
        low, high = 1, sys.getrecursionlimit() + 10
        while low + 1 < high:
            middle = (low + high) // 2
            python = self.both(lambda d=middle: _split.check_module("U", chain(d)))[1]
            low, high = (middle, high) if isinstance(python, list) else (low, middle)
        for depth, fits in ((low - 1, True), (high, False)):
            native, python = self.both(lambda d=depth: _split.check_module("U", chain(d)))
            self.assertEqual(isinstance(native, list), fits, depth)
            self.assertEqual(isinstance(python, list), fits, depth)

    def test_global_modes_tell_apart_the_settings_python_does(self):
        native = _graphs._native_global_modes()
        self.assertIsNotNone(native)
        python = _graphs._global_modes
        without_native = unittest.mock.patch.object(_graphs, "_native_global_modes", lambda: None)
        with without_native:
            base = (native(), python())
        self.assertEqual(_graphs._global_modes(), base[0])
        b = torch.backends
        settings = [
            lambda: torch.autocast("cpu", dtype=torch.bfloat16),
            lambda: torch.autocast("cpu", dtype=torch.float16),
            lambda: _setting(torch.set_autocast_cache_enabled, torch.is_autocast_cache_enabled(),
                             False),
            lambda: _setting(torch.set_default_dtype, torch.get_default_dtype(), torch.float64),
            lambda: _setting(torch.set_float32_matmul_precision,
                             torch.get_float32_matmul_precision(), "medium"),
            lambda: _setting(lambda v: setattr(b.cuda.matmul, "allow_tf32", v),
                             b.cuda.matmul.allow_tf32, not b.cuda.matmul.allow_tf32),
            lambda: _setting(lambda v: setattr(b.cudnn, "allow_tf32", v), b.cudnn.allow_tf32,
                             not b.cudnn.allow_tf32),
            lambda: _setting(b.cuda.enable_flash_sdp, b.cuda.flash_sdp_enabled(), False),
            lambda: _setting(b.cuda.enable_mem_efficient_sdp, b.cuda.mem_efficient_sdp_enabled(),
                             False),
            lambda: _setting(b.cuda.enable_math_sdp, b.cuda.math_sdp_enabled(), False),
            lambda: _setting(b.cuda.enable_cudnn_sdp, b.cuda.cudnn_sdp_enabled(), False),
            lambda: _setting(torch.use_deterministic_algorithms,
                             torch.are_deterministic_algorithms_enabled(), True),
            lambda: _setting(lambda v: torch.use_deterministic_algorithms(v, warn_only=v),
                             torch.are_deterministic_algorithms_enabled(), True),
            lambda: _setting(lambda v: setattr(b.cuda.matmul,
                                               "allow_fp16_reduced_precision_reduction", v),
                             b.cuda.matmul.allow_fp16_reduced_precision_reduction,
                             not b.cuda.matmul.allow_fp16_reduced_precision_reduction),
            lambda: _setting(lambda v: setattr(b.cuda.matmul,
                                               "allow_bf16_reduced_precision_reduction", v),
                             b.cuda.matmul.allow_bf16_reduced_precision_reduction,
                             not b.cuda.matmul.allow_bf16_reduced_precision_reduction),
            lambda: _setting(lambda v: setattr(b.cuda.matmul, "allow_fp16_accumulation", v),
                             b.cuda.matmul.allow_fp16_accumulation,
                             not b.cuda.matmul.allow_fp16_accumulation),
        ]
        seen = {base[0]}
        for k, setting in enumerate(settings):
            with setting():
                with without_native:
                    changed = python()
                now = native()
            self.assertNotEqual(changed, base[1], k)  # the Python key tells it apart
            self.assertNotIn(now, seen, k)  # and so does C++'s, from every other
            seen.add(now)
            self.assertEqual(native(), base[0], k)  # put back
        with without_native:
            self.assertEqual(python(), base[1])


@contextlib.contextmanager
def _setting(set_value, old, new):
    set_value(new)
    try:
        yield
    finally:
        set_value(old)


class ModuleTest(unittest.TestCase):
    def test_batch_norm_with_batch_statistics_refuses(self):
        from torch import nn

        block = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
        with self.assertRaisesRegex(_split.Refusal, r"^L\.0\.1: BatchNorm1d normalises"):
            _split.check_module("L.0", block)
        block.eval()  # running statistics: per row
        _split.check_module("L.0", block)
        block[1].running_mean = None  # no running statistics: the batch's, also in eval
        with self.assertRaises(_split.Refusal):
            _split.check_module("L.0", block)

    def test_under_capture_an_inference_buffer_refuses(self):
        from unittest import mock
        from torch import nn

        with torch.inference_mode():
            block = nn.Linear(2, 2)
            block.register_buffer("scale", torch.ones(2))
        with mock.patch.object(_split, "_capturing", lambda t: True), \
                mock.patch.object(_split, "_capture_underway", lambda: True):
            with self.assertRaisesRegex(_split.Refusal, r"^L\.0: buffer scale is an inference "
                                                        r"tensor shared"):
                _split.check_module("L.0", block)
            _split.check_module("L.0", nn.Linear(2, 2))  # no inference buffer
        _split.check_module("L.0", block)  # not capturing

    def test_modules_whose_dimension_0_is_not_the_batch_refuse(self):
        from torch import nn

        cases = [
            (nn.MultiheadAttention(4, 2), "MultiheadAttention takes the sequence first"),
            (nn.TransformerEncoderLayer(4, 2), "MultiheadAttention takes the sequence first"),
            (nn.LSTM(4, 4, batch_first=True), "LSTM returns its hidden state with the batch in "
                                              "dimension 1"),
            (nn.InstanceNorm1d(4, track_running_stats=True), "InstanceNorm1d updates its running"),
        ]
        for module, message in cases:
            with self.assertRaisesRegex(_split.Refusal, message):
                _split.check_module("L.0", module)
        _split.check_module("L.0", nn.MultiheadAttention(4, 2, batch_first=True))
        _split.check_module("L.0", nn.InstanceNorm1d(4))  # no running statistics

    def test_hooks_inside_the_unit_refuse_its_own_and_dynaflows_do_not(self):
        from torch import nn
        from torch.nn.modules import module as nn_module

        seen = []

        def count_rows(module, args, output):  # sees one micro-batch's rows per call
            seen.append(output.shape[0])

        block = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
        handle = block[0].register_forward_hook(count_rows)
        with self.assertRaisesRegex(
                _split.Refusal, r"^L\.0\.0: forward hook .*count_rows would run once per "
                                r"micro-batch, on part of the batch$"):
            _split.check_module("L.0", block)
        handle.remove()
        handle = block[1].register_full_backward_hook(lambda m, gi, go: None)
        with self.assertRaisesRegex(_split.Refusal, r"^L\.0\.1: backward hook "):
            _split.check_module("L.0", block)
        handle.remove()
        # The unit's own hooks run once, around the whole planned call.
        handle = block.register_forward_hook(count_rows)
        _split.check_module("L.0", block)
        handle.remove()
        # A global module hook runs inside every module of the unit.
        handle = nn_module.register_module_forward_pre_hook(lambda m, args: None)
        try:
            with self.assertRaisesRegex(_split.Refusal, r"^L\.0 \(a global module hook\): "
                                                        r"forward pre-hook .*<lambda> would run"):
                _split.check_module("L.0", block)
        finally:
            handle.remove()
        # dynaflow's module-path hooks keep a stack per thread: they pass.
        from dynaflow import _module_paths

        tracker = _module_paths.ModuleTracker.__new__(_module_paths.ModuleTracker)
        handles = [block[0].register_forward_pre_hook(tracker.pre_hook),
                   nn_module.register_module_forward_hook(tracker.post_hook)]
        try:
            _split.check_module("L.0", block)
        finally:
            for h in handles:
                h.remove()
        self.assertEqual(seen, [])

    @unittest.skipUnless(HAS_TRANSFORMERS, "needs transformers")
    def test_transformers_gradient_checkpointing_hook_passes(self):
        # activation_checkpointing_enable() (gradient_checkpointing_enable()
        # before transformers 5) puts a hook on the input embeddings that
        # marks their output as requiring grad: the same for every row.
        import transformers as tf

        config = tf.LlamaConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1,
                                num_attention_heads=2, intermediate_size=32)
        model = tf.LlamaForCausalLM(config)
        model.activation_checkpointing_enable()
        self.assertTrue(model.model.embed_tokens._forward_hooks)
        _split.check_module("LlamaForCausalLM.model", model.model)
        model.model.embed_tokens.register_forward_hook(lambda m, a, out: None)
        with self.assertRaisesRegex(_split.Refusal, r"embed_tokens: forward hook .*<lambda>"):
            _split.check_module("LlamaForCausalLM.model", model.model)

    def test_module_fingerprint_follows_structure_not_values(self):
        from torch import nn

        from dynaflow._module_paths import module_fingerprint

        def net(width, layers, dtype=torch.float32):
            torch.manual_seed(width * layers)
            return nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)]).to(dtype)

        base = module_fingerprint(net(8, 2))
        self.assertRegex(base, "^[0-9a-f]{16}$")
        self.assertEqual(module_fingerprint(net(8, 2)), base)
        other_weights = net(8, 2)
        with torch.no_grad():
            other_weights[0].weight.add_(1)
        self.assertEqual(module_fingerprint(other_weights), base)
        self.assertNotEqual(module_fingerprint(net(8, 3)), base)
        self.assertNotEqual(module_fingerprint(net(16, 2)), base)
        self.assertNotEqual(module_fingerprint(net(8, 2, torch.bfloat16)), base)
        # A lazy module before its first call: its parameters have no shape yet.
        lazy = nn.Sequential(nn.LazyLinear(8))
        self.assertRegex(module_fingerprint(lazy), "^[0-9a-f]{16}$")
        lazy(torch.randn(2, 8))
        self.assertNotEqual(module_fingerprint(lazy), module_fingerprint(nn.Sequential(
            nn.LazyLinear(8))))


@unittest.skipUnless(HAS_TRANSFORMERS, "needs transformers")
class CacheTest(unittest.TestCase):
    """Each micro-batch updates its view of a cache; after the merge the cache
    equals one updated by the unsplit call."""

    HEADS, DIM = 2, 4

    @unittest.skipUnless(HAS_TRANSFORMERS, "needs transformers")
    def test_shallow_copies_are_copy_copys(self):
        import copy

        from transformers import cache_utils as cu

        cache = cu.DynamicCache()
        cache.update(*self.kv(4, 3, 0), 0)
        values = [cache, cache.layers[0], cu.DynamicLayer(), cu.StaticLayer(8),
                  cu.EncoderDecoderCache(cu.DynamicCache(), cu.DynamicCache())]
        for value in values:
            self.assertTrue(_split._copied_by_dict(type(value)), type(value))
            got, expected = _split._shallow_copy(value), copy.copy(value)
            self.assertIs(type(got), type(expected))
            self.assertIsNot(got, value)
            self.assertEqual(vars(got).keys(), vars(expected).keys())
            for name, v in vars(expected).items():
                self.assertIs(vars(got)[name], v, name)

        class Own(cu.DynamicLayer):
            def __copy__(self):
                return "own"

        class Slotted(cu.DynamicLayer):
            __slots__ = ("x",)

        self.assertFalse(_split._copied_by_dict(Own))
        self.assertFalse(_split._copied_by_dict(Slotted))
        self.assertEqual(_split._shallow_copy(Own()), "own")

    def llama_config(self, layers):
        from transformers import LlamaConfig

        return LlamaConfig(hidden_size=self.HEADS * self.DIM, num_attention_heads=self.HEADS,
                           num_key_value_heads=self.HEADS, num_hidden_layers=layers,
                           head_dim=self.DIM)

    def kv(self, batch, length, seed):
        g = torch.Generator().manual_seed(seed)
        shape = (batch, self.HEADS, length, self.DIM)
        return torch.randn(shape, generator=g), torch.randn(shape, generator=g)

    def update_split(self, cache, step_seed, length, parts=2, batch=4):
        s = split((torch.randn(batch, length),), {"past_key_values": cache}, batch, parts)
        k, v = self.kv(batch, length, step_seed)
        for i in range(parts):
            begin, count = s.rows(i)
            view = s.kwargs[i]["past_key_values"]
            self.assertIsNot(view, cache)
            view.update(k.narrow(0, begin, count), v.narrow(0, begin, count), 0,
                        {"cache_position": torch.arange(self.offset, self.offset + length)})
        self.assertIs(_split.merge_outputs(s, [s.kwargs[i]["past_key_values"]
                                               for i in range(parts)], s.states), cache)
        s.merge_state()
        self.offset += length

    def update_whole(self, cache, step_seed, length, batch=4):
        k, v = self.kv(batch, length, step_seed)
        cache.update(k, v, 0, {"cache_position": torch.arange(self.offset, self.offset + length)})
        self.offset += length

    def check_same(self, make):
        """Prefill 5 positions, then decode 2, split and unsplit."""
        split_cache, whole_cache = make(), make()
        self.offset = 0
        for seed, length in ((1, 5), (2, 1), (3, 1)):
            self.update_split(split_cache, seed, length)
        self.offset = 0
        for seed, length in ((1, 5), (2, 1), (3, 1)):
            self.update_whole(whole_cache, seed, length)
        a, b = split_cache.layers[0], whole_cache.layers[0]
        torch.testing.assert_close(a.keys, b.keys, rtol=0, atol=0)
        torch.testing.assert_close(a.values, b.values, rtol=0, atol=0)
        self.assertEqual(split_cache.get_seq_length(), whole_cache.get_seq_length())
        return split_cache

    def test_dynamic_cache(self):
        from transformers import DynamicCache

        cache = self.check_same(DynamicCache)
        self.assertEqual(tuple(cache.layers[0].keys.shape), (4, self.HEADS, 7, self.DIM))

    def two_layer_cache(self, length=3):
        """A DynamicCache of 2 layers holding `length` positions of 4 rows."""
        from transformers import DynamicCache

        cache = DynamicCache()
        for layer in range(2):
            cache.update(*self.kv(4, length, 10 + layer), layer)
        return cache

    def updated_split(self, cache, k, v, twice=False, then=lambda i, keys: keys):
        """`cache` split in 2, each micro-batch's view updated with its rows
        of `k` and `v` (twice) and `then(micro-batch, keys it returned)`
        called, and merged: what each `then` returned."""
        s = split((torch.randn(4, 1),), {"past_key_values": cache}, 4, 2)
        returned = []
        for i in range(2):
            begin, count = s.rows(i)
            view = s.kwargs[i]["past_key_values"]
            for _ in range(2 if twice else 1):
                keys, _ = view.update(k.narrow(0, begin, count), v.narrow(0, begin, count), 0)
            returned.append(then(i, keys))
        s.merge_state()
        return returned

    def test_a_dynamic_layer_grows_in_the_tensor_the_merge_keeps(self):
        # Each micro-batch's update writes its rows of one tensor of the
        # whole batch, which the merged layer keeps: the cache is copied once
        # per call, as unsplit, not again by concatenating the micro-batches'.
        # A layer no micro-batch updated keeps its own tensors.
        cache, whole = self.two_layer_cache(), self.two_layer_cache()
        untouched = cache.layers[1].keys, cache.layers[1].values
        k, v = self.kv(4, 1, 3)
        with torch.no_grad():
            rows = self.updated_split(cache, k, v)
        whole.update(k, v, 0)
        merged = cache.layers[0]
        torch.testing.assert_close(merged.keys, whole.layers[0].keys, rtol=0, atol=0)
        torch.testing.assert_close(merged.values, whole.layers[0].values, rtol=0, atol=0)
        self.assertEqual([r._base is merged.keys for r in rows], [True, True])
        self.assertEqual([r.data_ptr() for r in rows],
                         [merged.keys.data_ptr(), merged.keys[2].data_ptr()])
        self.assertIs(cache.layers[1].keys, untouched[0])
        self.assertIs(cache.layers[1].values, untouched[1])

    def three_layer_split(self, cache):
        """`cache`'s views in a split in 2 of a batch of 4."""
        s = split((torch.randn(4, 1),), {"past_key_values": cache}, 4, 2)
        return s, [s.kwargs[i]["past_key_values"] for i in range(2)]

    def test_a_layer_no_micro_batch_reads_gets_no_view_and_is_not_merged(self):
        # A unit that is one decoder layer reads one layer of the cache:
        # views of every layer on every layer's call made a decode step's
        # views quadratic in the depth. The other layers' views are never
        # made, and the merge leaves those layers as they were.
        from transformers import DynamicCache, StaticCache

        config = self.llama_config(3)
        for kind in ("dynamic", "static"):
            with self.subTest(kind):
                def make():
                    return DynamicCache(config=config) if kind == "dynamic" else \
                        StaticCache(config=config, max_cache_len=8)
                cache, whole = make(), make()
                for layer in range(3):
                    for c in (cache, whole):
                        c.update(*self.kv(4, 3, 20 + layer), layer,
                                 {"cache_position": torch.arange(3)})
                before = [(layer.keys, layer.values, getattr(layer, "cumulative_length", None))
                          for layer in cache.layers]
                lengths = [int(getattr(layer, "cumulative_length", 0)) for layer in cache.layers]
                s, views = self.three_layer_split(cache)
                k, v = self.kv(4, 1, 30)
                for i, view in enumerate(views):
                    begin, count = s.rows(i)
                    view.update(k.narrow(0, begin, count), v.narrow(0, begin, count), 1,
                                {"cache_position": torch.tensor([3])})
                    self.assertEqual([_split._LazyLayers.made(view.layers, j) for j in range(3)],
                                     [False, True, False])
                    self.assertEqual(len(view.layers), 3)
                s.merge_state()
                whole.update(k, v, 1, {"cache_position": torch.tensor([3])})
                for j in (0, 2):
                    self.assertIs(cache.layers[j].keys, before[j][0])
                    self.assertIs(cache.layers[j].values, before[j][1])
                    if kind == "static":
                        self.assertIs(cache.layers[j].cumulative_length, before[j][2])
                self.assertEqual([int(getattr(layer, "cumulative_length", 0)) for layer
                                  in cache.layers][::2], lengths[::2])
                for a, b in zip(cache.layers, whole.layers):
                    torch.testing.assert_close(a.keys, b.keys, rtol=0, atol=0)
                    torch.testing.assert_close(a.values, b.values, rtol=0, atol=0)
                self.assertEqual(cache.get_seq_length(1), whole.get_seq_length(1))

    def test_a_layer_list_read_other_than_by_index_holds_every_view(self):
        # Iteration, slices, searches and copies see the list of all the
        # micro-batch's views (an eager one's), never a placeholder.
        import copy

        cache = self.two_layer_cache()
        _, views = self.three_layer_split(cache)
        reads = {
            "iteration": lambda layers: [layer for layer in layers],
            "slice": lambda layers: layers[0:2],
            "reversed": lambda layers: list(reversed(layers))[::-1],
            "copy": lambda layers: copy.copy(layers),
            "deepcopy": copy.deepcopy,
            "pop": lambda layers: [layers[0], layers.pop()],
            "insert": lambda layers: (layers.insert(0, None), layers[1:])[1],
            "repr": lambda layers: (repr(layers), list.__iter__(layers))[1],
            "added to": lambda layers: [None] + layers,
            "compared": lambda layers: (views[0].layers == layers, list.__iter__(layers))[1],
            "rebuilt by its type": lambda layers: type(layers)(layers),
        }
        for name, read in reads.items():
            with self.subTest(name):
                _, views = self.three_layer_split(cache)
                layers = views[1].layers
                got = [layer for layer in read(layers) if layer is not None]
                self.assertEqual(len(got), 2)
                for j, layer in enumerate(got):
                    self.assertIsNot(layer, _split._UNMADE)
                    self.assertEqual(tuple(layer.keys.shape), (2, self.HEADS, 3, self.DIM))
                    torch.testing.assert_close(layer.keys, cache.layers[j].keys[2:], rtol=0,
                                               atol=0)
        self.assertIs(type(copy.copy(views[0].layers)), list)
        self.assertEqual(views[0].layers.index(views[0].layers[1]), 1)
        self.assertIn(views[0].layers[0], views[0].layers)

    def test_a_layer_one_micro_batch_did_not_read_is_merged_from_its_view_as_made(self):
        # Micro-batch 0 writes a static layer, micro-batch 1 never reads it:
        # its view is made at the merge, unwritten, and the merge refuses the
        # micro-batches' different lengths, as it does for views made eagerly.
        from transformers import StaticCache

        config = self.llama_config(2)
        cache = StaticCache(config=config, max_cache_len=8)
        self.offset = 0
        self.update_whole(cache, 1, 2)
        s, views = self.three_layer_split(cache)
        k, v = self.kv(2, 1, 5)
        views[0].update(k, v, 0, {"cache_position": torch.tensor([2])})
        self.assertFalse(_split._LazyLayers.made(views[1].layers, 0))
        with self.assertRaisesRegex(_split.MergeError, r"different lengths \[2, 3\]"):
            s.merge_state()

    def test_a_call_reads_its_static_layers_lengths_on_the_host_once(self):
        # Read layer by layer, each length was a device synchronisation on
        # eager CUDA: 6 for 3 layers in 2 micro-batches. Now one read of
        # them all, which still finds the layer whose lengths differ.
        from transformers import StaticCache

        for differs in (None, 2):
            with self.subTest(differs=differs):
                cache = StaticCache(config=self.llama_config(3), max_cache_len=8)
                self.offset = 0
                for layer in range(3):
                    cache.update(*self.kv(4, 2, layer), layer)
                s, views = self.three_layer_split(cache)
                for mb in range(2):
                    for layer in range(3):
                        length = 2 if (mb, layer) == (1, differs) else 1
                        views[mb].update(*self.kv(2, length, 10 + layer), layer,
                                         {"cache_position": torch.arange(2, 2 + length)})
                reads = []
                tolist = torch.Tensor.tolist

                def counted(t):
                    reads.append(t.numel())
                    return tolist(t)

                with unittest.mock.patch.object(torch.Tensor, "tolist", counted), \
                        unittest.mock.patch.object(torch.Tensor, "__int__", None), \
                        unittest.mock.patch.object(torch.Tensor, "item", None):
                    if differs is None:
                        s.merge_state()
                    else:
                        with self.assertRaisesRegex(_split.MergeError,
                                                    r"different lengths \[3, 4\]"):
                            s.merge_state()
                self.assertEqual(reads, [6])
                if differs is None:
                    self.assertEqual([int(l.cumulative_length) for l in cache.layers], [3, 3, 3])

    def test_a_grown_layer_frees_the_tensors_it_replaced_without_the_collector(self):
        # The views' updates refer to their views weakly: a cycle kept the
        # layer's previous keys and values alive until the garbage collector
        # ran (a decode step's whole cache, on a GPU).
        cache = self.two_layer_cache()
        old = weakref.ref(cache.layers[0].keys)
        gc.disable()
        self.addCleanup(gc.enable)
        with torch.no_grad():
            self.updated_split(cache, *self.kv(4, 1, 3))
        self.assertIsNone(old())

    def test_a_dynamic_layer_with_grad_or_of_odd_updates_is_concatenated(self):
        # Where the micro-batches cannot write into one tensor, each
        # concatenates as the layer does, and the merge concatenates theirs:
        # the same values, and gradients. With grad enabled, what attention
        # saves for backward would be a view of that tensor, which the other
        # micro-batch's write would bump the version of (backward raised),
        # also where only the query requires grad; a micro-batch may update
        # twice.
        for case in ("keys require grad", "query requires grad", "twice"):
            with self.subTest(case):
                cache, whole = self.two_layer_cache(), self.two_layer_cache()
                k, v = self.kv(4, 1, 3)
                k.requires_grad_(case == "keys require grad")
                query = torch.randn(4, self.HEADS, 1, self.DIM, requires_grad=True)
                with torch.set_grad_enabled(case != "twice"):
                    # Each micro-batch's attention scores, before the next updates.
                    scores = torch.cat(self.updated_split(
                        cache, k, v, twice=case == "twice",
                        then=lambda i, keys: query[2 * i:2 * i + 2] @ keys.transpose(-1, -2)))
                whole.update(k, v, 0)
                if case == "twice":
                    whole.update(k, v, 0)
                merged = cache.layers[0]
                self.assertIsNone(merged.keys._base)  # a concatenation of its own
                torch.testing.assert_close(merged.keys, whole.layers[0].keys, rtol=0, atol=0)
                torch.testing.assert_close(merged.values, whole.layers[0].values, rtol=0, atol=0)
                if case != "twice":
                    scores.sum().backward()
                    torch.testing.assert_close(
                        query.grad, whole.layers[0].keys.detach().sum(-2, keepdim=True),
                        rtol=1e-5, atol=1e-6)
                if case == "keys require grad":
                    merged.keys.sum().backward()
                    self.assertEqual(k.grad.shape, k.shape)

    def test_only_a_layer_that_appends_as_dynamic_layer_does_grows_in_place(self):
        from transformers import cache_utils as cu

        class Windowed(cu.DynamicLayer):  # keeps only its last position
            def update(self, key_states, value_states, *args, **kwargs):
                keys, values = super().update(key_states, value_states)
                self.keys, self.values = keys[..., -1:, :], values[..., -1:, :]
                return self.keys, self.values

        self.assertTrue(_split._appends_by_concatenation(cu.DynamicLayer, cu.DynamicLayer.update))
        self.assertFalse(_split._appends_by_concatenation(Windowed, Windowed.update))
        layer = Windowed()
        layer.update(*self.kv(4, 2, 1))
        view = _split._DynamicLayerAdapter().views(layer, [0, 2, 4], None)
        self.assertEqual(["update" in vars(view(mb)) for mb in (0, 1)], [False, False])

    def test_static_cache(self):
        from transformers import StaticCache

        config = self.llama_config(1)
        cache = self.check_same(lambda: StaticCache(config=config, max_cache_len=16))
        self.assertEqual(tuple(cache.layers[0].keys.shape), (4, self.HEADS, 16, self.DIM))

    def sliding_config(self, window):
        from transformers import MistralConfig

        return MistralConfig(hidden_size=self.HEADS * self.DIM, num_attention_heads=self.HEADS,
                             num_key_value_heads=self.HEADS, num_hidden_layers=1,
                             head_dim=self.DIM, sliding_window=window)

    def test_dynamic_sliding_window_cache(self):
        # A window of 4 keeps the last 3 of the 7 positions; every position counts.
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicSlidingWindowLayer

        cache = self.check_same(lambda: DynamicCache(config=self.sliding_config(4)))
        self.assertIs(type(cache.layers[0]), DynamicSlidingWindowLayer)
        self.assertEqual(tuple(cache.layers[0].keys.shape), (4, self.HEADS, 3, self.DIM))
        self.assertEqual(cache.layers[0].cumulative_length, 7)

    def test_static_sliding_window_cache(self):
        from transformers import StaticCache
        from transformers.cache_utils import StaticSlidingWindowLayer

        cache = self.check_same(lambda: StaticCache(config=self.sliding_config(4),
                                                    max_cache_len=16))
        self.assertIs(type(cache.layers[0]), StaticSlidingWindowLayer)
        self.assertEqual(tuple(cache.layers[0].keys.shape), (4, self.HEADS, 4, self.DIM))
        self.assertEqual(cache.layers[0].cumulative_length_int, 7)

    def test_a_static_layer_replaced_instead_of_written_in_place_fails_the_merge(self):
        from transformers import StaticCache

        config = self.llama_config(1)
        cache = StaticCache(config=config, max_cache_len=16)
        self.offset = 0
        self.update_whole(cache, 1, 5)
        s = split((torch.randn(4, 1),), {"past_key_values": cache}, 4, 2)
        for i in range(2):
            view = s.kwargs[i]["past_key_values"]
            view.layers[0].cumulative_length.add_(1)
            if i == 1:  # writes a copy, so the cache would never see its rows
                view.layers[0].keys = view.layers[0].keys.clone()
        with self.assertRaisesRegex(_split.MergeError, "replaced its rows of a static cache"):
            s.merge_state()

    def test_an_output_that_could_not_be_merged_is_found_in_the_unsplit_call(self):
        # Asked of the audited first call: a cache the call built that no
        # adapter stacks (LFM2's, Mamba's) once failed after the micro-batches ran.
        from transformers import LlamaConfig
        from transformers.cache_utils import DynamicCache
        from transformers.modeling_outputs import CausalLMOutputWithPast

        config = LlamaConfig(hidden_size=8, num_attention_heads=2, num_hidden_layers=2)
        logits = torch.ones(2, 3)
        merged = CausalLMOutputWithPast(logits=logits, past_key_values=DynamicCache(config=config))
        self.assertEqual(_split.output_refusal((merged, 3, None, "x"), set(), 2), "")
        config.layer_types = ["full_attention", "linear_attention"]
        built = DynamicCache(config=config)
        out = CausalLMOutputWithPast(logits=logits, past_key_values=built)
        self.assertEqual(_split.output_refusal(out, set(), 2),
                         "the output.past_key_values is a DynamicCache the call built, which has "
                         "a layer of type LinearAttentionLayer (layer 1) (a call with "
                         "use_cache=False builds none)")
        self.assertEqual(_split.output_refusal(out, {id(built)}, 2), "")  # passed, returned as is
        self.assertEqual(_split.output_refusal({"h": [logits, object()]}, set(), 2),
                         "the output['h'][1] is of type object, which dynaflow cannot merge")
        # Tensors whose dimension 0 is not the batch's rows (each micro-batch
        # would return another shape), but for the per-token fields.
        for tensor in (torch.zeros(()), logits.reshape(-1), logits[:1]):
            self.assertEqual(_split.output_refusal((logits, tensor), set(), 2),
                             f"the output[1] is a tensor of shape {tuple(tensor.shape)}, not 2 "
                             f"rows")
        from transformers.modeling_outputs import MoeModelOutputWithPast

        per_token = MoeModelOutputWithPast(last_hidden_state=logits,
                                           router_logits=(logits.reshape(6, 1),))
        self.assertEqual(_split.output_refusal(per_token, set(), 2), "")

    def test_an_encoder_decoder_cache_splits_both_caches_and_its_cross_attention_flags(self):
        from transformers import DynamicCache, EncoderDecoderCache

        def cross_step(cache, keys, values):
            # What BART's and T5's cross-attention does: compute the encoder's
            # keys and values on a layer's first call, reuse them after.
            if not cache.is_updated.get(0):
                cache.cross_attention_cache.update(keys, values, 0)
                cache.is_updated[0] = True
            return cache.cross_attention_cache.layers[0].keys

        enc_k, enc_v = self.kv(4, 3, 9)
        whole = EncoderDecoderCache(DynamicCache(), DynamicCache())
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        for step, length in ((1, 5), (2, 1)):
            k, v = self.kv(4, length, step)
            whole.self_attention_cache.update(k, v, 0)
            cross_step(whole, enc_k, enc_v)
            s = split((torch.randn(4, length),), {"past_key_values": cache})
            for i in range(2):
                begin, count = s.rows(i)
                view = s.kwargs[i]["past_key_values"]
                view.self_attention_cache.update(k.narrow(0, begin, count),
                                                 v.narrow(0, begin, count), 0)
                # Each micro-batch computes its own rows' cross-attention
                # keys: a flag shared by the views would skip micro-batch 1's.
                self.assertEqual(cross_step(view, enc_k.narrow(0, begin, count),
                                            enc_v.narrow(0, begin, count)).shape[0], count)
            s.merge_state()
            self.assertEqual(cache.is_updated, {0: True})
            for name in ("self_attention_cache", "cross_attention_cache"):
                a, b = getattr(cache, name).layers[0], getattr(whole, name).layers[0]
                torch.testing.assert_close(a.keys, b.keys, rtol=0, atol=0)
                torch.testing.assert_close(a.values, b.values, rtol=0, atol=0)

        # A CUDA graph replays a call only once its cross-attention keys are
        # computed (a replay would not set the flags) and both caches are
        # written in place (static).
        from transformers import StaticCache

        config = self.llama_config(1)
        static = EncoderDecoderCache(StaticCache(config=config, max_cache_len=8),
                                     StaticCache(config=config, max_cache_len=3))
        adapter = _split.state_adapter(static)
        for part in (static.self_attention_cache, static.cross_attention_cache):
            part.update(*self.kv(4, 3, 4), 0, {"cache_position": torch.arange(3)})
        self.assertEqual(adapter.graph_state(static), "marks its cross-attention keys computed "
                                                      "(is_updated) on the host")
        static.is_updated[0] = True
        fingerprint, tensors = adapter.graph_state(static)
        self.assertEqual([name for name, _ in tensors],
                         [f"{c}.layers[0].{t}" for c in ("self_attention_cache",
                                                         "cross_attention_cache")
                          for t in ("keys", "values", "cumulative_length")])
        self.assertIn("grows its keys and values by concatenation",
                      adapter.graph_state(cache))  # dynamic: never replayed

        passed = EncoderDecoderCache(DynamicCache(), DynamicCache())
        passed._is_user_defined = True  # generate() marks a cache its caller passed
        self.assertEqual(_split.state_adapter(passed).refusal(passed, 4), "")
        odd = EncoderDecoderCache(DynamicCache(), DynamicCache())
        odd.self_attention_cache.extra = 1
        self.assertEqual(_split.state_adapter(odd).refusal(odd, 4),
                         "self_attention_cache: keeps state this version of dynaflow cannot "
                         "split (extra)")
        s = split((torch.randn(4, 1),), {"past_key_values": EncoderDecoderCache(
            DynamicCache(), DynamicCache())})
        s.kwargs[0]["past_key_values"].is_updated[0] = True
        with self.assertRaisesRegex(_split.MergeError,
                                    "micro-batches computed different cross-attention layers"):
            s.merge_state()

    def test_caches_made_inside_the_call_are_stacked_by_rows(self):
        from transformers import DynamicCache

        s = split((torch.randn(4, 3),))
        made = []
        for i in range(2):
            cache = DynamicCache()
            cache.update(*self.kv(2, 5, i), 0)
            made.append(cache)
        merged = _split.merge_outputs(s, [(torch.ones(2, 3), made[0]),
                                          (torch.ones(2, 3), made[1])], s.states)[1]
        self.assertIsInstance(merged, DynamicCache)
        self.assertEqual(tuple(merged.layers[0].keys.shape), (4, self.HEADS, 5, self.DIM))
        torch.testing.assert_close(merged.layers[0].keys[2:], made[1].layers[0].keys)

    def test_a_cache_subclass_or_a_foreign_layer_refuses(self):
        from transformers import DynamicCache

        class MyCache(DynamicCache):
            pass

        with self.assertRaisesRegex(_split.Refusal, "past_key_values of type .*MyCache"):
            split((torch.randn(4, 2),), {"past_key_values": MyCache()})
        cache = DynamicCache()
        cache.layers.append(Opaque())
        with self.assertRaisesRegex(_split.Refusal, "has a layer of type Opaque"):
            split((torch.randn(4, 2),), {"past_key_values": cache})

    def test_a_cache_for_another_batch_refuses(self):
        from transformers import DynamicCache

        cache = DynamicCache()
        cache.update(*self.kv(3, 2, 0), 0)
        with self.assertRaisesRegex(_split.Refusal, "holds 3 rows for a batch of 4"):
            split((torch.randn(4, 2),), {"past_key_values": cache})


if __name__ == "__main__":
    unittest.main()
