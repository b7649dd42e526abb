"""Tests of dynaflow._rows: the audit that proves a call keeps its batch's
rows apart, on functions written the ways models write them."""

import importlib.util
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dynaflow import _rows  # noqa: E402 - after the path is set

HAS_TORCH = importlib.util.find_spec("torch") is not None
if HAS_TORCH:
    import torch
    import torch.nn.functional as F

B, T, H = 4, 6, 8


def audit(fn, *inputs, rows=None, inference=False):
    """Runs fn(*inputs) under a RowAudit whose per-row inputs are `rows`
    (default: every input); returns (result, why it mixes rows or None).
    Under inference mode the audit sees composite operators (linear,
    matmul) that autograd otherwise decomposes first."""
    a = _rows.make_audit(B)
    for t in inputs if rows is None else rows:
        a.tag_rows(t)
    with a, torch.inference_mode(inference):
        out = fn(*inputs)
    outputs = [out] if isinstance(out, torch.Tensor) else \
        [o for o in out if isinstance(o, torch.Tensor)]
    a.check_result(outputs, "the call")
    return out, a.mixed


def _concat_into_new(x, stat):
    """transformers' multi-head latent attention writes into slices of a
    tensor it made; here a batch statistic goes into one of them."""
    k = x.new_empty(B, T, 2 * H)
    k[..., :H] = stat
    k[..., H:] = x
    return k


def _shift_through_slices(x):
    buf = torch.zeros(B, T, H)
    lo, hi = buf[:-1], buf[1:]
    buf.copy_(x)
    hi.copy_(lo.clone())  # each row takes the previous row's values
    return buf


@unittest.skipUnless(HAS_TORCH, "needs torch")
class RowAuditTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.x = torch.randn(B, T, H)
        self.w = torch.randn(H, H)

    def assertKeeps(self, fn, *inputs, rows=None):
        for inference in (False, True):
            out, why = audit(fn, *inputs, rows=rows, inference=inference)
            self.assertIsNone(why, f"inference mode {inference}")
        return out

    def assertMixes(self, fn, *inputs, why, rows=None):
        for inference in (False, True):
            _, mixed = audit(fn, *inputs, rows=rows, inference=inference)
            self.assertIsNotNone(mixed, f"not caught, inference mode {inference}: {why}")
            self.assertRegex(mixed, why)

    def test_what_transformer_layers_do_keeps_rows_apart(self):
        w, x = self.w, self.x
        mask = torch.zeros(B, 1, T, T)  # the same for every row: made in the call
        ids = torch.randint(0, 10, (B, T))
        table = torch.randn(10, H)

        def layer(x, ids):
            h = F.layer_norm(x + F.embedding(ids, table), (H,))
            q = (h @ w).view(B, T, 2, H // 2).transpose(1, 2)
            k = torch.cat([q[..., :2], -q[..., 2:]], dim=-1)  # a rotation's halves
            att = F.scaled_dot_product_attention(q, k, q, attn_mask=mask)
            flat = att.transpose(1, 2).reshape(B * T, H)  # rows x tokens
            y = F.linear(F.silu(flat), w).view(B, T, H)
            return y.softmax(-1) + y.mean(-1, keepdim=True) + x[:, -1:]

        self.assertKeeps(layer, x, ids)

    def test_writes_into_a_tensor_made_in_the_call_keep_rows_apart(self):
        def mla(x):
            k = x.new_empty(B, T, 2 * H)  # transformers' multi-head latent attention
            k[..., :H] = x
            k[..., H:] = x * 2
            final = torch.zeros_like(x)
            final.index_add_(1, torch.tensor([0, 2]), x[:, :2])
            return k.sum(-1) + final.sum(-1)

        self.assertKeeps(mla, self.x)

    def test_the_identity_on_rows_indexes_them_apart(self):
        # GPT-2's pooled logits: each row's own last token.
        lengths = torch.tensor([5, 3, 0, 2])
        out = self.assertKeeps(lambda x, n: x[torch.arange(B), n], self.x, lengths)
        torch.testing.assert_close(out[1], self.x[1, 3])

    def test_operators_that_mix_rows_are_caught(self):
        x = self.x
        cases = {
            "softmax over the batch": (lambda x: x.softmax(0),
                                       r"aten::_?softmax\S* computes along dimension 0"),
            "centering by the batch mean": (lambda x: x - x.mean(0),
                                            r"combines a value reduced over the rows with the "
                                            r"rows"),
            "rows by rows (CLIP logits)": (lambda x: x[:, 0] @ x[:, 0].t(),
                                           r"aten::(mm|matmul) multiplies rows by rows"),
            "the first row added to all": (lambda x: x + x[0], r"picks one row"),
            "a row number": (lambda x: x + torch.arange(B)[:, None, None],
                             r"differs between rows \(such as arange\(batch\)\)"),
            "a sort over the batch": (lambda x: x.sort(0).values,
                                      r"aten::sort computes along dimension 0"),
            "a running sum over the batch": (lambda x: x.cumsum(0), r"aten::cumsum"),
            "batch norm in training": (lambda x: F.batch_norm(x, None, None, training=True),
                                       r"statistics of the whole batch"),
            "a linear layer across the rows": (lambda x: F.linear(x.transpose(0, 2),
                                                                  torch.randn(3, B)),
                                               r"contracts over the dimension of the rows"),
            "a boolean mask": (lambda x: x[x.sum(-1) > 0], r"boolean mask"),
            "rows regrouped": (lambda x: x.reshape(2, -1), r"reshapes the rows' dimension"),
            "rows returned in dimension 1": (lambda x: x.transpose(0, 1),
                                             r"returns its rows in dimension 1"),
            "the batch read on the host": (lambda x: x * 2 if (x.sum() > 0).item() else x,
                                           r"reads on the host a value reduced over the rows "
                                           r"\(by aten::sum"),
            "positions of the batch's values": (lambda x: torch.nonzero(x),
                                                r"computes from its inputs' values"),
            "an operator without a rule": (lambda x: torch.kthvalue(x, 2, 0).values,
                                           r"has no rule"),
            "the batch's total returned": (lambda x: x.sum(), r"returns a value reduced over "
                                                              r"the rows \(by aten::sum"),
            # Found by review: each passed the audit once.
            "torch.equal on the rows": (lambda x: x if torch.equal(x, x * 0) else x * 2,
                                        r"aten::equal computes from its inputs' values"),
            "allclose on a batch statistic": (
                lambda x: x * 2 if torch.allclose(x.amax(0), x.amin(0)) else x,
                r"aten::allclose reads on the host a value reduced over the rows"),
            "a shape from a batch statistic": (
                lambda x: x[:, :torch.nonzero(x.amax(0) > 0).shape[0]],
                r"aten::nonzero reads on the host a value reduced over the rows"),
            "a batch statistic written into part of a tensor made in the call": (
                lambda x: _concat_into_new(x, x.mean(0)), r"combines a value reduced over "
                                                          r"the rows with the rows"),
            "rows shifted through slices of a tensor made in the call": (
                _shift_through_slices, r"reads part of the rows' dimension of a tensor rows "
                                       r"were written into"),
            "a scatter whose index moves values between rows": (
                lambda x: x.new_zeros(x.shape).scatter_(
                    2, (torch.arange(B).view(B, 1, 1) + torch.arange(H)).remainder(H)
                    .expand(x.shape).contiguous(), x),
                r"scatters with an index that does not hold the rows"),
            "a row number added by baddbmm": (
                lambda x: torch.baddbmm(torch.arange(B).float().view(B, 1, 1), x,
                                        x.transpose(1, 2)),
                r"differs between rows"),
            "a reduction into an out= buffer": (
                lambda x: torch.mean(x, 0, out=torch.zeros(T, H)), r"out= tensor"),
            # Found by probing: split, each micro-batch divided by its own count.
            "the batch size as a number": (lambda x: x / x.shape[0],
                                           r"aten::div\.Tensor takes the batch size \(4\) as "
                                           r"a number"),
            "the batch size as a fill value": (lambda x: x.masked_fill(x > 0, x.shape[0]),
                                               r"takes the batch size \(4\)"),
            "where's positions (one argument)": (lambda x: torch.where(x > 0)[0],
                                                 r"aten::(where|nonzero) computes from its "
                                                 r"inputs' values"),
        }
        for name, (fn, why) in cases.items():
            with self.subTest(name):
                self.assertMixes(fn, x, why=why)

    def test_the_batch_size_as_a_size_or_an_exponent_keeps_rows_apart(self):
        # Sizes, dimensions and exponents equal to the batch size are not the
        # batch size as a value; nor is it taken where no rows are involved.
        x = torch.randn(B, B, B)
        self.assertKeeps(lambda x: x.reshape(x.shape[0], -1).pow(B).sum(B - 3), x)
        self.assertKeeps(lambda x: x * torch.full((B,), B), x)

    def test_an_index_that_holds_rows_is_not_the_identity(self):
        # x[p] with p = arange(batch) in the audited call could be any
        # permutation in a later call of the same kind.
        p = torch.arange(B)
        self.assertMixes(lambda x, p: x[p], self.x, p, why=r"indexes the dimension of the "
                                                           r"rows with other than arange")

    def test_position_tables_looked_up_by_per_row_positions_keep_rows_apart(self):
        # Found by probing transformers' models: each was refused, safe.
        x, half = self.x, H // 2
        positions = torch.randint(0, 10, (B, T))
        table = torch.randn(10, H)  # made once, the same for every row

        def gptj(x, positions):  # a table repeated per row, gathered by positions
            repeated = table.unsqueeze(0).repeat(positions.shape[0], 1, 1)
            index = positions.unsqueeze(-1).repeat(1, 1, H)
            return x * torch.gather(repeated, 1, index)

        def xglm(x, positions):  # a sinusoidal table selected by positions
            return x + table.index_select(0, positions.view(-1)).view(B, T, H)

        def deepseek_v2(x, positions):  # rotation by complex numbers
            freqs = positions[..., None].float() * torch.linspace(0.1, 1.0, half)
            cis = torch.polar(torch.ones_like(freqs), freqs)
            return torch.view_as_real(torch.view_as_complex(x.reshape(B, T, half, 2)) *
                                      cis).flatten(2)

        for fn in (gptj, xglm, deepseek_v2):
            with self.subTest(fn.__name__):
                self.assertKeeps(fn, x, positions)
        # Rows gathered or selected along their own dimension, or from a
        # table that differs between rows, are still caught.
        differs = torch.arange(B).float().view(B, 1, 1).expand(B, 10, H)
        cases = {
            "a gather across the rows": (
                lambda x, p: x.gather(0, torch.zeros(B, T, H, dtype=torch.long)),
                r"aten::gather gathers along the dimension of the rows"),
            "a table that differs between rows, gathered by positions": (
                lambda x, p: x * differs.gather(1, p.unsqueeze(-1).expand(B, T, H)),
                r"aten::gather pairs rows with a tensor of 4 elements made in the call that "
                r"differs between rows"),
            "rows selected by positions that hold rows": (
                lambda x, p: x.index_select(1, p[:, 0] % T),
                r"aten::index_select selects from rows by indices that hold rows"),
            "rows selected along their own dimension": (
                lambda x, p: x.index_select(0, torch.tensor([1, 0, 3, 2])),
                r"aten::index_select selects along the dimension of the rows"),
        }
        for name, (fn, why) in cases.items():
            with self.subTest(name):
                self.assertMixes(fn, x, positions, why=why)

    def test_triangular_systems_solved_per_row_keep_rows_apart(self):
        # Qwen3-Next's chunked delta rule: one system per row, head and chunk.
        systems = torch.eye(T) + torch.randn(B, 2, T, T).tril(-1) * 0.1
        rhs = torch.randn(B, 2, T, H)

        def solve(systems, rhs):
            return torch.linalg.solve_triangular(systems, rhs, upper=False, unitriangular=True)

        self.assertKeeps(solve, systems, rhs)
        self.assertKeeps(solve, systems[0, 0], rhs, rows=[rhs])  # one system for every row
        across = torch.eye(B) + torch.randn(B, B).tril(-1) * 0.1
        self.assertMixes(solve, across, torch.randn(B, H),
                         why=r"aten::linalg_solve_triangular solves across the dimension of "
                             r"the rows")
        self.assertMixes(solve, systems, rhs, rows=[rhs],  # other systems for each row
                         why=r"pairs rows with a tensor of 4 elements made in the call that "
                             r"differs between rows")

    def test_shape_operators_keep_rows_apart(self):
        # Seen undecomposed under inference mode.
        x = self.x
        self.assertKeeps(lambda x: x.expand_as(torch.empty(2, B, T, H)).sum(0), x)
        self.assertKeeps(lambda x: x.view_as(torch.empty(B, T * H)), x)
        self.assertKeeps(lambda x: x.swapaxes(1, 2).movedim(2, 1), x)
        self.assertKeeps(lambda x: x @ x.mT, x)  # per row: [T, H] x [H, T]
        self.assertMixes(lambda x: x[:, 0].T @ x[:, 0], x, why=r"contracts over|rows by rows")
        self.assertKeeps(lambda x: torch.max(x, torch.zeros(H)).triu().flip(-1), x)
        self.assertKeeps(lambda x: x.repeat(1, 2, 1), x)
        self.assertMixes(lambda x: x.repeat(2, 1, 1), x, why=r"repeats the rows")
        self.assertMixes(lambda x: x.flip(0), x, why=r"reverses the order of the rows")

    def test_state_written_from_the_rows_is_caught(self):
        running = torch.zeros(H)  # a buffer: made before the call
        self.assertMixes(lambda x: running.copy_(x.mean((0, 1))), self.x,
                         why=r"writes a value reduced over the rows into a tensor made before")
        history = torch.zeros(B, T, H)
        self.assertMixes(lambda x: history.add_(x), self.x,
                         why=r"writes rows into a tensor that does not hold rows")

    def test_a_rule_that_cannot_follow_an_operator_fails_the_proof_not_the_call(self):
        from unittest import mock

        def broken(a, func, args, kwargs):
            raise IndexError("an argument form no rule expects")

        _rows.make_audit(B)  # the rules are made on first use
        with mock.patch.dict(_rows._RULES, {"cumsum": broken}):
            out, why = audit(lambda x: x.cumsum(-1), self.x)
        torch.testing.assert_close(out, self.x.cumsum(-1))
        self.assertRegex(why, r"aten::cumsum could not be followed by the audit \(IndexError: "
                              r"an argument form no rule expects\)")

    def test_a_higher_order_operator_fails_the_proof_not_the_call(self):
        # torch raised NotImplementedError into the program before (flex
        # attention: transformers' attn_implementation="flex_attention").
        def branch(x):
            return torch.cond(x.sum() > 0, lambda t: t * 2, lambda t: t * 3, (x,))

        x = self.x.abs()
        out, why = audit(branch, x)
        torch.testing.assert_close(out, x * 2)
        self.assertRegex(why, r"^cond is a higher-order operator, whose body the audit does not "
                              r"follow \(at ")

    def test_only_the_reviewed_guards_read_a_value_reduced_over_the_rows(self):
        # transformers' mask guard: "no row is padded, so no mask is needed".
        source = ("def _ignore_causal_mask_sdpa(padding_mask):\n"
                  "    return bool(padding_mask.all())\n")
        guard, other = {"__name__": "transformers.masking_utils"}, {"__name__": "mymodel"}
        exec(source, guard)
        exec(source, other)
        mask = torch.ones(B, T, dtype=torch.bool)

        def attend(fn):
            return lambda x, m: x * 2 if fn(m) else x

        self.assertKeeps(attend(guard["_ignore_causal_mask_sdpa"]), self.x, mask)
        self.assertMixes(attend(other["_ignore_causal_mask_sdpa"]), self.x, mask,
                         why=r"reads on the host a value reduced over the rows \(by aten::all")

    @unittest.skipUnless(importlib.util.find_spec("transformers"), "needs transformers")
    def test_transformers_experts_are_taken_whole(self):
        # Their loop over the experts the batch hits reads the batch on the
        # host; each token's output still comes from its own experts.
        import transformers as tf
        from transformers.models.mixtral import modeling_mixtral as mm

        config = tf.MixtralConfig(hidden_size=H, intermediate_size=16, num_local_experts=4,
                                  num_experts_per_tok=2)
        moe = mm.MixtralSparseMoeBlock(config)
        for p in moe.parameters():
            torch.nn.init.normal_(p)
        self.assertTrue(_rows._is_experts(moe.experts))
        self.assertFalse(_rows._is_experts(moe.gate))

        def run(x):
            a = _rows.make_audit(B)
            a.tag_rows(x)
            handles = a.watch(moe)
            with a, torch.no_grad():
                out = moe(x)
            for h in handles:
                h.remove()
            a.check_result([out], "the call")
            return out, a.mixed

        out, why = run(self.x)
        self.assertIsNone(why)
        torch.testing.assert_close(out[:2], moe(self.x[:2]).detach())
        # Unwatched, the loop's host read of the batch refuses.
        a = _rows.make_audit(B)
        a.tag_rows(self.x)
        with a, torch.no_grad():
            moe(self.x)
        self.assertRegex(a.mixed, r"reads on the host a value reduced over the rows")

    def test_where_it_failed_names_the_line(self):
        _, why = audit(lambda x: x.softmax(0), self.x)
        self.assertRegex(why, r"\(at rows_test\.py:\d+ <lambda>\)$")

    def test_calls_of_one_kind_share_a_key(self):
        # A prefill and a decode step differ; two decode steps do not.
        m = torch.nn.Linear(H, H)
        prefill = _rows.audit_key(m, (torch.randn(B, T, H),), {"use_cache": True}, B)
        decode = _rows.audit_key(m, (torch.randn(B, 1, H),), {"use_cache": True}, B)
        later = _rows.audit_key(m, (torch.randn(B, 1, H),), {"use_cache": True}, B)
        self.assertNotEqual(prefill, decode)
        self.assertEqual(decode, later)
        self.assertNotEqual(decode, _rows.audit_key(m, (torch.randn(B, 1, H),),
                                                     {"use_cache": False}, B))
        # The row count is no part of a kind; whether a tensor's first
        # dimension is the rows, 1 or another size is (the split cuts,
        # shares or refuses it).
        self.assertEqual(decode, _rows.audit_key(m, (torch.randn(2 * B, 1, H),),
                                                  {"use_cache": True}, 2 * B))
        mask = [_rows.audit_key(m, (torch.randn(B, 1, H),), {"mask": torch.ones(rows, 5)}, B)
                for rows in (B, 1, B + 1)]
        self.assertEqual(len(set(mask)), 3)
        m.eval()
        self.assertNotEqual(later, _rows.audit_key(m, (torch.randn(B, 1, H),),
                                                    {"use_cache": True}, B))
        # A Hugging Face model builds a cache when a call leaves use_cache
        # to its config: the config's flag is part of the kind.
        m.config = type("Config", (), {"use_cache": False})()
        no_cache = _rows.audit_key(m, (torch.randn(B, T, H),), {}, B)
        m.config.use_cache = True
        self.assertNotEqual(no_cache, _rows.audit_key(m, (torch.randn(B, T, H),), {}, B))


if __name__ == "__main__":
    unittest.main()


@unittest.skipUnless(HAS_TORCH, "needs torch")
class CollectiveGroupsTest(unittest.TestCase):
    """The audit keeps the process groups of the collectives a call issues:
    the ranks that must agree on its split (_apply._agreed)."""

    @classmethod
    def setUpClass(cls):
        import socket

        import torch.distributed as dist

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=1)

    @classmethod
    def tearDownClass(cls):
        import torch.distributed as dist

        dist.destroy_process_group()

    def test_groups_of_c10d_and_functional_collectives_each_once(self):
        import torch.distributed as dist
        import torch.distributed._functional_collectives as fc

        sub = dist.new_group([0])

        def layer(x):
            y = x * 2
            dist.all_reduce(y)
            dist.all_reduce(y, group=sub)
            dist.all_reduce(y)  # the world again: kept once
            return fc.wait_tensor(fc.all_reduce(y, "sum", sub)) + 1

        a = _rows.make_audit(B)
        x = torch.randn(B, H)
        a.tag_rows(x)
        with a:
            out = layer(x)
        # (The functional collective's autograd wrapper has no row rule yet:
        # a.mixed says so; its group is kept all the same.)
        self.assertEqual(len(a.groups), 2)
        self.assertTrue(a.groups[0] == dist.group.WORLD)
        self.assertIs(a.groups[1], sub)
        self.assertEqual(out.shape, (B, H))

    def test_list_all_gather_and_reduce_scatter_keep_rows_apart(self):
        # As tensor-parallel layers gather a column-parallel output (and
        # concatenate its features) and scatter a row-parallel sum.
        import torch.distributed as dist

        def layer(x):
            parts = [torch.empty_like(x)]
            dist.all_gather(parts, x)
            out = torch.empty(B, H)
            dist.reduce_scatter(out, [torch.cat(parts, -1)[:, :H]])
            return out

        _, why = audit(layer, torch.randn(B, H))
        self.assertIsNone(why)
        # Rows gathered into tensors from an input that holds none of them:
        # refused (safe, if over-cautious).
        def gather_other(x, w):
            parts = [torch.empty_like(x)]
            dist.all_gather(parts, w)
            return parts[0]

        x = torch.randn(B, H)
        _, why = audit(gather_other, x, torch.randn(B, H), rows=[x])
        self.assertIn("c10d::allgather_ takes tensors whose rows lie in different places, or in "
                      "some of them only", why)

    def test_rows_gathered_into_views_are_rows_in_every_view(self):
        # The outputs are written in place: into a factory's tensor, whose
        # views then hold the rows, or refused. Gathered into a buffer's
        # chunks (the ranks' rows one after another, as the tensor form lays
        # them) and read whole, into a view taken before, or a value reduced
        # over the rows gathered into chunks: each passed before, and split
        # gave other outputs.
        import torch.distributed as dist

        def chunks_read_whole(x):
            big = torch.empty(B, H)
            dist.all_gather(list(big.chunk(1)), x)
            return x - big.mean(0)

        def view_taken_before(x):
            out = torch.empty(B, H)
            flat = out.view(-1)
            dist.all_gather([out], x)
            return x - flat.mean()

        def slice_read_across(x):
            out = torch.empty(B, H)
            head = out[:, :2]
            dist.reduce_scatter(out, [x])
            return x * head.amax()

        def reduced_into_chunks(x):
            big = torch.empty(1, H)
            dist.all_gather(list(big.chunk(1)), x.sum(0, keepdim=True))
            return x + big

        held = torch.empty(B, H)

        def into_a_tensor_made_before(x):
            dist.all_gather([held], x)
            return x + held

        for fn in (chunks_read_whole, view_taken_before, slice_read_across,
                   reduced_into_chunks, into_a_tensor_made_before):
            with self.subTest(fn=fn.__name__):
                _, why = audit(fn, torch.randn(B, H))
                self.assertIsNotNone(why)
                self.assertRegex(why, "writes rows into a tensor that does not hold rows|"
                                      "combines a value reduced over the rows with the rows")

    def test_a_call_without_collectives_has_no_groups(self):
        a = _rows.make_audit(B)
        with a:
            torch.randn(B, H).sum()
        self.assertEqual(a.groups, [])
