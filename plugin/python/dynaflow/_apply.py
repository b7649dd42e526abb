"""Runs the modules a plan partitions through dynaflow's overlap runtime.

A plan (plan.json, schema dynaflow.plan/1, written by `dynaflow advise --plan`)
names, per workload bucket (tokens per step), a strategy and the units it
splits: module paths whose layer index is "*" ("LlamaForCausalLM.model" for
the decoder stack, "LlamaForCausalLM.model.layers.*" for each layer). Each
matching module's forward is replaced by a planned forward that, for a call
whose token count falls in a bucket that splits the batch:
  - proves the split safe before anything runs (`_split.split_call`): tensors
    with the batch as first dimension and containers of them are split into
    row views (narrow: no copy), shared inputs are checked unmodified, and
    state objects (Hugging Face caches) are split and merged back through
    adapters; any other argument refuses the call in one line naming the
    module, the argument and its type, and the call runs once the original way;
  - runs micro-batch i as one task on stream i of the runtime (libdynaflow_apply:
    CPU workers, or CUDA streams forked from and joined into the caller's
    stream), so the micro-batches' kernels overlap; where the bucket has
    `segments`, as a region (_Region): the micro-batches flow through the
    whole unit, their host threads turned by the runtime's sequencer through
    the schedule the simulator predicted (staggered at the plan's stage
    modules, or, for dual-batch overlap, cut at the unit's collectives;
    under a CUDA graph capture, a staggered region's micro-batches are issued
    one after the other from the caller's thread, ordered by events);
  - merges the micro-batches' outputs by rows and their state into the
    caller's state objects, so both equal the unsplit call's.
  - on CUDA, once a kind of call has run eagerly, captures its whole planned
    schedule into a CUDA graph (rows padded to a power of two within the
    bucket, static inputs and outputs) and replays it on later calls of that
    shape; a call a graph cannot replay runs eagerly, said once (`_graphs`).
Calls in a sequential bucket, or with fewer rows than splits, run the original
forward after one policy lookup. A plan whose buckets name phases (a trace with
prefill and decode steps gets a tiling for each) picks the tiling by the
call's phase (`call_phase`): decode when it passes a cache that already holds
tokens and one new token per row, training when autograd records, the module
trains and the plan has training buckets, prefill otherwise, unknown for
flattened (1-D) inputs or a cache length held on a GPU; a phase without a tiling takes the buckets
without a phase, and, when there are none, runs the original forward.

Strategies that split the batch (nanobatch_overlap, dual_batch_overlap) are
applied, and comm_overlap (a unit's collectives launched asynchronously, each
waited for just before the first operator that uses its tensors: an operator
the dispatcher sees; reading a tensor's memory without one, as .numpy() does,
is not watched); a plan
whose strategy at some bucket is fusion is refused, as is one whose units or
device do not match the program.
A refused plan prints one "dynaflow apply: ..." line and the program runs
unmodified; with strict, the process exits with code 2 instead.

Environment (set by `dynaflow apply`): DYNAFLOW_PLAN, DYNAFLOW_APPLY_LIB (the
runtime library), DYNAFLOW_APPLY_STRICT=1, DYNAFLOW_APPLY_VERIFY=1 (run the
original forward on a snapshot of each planned call's arguments and state, and
compare outputs and state), DYNAFLOW_APPLY_GRAPHS=0 (on CUDA, run every
planned call eagerly instead of replaying CUDA graphs of them, `_graphs`),
DYNAFLOW_REPLAY_EXT (the replay module, _dynaflow_replay.so: graphs need it, and
the micro-batches get the caller's torch state through it),
DYNAFLOW_APPLY_REPORT (a folder: each process writes its JSON summary there
at exit, <pid>.json, which the CLI merges and prints).
"""

import atexit
import contextlib
import contextvars
import copy
import ctypes
import functools
import inspect
import itertools
import json
import os
import sys
import threading
import time
import types
import weakref

from ._graphs import (EAGER, CudaGraphs, NoGraph, UnitGraphs, _first_line, _native, rebuild,
                      torch_modes, unwatched)
from ._rows import audit_key, make_audit
from ._split import (_UNCHECKABLE, ContextState, MergeError, ModuleState, Refusal, SliceMerge,
                     Unchanged, Unsplittable, _capture_underway, _replay_module, _storage_address,
                     alias_refusal, check_module, eager_after_fork_in_child, inference_buffers,
                     install_lazy_hooks, kind_refusal, merge_outputs, output_aliases,
                     output_refusal, split_call, watching)

PLAN_SCHEMA = "dynaflow.plan/1"
SPLIT_STRATEGIES = ("nanobatch_overlap", "dual_batch_overlap")
UNSUPPORTED_STRATEGIES = ("fusion",)
# A bucket of communication overlap runs its units unsplit; in the policy's
# table it takes the schedule index of this pseudo split count.
OVERLAP = 1
# schemas/plan.schema.json's bound on splits (analysis/advisor/plan.h
# PlanLimits::kMaxSplits): `dynaflow apply` validates it before the program
# starts; dynaflow.apply(model, plan) in code checks it here.
MAX_SPLITS = 16
DYNAFLOW_APPLY_MAX_STREAMS = 64  # plugin/apply/dynaflow_apply.h
# Names quoted in messages are cut to this many characters.
_QUOTED = 200
INT64_MAX = 2**63 - 1

# Per dtype (rtol, atol): a planned output element b may differ from the
# original a by atol + rtol * |a|. Splitting the batch changes GEMM shapes, so
# kernels may accumulate in another order; these bound that, as
# torch.testing's defaults do, loosened for float32's many layers.
_TOLERANCES = {
    "torch.float64": (1e-7, 1e-9),
    "torch.float32": (1e-4, 1e-5),
    "torch.float16": (1e-2, 1e-3),
    "torch.bfloat16": (2e-2, 1e-2),
}
_EXACT = (0.0, 0.0)  # integer and boolean outputs must be equal


class PlanMismatch(Exception):
    """The plan does not fit the program; the message names what differs."""


def _say(message):
    """One line on stderr, in one write: print writes the newline apart, and
    the ranks of a program share one stderr, so two ranks' lines came out
    as one line and an empty one."""
    try:
        sys.stderr.write(f"dynaflow apply: {message}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - stderr may be closed
        pass


def _cut(name):
    """`name` for a message: at most _QUOTED characters, then an ellipsis and
    its length (a 100 MB module name is not echoed whole)."""
    name = str(name)
    if len(name) <= _QUOTED:
        return name
    return f"{name[:_QUOTED]}... ({len(name)} characters)"


def load_plan(path):
    try:
        with open(path, encoding="utf-8") as f:
            plan = json.load(f)
    except (OSError, ValueError) as e:
        raise PlanMismatch(f"cannot read the plan {path}: {e}") from None
    if not isinstance(plan, dict) or plan.get("schema") != PLAN_SCHEMA:
        raise PlanMismatch(f"{path} is not a {PLAN_SCHEMA} plan")
    return plan


def _rules_by_name(plan):
    return {r.get("name"): r for r in plan.get("partition_rules", [])}


def split_units(plan):
    """The module patterns the plan's buckets run planned, in plan order: the
    split rules of the batch-splitting buckets, the side-stream rules of the
    communication-overlap buckets."""
    rules = _rules_by_name(plan)
    units = {}  # a dict keeps plan order and de-duplicates in linear time
    for bucket in plan.get("buckets", []):
        strategy = bucket.get("strategy")
        role = "split" if strategy in SPLIT_STRATEGIES else (
            "side_stream" if strategy == "comm_overlap" else None)
        if role is None:
            continue
        for name in bucket.get("rules", []):
            rule = rules.get(name)
            if rule is None or rule.get("role") != role:
                continue
            units.update(dict.fromkeys(rule.get("modules", [])))
    return list(units)


def region_rules(plan):
    """{splits: (kind, stage patterns, n)} of the plan's split buckets that
    run a region (a segment count): the unit's micro-batches flow through the
    whole unit. nanobatch_overlap with a "stage" rule: cut at those stages'
    calls into n segments (runtime/schedule.h BuildStaggeredRegion);
    dual_batch_overlap: cut at its n collective calls (BuildDualBatchRegion)."""
    rules = _rules_by_name(plan)
    out = {}
    for bucket in plan.get("buckets", []):
        if bucket.get("strategy") not in SPLIT_STRATEGIES or not bucket.get("segments"):
            continue
        n = int(bucket["segments"])
        if bucket.get("strategy") == "dual_batch_overlap":
            out[2] = (DUAL_BATCH, [], n)
            continue
        stages = [m for name in bucket.get("rules", [])
                  for m in (rules.get(name) or {}).get("modules", [])
                  if (rules.get(name) or {}).get("role") == "stage"]
        if stages:
            out[int(bucket.get("splits", 1))] = (STAGGERED, stages, n)
    return out


def stage_modules(unit_path, unit, patterns):
    """The submodules of `unit` (at `unit_path`) that match a stage pattern,
    in registration order."""
    return [m for name, m in unit.named_modules()
            if name and any(matches(p, f"{unit_path}.{name}") for p in patterns)]


def matches(pattern, path):
    """Whether module `path` matches `pattern`: equal components, where "*"
    matches one all-digit component (a layer index)."""
    p = pattern.split(".")
    q = path.split(".")
    if len(p) != len(q):
        return False
    return all(a == b or (a == "*" and b.isdigit()) for a, b in zip(p, q))


def _first_matching_unit(parts, units, order):
    """The first unit (plan order) that matches the module path `parts`: the
    path's spellings with any of its all-digit components as "*" looked up in
    `order` (unit -> index), so a plan's size costs nothing per module."""
    digits = [i for i, p in enumerate(parts) if p.isdigit()]
    if len(digits) > 12:  # 4096 spellings: match the units one by one instead
        return next((u for u in units if matches(u, ".".join(parts))), None)
    best = None
    for mask in range(1 << len(digits)):
        spelled = list(parts)
        for bit, i in enumerate(digits):
            if mask >> bit & 1:
                spelled[i] = "*"
        i = order.get(".".join(spelled))
        if i is not None and (best is None or i < best):
            best = i
    return None if best is None else units[best]


def root_class(plan):
    """The class name the plan's module paths start with, or None."""
    for unit in split_units(plan):
        return unit.split(".")[0]
    return None


def resolve_units(model, plan):
    """[(path, module)] of `model` that the plan splits, outermost only.
    Raises PlanMismatch naming a unit that matches nothing."""
    root = type(model).__name__
    units = split_units(plan)
    for unit in units:
        if "::" in unit:
            raise PlanMismatch(
                f"the plan splits operators ({_cut(unit)}), not modules: advise a trace made by "
                f"`dynaflow trace`, which records module paths")
    found = []
    found_paths = set()
    used = set()
    order = {unit: i for i, unit in enumerate(units)}
    for name, module in model.named_modules():
        path = root + ("." + name if name else "")
        parts = path.split(".")
        if any(".".join(parts[:k]) in found_paths for k in range(1, len(parts))):
            continue  # inside a unit already split
        unit = _first_matching_unit(parts, units, order)
        if unit is not None:
            found.append((path, module))
            found_paths.add(path)
            used.add(unit)
    missing = [u for u in units if u not in used]
    if missing:
        names = [root + ("." + n if n else "") for n, _ in model.named_modules()]
        depth = missing[0].count(".")
        near = sorted({n for n in names if n.count(".") == depth})[:4]
        raise PlanMismatch(f"unknown module {_cut(missing[0])} (modules at that depth: "
                           f"{', '.join(_cut(n) for n in near) or 'none'})")
    return found


def model_device(model):
    """The device of the model's first parameter, or of its first buffer
    where it has none (a model of buffers alone is on a device too); None
    for a model that holds no tensor, whose calls run where their
    arguments are (each planned call checks its own: _PlannedForward)."""
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        return tensor.device
    return None


def device_refusal(call, executor, current):
    """Why a call whose batch argument is on device `call` cannot run on an
    executor that issues on `executor` (a torch.device: cpu, or cuda:N), with CUDA
    device index `current` current on the caller's thread; or "". The
    micro-batches run on the executor's streams and wait for the caller's
    current stream: a call on another device (a model of no tensors, or one
    moved since apply) would run its kernels on that device's default
    stream, unordered with the caller's work."""
    if call != executor:
        return (f"its arguments are on {call}, the plan's executor issues on {executor} (the "
                f"device of the model's parameters or buffers at apply)")
    if current is not None and current != executor.index:
        return (f"the current CUDA device is {current}, the plan's executor issues on "
                f"{executor}, where the model is")
    return ""


def traced(x):
    """Why a call is recorded by a tracer rather than run, or "":
    torch.jit.trace, torch.export, or fake tensors (make_fx, a compiler's
    shape propagation), whose recorded graph must hold the original
    operators (a split would record one call's row counts, and jit.trace
    cannot even count its rows). Such a call runs the original way and
    refuses nothing: the program's real calls are planned as before."""
    import torch

    if torch.jit.is_tracing():
        return "torch.jit.trace records it, the original way"
    if torch.compiler.is_exporting():
        return _EXPORT_RECORDS
    if type(x) is torch.Tensor and torch._C._len_torch_dispatch_stack() == 0:
        return ""  # no dispatch mode at all, a plain tensor: the usual call, cheaply
    fake, keys = _fake_tensor_type(), torch._C._TorchDispatchModeKey
    if isinstance(x, fake) or torch._C._get_dispatch_mode(keys.FAKE) is not None or \
            torch._C._get_dispatch_mode(keys.PROXY) is not None:
        return "a tracer records it on fake tensors, the original way"
    return ""


_EXPORT_RECORDS = "torch.export records it, the original way"


def _graph_break_raises():
    """Why dynamo, if it is tracing on this thread, would raise at a graph
    break rather than run the code eagerly, or "": a strict torch.export
    (_EXPORT_RECORDS), torch.compile(fullgraph=True), or
    torch._dynamo.error_on_graph_break. Called by dynamo while it traces
    (_installed_forward, _stage_pre_hook, _FromEnvironment.pre_hook); a
    non-strict export runs the code, and so does any dynamo this cannot
    read (torch's private tracer state), whose graph break raises as
    before."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        from torch._dynamo.utils import _get_error_on_graph_break

        tx = InstructionTranslator.current_tx()
        if tx is None:
            return ""
        if tx.export:
            return _EXPORT_RECORDS
        if tx.one_graph:
            return _WHOLE_GRAPH.format("torch.compile(fullgraph=True)")
        if _get_error_on_graph_break():
            return _WHOLE_GRAPH.format("torch.compile under torch._dynamo.error_on_graph_break")
    except Exception:  # noqa: BLE001 - another torch's dynamo: the graph break as before
        return ""
    return ""


_WHOLE_GRAPH = ("{} traces it into one graph, where a planned call cannot run (it runs between "
                "graphs): the compiled program runs it the original way")


@functools.cache
def _fake_tensor_type():
    from torch._subclasses.fake_tensor import FakeTensor

    return FakeTensor


def saved_tensor_hooks_refusal():
    """Why the saved-tensor hooks active on this thread keep a call unsplit,
    or "". The micro-batches save their own tensors, fewer rows each, in
    an order their threads choose: a hook that counts or matches the saved
    tensors (torch.utils.checkpoint's, without reentrancy: its recomputation
    raised, or matched a micro-batch's tensors to the other's) cannot be
    proved to hold. torch.autograd.graph.save_on_cpu's, which moves each
    tensor by itself, can."""
    import torch

    hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    if hooks is None:
        return ""
    pack = hooks[0]
    if getattr(pack, "__module__", "") == "torch.autograd.graph" and \
            getattr(pack, "__qualname__", "").startswith("save_on_cpu."):
        return ""
    name = f"{getattr(pack, '__module__', '')}.{getattr(pack, '__qualname__', '')}".strip(".")
    return (f"saved-tensor hooks are active ({_cut(name) or type(pack).__name__}), which would "
            f"see the micro-batches' saved tensors, of other shapes and in another order")


def unauditable():
    """Why a call cannot be its kind's audit here, or "". Under a torch.func
    transform (grad, vjp, jvp, vmap) the operators see wrapped tensors, and
    under forward-mode AD each one also computes its tangents: the audit
    (_rows) follows neither, and would refuse the plan for what it cannot
    see. Such a first call runs the original way, unsplit, and the kind is
    audited at its first call without them; its later calls under them
    split as audited (the micro-batches carry the transforms' state)."""
    import torch
    from torch.autograd import forward_ad

    if torch._C._functorch.peek_interpreter_stack() is not None:
        return "a torch.func transform is active"
    if forward_ad._current_level >= 0:
        return "a forward-mode AD level is open"
    return ""


def _current_cuda_index():
    import torch

    return torch.cuda.current_device()


def check_device(model, plan):
    """Raises PlanMismatch when the plan was made on another device."""
    import torch

    name = (plan.get("device") or {}).get("name") or ""
    device = model_device(model)
    if not name or device is None:
        # A plan from a run without GPU activity holds for any device; a
        # model without tensors is checked call by call.
        return
    if device.type != "cuda":
        raise PlanMismatch(f"the plan is for {name}, the model runs on {device.type}")
    running = torch.cuda.get_device_name(device)
    if running != name:
        raise PlanMismatch(f"the plan is for {name}, the model runs on {running}")


def check_model(model, plan, strict):
    """Compares the plan's model.module_fingerprint (the traced program's
    root module structure) with `model`'s. A different model raises
    PlanMismatch with strict, else is said in one line: the split stays
    correct on another model, the plan's predictions and buckets do not hold.
    With strict, a plan that records no fingerprint cannot be checked and
    raises too."""
    from ._module_paths import module_fingerprint

    expected = (plan.get("model") or {}).get("module_fingerprint")
    name = type(model).__name__
    if not expected:
        if strict:
            raise PlanMismatch("the plan records no module fingerprint (its trace was not made "
                               "by `dynaflow trace` of a torch program), so --strict cannot check "
                               f"that it was made for this {name}")
        return
    running = module_fingerprint(model)
    if running == expected:
        return
    message = (f"the plan was made for another model: module fingerprint {expected}, this "
               f"program's {name} has {running} (other layers, sizes or dtypes)")
    if strict:
        raise PlanMismatch(message)
    _say(f"warning: {message}; the split holds, its predictions may not")


def check_strategies(plan):
    for bucket in plan.get("buckets", []):
        s = bucket.get("strategy")
        if s in UNSUPPORTED_STRATEGIES:
            raise PlanMismatch(f"strategy {_cut(s)} (tokens {bucket.get('min_tokens')} and up) is "
                               f"not applied by this version (fusing a collective with its "
                               f"consumers needs a fused kernel); advise with --force-strategy "
                               f"nanobatch_overlap, dual_batch_overlap or comm_overlap")


class _Runtime:
    """libdynaflow_apply through ctypes (plugin/apply/dynaflow_apply.h)."""

    TASK_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                               ctypes.c_size_t)

    def __init__(self, path):
        if not path:
            raise PlanMismatch("no runtime library (DYNAFLOW_APPLY_LIB is not set)")
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise PlanMismatch(f"cannot load {path}: {e}") from None
        vp, ip, i64p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int64)
        err = [ctypes.c_char_p, ctypes.c_size_t]
        lib.dynaflow_apply_executor_new.argtypes = [ctypes.c_int, ctypes.c_int] + err
        lib.dynaflow_apply_executor_new.restype = vp
        lib.dynaflow_apply_executor_free.argtypes = [vp]
        lib.dynaflow_apply_schedule_new.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                                                    ip, ip, ip, ip, self.TASK_FN, vp] + err
        lib.dynaflow_apply_schedule_new.restype = vp
        lib.dynaflow_apply_schedule_free.argtypes = [vp]
        lib.dynaflow_apply_run.argtypes = [vp, vp, ctypes.c_size_t, ctypes.c_int] + err
        lib.dynaflow_apply_run.restype = ctypes.c_int
        lib.dynaflow_apply_policy_new.argtypes = [ctypes.c_int, i64p, ip, ctypes.c_int] + err
        lib.dynaflow_apply_policy_new.restype = vp
        lib.dynaflow_apply_policy_pick.argtypes = [vp, ctypes.c_int64]
        lib.dynaflow_apply_policy_pick.restype = ctypes.c_int
        lib.dynaflow_apply_policy_free.argtypes = [vp]
        lib.dynaflow_apply_region_new.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int] + err
        lib.dynaflow_apply_region_new.restype = vp
        lib.dynaflow_apply_region_free.argtypes = [vp]
        lib.dynaflow_apply_region_tasks.argtypes = [vp, ip, ip, ip, ip, ctypes.c_int]
        lib.dynaflow_apply_region_tasks.restype = ctypes.c_int
        lib.dynaflow_apply_region_reset.argtypes = [vp]
        lib.dynaflow_apply_region_turn.argtypes = [vp, ctypes.c_int, ctypes.c_int, ip, ip, ip,
                                                   ctypes.c_int, ip] + err
        lib.dynaflow_apply_region_turn.restype = ctypes.c_int
        lib.dynaflow_apply_region_edges.argtypes = [vp, ctypes.c_int, ip, ip, ctypes.c_int,
                                                    ip] + err
        lib.dynaflow_apply_region_edges.restype = ctypes.c_int
        lib.dynaflow_apply_region_finish.argtypes = [vp, ctypes.c_int]
        lib.dynaflow_apply_region_abort.argtypes = [vp, ctypes.c_char_p]
        lib.dynaflow_apply_region_executed.argtypes = [vp, ip, ctypes.c_int, ip, ip]
        lib.dynaflow_apply_region_executed.restype = ctypes.c_int
        lib.dynaflow_apply_comm_overlap_beside.argtypes = [ip, ctypes.c_int] + err
        lib.dynaflow_apply_comm_overlap_beside.restype = ctypes.c_int
        self.lib = lib

    @staticmethod
    def _ints(values, ctype=ctypes.c_int):
        return (ctype * max(1, len(values)))(*values)

    def executor(self, cuda, streams):
        err = ctypes.create_string_buffer(512)
        h = self.lib.dynaflow_apply_executor_new(1 if cuda else 0, streams, err, len(err))
        if not h:
            raise PlanMismatch(f"runtime: {err.value.decode()}")
        return h

    def micro_batch_schedule(self, name, splits, task_fn, ordered=False):
        """`splits` tasks, micro-batch i on stream i: independent, or each
        after the one before when `ordered`."""
        err = ctypes.create_string_buffer(512)
        idx = list(range(splits))
        dep_begin = [max(0, i - 1) for i in range(splits + 1)] if ordered else [0] * (splits + 1)
        deps = list(range(splits - 1)) if ordered else []
        h = self.lib.dynaflow_apply_schedule_new(
            name.encode(), splits, splits, self._ints(idx), self._ints(idx),
            self._ints(dep_begin), self._ints(deps), task_fn, None, err, len(err))
        if not h:
            raise PlanMismatch(f"runtime: {err.value.decode()}")
        return h

    def run(self, executor, schedule, caller_stream, wait):
        err = ctypes.create_string_buffer(512)
        rc = self.lib.dynaflow_apply_run(executor, schedule, caller_stream, 1 if wait else 0,
                                         err, len(err))
        return rc, err.value.decode()

    def policy(self, max_tokens, schedules, num_schedules):
        err = ctypes.create_string_buffer(512)
        h = self.lib.dynaflow_apply_policy_new(len(max_tokens), self._ints(max_tokens, ctypes.c_int64),
                                               self._ints(schedules), num_schedules, err, len(err))
        if not h:
            raise PlanMismatch(f"plan buckets: {err.value.decode()}")
        return h

    def pick(self, policy, tokens):
        return self.lib.dynaflow_apply_policy_pick(policy, tokens)

    def region(self, kind, segments, splits):
        """A region of `kind` and its sequencer: (handle, [(segment, micro-batch,
        stream)] per task, issue order)."""
        err = ctypes.create_string_buffer(512)
        h = self.lib.dynaflow_apply_region_new(kind, segments, splits, err, len(err))
        if not h:
            raise PlanMismatch(f"runtime: {err.value.decode()}")
        n = self.lib.dynaflow_apply_region_tasks(h, None, None, None, None, 0)
        streams, segs, mbs, order = (self._ints([0] * n) for _ in range(4))
        self.lib.dynaflow_apply_region_tasks(h, streams, segs, mbs, order, n)
        return h, [(segs[i], mbs[i], streams[i]) for i in range(n)], list(order[:n])

    def turn(self, region, mb, first):
        """(task, signal, waits) once micro-batch `mb`'s next task has its turn."""
        task, signal, count = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        waits = (ctypes.c_int * DYNAFLOW_APPLY_MAX_STREAMS)()
        err = ctypes.create_string_buffer(512)
        rc = self.lib.dynaflow_apply_region_turn(region, mb, 1 if first else 0, ctypes.byref(task),
                                                 ctypes.byref(signal), waits, len(waits),
                                                 ctypes.byref(count), err, len(err))
        if rc != 0:
            raise RuntimeError(f"dynaflow apply: {err.value.decode()}")
        return task.value, bool(signal.value), list(waits[:count.value])

    def edges(self, region, task):
        """(signal, waits) of a region's task in its schedule."""
        signal, count = ctypes.c_int(), ctypes.c_int()
        waits = (ctypes.c_int * DYNAFLOW_APPLY_MAX_STREAMS)()
        err = ctypes.create_string_buffer(512)
        rc = self.lib.dynaflow_apply_region_edges(region, task, ctypes.byref(signal), waits,
                                                  len(waits), ctypes.byref(count), err, len(err))
        if rc != 0:
            raise PlanMismatch(f"runtime: {err.value.decode()}")
        return bool(signal.value), list(waits[:count.value])

    def comm_overlap_beside(self, consumers):
        """(the compute parts a comm_overlap call's schedule ran beside its
        collectives, "") or (0, why the builder refused the schedule)
        (plugin/apply/dynaflow_apply.h). Never raises: the call has run."""
        err = ctypes.create_string_buffer(512)
        beside = self.lib.dynaflow_apply_comm_overlap_beside(self._ints(consumers), len(consumers),
                                                             err, len(err))
        return (beside, "") if beside >= 0 else (0, err.value.decode())

    def executed(self, region, capacity):
        tasks = self._ints([0] * capacity)
        skipped, extra = ctypes.c_int(), ctypes.c_int()
        n = self.lib.dynaflow_apply_region_executed(region, tasks, capacity, ctypes.byref(skipped),
                                                    ctypes.byref(extra))
        return list(tasks[:min(n, capacity)]), skipped.value, extra.value


def bucket_table(plan):
    """({phase: (max_tokens list, schedule index list)}, splits per schedule)
    for the runtime's policies, one per phase's tiling ("": the buckets
    without a phase): one schedule per distinct split count; -1 sequential."""
    tilings, splits_of = {}, []
    for bucket in plan.get("buckets", []):
        max_tokens, schedules = tilings.setdefault(bucket.get("phase", ""), ([], []))
        top = bucket.get("max_tokens")
        max_tokens.append(INT64_MAX if top is None else int(top))
        splits = int(bucket.get("splits", 1))
        if splits > MAX_SPLITS:
            raise PlanMismatch(f"a bucket splits {splits} ways; at most {MAX_SPLITS}")
        if bucket.get("strategy") in SPLIT_STRATEGIES and splits > 1:
            if splits not in splits_of:
                splits_of.append(splits)
            schedules.append(splits_of.index(splits))
        elif bucket.get("strategy") == "comm_overlap":
            if OVERLAP not in splits_of:
                splits_of.append(OVERLAP)
            schedules.append(splits_of.index(OVERLAP))
        else:
            schedules.append(-1)
    return tilings, splits_of


def call_phase(module, args, kwargs, x, training_planned):
    """The phase of a call whose batch tensor is `x`, as the advisor tells
    steps apart: "training" when autograd records, the module trains and the
    plan has training buckets (the advisor calls a step training only when
    a backward pass follows, which a call cannot know: a model built from a
    config trains by default, also when a program only runs it forward);
    "decode" when it passes a cache that already holds tokens
    (`get_seq_length() > 0`, the Hugging Face Cache protocol) and one new
    token per row; "prefill" otherwise (a forward over new prompts).
    "unknown" where telling would cost more than it may: a batch tensor of
    one dimension (flattened tokens, as serving frameworks pass them) has no
    rows to count tokens in, and a cache length held on a GPU (a static
    cache's) would synchronise the device to be read."""
    import torch

    if training_planned and torch.is_grad_enabled() and module.training:
        return "training"
    if x.dim() < 2:
        return "unknown"
    if x.shape[1] == 1:
        for value in itertools.chain(args, kwargs.values()):
            length = getattr(value, "get_seq_length", None)
            if not callable(length) or isinstance(value, torch.Tensor):
                continue
            n = length()
            if isinstance(n, torch.Tensor):
                if n.device.type != "cpu":
                    return "unknown"
                n = int(n)
            if n > 0:
                return "decode"
    return "prefill"


def even_bounds(rows, parts):
    """Row offsets of `parts` near-equal parts (the first rows % parts get one
    more), as the runtime's RowSplit::Even."""
    base, extra = divmod(rows, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return bounds


BATCH_INPUT_NAMES = ("input_ids", "inputs_embeds", "hidden_states")


def first_tensor(args, kwargs=None):
    """The tensor whose first dimension is the call's batch: the first
    positional tensor, else (a call by keywords only, as transformers calls
    its decoder stack) the first keyword tensor of two or more dimensions
    (`input_ids`, `inputs_embeds`; not a 1-D `cache_position`). None when
    there is none."""
    import torch

    for a in args:
        if isinstance(a, torch.Tensor) and a.dim() >= 1:
            return a
    # The names transformers gives a stack's batch-first input come first: a
    # keyword before them may hold the batch elsewhere (Qwen2-VL's multimodal
    # position_ids [4, batch, seq]).
    for name in BATCH_INPUT_NAMES:
        a = (kwargs or {}).get(name)
        if isinstance(a, torch.Tensor) and a.dim() >= 2:
            return a
    for a in (kwargs or {}).values():
        if isinstance(a, torch.Tensor) and a.dim() >= 2:
            return a
    return None


def tokens_of(x):
    """Tokens in a call whose batch tensor is `x`: token ids count one token
    per element (rows x sequence); activations one per vector (every
    dimension but the last)."""
    if not (x.is_floating_point() or x.is_complex()):
        return x.numel()
    if x.dim() >= 2 and x.shape[-1]:
        return x.numel() // x.shape[-1]
    return x.shape[0]


def _tolerance(dtype):
    if dtype.is_complex:
        dtype = dtype.to_real()  # real and imaginary parts each within it
    if dtype.is_floating_point:
        return _TOLERANCES.get(str(dtype), _TOLERANCES["torch.float32"])
    return _EXACT


# Elements compared at once (_difference): a chunk's float64 copies take
# 128 MiB, whatever the size of the outputs compared (a prefill's logits).
_COMPARE_CHUNK = 1 << 23


def _mismatch(where, e, a):
    """Why `a` cannot be compared with the expected `e` element by element
    (a pair of _tensor_pairs), or ""."""
    if e is None:
        return f"{where}: {a}"
    if e.shape != a.shape:
        return f"{where}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    if e.dtype != a.dtype:
        return f"{where}: dtype {a.dtype} != {e.dtype}"
    return ""


def _difference(e, a):
    """(max abs difference, max relative difference, whether some element
    is beyond e's dtype's tolerance) of two tensors of one shape and dtype,
    computed on e's device in chunks. Equal infinities are equal; a NaN is
    beyond any tolerance unless both hold it. Complex tensors are compared
    part by part; integers and booleans exactly (not through float64, which
    would make 2**60 and 2**60 + 1 equal)."""
    import torch

    if _identical(e, a):
        return 0.0, 0.0, False
    rtol, atol = _tolerance(e.dtype)
    e, a = e.detach(), a.detach()
    if e.is_complex():
        e, a = torch.view_as_real(e.resolve_conj()), torch.view_as_real(a.resolve_conj())
    exact = not e.is_floating_point()
    e, a = e.reshape(-1), a.reshape(-1)
    abs_max = rel_max = 0.0
    bad = False
    for begin in range(0, e.numel(), _COMPARE_CHUNK):
        e_part = e[begin:begin + _COMPARE_CHUNK]
        a_part = a[begin:begin + _COMPARE_CHUNK].to(e.device)
        e64, a64 = e_part.double(), a_part.double()
        if exact:
            same = e_part == a_part
        else:
            same = (e64 == a64) | (torch.isnan(e64) & torch.isnan(a64))
        inf = float("inf")
        diff = torch.where(same, 0.0, (e64 - a64).abs()).nan_to_num(nan=inf, posinf=inf)
        close = same if exact else same | ((diff <= atol + rtol * e64.abs()) &
                                           torch.isfinite(e64))
        bad = bad or not bool(close.all())
        rel = (diff / e64.abs().clamp_min(max(atol, 1e-30))).nan_to_num(nan=inf, posinf=inf)
        abs_max = max(abs_max, float(diff.max()))
        rel_max = max(rel_max, float(rel.max()))
    return abs_max, rel_max, bad


def _identical(e, a):
    """Whether two tensors of one shape and dtype (_mismatch) hold equal
    elements, in one pass: most of what a first call's comparison, or
    --verify's, compares is (a cache's layers the call did not write), and
    _difference's float64 passes over them made the first decode step of a
    32-layer model with its layers as units take 28 s on the CPU. False
    where a NaN is in either, which _difference then judges in full."""
    import torch

    return e.layout == torch.strided and a.layout == torch.strided and \
        e.device == a.device and torch.equal(e, a)


def _beyond_tolerance(where, dtype, abs_max):
    rtol, atol = _tolerance(dtype)
    return f"{where}: {dtype} differs beyond rtol={rtol} atol={atol} (max abs {abs_max:.3g})"


class Report:
    """What happened, for the CLI's summary and --verify."""

    def __init__(self):
        self.lock = threading.Lock()
        self.plan = ""
        self.refused = ""
        self.units = []
        self.planned_calls = 0
        self.original_calls = 0
        self.verified_calls = 0
        self.max_abs_diff = 0.0
        self.max_rel_diff = 0.0
        self.verify_ok = True
        self.worst = ""
        self.regions = {}  # unit path -> what its staggered calls ran
        self.overlapped_collectives = 0  # launched asynchronously by comm_overlap calls
        # Of those: read inside their call (not only at its end), the
        # operators that ran between a launch and its read, and the compute
        # parts that the calls' schedules ran beside a collective.
        self.collectives_read_in_call = 0
        self.ops_beside_collectives = 0
        self.parts_beside_collectives = 0
        self.comm_overlap_error = ""  # the first call whose schedule the builder refused
        self.comm_overlap_schedules = {}  # consumers -> comm_overlap_beside's answer
        # A plan with phases: per phase, the unit calls of that phase and how
        # many of them no tiling was for.
        self.phase_calls = {}
        # Calls that ran the original way for a reason that passes
        # (_split.Unsplittable): why -> how many.
        self.unsplit = {}
        # CUDA graphs (_graphs): captured and replayed calls, and the planned
        # calls that ran eagerly although a graph backend was there: why -> how many.
        self.graphs_captured = 0
        self.graph_replays = 0
        self.graph_eager_calls = {}

    def forked(self):
        """In a process forked from this one: its counts start at zero (the
        parent reports its own calls); the plan, units and refusal stay."""
        kept = self.plan, self.units, self.refused
        self.__init__()
        self.plan, self.units, self.refused = kept

    # Counted under the lock: planned calls run on the program's threads
    # concurrently, and `+=` on an attribute is not atomic.
    def planned_call(self):
        with self.lock:
            self.planned_calls += 1

    def original_call(self):
        with self.lock:
            self.original_calls += 1

    def unsplit_call(self, why):
        with self.lock:
            self.original_calls += 1
            self.unsplit[why] = self.unsplit.get(why, 0) + 1

    def graph_captured(self):
        with self.lock:
            self.graphs_captured += 1

    def graph_replayed(self):
        with self.lock:
            self.graph_replays += 1

    def graph_eager(self, why):
        with self.lock:
            self.graph_eager_calls[why] = self.graph_eager_calls.get(why, 0) + 1

    def region_call(self, region, executed, skipped, extra):
        """One call of a region: the tasks in the order the host issued them
        (their turns, or inline micro-batch by micro-batch), against the
        order that call issues the simulator's schedule in."""
        as_rows = lambda ids: [list(region.tasks[i]) for i in ids]  # noqa: E731
        with self.lock:
            r = self.regions.setdefault(region.path, {
                "kind": "dual-batch" if region.kind == DUAL_BATCH else "staggered",
                "segments": region.segments, "micro_batches": region.splits,
                "issue_order": as_rows(region.issue_order), "executed": as_rows(executed),
                "calls": 0, "off_schedule_calls": 0, "calls_issued_by_micro_batch": 0})
            r["calls"] += 1
            r["calls_issued_by_micro_batch"] += region.inline
            order = region.inline_order if region.inline else region.issue_order
            if executed != order or skipped or extra:
                r["off_schedule_calls"] += 1
                r["executed"] = as_rows(executed)

    def comm_overlap_call(self, overlap, runtime):
        """One comm_overlap call: the schedule it ran, built by the runtime's
        builder (the simulator's), and what ran beside its collectives."""
        n = overlap.launched
        key = tuple(overlap.consumers)
        if key not in self.comm_overlap_schedules:  # every call of a unit reads alike
            self.comm_overlap_schedules[key] = runtime.comm_overlap_beside(key) if n else (0, "")
        parts, error = self.comm_overlap_schedules[key]
        with self.lock:
            self.comm_overlap_error = self.comm_overlap_error or error
            self.overlapped_collectives += n
            self.collectives_read_in_call += sum(1 for c in overlap.consumers if c <= n)
            self.ops_beside_collectives += sum(overlap.beside_ops)
            self.parts_beside_collectives += parts

    def compare_call(self, path, baseline, planned):
        """Compares a planned call with its baseline (`_Baseline`): outputs,
        the module's buffers, and every tensor reachable from the arguments
        (in-place writes and state objects such as KV caches)."""
        module, args, kwargs, out = planned
        pairs = list(_tensor_pairs(baseline.out, out, f"{path}: output"))
        pairs += _tensor_pairs(baseline.buffers, dict(module.named_buffers()), f"{path}: buffers")
        pairs += _tensor_pairs(baseline.args, args, f"{path}: args")
        pairs += _tensor_pairs(baseline.kwargs, kwargs, f"{path}: kwargs")
        with self.lock:
            self.verified_calls += 1
        for where, e, a in pairs:
            self._compare_tensor(where, e, a)

    def _fail(self, message):
        with self.lock:
            if self.verify_ok:
                self.verify_ok = False
                self.worst = message

    def _compare_tensor(self, where, e, a):
        why = _mismatch(where, e, a)
        if why:
            self._fail(why)
            return
        abs_max, rel_max, bad = _difference(e, a)
        with self.lock:
            self.max_abs_diff = max(self.max_abs_diff, abs_max)
            self.max_rel_diff = max(self.max_rel_diff, rel_max)
        if bad:
            self._fail(_beyond_tolerance(where, e.dtype, abs_max))

    def as_json(self, verify):
        out = {
            "plan": self.plan,
            "refused": self.refused,
            "units": self.units,
            "planned_calls": self.planned_calls,
            "original_calls": self.original_calls,
            "regions": self.regions,
            "overlapped_collectives": self.overlapped_collectives,
        }
        if self.overlapped_collectives:
            out["comm_overlap"] = {
                "collectives": self.overlapped_collectives,
                "read_in_call": self.collectives_read_in_call,
                "ops_beside": self.ops_beside_collectives,
                "parts_beside": self.parts_beside_collectives,
            }
            if self.comm_overlap_error:
                out["comm_overlap"]["error"] = self.comm_overlap_error
        if self.phase_calls:
            out["phase_calls"] = self.phase_calls
        if self.unsplit:
            out["unsplit_calls"] = self.unsplit
        if self.graphs_captured or self.graph_eager_calls:
            out["graphs"] = {"captured": self.graphs_captured, "replayed": self.graph_replays,
                             "eager_calls": self.graph_eager_calls}
        if verify:
            out["verify"] = {
                "calls": self.verified_calls,
                "max_abs_diff": self.max_abs_diff,
                "max_rel_diff": self.max_rel_diff,
                "ok": self.verify_ok and self.verified_calls > 0,
                "worst": self.worst,
            }
        return out


# Whether planned calls on the CPU backend also merge their outputs into
# preallocated slices as each micro-batch finishes (_split.SliceMerge). On
# CUDA they do: each micro-batch's copy runs on its own stream, beside the
# others' work, instead of one concatenation on the caller's stream after the
# last. On the CPU there is nothing to overlap it with, and it measured slower
# than the concatenation (bench/apply_overhead.py, docs/performance.md).
SLICES_ON_CPU = False

# The region (and micro-batch) the current thread runs, if any: the Python
# twin's stage pre-hooks cut segments only there (RegionTurns keeps its own
# in C++), and a dual-batch region's collectives are cut there.
_ON_THREAD = threading.local()


# Region kinds (plugin/apply/dynaflow_apply.h DynaflowApplyRegionKind).
STAGGERED, DUAL_BATCH = 0, 1

# The torch.distributed collectives a dual-batch region cuts at.
_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "broadcast",
                "reduce")


def _stage_pre_hook(hook):
    """`hook`, a region's pre-hook of its stage modules, as dynamo sees it:
    a graph break, where it runs as it does eagerly (acting only in a
    micro-batch). Where a graph break would raise (_graph_break_raises: a
    strict export, a graph compiled whole), it is nothing: outside a
    micro-batch, as the hook is eagerly; inside one (a function compiled
    whole that the unit calls), that call runs off the schedule, counted
    (_Region.account), where the graph break raised. Which of the two a
    graph holds depends on how it is compiled alone, not on the thread that
    traced it: dynamo reuses a graph on any thread."""
    import torch

    is_compiling = torch.compiler.is_compiling
    # Dynamo calls it while it traces, and bakes in the answer.
    whole = torch._dynamo.assume_constant_result(lambda: bool(_graph_break_raises()))
    at_graph_break = torch.compiler.disable(hook)  # not traced into as C++ (a warning)

    def stage_pre_hook(module, args):
        if is_compiling():
            return None if whole() else at_graph_break(module, args)
        return hook(module, args)

    return stage_pre_hook


def _native_region(runtime, handle, tasks, staggered, cuda):
    """RegionTurns (plugin/torch/region_turns.h) driving the region
    `handle` of `runtime`'s library, on the current CUDA device when `cuda`;
    None without the replay module."""
    module = _replay_module()
    if module is None:
        return None
    lib = runtime.lib
    address = lambda fn: ctypes.cast(fn, ctypes.c_void_p).value  # noqa: E731
    device = None
    if cuda:
        import torch

        device = torch.device("cuda", _current_cuda_index())
    return module.RegionTurns(
        handle, address(lib.dynaflow_apply_region_turn), address(lib.dynaflow_apply_region_edges),
        address(lib.dynaflow_apply_region_reset), address(lib.dynaflow_apply_region_finish),
        tasks, staggered, device)


class _Region:
    """One planned unit's schedule for one split count (runtime/schedule.h:
    BuildStaggeredRegion or BuildDualBatchRegion, the object the simulator
    predicts), cut into tasks at boundaries: for a staggered region, every
    call of one of its `stages` after the first in a micro-batch; for a
    dual-batch region, the start and the end of every torch.distributed
    collective (the collective is its own part, on the communication stream).

    On the CPU, and for a dual-batch region also on CUDA, the micro-batches
    each run the whole unit on their own host thread, and at every boundary
    the sequencer (runtime/sequencer.h) hands the turn to the next task in
    the schedule's issue order, so the work is issued in that order (and
    every rank issues its collectives alike).

    While the caller's stream is captured into a CUDA graph, a staggered
    region is issued `inline` instead: its micro-batches run one after the
    other on the caller's thread, with no turns. The graph holds the
    predicted schedule whatever order the host issued it in: each task runs
    on its schedule stream (the thread's current stream is switched at each
    boundary), a task that another waits for records an event at its end,
    and the waiting task's stream waits for that event (the schedule's
    edges). A staggered task waits only for tasks of earlier micro-batches,
    so every event it waits for has been recorded by then. One capturing
    thread is what capture supports (other threads' allocations under a
    "global" capture fail). Eagerly the turns stay: a host synchronisation
    inside one micro-batch (a mixture-of-experts layer's `nonzero`) would
    otherwise keep the next micro-batch's work from being queued at all.

    With the replay module, the boundaries run in C++ (`native`,
    plugin/torch/region_turns.h): the stage modules' pre-hook, the turns,
    and on CUDA the streams and events, through the same sequencer. The
    methods below are its Python twin, for when the module is not built."""

    def __init__(self, runtime, path, kind, stages, n, splits, cuda):
        self.runtime = runtime
        self.path = path
        self.kind = kind
        self.segments = n
        self.splits = splits
        self.handle, self.tasks, self.issue_order = runtime.region(kind, n, splits)
        self.cuda = cuda
        self.inline = False  # this call's: see the class comment
        self.task_of = {(seg, mb): t for t, (seg, mb, _) in enumerate(self.tasks)}
        # The order an inline call issues the tasks in: micro-batch by micro-batch.
        self.inline_order = [self.task_of[(seg, mb)] for mb in range(splits) for seg in range(n)]
        self.native = _native_region(runtime, self.handle, self.tasks, kind == STAGGERED, cuda)
        hook = _stage_pre_hook(self._pre_hook if self.native is None else self.native.stage_hook)
        self.hooks = [m.register_forward_pre_hook(hook) for m in stages]
        # The Python twin's state.
        self.edges = None
        if kind == STAGGERED and self.native is None:
            self.edges = [runtime.edges(self.handle, t) for t in range(len(self.tasks))]
        self.current = [None] * splits  # per micro-batch: (task, signal)
        self.cut = [False] * splits     # per micro-batch: a stage has been called
        self.issued = []  # inline: this call's tasks, in the order they were issued
        self.extra = 0    # inline: boundaries past a micro-batch's last segment
        self.streams = self.events = self.fork = self.ends = None
        if cuda and self.native is None:
            import torch

            self.streams = [torch.cuda.Stream() for _ in range(max(t[2] for t in self.tasks) + 1)]
            self.events = [torch.cuda.Event() for _ in self.tasks]
            self.fork = torch.cuda.Event()
            self.ends = [torch.cuda.Event() for _ in range(splits)]

    def free(self):
        for h in self.hooks:
            h.remove()
        self.hooks = []
        if self.native is not None:
            self.native.detach()  # whoever still holds it can no longer reach the handle
            self.native = None
        if self.handle:
            self.runtime.lib.dynaflow_apply_region_free(self.handle)
            self.handle = None

    def start_call(self, caller_stream, inline=False):
        if self.native is not None:
            self.native.start_call(inline, caller_stream)
            self.inline = self.native.inline
            return
        self.inline = inline and self.edges is not None
        if not self.inline:
            self.runtime.lib.dynaflow_apply_region_reset(self.handle)
        self.current = [None] * self.splits
        self.cut = [False] * self.splits
        self.issued = []
        self.extra = 0
        if self.cuda:
            self.fork.record(caller_stream)

    def end_call(self, caller_stream):
        if self.native is not None:
            self.native.end_call(caller_stream)
        elif self.cuda:
            for e in self.ends:
                caller_stream.wait_event(e)

    def _stream_of(self, task):
        return self.streams[self.tasks[task][2]]

    def _next_inline(self, mb, first):
        """(task, signal, waits) of micro-batch `mb`'s next task, issued now."""
        segment = 0 if first else self.tasks[self.current[mb][0]][0] + 1
        if segment >= self.segments:
            self.extra += 1
            return -1, False, []
        task = self.task_of[(segment, mb)]
        signal, waits = self.edges[task]
        # An earlier micro-batch that ended before this segment recorded no event for it.
        waits = [w for w in waits if w in self.issued]
        self.issued.append(task)
        return task, signal, waits

    def _take(self, mb, first):
        if self.inline:
            task, signal, waits = self._next_inline(mb, first)
        else:
            task, signal, waits = self.runtime.turn(self.handle, mb, first)
        if task < 0:
            return  # past the last segment: stays in it (counted)
        self.current[mb] = (task, signal)
        if self.cuda:
            import torch

            stream = self._stream_of(task)
            torch.cuda.set_stream(stream)  # this thread's current stream
            if first:
                stream.wait_event(self.fork)
            for w in waits:
                stream.wait_event(self.events[w])

    def _close(self, mb):
        task, signal = self.current[mb]
        if signal and self.cuda:
            self.events[task].record(self._stream_of(task))

    def begin(self, mb):
        """Micro-batch `mb`'s first task, on this thread, once it has its
        turn; until end(mb) the stage modules' calls on this thread cut it,
        and a dual-batch region's collectives (_CollectiveCuts, which reads
        _ON_THREAD.at)."""
        _ON_THREAD.at = (self, mb)
        if self.native is not None:
            self.native.begin(mb)
        else:
            self._take(mb, True)

    def end(self, mb):
        """Micro-batch `mb` returned or failed (also after begin raised)."""
        _ON_THREAD.at = None
        if self.native is not None:
            self.native.end(mb)
            return
        try:
            if self.current[mb] is not None:
                self._close(mb)
                if self.cuda:
                    self.ends[mb].record(self._stream_of(self.current[mb][0]))
        finally:
            if not self.inline:
                self.runtime.lib.dynaflow_apply_region_finish(self.handle, mb)

    def _pre_hook(self, _module, _args):
        at = getattr(_ON_THREAD, "at", None)
        if at is None or at[0] is not self:
            return
        mb = at[1]
        if not self.cut[mb]:
            self.cut[mb] = True  # the first stage call lies inside segment 0
            return
        self._close(mb)
        self._take(mb, False)

    def collective(self, mb, fn, args, kwargs):
        """A dual-batch region's collective call: its own part, on the
        communication stream; the compute part after it waits for it."""
        self._boundary(mb)
        if self.cuda:
            # Its tensors are used on the communication stream: their memory
            # is not reused before that stream is done (torch's rule).
            import torch

            for t in _tensors_in((args, kwargs)):
                if t.is_cuda:
                    t.record_stream(torch.cuda.current_stream())
        _ON_THREAD.in_collective = True
        try:
            return fn(*args, **kwargs)
        finally:
            _ON_THREAD.in_collective = False
            self._boundary(mb)

    def abort(self, why):
        """Fails every turn of this call still waiting, and every later one
        (until the next call): a micro-batch failed."""
        if self.handle and not self.inline:
            self.runtime.lib.dynaflow_apply_region_abort(self.handle, why.encode())

    def _boundary(self, mb):
        if self.native is not None:
            self.native.boundary(mb)
        else:
            self._close(mb)
            self._take(mb, False)

    def account(self, report):
        if self.inline:
            issuer = self if self.native is None else self.native
            executed, extra = issuer.issued, issuer.extra
            skipped = len(self.tasks) - len(executed)
        else:
            executed, skipped, extra = self.runtime.executed(self.handle, len(self.tasks))
        report.region_call(self, executed, skipped, extra)


class _CommOverlap:
    """The collectives one planned call launched asynchronously, by the
    storages of their tensors, until they are waited for; and the schedule
    that ran, in runtime::BuildCommOverlapRegion's terms: for collective j (in
    launch order) the compute part that first read it (`consumers[j]`, parts
    cut at the launches: the number launched when it was waited for; n + 1
    when only the call's end waited), and the operators that ran between its
    launch and that wait (`beside_ops[j]`)."""

    def __init__(self):
        self.pending = {}  # storage data pointer -> work
        self.index = {}    # id(work) -> its collective's launch index
        self.launched = 0
        self.ops = 0       # operators the call dispatched, collectives' own excluded
        self.consumers = []
        self.beside_ops = []

    def launch(self, fn, args, kwargs):
        """Calls the collective `fn` asynchronously; returns what the
        synchronous call returns (None). A call that asks for its own work
        (async_op) is left to the caller."""
        if kwargs.get("async_op") or len(args) >= 4:
            return fn(*args, **kwargs)
        work = fn(*args, **dict(kwargs, async_op=True))
        if work is None:  # this rank is not in the group
            return None
        self.index[id(work)] = self.launched
        self.consumers.append(None)
        self.beside_ops.append(self.ops)  # the count at launch, until the wait
        self.launched += 1
        for t in _tensors_in((args, kwargs)):
            self.pending[t.untyped_storage().data_ptr()] = work
        return None

    def wait_for(self, values):
        """Waits for the collectives whose tensors `values` reference."""
        for t in _tensors_in(values):
            work = self.pending.get(t.untyped_storage().data_ptr())
            if work is not None:
                self._wait(work, self.launched)

    def _wait(self, work, consumer):
        work.wait()
        j = self.index.pop(id(work))
        self.consumers[j] = consumer
        self.beside_ops[j] = self.ops - self.beside_ops[j]
        self.pending = {k: w for k, w in self.pending.items() if w is not work}

    def wait_all(self):
        """The call's end: what nothing read before is read now."""
        for work in list(dict.fromkeys(self.pending.values())):
            self._wait(work, self.launched + 1)


@functools.lru_cache(maxsize=None)
def _wait_before_use_mode():
    """The dispatch mode class, made on first use (torch is imported late)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class WaitBeforeUse(TorchDispatchMode):
        supports_higher_order_operators = True  # else torch raises on one

        def __init__(self, overlap):
            super().__init__()
            self.overlap = overlap

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if isinstance(func, torch._ops.HigherOrderOperator):
                # Its body (flex_attention's score function, cond's branches)
                # may read any tensor, outside this mode: all are waited for.
                self.overlap.wait_all()
            elif self.overlap.pending:
                self.overlap.wait_for((args, kwargs))
            if not getattr(_ON_THREAD, "in_collective", False):
                self.overlap.ops += 1
            return func(*args, **kwargs)

    return WaitBeforeUse


def _wait_before_use(overlap):
    """A dispatch mode in which every operator first waits for the pending
    collectives of `overlap` whose tensors it reads or writes."""
    return _wait_before_use_mode()(overlap)


# Tensor methods that read values on the host without dispatching an
# operator for the tensor itself.
_HOST_READS = ("tolist", "numpy", "__array__")


class _CollectiveCuts:
    """torch.distributed's collectives, wrapped while a plan with a
    dual-batch region or communication overlap is attached: called during a
    comm_overlap call, a collective is launched asynchronously; from a
    micro-batch's thread of a dual-batch region, it becomes that region's
    part; from anywhere else (or inside another collective) it runs as it
    would."""

    def __init__(self):
        import torch
        import torch.distributed as dist

        self.dist = dist
        self.originals = {name: getattr(dist, name) for name in _COLLECTIVES
                          if hasattr(dist, name)}
        for name, fn in self.originals.items():
            setattr(dist, name, self._wrap(fn))
        # Reads of a tensor's values that no operator dispatches (the
        # dispatch mode of _wait_before_use cannot see them) wait first too.
        self.tensor_reads = {name: getattr(torch.Tensor, name) for name in _HOST_READS}
        for name, fn in self.tensor_reads.items():
            setattr(torch.Tensor, name, self._waiting_read(fn))

    @staticmethod
    def _waiting_read(fn):
        @functools.wraps(fn)
        def read(t, *args, **kwargs):
            overlap = getattr(_ON_THREAD, "overlap", None)
            if overlap is not None and overlap.pending:
                overlap.wait_for(t)
            return fn(t, *args, **kwargs)

        return read

    @staticmethod
    def _wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            if getattr(_ON_THREAD, "in_collective", False):
                return fn(*args, **kwargs)
            overlap = getattr(_ON_THREAD, "overlap", None)
            if overlap is not None:
                _ON_THREAD.in_collective = True
                try:
                    return overlap.launch(fn, args, kwargs)
                finally:
                    _ON_THREAD.in_collective = False
            at = getattr(_ON_THREAD, "at", None)
            if at is None or at[0].kind != DUAL_BATCH:
                return fn(*args, **kwargs)
            return at[0].collective(at[1], fn, args, kwargs)

        return call

    def restore(self):
        import torch

        for name, fn in self.originals.items():
            setattr(self.dist, name, fn)
        self.originals = {}
        for name, fn in self.tensor_reads.items():
            setattr(torch.Tensor, name, fn)
        self.tensor_reads = {}


# Why the first call of each kind runs the original way (_PlannedForward._audited).
_AUDITED = ("the first call of its kind, run the original way to prove that its operators "
            "keep the rows apart")
_ATTACHED = ("the call the plan was attached in, whose forward torch had looked up before: "
             "the model's own top module is a unit")
# The audited call is also run split on a copy of its arguments and compared
# (_PlannedForward._split_differs), unless the copy would take more than this:
# a decode step's KV cache of a large model at a long context (GiBs) would
# then be held twice on the device.
_COMPARED_BYTES = 1 << 30
_UNCOMPARED = ("the first call of its kind was not also run split and compared with its "
               "unsplit result, so what its forward does with the batch size as a number, or "
               "with a global, is not checked")
_BATCH_AS_NUMBER = ("its forward uses the batch size as a number (`x / x.shape[0]`) or reads "
                    "state dynaflow does not see (a global, a closure)")
# _ON_THREAD.in_plan in the micro-batches of that comparison.
_COMPARING = "comparing"
# What happens once the plan is refused (Applier.refuse).
_UNMODIFIED = "the program runs unmodified"
_RAISES = "this call raises (its micro-batches ran), and the program runs unmodified after it"
# A refusal in a torch.distributed program (_PlannedForward._refuse).
_KIND_UNMODIFIED = ("on this rank its calls of this kind run unmodified, and the rest of the "
                    "plan goes on (the ranks split alike the calls whose collectives pair up)")
_KIND_RAISES = "this call raises (its micro-batches ran), and its calls of this kind run unmodified"
_KIND_OUTCOMES = (_KIND_UNMODIFIED, _KIND_RAISES)
# Why calls run the original way (_PlannedForward.__call__).
_FEW_ROWS = "{}: its batch has {}, fewer than the {} micro-batches of its bucket"
_PACKED = " (sequences packed into one row, as in continuous batching, are one row)"
_FORKED = ("this process was forked from the one that applied the plan, whose runtime threads "
           "it does not have")
# Split, each micro-batch draws its own random numbers (dropout's masks, say),
# in another order and count than the unsplit call: its result would differ.
_DRAWS_RANDOM = ("the call draws random numbers (dropout in training, say): split, each "
                 "micro-batch would draw its own, so the result could not equal the unsplit "
                 "call's")
_DREW_RANDOM = ("the call drew random numbers, which the first call of its kind did not: split, "
                "each micro-batch drew its own, so the result differs from the unsplit call's")


# Where a unit whose instance had its own forward at apply (a patch, a
# library's hook wrapper) keeps it, for its copies and for references to the
# installed forward kept past detach; left there after detach.
_OWN_FORWARD = "_dynaflow_own_forward"


def _state_with_own_forward(module):
    """The __getstate__ of a unit whose instance had a forward of its own,
    while the plan is applied: its class's state with that forward in place
    of the installed one. pickle saves a bound method by name, so a pickled
    copy loaded the installed forward as its class's and lost the patch
    (a model that scales a unit's output loaded without the scaling);
    copy.deepcopy reads the same state."""
    state = type(module).__getstate__(module)
    if isinstance(state, dict) and _OWN_FORWARD in state:
        state = dict(state)
        state.pop("__getstate__", None)
        state["forward"] = state.pop(_OWN_FORWARD)
    return state


def _unplanned_forward(module, *args, **kwargs):
    """The forward `module` had before apply, called: its instance's own,
    else its class's. A copy's (deepcopy binds the copy), or the unit's
    once restored, reached through a reference kept past detach."""
    own = module.__dict__.get(_OWN_FORWARD)
    if own is not None:
        return own(*args, **kwargs)
    return type(module).forward(module, *args, **kwargs)


def _installed_forward(planned):
    """A unit's forward while the plan is applied (module.forward): a method
    of the module that calls `planned`. To what reads or copies it, it is
    a forward like the original: it shows the original's parameters
    (transformers' generate() passes position_ids only to a forward that
    takes them, its Trainer drops the dataset columns a forward does not
    take) and has a method's attributes (torch.export reads __code__); a
    copy of the module (copy.deepcopy binds the copy, pickle looks the
    copy's forward up) runs the forward it had before apply, unplanned (its
    instance's own, through _state_with_own_forward, else its class's):
    sharing the planned call, it ran the original module's weights. It holds `planned`
    weakly, so a copy keeps nothing of the original alive."""
    import torch

    planned_ref = weakref.ref(planned)
    if planned.replaced is not None:  # copies and pickles carry it, bound to themselves
        own = planned.module.__dict__
        own[_OWN_FORWARD] = planned.replaced
        # (an instance's own __getstate__, which a library may have set, stays)
        own.setdefault("__getstate__", types.MethodType(_state_with_own_forward, planned.module))

    def forward(module, *args, **kwargs):
        planned = planned_ref()
        if planned is not None and not planned.restored and module is planned.module:
            return planned(*args, **kwargs)
        return _unplanned_forward(module, *args, **kwargs)

    # Under torch.compile the planned call is a graph break: the split,
    # the runtime's threads and streams, and the merge run as they do
    # eagerly, never traced into a graph that would bake in one call's
    # split (the compiled parts around it stay compiled).
    eager = torch.compiler.disable(forward)

    # Dynamo calls it while it traces (assume_constant_result), with whether
    # the traced call is the unit's, and bakes in the answer, which no guard
    # checks: where a graph break would not raise, always the graph break,
    # whose eager call tells the unit from a copy (forward) on every call.
    # Where it would, a copy's forward, unplanned, is traced; and no guard
    # tells the copy's graph from the unit's (torch 2.11 matches the
    # installed forward by its code): reused for the unit, it runs the
    # original without the refusal being said (README).
    @torch._dynamo.assume_constant_result
    def traced_whole(mine):
        why = _graph_break_raises()
        if not why:
            return False
        return not mine or planned_ref().traced_whole(why)

    is_compiling = torch.compiler.is_compiling

    def installed(module, *args, **kwargs):
        # Where dynamo would raise at the graph break (_graph_break_raises),
        # it traces the original forward instead (_PlannedForward.traced_whole).
        if is_compiling():
            planned = planned_ref()
            if traced_whole(planned is not None and module is planned.module):
                return _unplanned_forward(module, *args, **kwargs)
        return eager(module, *args, **kwargs)

    installed.__name__ = "forward"
    installed.__qualname__ = f"{type(planned.module).__qualname__}.forward"
    if planned.signature is not None:
        this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
        installed.__signature__ = planned.signature.replace(
            parameters=[this, *planned.signature.parameters.values()])
    return types.MethodType(installed, planned.module)


class _PlannedForward:
    """Replaces one module's forward: the plan's schedule for the call's bucket.

    A planned call first proves its split safe (`_split.split_call`, which
    runs nothing); a call it cannot prove refuses the plan before any of it
    runs, and runs once the original way. The micro-batches then run once,
    their outputs and state are merged, and nothing runs twice: --verify runs
    the original on a snapshot of what the call may mutate, before the planned
    run, and compares outputs and state afterwards."""

    def __init__(self, path, module, applier):
        self.path = path
        self.module = module
        self.original = module.forward
        self.replaced = module.__dict__.get("forward")  # an instance's own (torch.compile's)
        self.applier = applier
        try:
            self.signature = inspect.signature(self.original)
        except (TypeError, ValueError):
            self.signature = None
        self.schedules = {}  # splits -> (schedule handle, task function, state)
        self.regions = {}    # splits -> _Region, where the plan staggers the unit
        # _rows.audit_key -> why its calls are refused ("": they split). In a
        # torch.distributed program a refusal ends the plan for its kind only
        # (_refuse), and later calls of a refused kind run the original way.
        self.audited = {}
        # _rows.audit_key -> the process groups of the collectives its audited
        # call issued: its ranks agreed there, and split its calls alike.
        self.groups = {}
        self.changed_state = set()  # keys whose audited first call changed the modules' state
        # _rows.audit_key -> what its audited first call's output shared
        # (_split.output_aliases), which the merge of its later calls keeps.
        self.aliases = {}
        self.uncompared = set()  # why audited calls were not compared split (said once each)
        self.graphs = None   # _graphs.UnitGraphs, made at the first call with a graph backend
        self.restored = False
        self.installed = _installed_forward(self)
        module.forward = self.installed

    def restore(self):
        """Puts the original forward back and frees the schedules."""
        self.restored = True
        getstate = self.module.__dict__.get("__getstate__")
        if getattr(getstate, "__func__", None) is _state_with_own_forward:
            del self.module.__dict__["__getstate__"]
        if self.module.__dict__.get("forward") is self.installed:
            if self.replaced is None:
                del self.module.forward
            else:
                self.module.forward = self.replaced
        for handle, _, _ in self.schedules.values():
            self.applier.runtime.lib.dynaflow_apply_schedule_free(handle)
        self.schedules = {}
        for region in self.regions.values():
            region.free()
        self.regions = {}
        if self.graphs is not None:
            self.graphs.clear()

    def traced_whole(self, why):
        """Dynamo traces a call of the unit where its graph break would raise,
        for `why` (_graph_break_raises): it traces the original forward. A
        strict torch.export records the original operators, as a non-strict
        one does (traced), and refuses nothing; a graph compiled whole
        (fullgraph=True) runs them on every later call, and so refuses the
        plan (Applier.refuse_traced). Inside a planned or audited call the
        original is what runs there (__call__), and refuses nothing."""
        if self.restored or getattr(_ON_THREAD, "in_plan", False) or \
                getattr(_ON_THREAD, "auditing", False):
            return True
        if why == _EXPORT_RECORDS:
            self.applier.report.unsplit_call(f"{self.path}: {why}")
        else:
            self.applier.refuse_traced(f"{self.path}: {why}")
        return True

    def __call__(self, *args, **kwargs):
        a = self.applier
        if getattr(_ON_THREAD, "in_plan", False) or getattr(_ON_THREAD, "auditing", False):
            # A unit called from inside a planned call (one unit nested in
            # another) runs as its micro-batch calls it: splitting it again
            # would wait for the executor the outer call holds. Inside an
            # audited call, the audit covers its operators. Calls made by
            # the audited call's split comparison are not the program's.
            if getattr(_ON_THREAD, "in_plan", False) is not _COMPARING:
                a.report.original_call()
            return self.original(*args, **kwargs)
        if a.forked:
            a.report.unsplit_call(f"{self.path}: {_FORKED}")
            return self.original(*args, **kwargs)
        x = first_tensor(args, kwargs)
        why = traced(x)
        if why:  # nothing runs: the tracer records the original operators
            a.report.unsplit_call(f"{self.path}: {why}")
            return self.original(*args, **kwargs)
        why = kind_refusal(x) if x is not None else ""
        if why:  # its tokens cannot even be counted (a nested tensor's sizes)
            return self._refused_call(
                None, f"{self.path}: its batch argument of type {type(x).__qualname__} {why}",
                args, kwargs)
        policy = a.policy_for(self.module, args, kwargs, x)
        index = -1 if policy is None else a.runtime.pick(policy, tokens_of(x))
        if index < 0:  # the plan runs its bucket sequentially
            a.report.original_call()
            return self.original(*args, **kwargs)
        if x.shape[0] < a.splits_of[index]:
            rows = x.shape[0]
            a.report.unsplit_call(_FEW_ROWS.format(self.path, f"{rows} row{'s' * (rows != 1)}",
                                                   a.splits_of[index]) + _PACKED * (rows == 1))
            return self.original(*args, **kwargs)
        why = device_refusal(x.device, a.device, _current_cuda_index() if a.cuda else None)
        if why:
            a.report.unsplit_call(f"{self.path}: {why}")
            return self.original(*args, **kwargs)
        if a.splits_of[index] == OVERLAP:  # unsplit: its saves are the original's
            return self._overlapped(args, kwargs)
        why = saved_tensor_hooks_refusal()
        if why:
            a.report.unsplit_call(f"{self.path}: {why}")
            return self.original(*args, **kwargs)
        batch = x.shape[0]
        if a.caller_state is None:
            why = torch_modes()
            if why:
                a.report.unsplit_call(f"{self.path}: {why}, which only the replay module "
                                      f"carries into the micro-batches ({a.no_caller_state})")
                return self.original(*args, **kwargs)
        key = None  # a call that cannot be keyed is refused as a kind of its own
        try:
            try:
                key = audit_key(self.module, args, kwargs, batch)
            except RecursionError:
                raise Refusal(f"{self.path}: an argument is nested too deep to split, or holds "
                              f"itself") from None
            if self.audited.get(key):  # a kind refused on this rank (_refuse)
                a.report.unsplit_call(self.audited[key])
                return self.original(*args, **kwargs)
            # After the key: a refusal here (a hook on one rank) is the kind's.
            modules = check_module(self.path, self.module)
            fits = None
            if a.graph_backend is not None and not a.verify and self.audited.get(key) == "":
                # A call of a kind with a graph of its shape replays it: the
                # split its capture proved holds for the same arguments'
                # structure, shapes and values (the graph key).
                fits = self._fits(policy, index, x)
                with a.lock:  # the graph's static inputs and outputs are shared
                    out = self._graphs().replay_hit(key, batch, args, kwargs, fits, modules)
                    if out is not EAGER:
                        a.report.planned_call()
                        return out
            split = split_call(self.path, self.signature, args, kwargs, batch,
                               even_bounds(batch, a.splits_of[index]))
        except Refusal as e:
            return self._refused_call(key, str(e), args, kwargs)
        except Unsplittable as e:
            a.report.unsplit_call(str(e))
            return self.original(*args, **kwargs)
        if key not in self.audited:
            why = unauditable()
            if why:
                a.report.unsplit_call(f"{self.path}: {why}, and the first call of a kind is "
                                      f"audited without one")
                return self.original(*args, **kwargs)
            return self._audited(key, split, args, kwargs, batch, modules)
        split.aliases = self.aliases[key]
        baseline = _Baseline(self.module, self.original, args, kwargs) if a.verify else None
        split.share_buffers(modules)  # after the baseline, which writes them back
        prepared = None
        if a.graph_backend is not None:
            prepared = self._graphs().prepare(key, split, args, kwargs,
                                              fits or self._fits(policy, index, x))
        with a.lock:  # one call at a time per executor
            if a.executor is None or self.restored:
                # The plan was refused since this call's checks, by another
                # thread's call (Applier.refuse waits for the lock) or while
                # dynamo traced (refuse_traced): the modules are restored,
                # nothing of this call ran.
                a.report.original_call()
                return self.original(*args, **kwargs)
            out = EAGER
            if prepared is not None:
                out = self.graphs.call(
                    prepared, split, modules, lambda: self._run_for_graph(split, key),
                    lambda static, padded: self._capture(static, padded, args, kwargs, modules,
                                                         split.parts, key))
                if out is EAGER and (a.executor is None or self.restored or
                                     self.audited.get(key)):
                    # The capture's merge refused the plan (the modules are
                    # restored), or its kind (_refuse). Nothing of the call
                    # ran on the device, and its warm-up showed it changes no
                    # state of its modules: it runs once, the original way.
                    if self.audited.get(key):
                        a.report.unsplit_call(self.audited[key])
                    else:
                        a.report.original_call()
                    return self.original(*args, **kwargs)
            if out is EAGER:
                out = self._run(split, key)
        a.report.planned_call()
        if baseline is not None:
            a.report.compare_call(self.path, baseline, (self.module, args, kwargs, out))
        return out

    def _audited(self, key, split, args, kwargs, batch, modules):
        """The first call of its kind (`_rows.audit_key`) runs the original
        way, once, under `_rows`' audit: the proof that its operators keep
        the batch's rows apart, and that their outputs can be merged (a
        cache the call builds has an adapter: `_split.output_refusal`).
        Calls of that kind split from then on; if they would mix rows or
        return what cannot be merged, the plan is refused (before any of them
        ran split). A call that changes the state of the unit's modules
        (`_split.ModuleState`: an attribute set, a buffer replaced) or of the
        caller's context variables (`_split.ContextState`) would change it
        once per micro-batch: the next call of its kind is audited too, and
        the plan refused if it changes that state again (the first may only
        have set up what later calls reuse)."""
        a = self.applier
        if _distributed():  # the process group may have come after the attach
            _let_collectives_finish_at_exit()
        state = ModuleState(modules)
        copied = self._copy_for_comparison(args, kwargs)
        audit = make_audit(batch)
        for t, _ in split.row_views.values():
            audit.tag_rows(t)
        for adapter, original, _ in split.states:
            for t in adapter.row_tensors(original):
                audit.tag_rows(t)
        handles = audit.watch(self.module)
        rng, context = _rng_states(), ContextState(contextvars.copy_context())
        try:
            out = self._original_under(audit, args, kwargs)
        finally:
            for h in handles:
                h.remove()
        self.groups[key] = audit.groups
        audit.check_result(_tensors_in(out), "the call")
        for adapter, original, _ in split.states:
            audit.check_result(adapter.row_tensors(original), type(original).__name__)
        why = audit.mixed or ("" if rng == _rng_states() else _DRAWS_RANDOM) or \
            output_refusal(out, {id(original) for _, original, _ in split.states}, batch) or \
            alias_refusal(out, self.signature, args, kwargs, state.named_tensors())
        a.report.unsplit_call(f"{self.path}: {_AUDITED}")
        self.aliases[key] = output_aliases(out, args, kwargs)
        again = False
        try:
            state.check()
            context.check(contextvars.copy_context())
        except MergeError as e:
            if not why and key not in self.changed_state:
                again = True
            else:
                why = why or f"{e} (found in two unsplit calls of its kind: none ran split)"
        # The ranks that issue the unit's collectives go on alike (_agreed).
        why = why or _agreement_refusal(audit.groups)
        outcome = _agreed(audit.groups, _REFUSE if why else _AGAIN if again else
                          _NO_COMPARISON if copied is None else _COMPARE)
        if outcome == _REFUSE:
            why = why or _ANOTHER_RANK
        elif outcome == _AGAIN:
            self.changed_state.add(key)
            return out  # its next call is audited again
        elif outcome == _COMPARE:
            why = self._split_differs(copied, split.bounds, out, args, kwargs, batch, modules,
                                      self.aliases[key])
            if _agreed(audit.groups, _REFUSE if why else _COMPARE) == _REFUSE:
                why = why or _ANOTHER_RANK
        self.audited[key] = why
        if why:
            self._refuse(key, f"{self.path}: {why}")
        return out

    def _original_under(self, audit, args, kwargs):
        """The original forward, run once under `audit`; the units it calls
        run as it calls them (_ON_THREAD.auditing)."""
        _ON_THREAD.auditing = True
        try:
            with watching(audit):
                return self.original(*args, **kwargs)
        finally:
            _ON_THREAD.auditing = False

    def _refuse(self, key, message, outcome=_UNMODIFIED):
        """Refuses the plan at a call of kind `key`. In a torch.distributed
        program, only for the calls of that kind on this rank: ending the
        whole plan here would leave this rank running whole the units whose
        collectives the other ranks go on splitting (they agreed on those
        at their audited first calls, _audited), and the ranks' collectives
        would no longer pair up."""
        if not _distributed():
            self.applier.refuse(message, outcome)
            return
        if key is not None:  # a call that could not be keyed is refused alone
            self.audited[key] = message
        self.applier.refuse_kind(message, _KIND_RAISES if outcome == _RAISES else _KIND_UNMODIFIED)

    def _refused_call(self, key, message, args, kwargs):
        """The call, run the original way, after `message` refused it before
        anything ran. In a torch.distributed program the ranks of the
        collectives it issues must refuse it alike: at the first call of its
        kind the others audit it and agree on its outcome (_audited), so
        this rank runs it under an audit that notes its collectives' groups
        and agrees with them on a refusal. At a later call of a kind the
        ranks agreed to split, on collectives, they split it: run whole,
        this rank's collectives would not pair with theirs, so it raises. A
        call that could not be keyed (`key` None: its batch cannot be
        counted, its arguments hold themselves) is audited and agreed on at
        every such call: the other ranks, given alike arguments, refuse it
        alike."""
        a = self.applier
        if not _distributed():
            a.report.original_call()
            self._refuse(key, message)
            return self.original(*args, **kwargs)
        if key in self.audited and self.groups.get(key):
            raise RuntimeError(
                f"dynaflow apply: {message}; the other ranks of its process group split its "
                f"calls of this kind, as they agreed at its first, and run whole here its "
                f"collectives would not pair with theirs")
        a.report.unsplit_call(message)
        if key in self.audited:  # split so far, without collectives
            self._refuse(key, message)
            return self.original(*args, **kwargs)
        _let_collectives_finish_at_exit()
        audit = make_audit(0)
        audit.fail(message)  # it only notes the collectives
        out = self._original_under(audit, args, kwargs)
        if key is not None:
            self.groups[key] = audit.groups
        _agreed(audit.groups, _REFUSE)
        self._refuse(key, message)
        return out

    def _copy_for_comparison(self, args, kwargs):
        """The call's arguments copied before it runs, for _split_differs; or
        None, said once per unit and reason: under a CUDA graph capture (the
        comparison would be captured into the program's graph), or when the
        copy would exceed _COMPARED_BYTES (a long KV cache)."""
        import torch

        why = ""
        if self.applier.cuda and torch.cuda.is_current_stream_capturing():
            why = "under a CUDA graph capture"
        else:
            # The copy takes each tensor's whole memory (_snapshot), also
            # for a view into a larger pool; a tensor without one (no
            # elements, a sparse layout) counts nothing.
            storages = {}
            for t in _tensors_in((args, kwargs)):
                address = _storage_address(t)
                if address is not None:
                    storages[address] = t.untyped_storage().nbytes()
            size = sum(storages.values())
            if size > _COMPARED_BYTES:
                why = (f"its arguments hold {size / 2**20:.0f} MiB, more than the "
                       f"{_COMPARED_BYTES >> 20} MiB dynaflow copies for it")
        if not why:
            try:
                return _snapshot((args, kwargs))
            except Exception as e:  # noqa: BLE001 - deepcopy of whatever the program passes
                why = f"its arguments cannot be copied: {type(e).__qualname__}: {_first_line(e)}"
        if why not in self.uncompared:
            self.uncompared.add(why)
            _say(f"{self.path}: {_UNCOMPARED} ({why})")
        return None

    def _split_differs(self, copied, bounds, out, args, kwargs, batch, modules, aliases):
        """Why the call, run split on `copied` (its arguments as they were
        before the audited call), does not give what the audited call gave:
        its outputs and its arguments' state (a cache written) compared
        within the dtype's tolerance; "" when it does. The proof of the audit
        covers the operators; this covers what they are given from outside
        the dispatcher: the batch size as a number (`x / x.shape[0]`), a
        global or a closure read. The random numbers it draws (none, or the
        run is refused), torch's, Python's and numpy's, are put back. It runs
        without grad: the audited call's output holds the call's autograd
        graph already, and a second one would hold a second forward's
        activations (on a GPU near its memory's end, an out-of-memory)."""
        import torch

        a = self.applier
        copied_args, copied_kwargs = copied
        head = f"the first call of its kind, run split in {len(bounds) - 1} on a copy of its " \
               f"arguments,"
        try:
            split = split_call(self.path, self.signature, copied_args, copied_kwargs, batch,
                               bounds)
            split.aliases = aliases
            split.share_buffers(modules)
            with _random_states_kept(), torch.no_grad(), a.lock:
                if a.executor is None:  # another thread's call refused the plan meanwhile
                    return ""
                got = self._run_merged(split, counted=False)
        except MergeError as e:
            return f"{head} could not be merged: {e}"
        except Exception as e:  # noqa: BLE001 - whatever the forward raises on a micro-batch
            return f"{head} raised {type(e).__qualname__}: {_first_line(e)}"
        try:
            return self._differs(head, out, got, args, kwargs, copied_args, copied_kwargs)
        except Exception as e:  # noqa: BLE001 - tensors no comparison here knows
            return f"{head} could not be compared with it: {type(e).__qualname__}: " \
                   f"{_first_line(e)}"

    @staticmethod
    def _differs(head, out, got, args, kwargs, copied_args, copied_kwargs):
        pairs = itertools.chain(_tensor_pairs(out, got, "output"),
                                _tensor_pairs(args, copied_args, "args"),
                                _tensor_pairs(kwargs, copied_kwargs, "kwargs"))
        for where, e, g in pairs:
            why = _mismatch(where, e, g)
            if not why:
                abs_max, _, bad = _difference(e, g)
                why = _beyond_tolerance(where, e.dtype, abs_max) if bad else ""
            if why:
                return f"{head} computed another result ({why}): {_BATCH_AS_NUMBER}"
        return ""

    def _graphs(self):
        if self.graphs is None:
            self.graphs = UnitGraphs(self.path, self.applier.graph_backend, self.applier.report,
                                     _say)
        return self.graphs

    def _fits(self, policy, index, x):
        """Whether a call padded to `padded` rows falls in the bucket of this
        call (batch tensor `x`, schedule `index` of `policy`)."""
        tokens, batch, pick = tokens_of(x), x.shape[0], self.applier.runtime.pick
        return lambda padded: pick(policy, tokens * padded // batch) == index

    def _capture(self, static, padded, args, kwargs, modules, parts, key):
        """(graph, output) of the planned call on `static` (the call's tensors'
        static copies, `padded` rows) captured by the applier's graph
        backend on their device (_graphs.UnitGraphs.call)."""
        region = self.regions.get(parts)
        if region is not None and region.kind == DUAL_BATCH:
            raise NoGraph("a dual-batch region issues each micro-batch from its own host "
                          "thread, which one capture cannot follow")
        for path, m in modules:
            for name, _ in inference_buffers(m):  # path: under the unit's, which is said
                raise NoGraph(f"buffer {f'{path}.' if path else ''}{name} {_UNCHECKABLE}")
        tensors = iter(static)
        static_args, static_kwargs = rebuild(args, tensors), rebuild(kwargs, tensors)

        def planned():
            # The split is made inside the capture: what it runs on the
            # device (a static cache layer's length, cloned for each
            # micro-batch) must run again at every replay.
            split = split_call(self.path, self.signature, static_args, static_kwargs, padded,
                               even_bounds(padded, parts))
            split.aliases = self.aliases[key]
            split.share_buffers(modules)
            return self._run_for_graph(split, key)

        device = next((t.device for t in static if t is not None and t.is_cuda), None)
        return self.applier.graph_backend.capture(planned, device)

    def _overlapped(self, args, kwargs):
        """Communication overlap: the call runs once, unsplit; each
        torch.distributed collective it makes is launched asynchronously (on
        CUDA, on the process group's communication stream) and waited for
        just before the first operator that uses one of its tensors, or when
        the call returns: work in between that does not touch them runs
        beside it."""
        a = self.applier
        baseline = _Baseline(self.module, self.original, args, kwargs) if a.verify else None
        overlap = _CommOverlap()
        _ON_THREAD.overlap = overlap
        try:
            with watching(_wait_before_use(overlap)):
                out = self.original(*args, **kwargs)
        finally:
            _ON_THREAD.overlap = None
            overlap.wait_all()
        a.report.planned_call()
        a.report.comm_overlap_call(overlap, a.runtime)
        if baseline is not None:
            a.report.compare_call(self.path, baseline, (self.module, args, kwargs, out))
        return out

    def _run_for_graph(self, split, key):
        """The planned call of `split` as a graph's warm-up and capture run
        it: issued from this thread, its merge reading no device value on
        the host."""
        split.host_reads = False
        return self._run(split, key, one_thread=True)

    def _run(self, split, key, one_thread=False):
        """The planned call of `split`. `one_thread`: every micro-batch is
        issued from this thread, as a graph backend's capture (which follows
        one host thread) and the warm-up before it (whose writes a dispatch
        mode of this thread watches) need: a staggered region inline; on
        CUDA the executor's task callbacks run on the calling thread anyway;
        on the CPU, whose graph backend is a test double, the micro-batches
        run one after the other."""
        import torch

        try:
            return self._run_merged(split, one_thread)
        except MergeError as e:
            # The micro-batches ran and may have written through their views:
            # running the original now would run the module twice. Loud, not
            # silently wrong. The plan is refused from here on, as if this had
            # been known before (later calls run unmodified; --strict exits 2).
            # Under a capture nothing ran: the call runs the original way
            # (_graphs.UnitGraphs.call), and does not raise.
            a = self.applier
            if _distributed() and self.groups.get(key):
                # Its ranks split this kind, as they agreed at its first
                # call, and go on splitting it: run whole from here on, this
                # rank's collectives would no longer pair with theirs. Loud,
                # at every such call (under a capture, the capture fails and
                # the call runs eagerly, split).
                raise RuntimeError(f"dynaflow apply: {self.path}: {e}") from None
            capturing = a.cuda and torch.cuda.is_current_stream_capturing()
            self._refuse(key, f"{self.path}: {e}", _UNMODIFIED if capturing else _RAISES)
            raise RuntimeError(f"dynaflow apply: {self.path}: {e}") from None

    def _run_merged(self, split, one_thread=False, counted=True):
        """_run's work: the micro-batches run and merged; MergeError when the
        merge finds they did what the unsplit call would not have. A call
        not `counted` (the first-call comparison's) is left out of the
        report's region calls."""
        import torch

        a = self.applier
        context = contextvars.copy_context()
        state = {
            "split": split,
            "counted": counted,
            "results": [None] * split.parts,
            "error": None,
            # The caller's torch state, for the micro-batches (_task): all of
            # it, or without the replay module grad, inference mode and
            # autocast ((device type, dtype) of each enabled).
            "carried": a.caller_state() if a.caller_state is not None else None,
            "modes": None if a.caller_state is not None else (
                torch.is_inference_mode_enabled(), torch.is_grad_enabled(),
                [(d, torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")
                 if torch.is_autocast_enabled(d)]),
            "caller": torch.cuda.current_stream() if a.cuda else None,
            # The caller's context variables (contextvars, which are per
            # thread too): each micro-batch runs in a copy, kept to check
            # that it changed none.
            "context": context,
            "context_state": ContextState(context),
            "contexts": [None] * split.parts,
        }
        # Collectives are paired across ranks by the order each rank issues
        # them in. The CPU workers would issue the micro-batches' in whatever
        # order the threads run, differently on each rank (gloo then sums
        # one rank's micro-batch 0 with another's micro-batch 1), so with
        # torch.distributed on the CPU the micro-batches run one after the
        # other. On CUDA every task is launched from this thread, in order.
        # A region needs no such care: its sequencer issues the segments in
        # the schedule's order on every rank, from one host thread per
        # micro-batch (CPU workers also on CUDA, each on its micro-batch's
        # stream); under a CUDA graph capture a staggered region is issued
        # inline, from this thread, micro-batch by micro-batch (_Region).
        region = self.regions.get(split.parts)
        state["region"] = region
        # A call of a kind whose audit drew no random numbers may still draw
        # some (a branch the audit did not take): known after it ran split,
        # it is a loud error. Not under a capture (its warm-up checked).
        rng = None if a.cuda and torch.cuda.is_current_stream_capturing() else _rng_states()
        if a.cuda or SLICES_ON_CPU:
            split.slices = SliceMerge(split, state["caller"])
        if region is not None:
            region.start_call(state["caller"], inline=one_thread or (
                a.cuda and torch.cuda.is_current_stream_capturing()))
        if (region is not None and region.inline) or (region is None and one_thread and
                                                        not a.cuda):
            rc, message = 0, ""
            for mb in range(split.parts):
                if self._task(state, mb, 0) != 0:
                    break
            error, results = state["error"], state["results"]
        else:
            ordered = region is None and not a.cuda and _distributed()
            handle, _, shared = self._schedule(split.parts, ordered)
            shared.update(state)  # what the schedule's task function reads
            caller = state["caller"].cuda_stream if a.cuda and region is None else 0
            executor = a.executor if region is None or not a.cuda else a.host_executor
            try:
                rc, message = a.runtime.run(executor, handle, caller,
                                            wait=not a.cuda or region is not None)
                error = shared["error"]
                results = shared["results"]
            finally:
                shared.clear()  # drops the views and results
        if region is not None:
            region.end_call(state["caller"])
            if counted:
                region.account(a.report)
        if error is not None:
            raise error
        if rc != 0:
            raise RuntimeError(f"dynaflow apply: {self.path}: {message}")
        if a.cuda:
            _record_on(results, state["caller"])
            _record_on([v for _, _, views in split.states for v in views], state["caller"])
        if rng is not None and rng != _rng_states():
            raise MergeError(_DREW_RANDOM)
        for context in state["contexts"]:
            state["context_state"].check(context)
        with unwatched():  # dynaflow's own check, which a capture skips
            split.check_shared_unmodified()
        out = merge_outputs(split, results, split.states)
        split.merge_state()
        return out

    def _schedule(self, splits, ordered):
        key = (splits, ordered)
        if key not in self.schedules:
            state = {}
            fn = _Runtime.TASK_FN(lambda _u, _t, mb, stream: self._task(state, mb, stream))
            handle = self.applier.runtime.micro_batch_schedule(self.path, splits, fn, ordered)
            self.schedules[key] = (handle, fn, state)
        return self.schedules[key]

    def _task(self, state, mb, stream):
        """Micro-batch `mb` on `stream`, on whatever thread the runtime runs
        it: 0, or 1 with the error kept for the caller's thread. Torch's
        state is per thread: the caller's is set around it (CallerState),
        or without the replay module its grad, inference mode and autocast
        (_PlannedForward.__call__ ran calls under any other torch state
        unsplit). It runs in a copy of the caller's context variables."""
        import torch

        try:
            context = state["contexts"][mb] = state["context"].copy()
            carried = state["carried"]
            if carried is not None:
                carried.run(lambda: context.run(self._micro_batch, state, mb, stream))
                return 0
            inference, grad, autocast = state["modes"]
            with contextlib.ExitStack() as modes:
                if inference:
                    modes.enter_context(torch.inference_mode())
                else:
                    modes.enter_context(torch.set_grad_enabled(grad))
                for device, dtype in autocast:
                    modes.enter_context(torch.autocast(device, dtype=dtype))
                context.run(self._micro_batch, state, mb, stream)
            return 0
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            if state.get("error") is None:
                state["error"] = e
            region = state.get("region")
            if region is not None:
                # The executor skips the micro-batches it has not started,
                # which then never end their tasks: every micro-batch waiting
                # for a turn after theirs is woken, failed, instead.
                region.abort(f"micro-batch {mb} failed: {_first_line(e)}")
            return 1

    def _micro_batch(self, state, mb, stream):
        """Runs micro-batch `mb` of the call in `state` on `stream` (0: the
        thread's current one), in its region's turns where the unit has one,
        and keeps its result."""
        import torch

        split = state["split"]
        with contextlib.ExitStack() as modes:
            _ON_THREAD.in_plan = True if state["counted"] else _COMPARING
            modes.callback(setattr, _ON_THREAD, "in_plan", False)
            if stream:
                modes.enter_context(torch.cuda.stream(torch.cuda.ExternalStream(stream)))
            region = state["region"]
            if region is None:
                state["results"][mb] = self.original(*split.args[mb], **split.kwargs[mb])
                if split.slices is not None:
                    split.slices.put(mb, state["results"][mb])
                return
            if region.cuda and region.native is None:
                # Restores this thread's stream after the turns switched it
                # (the native region's end does).
                modes.enter_context(torch.cuda.stream(torch.cuda.current_stream()))
            try:
                region.begin(mb)
                state["results"][mb] = self.original(*split.args[mb], **split.kwargs[mb])
                if split.slices is not None:  # in its last turn
                    split.slices.put(mb, state["results"][mb])
            finally:
                region.end(mb)


# What the audited first call of a kind leads to, from the least to the most
# cautious (_agreed takes the largest): split after the comparison, split
# without it (no copy: _copy_for_comparison), audit the next call of its kind
# again (it changed its modules' state), refuse the plan.
_COMPARE, _NO_COMPARISON, _AGAIN, _REFUSE = range(4)
_ANOTHER_RANK = ("another rank of its process group refused the plan at this call (that "
                 "rank says why): the ranks split the unit alike or not at all, or the "
                 "collectives inside it would not pair up")


def _agreed(groups, outcome):
    """The outcome every rank of `groups` goes on with: the most cautious
    of theirs. A unit whose audited call issued collectives on `groups` (the
    audit's) runs in step on their ranks, so each reaches this call; if one
    refused and another split, the one's single collective would pair with
    the other's first micro-batch's, and the ranks would hang or sum
    mismatched rows. An all-reduce (MAX) per group, on the group's device
    (_agreement_refusal has ruled out what would keep it from running), in
    world size - 1 rounds: ranks whose groups overlap (tensor parallel in
    one, expert parallel in another) pass a refusal along a chain of groups
    one group per round, and every rank runs as many rounds, so each group
    pairs its all-reduces."""
    if not groups or outcome == _REFUSE and _agreement_refusal(groups):
        return outcome
    import torch
    import torch.distributed as dist

    devices = []
    for group in groups:
        # NCCL reduces device tensors; gloo, and a backend for both
        # ("cpu:gloo,cuda:nccl"), host ones.
        backend = str(dist.get_backend(group))
        devices.append(torch.device("cuda", torch.cuda.current_device())
                       if "nccl" in backend and "gloo" not in backend else "cpu")
    for _ in range(max(1, dist.get_world_size() - 1)):
        for group, device in zip(groups, devices):
            value = torch.tensor([outcome], device=device)
            dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
            outcome = int(value.item())
    return outcome


def _agreement_refusal(groups):
    """Why the ranks of `groups` (an audit's) cannot agree on a call, or "":
    a group the audit could not tell, or a CUDA graph capture underway (the
    agreed value could not be read during one). Every rank of them finds the
    same, and refuses alike, without agreeing."""
    if None in groups:
        return ("it issues a collective whose process group dynaflow cannot tell, so its "
                "ranks cannot agree to split it alike")
    if groups and _capture_underway():
        return ("it issues collectives, and while a CUDA graph is captured its ranks cannot "
                "agree to split it alike")
    return ""


def _distributed():
    """Whether this process is one of several ranks of torch.distributed."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@functools.cache
def _let_collectives_finish_at_exit():
    """Registers, once, an exit handler that hands the GIL to torch's
    threads for 20 ms. Once torch._dynamo is imported (torch.compiler.disable
    in _PlannedForward does), a gloo process group outlives
    destroy_process_group (torch 2.11): its worker threads are not joined,
    and release the tensors of the program's last collective only once they
    hold the GIL. The main thread, running on to the interpreter's
    finalization without letting go of the GIL, left one asking for it
    there, which aborted the process at exit ("terminate called without an
    active exception"; 1 exit in 4 of tests/dist/tp_mlp.py --batch-scaled
    under a refused plan, 0 in 16 with a sleep at its end)."""
    atexit.register(time.sleep, 0.02)


def _record_on(values, stream):
    """Tells the caching allocator that the tensors in `values` (made on the
    micro-batches' streams) are used on `stream`, so their memory is not
    reused before the caller's stream has read them (torch's cross-stream
    rule)."""
    for t in _tensors_in(values):
        if t.is_cuda:
            t.record_stream(stream)


def _tensors_in(value, seen=None):
    import torch

    seen = set() if seen is None else seen
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, tuple):
        for v in value:
            yield from _tensors_in(v, seen)
    elif isinstance(value, list):
        # A list's own items: a cache view's layers that no micro-batch read
        # stay unmade (_split._LazyLayers), placeholders without tensors.
        for v in list.__iter__(value):
            yield from _tensors_in(v, seen)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors_in(v, seen)
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        for v in vars(value).values():
            yield from _tensors_in(v, seen)


class _Baseline:
    """The original forward run on a snapshot of the call's arguments (tensors
    cloned, state objects deep-copied), so what the call mutates can be
    compared after the planned run without running the module twice on the
    program's own state."""

    def __init__(self, module, original, args, kwargs):
        import torch

        self.args, self.kwargs = _snapshot((args, kwargs))
        buffers = dict(module.named_buffers())
        before = {k: (b.detach().clone(), Unchanged(b, by_bytes=True))
                  for k, b in buffers.items()}
        # The random numbers the baseline draws are put back, so that the
        # planned run draws from where the program would have (and is then
        # refused for drawing them, see _DRAWS_RANDOM).
        with _random_states_kept(), torch.no_grad():
            self.out = original(*self.args, **self.kwargs)
        with torch.no_grad():
            # The module's own state (running statistics, counters) as the
            # unsplit call leaves it; then put back for the planned run. Only
            # what changed: a write bumps the version that autograd checks
            # for the tensors an earlier call saved for its backward.
            self.buffers = {k: b.detach().clone() for k, b in buffers.items()}
            for k, b in buffers.items():
                saved, unchanged = before[k]
                if not unchanged(b):
                    b.copy_(saved)


def _rng_states():
    """The default generators' states, as bytes: the CPU's, and each CUDA
    device's once CUDA is initialized. Read without dispatching an operator,
    so that neither a warm-up's watch nor a graph's capture sees it."""
    import ctypes

    import torch

    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []
    return tuple(ctypes.string_at(t.data_ptr(), t.nbytes)
                 for t in (torch.get_rng_state(), *cuda))


def _snapshot(value, memo=None):
    """A copy of `value` that nothing done to `value` changes: tensors
    detached and copied with their whole memory, state objects deep-copied.
    One memo (copy.deepcopy's, id -> copy) serves the whole value: an object
    reached twice is copied once, and views of one memory (`x` and `x[:, 1:]`,
    an argument and a cache's tensor) stay views of one copy, as torch
    deep-copies a storage once per memo."""
    import torch

    memo = {} if memo is None else memo
    if id(value) in memo:
        return memo[id(value)]
    if isinstance(value, torch.Tensor):
        copied = copy.deepcopy(value.detach(), memo)
    elif isinstance(value, (tuple, list)) and type(value) in (tuple, list):
        copied = type(value)(_snapshot(v, memo) for v in value)
    elif type(value) is dict:
        copied = {k: _snapshot(v, memo) for k, v in value.items()}
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        copied = copy.deepcopy(value, memo)
    else:
        return value
    memo[id(value)] = copied
    return copied


@contextlib.contextmanager
def _random_states_kept():
    """The global random states put back after the block, for a forward run
    that is not the program's (the --verify baseline, the first call's
    comparison): torch's (the CPU's, and each CUDA device's once CUDA is
    initialized), Python's and numpy's."""
    import random

    import torch

    cuda = range(torch.cuda.device_count()) if torch.cuda.is_initialized() else []
    kept = random.getstate()
    numpy = sys.modules.get("numpy")
    kept_numpy = numpy.random.get_state() if numpy is not None else None
    try:
        with torch.random.fork_rng(devices=cuda):
            yield
    finally:
        random.setstate(kept)
        if kept_numpy is not None:
            numpy.random.set_state(kept_numpy)


def _tensor_pairs(expected, actual, where):
    """(where, expected tensor, actual tensor) for every tensor reachable in
    both, walked side by side; a structure that differs is yielded as
    (where, None, reason)."""
    import torch

    if isinstance(expected, torch.Tensor):
        if isinstance(actual, torch.Tensor):
            yield where, expected, actual
        else:
            yield where, None, f"a tensor became {type(actual).__qualname__}"
    elif isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            yield where, None, "a sequence changed length"
            return
        for k, (e, a) in enumerate(zip(expected, actual)):
            yield from _tensor_pairs(e, a, f"{where}[{k}]")
    elif isinstance(expected, dict):
        for k, e in expected.items():
            yield from _tensor_pairs(e, actual.get(k) if isinstance(actual, dict) else None,
                                     f"{where}[{k!r}]")
    elif hasattr(expected, "__dict__") and not isinstance(expected, type) \
            and type(expected) is type(actual):
        for k, e in vars(expected).items():
            yield from _tensor_pairs(e, vars(actual).get(k), f"{where}.{k}")


class Applier:
    """A plan applied to one model."""

    def __init__(self, plan, runtime_lib, verify=False, report=None, graphs=True):
        self.plan = plan
        self.verify = verify
        # Whether planned calls on CUDA are replayed from CUDA graphs; the
        # backend (_graphs.CudaGraphs) is made by attach for a CUDA model.
        self.graphs = graphs
        self.graph_backend = None
        self.report = report or Report()
        # Held by a planned call while it runs on the executor, and by
        # refuse() to free the executor: reentrant, as a call that finds the
        # plan does not fit refuses it while it holds the lock.
        self.lock = threading.RLock()
        self.merge_lock = threading.Lock()
        # Called with the reason when a call finds the plan does not fit,
        # and what happens now: the modules are restored first, so the
        # program runs unmodified (but for a call that found it after its
        # micro-batches ran, which raises).
        self.on_refuse = lambda message, outcome: _say(f"plan refused: {message}; {outcome}")
        self.runtime = _Runtime(runtime_lib)
        tilings, self.splits_of = bucket_table(plan)
        self.policies = {}
        try:
            for phase, (max_tokens, schedules) in tilings.items():
                self.policies[phase] = self.runtime.policy(max_tokens, schedules,
                                                           len(self.splits_of))
        except PlanMismatch:
            for policy in self.policies.values():
                self.runtime.lib.dynaflow_apply_policy_free(policy)
            raise
        self.phased = any(self.policies)  # some tiling names a phase
        self.cuda = False
        self.device = None  # where the executor issues, a torch.device (attach)
        self.executor = None
        self.host_executor = None  # CPU threads of regions on CUDA
        self.collective_cuts = None  # torch.distributed wrapped for dual-batch regions
        # The replay module's CallerState, which carries the caller's torch
        # state into each micro-batch (_PlannedForward._task); without it
        # (no_caller_state says why) only grad, inference mode and autocast
        # are carried, and calls under other torch state run unsplit
        # (_graphs.torch_modes).
        self.caller_state = None
        self.no_caller_state = ""
        self.forwards = []
        self.refused_kinds = set()  # refuse_kind's messages, said once each
        self.forked = False  # this process was forked from the one that attached (_forked)

    def __reduce_ex__(self, _protocol):
        """A copy of the model (model._dynaflow_applier) is not planned: None."""
        return type(None), ()

    def attach(self, model, strict=False):
        check_strategies(self.plan)
        check_device(model, self.plan)
        check_model(model, self.plan, strict)
        units = resolve_units(model, self.plan)
        if not units or not self.splits_of:
            return self
        import torch

        device = model_device(model)
        self.cuda = device is not None and device.type == "cuda"
        # On CUDA the executor's streams are made on the current device.
        self.device = torch.device("cuda", _current_cuda_index()) if self.cuda else \
            torch.device("cpu")
        try:
            self.caller_state = _native()[0].CallerState
        except NoGraph as e:
            self.caller_state = None
            self.no_caller_state = str(e)
        if self.cuda and self.graphs:
            try:
                self.graph_backend = CudaGraphs()
            except NoGraph as e:
                _say(f"CUDA graphs off: {e}; planned calls run eagerly")
        regions = region_rules(self.plan)
        # Every unit's stages are counted before anything is installed: a
        # model whose stage calls differ from the plan's segments would run
        # another schedule than the one predicted, so the plan is refused.
        # (A dual-batch region's collectives are counted as they run: calls
        # that make other collectives are reported off schedule.)
        stages = {}
        for path, module in units:
            for splits, (kind, patterns, segments) in regions.items():
                if kind != STAGGERED:
                    stages[(path, splits)] = []
                    continue
                found = stage_modules(path, module, patterns)
                if len(found) != segments:
                    raise PlanMismatch(
                        f"{_cut(path)}: the plan cuts it into {segments} segments at "
                        f"{_cut(patterns[0])}{' and others' if len(patterns) > 1 else ''}, "
                        f"this model has {len(found)} such modules")
                stages[(path, splits)] = found
        # Told of a fork from here on: a child forked once the executor's
        # threads exist (by another thread, while this one attaches) would
        # otherwise wait for them forever.
        _ATTACHED_APPLIERS.add(self)
        self.executor = self.runtime.executor(self.cuda, max(self.splits_of))
        if self.cuda and regions:
            self.host_executor = self.runtime.executor(False, max(self.splits_of))
        if any(kind == DUAL_BATCH for kind, _, _ in regions.values()) or OVERLAP in self.splits_of:
            self.collective_cuts = _CollectiveCuts()
        for path, module in units:
            install_lazy_hooks(module)
            forward = _PlannedForward(path, module, self)
            self.forwards.append(forward)
            for splits, (kind, _, n) in regions.items():
                forward.regions[splits] = _Region(self.runtime, path, kind, stages[(path, splits)],
                                                  n, splits, self.cuda)
        self.report.units = [p for p, _ in units]
        if _distributed():
            _let_collectives_finish_at_exit()
        return self

    def _forked(self):
        """In a child forked after attach: the executors' threads are the
        parent's, so a call waiting for them would wait forever, and their
        join at exit too; the handles are dropped (never freed here), the
        locks made anew (another thread may have held them at the fork),
        and every later call runs the original way (_PlannedForward). The
        collectives and tensor reads wrapped for the plan (_CollectiveCuts)
        are put back: the child's own collectives run as they would."""
        self.forked = True
        self.executor = self.host_executor = None
        if self.collective_cuts is not None:
            self.collective_cuts.restore()
            self.collective_cuts = None
        self.lock, self.merge_lock = threading.RLock(), threading.Lock()
        self.report.forked()

    def detach(self):
        """Restores every module and frees the runtime's objects."""
        for f in self.forwards:
            f.restore()
        self.forwards = []
        if self.collective_cuts is not None:
            self.collective_cuts.restore()
            self.collective_cuts = None
        lib = self.runtime.lib
        for name in ("executor", "host_executor"):
            if getattr(self, name):
                lib.dynaflow_apply_executor_free(getattr(self, name))
                setattr(self, name, None)
        for policy in self.policies.values():
            lib.dynaflow_apply_policy_free(policy)
        self.policies = {}

    def policy_for(self, module, args, kwargs, x):
        """The policy of the call's phase's tiling, else of the buckets
        without a phase; None (the call runs unplanned) when there is neither
        or the call has no batch tensor. Counts the calls per phase in a
        plan with phases."""
        if x is None:
            return None
        if not self.phased:
            return self.policies.get("")
        phase = call_phase(module, args, kwargs, x, "training" in self.policies)
        policy = self.policies.get(phase, self.policies.get(""))
        with self.report.lock:
            counts = self.report.phase_calls.setdefault(phase, {"calls": 0, "unplanned": 0})
            counts["calls"] += 1
            counts["unplanned"] += policy is None
        return policy

    def refuse_kind(self, message, outcome):
        """A refusal of one unit's calls of one kind, in a torch.distributed
        program (_PlannedForward._refuse): the rest of the plan goes on, and
        the report counts those calls as run the original way for `message`
        (not as the plan refused). Said once per message."""
        with self.lock:
            if message in self.refused_kinds:
                return
            self.refused_kinds.add(message)
        self.on_refuse(message, outcome)

    def refuse(self, message, outcome=_UNMODIFIED):
        with self.lock:  # not while another thread's call runs on the executor
            self.detach()
            # The first reason stays: the one that ended the plan.
            self.report.refused = self.report.refused or message
        self.on_refuse(message, outcome)

    def refuse_traced(self, message):
        """refuse, for a refusal found while dynamo traces a call of a unit
        (_PlannedForward.traced_whole): from now on every unit's installed
        forward calls the original (restored), and detach, at exit or the
        program's, frees the rest. Nothing else changes during the trace:
        dynamo builds its guards on the modules' attributes after it (the
        forward it read, gone by then, no longer resolved: torch 2.11 raised
        an internal error), and it holds its compile lock, which a planned
        call holding self.lock may be waiting for (its micro-batches
        compiling). In a torch.distributed program every rank refuses so
        when it compiles the unit so: the ranks must compile alike, as they
        run the same program."""
        for f in self.forwards:
            f.restored = True
        self.report.refused = self.report.refused or message
        self.on_refuse(message, _UNMODIFIED)


# The appliers attached in this process, told when it forks (_forked).
_ATTACHED_APPLIERS = weakref.WeakSet()


def _after_fork_in_child():
    eager_after_fork_in_child()
    for applier in list(_ATTACHED_APPLIERS):
        applier._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


def apply(model, plan, verify=False, runtime_lib=None, strict=False, graphs=True):
    """Applies `plan` (a path or a loaded dict) to `model` in place and returns
    model. Raises PlanMismatch when the plan does not fit (with strict, also
    when it was made for another model or cannot say); nothing is changed
    then."""
    if not isinstance(plan, dict):
        plan = load_plan(plan)
    applier = Applier(plan, runtime_lib or os.environ.get("DYNAFLOW_APPLY_LIB"), verify,
                      graphs=graphs)
    try:
        applier.attach(model, strict)
    except PlanMismatch:
        applier.detach()
        raise
    model._dynaflow_applier = applier
    atexit.register(applier.detach)  # the runtime's threads joined before C++ teardown
    return model


class _FromEnvironment:
    """The bootstrap's way: attach to the first module whose class is the
    plan's root, when it is first called; report at exit."""

    def __init__(self):
        self.strict = os.environ.get("DYNAFLOW_APPLY_STRICT") == "1"
        self.verify = os.environ.get("DYNAFLOW_APPLY_VERIFY") == "1"
        self.graphs = os.environ.get("DYNAFLOW_APPLY_GRAPHS", "1") != "0"
        self.report_path = os.environ.get("DYNAFLOW_APPLY_REPORT")
        self.report = Report()
        self.report.plan = os.environ.get("DYNAFLOW_PLAN", "")
        self.plan = None
        self.root = None
        self.hook = None
        self.applier = None
        atexit.register(self.write_report)

    def install(self):
        import torch
        from torch.nn.modules import module as nn_module

        try:
            self.plan = load_plan(self.report.plan)
            check_strategies(self.plan)
        except PlanMismatch as e:
            self.refuse(str(e))
            return
        self.root = root_class(self.plan)
        if self.root is None:
            _say("the plan splits nothing (sequential): the program runs unmodified")
            return
        self.is_compiling = torch.compiler.is_compiling
        # Under torch.compile the root's first call attaches in a graph
        # break, as eagerly; dynamo calls traced_whole while it traces
        # (assume_constant_result) and bakes in the answer.
        self.attach_eagerly = torch.compiler.disable(self.attach)
        self.traced_whole = torch._dynamo.assume_constant_result(
            lambda: self.traced_whole_now())  # a function: dynamo marks no methods
        self.hook = nn_module.register_module_forward_pre_hook(self.pre_hook)

    def pre_hook(self, module, _args):
        if self.applier is not None or self.report.refused or type(module).__name__ != self.root:
            return
        if self.is_compiling() and self.traced_whole():
            return
        self.attach_eagerly(module)

    def traced_whole_now(self):
        """Whether dynamo, tracing a first call of the root now, traces it
        unplanned: where the graph break the plan attaches in would raise
        (_graph_break_raises). A strict torch.export records the original
        operators, and a later call attaches; a graph compiled whole runs
        them on every call, and refuses the plan."""
        why = _graph_break_raises()
        if why and why != _EXPORT_RECORDS:
            self.hook.remove()
            self.refuse(f"{_cut(self.root)}: {why}")
        return bool(why)

    def attach(self, module):
        self.hook.remove()
        try:
            self.applier = Applier(self.plan, os.environ.get("DYNAFLOW_APPLY_LIB"), self.verify,
                                   self.report, self.graphs)
            self.applier.on_refuse = self.refuse
            self.applier.attach(module, self.strict)
            # The runtime's worker threads are joined at interpreter exit,
            # before C++ static destructors run: left running, a rank of a
            # torch.distributed program sometimes aborted at exit.
            atexit.register(self.applier.detach)
            _say(f"{len(self.applier.forwards)} modules of {_cut(self.root)} run the plan")
            # torch looked up this call's forward before its hooks ran: when
            # the root is itself a unit, this first call runs the original.
            for f in self.applier.forwards:
                if f.module is module:
                    self.applier.report.unsplit_call(f"{f.path}: {_ATTACHED}")
        except PlanMismatch as e:
            if self.applier is not None:
                self.applier.detach()
            self.refuse(str(e))
        except Exception as e:  # noqa: BLE001 - attaching must not take the program down
            if self.applier is not None:
                self.applier.detach()
            self.refuse(f"cannot attach to {_cut(self.root)}: {type(e).__name__}: {e}")

    def refuse(self, message, outcome=_UNMODIFIED):
        if outcome not in _KIND_OUTCOMES or self.strict:  # a kind's goes on (refuse_kind)
            self.report.refused = self.report.refused or message  # Applier.refuse's, or the first
        _say(f"plan refused: {message}; " + ("exiting (--strict)" if self.strict else outcome))
        if self.strict:
            self.write_report()
            sys.stdout.flush()
            os._exit(2)

    def write_report(self):
        """This process's summary, <DYNAFLOW_APPLY_REPORT>/<pid>.json: the CLI
        merges those of every process of the program (ranks, workers). That
        the plan's model never ran here is said by the CLI, and only when it
        ran in no process; without the CLI, here."""
        out = self.report.as_json(self.verify)
        out["ran_model"] = self.applier is not None
        out["refusal_said"] = bool(self.report.refused)
        if self.plan is not None and self.root is not None and self.applier is None \
                and not self.report.refused:
            out["refused"] = f"no module {_cut(self.root)} ran"
            if not self.report_path:
                _say(f"plan not applied: {out['refused']}")
        if not self.report_path:
            return
        path = os.path.join(self.report_path, f"{os.getpid()}.json")
        try:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(out, f)
        except OSError as e:
            _say(f"cannot write {path}: {e}")


def install_from_env():
    """Called by the bootstrap right after torch is imported."""
    _FromEnvironment().install()
