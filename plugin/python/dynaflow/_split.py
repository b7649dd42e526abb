"""Splits one module call into micro-batches, and merges them back, only where
that is provably the same as the unsplit call.

Contract: `split_call(...)` either returns a `CallSplit` whose micro-batch
arguments, run one after the other or concurrently, produce (after
`merge_outputs` and `merge_state`) the outputs and the state the unsplit call
would have produced, or raises `Refusal` naming the argument it cannot prove
safe. It runs nothing and mutates nothing, so a refusal leaves the call free to
run the original way, once.

What is proved safe:
  - immutable values (None, bools, numbers, strings, dtypes, devices): shared;
  - plain strided tensors (no subclass, sparse or nested tensor) whose first
    dimension is the batch (and that have at least two
    dimensions, or a name known to be per row): split into row views (narrow,
    no copy), so in-place writes land in the caller's rows;
  - tensors that are not per row (first dimension 1, scalars, or known shared
    names such as `cache_position`): shared, and checked unmodified after the
    call (their version counter), since a write to a shared input by several
    micro-batches would be a wrong answer;
  - tuples, lists, dicts and dataclasses of the above, rebuilt with their type;
  - state objects through the adapters of `STATE_ADAPTERS` (the Hugging Face
    Cache classes): each micro-batch gets its own view of the state and the
    views are merged back after the call, so the state afterwards equals the
    unsplit call's.
Anything else (another object, an ambiguous 1-D tensor as long as the batch,
a cache class or layer with attributes its adapter does not know) refuses, as
does a module that computes across rows or has hooks inside (`check_module`).

Where the replay module is loaded, `split_call` and `merge_outputs` walk in C++
(plugin/torch/call_split.h), which handles tensors, tuples, lists and dicts
itself and hands every other value, and every refusal, to the Python walk
here, so that both give the same result.
"""

import collections
import contextlib
import copy
import dataclasses
import decimal
import enum
import functools
import operator
import sys
import threading
import weakref

# Tensor arguments that are never per row, whatever their shape: positions in
# the sequence shared by every row (Hugging Face's `cache_position`).
SHARED_TENSOR_NAMES = frozenset({"cache_position"})


class Refusal(Exception):
    """The call cannot be split safely; the message names the argument."""


class Unsplittable(Exception):
    """This call cannot be split, for a reason that passes: a lazy module's
    first call, a caller collecting the unit's submodules' outputs. The call
    runs the original way and the plan stays; the message names the module."""


class MergeError(Exception):
    """Micro-batch outputs or state that cannot be put back together."""


@functools.cache
def _immutable_types():
    """The types besides Python's scalars whose values a split passes to
    every micro-batch as they are (C++ knows the scalars: call_split.h)."""
    import torch

    return (enum.Enum, torch.dtype, torch.device, torch.Size, type(Ellipsis))


def _is_immutable(value):
    return value is None or isinstance(value, (bool, int, float, complex, str, bytes)) or \
        isinstance(value, _immutable_types())


class OutputAliases(collections.namedtuple("OutputAliases", "returned viewed",
                                          defaults=(frozenset(), False))):
    """What an unsplit call's output shares (output_aliases, asked of the
    audited first call of each kind), which the merge of its later calls
    keeps: `returned`, where (in _merge's names) it returned an argument
    itself, the only places a micro-batches' return of their row views of
    it merges as that argument (elsewhere the unsplit call made a tensor of
    its own: `x.contiguous()` returns a one-row view of a padded buffer
    itself, but copies the whole buffer); `viewed`, whether a tensor of it
    is a view of another (then output_views looks for them)."""


def output_aliases(out, args, kwargs):
    """The OutputAliases of output `out` of an unsplit call of `args` and
    `kwargs`."""
    passed = {id(t) for _, t in _tensor_leaves((args, kwargs), "", ())}
    returned, memories, viewed = set(), {}, False
    for where, t in _tensor_leaves(out, "output", ()):
        if id(t) in passed:
            returned.add(where)
        address = _storage_address(t)
        if address is not None:
            viewed = viewed or memories.setdefault(address, t) is not t
    return OutputAliases(frozenset(returned), viewed)


class CallSplit:
    """One call's arguments per micro-batch, and what must be merged or
    checked afterwards."""

    def __init__(self, bounds):
        self.bounds = bounds
        self.parts = len(bounds) - 1
        self.states = []  # (adapter, original, [per micro-batch view])
        self.shared = []  # (what, tensor, Unchanged) of arguments
        self.args = None  # [tuple] per micro-batch
        self.kwargs = None  # [dict] per micro-batch
        self.slices = None  # SliceMerge of the call's run, where it has one
        self.row_views = {}  # id(row view of an argument) -> (the argument, micro-batch)
        self.module_state = None  # ModuleState of the unit, where share_buffers was called
        self.output_views = {}  # merge_outputs': its outputs that are views of others
        self.aliases = OutputAliases()  # what the audited unsplit call's output shared
        # Whether the merge may read device values on the host: not in a
        # call that runs under a graph capture (_graphs; nothing has run to
        # read), nor in the warm-up before it, which must run as it will.
        self.host_reads = True

    def rows(self, i):
        return self.bounds[i], self.bounds[i + 1] - self.bounds[i]

    def share_buffers(self, modules):
        """The unit's own state is read by every micro-batch (ModuleState of
        its (path, module) pairs, as check_module returns them): checked left
        as it was after the call. Taken and checked in C++ where the replay
        module is loaded (plugin/torch/module_state.h, ModuleState's
        contract)."""
        native = _native_module_state()
        self.module_state = ModuleState(modules) if native is None else \
            _CheckedNatively(native(modules, _module_tables(), Unchanged))

    def share(self, name, tensor):
        """Argument `name` is read by every micro-batch: checked unmodified."""
        self.shared.append((f"argument {name}", tensor, Unchanged(tensor)))

    def check_shared_unmodified(self):
        """Raises MergeError when a micro-batch wrote to a shared input, or
        changed the module's own state (ModuleState.check)."""
        for what, tensor, unchanged in self.shared:
            if not unchanged(tensor):
                raise MergeError(f"{what} {_MODIFIED}")
        if self.module_state is not None:
            self.module_state.check()

    def merge_state(self):
        lengths = SameLengths() if self.host_reads else None
        for adapter, original, views in self.states:
            adapter.merge(original, views, self.bounds, lengths)
        if lengths is not None:
            lengths.check()

    def state_originals(self):
        return [original for _, original, _ in self.states]


class SameLengths:
    """The positions a call's micro-batches counted in each static cache
    layer they wrote (device tensors, one per micro-batch), which must be
    the same: read on the host once per call, one read per device, where a
    read per layer was a device synchronisation each on eager CUDA (a
    decoder's whole stack as the unit merges every layer in one call)."""

    def __init__(self):
        self.layers = []  # per layer: its micro-batches' lengths

    def add(self, lengths):
        self.layers.append(lengths)

    def check(self):
        """Raises MergeError when the micro-batches of a layer differ."""
        import torch

        on = {}  # device -> the lengths on it, in the order of self.layers
        for lengths in self.layers:
            for t in lengths:
                on.setdefault(t.device, []).append(t.reshape(1))
        read = {device: iter(torch.cat(ts).tolist()) for device, ts in on.items()}
        for lengths in self.layers:
            values = sorted({next(read[t.device]) for t in lengths})
            if len(values) != 1:
                raise MergeError(f"micro-batches wrote different lengths {values} into a static "
                                 f"cache layer")


_MODIFIED = ("is shared by the micro-batches and was modified in place: the split result "
             "would be wrong")


class ModuleState:
    """What a split call must leave as it found it in the unit's modules.
    Every micro-batch runs the same modules, so what the call writes there
    is written once per micro-batch:
      - their tensors (buffers, parameters, tensors kept as plain attributes,
        such as a hand-written KV cache): checked still bound (not rebound,
        `self.n = self.n + 1`) and unmodified in place (version counters; an
        inference-mode weight or cache has none, and copying its bytes on
        every call would cost more than the call, so only its binding is
        checked, but an inference buffer's bytes are);
      - their other attributes (`_python_state`): a counter, a flag, a list
        appended to, an attribute set to an output.
    Kept in flat lists of references and ints, whatever the number of
    modules: one record object per module or tensor would keep so many
    objects alive through the call that CPython's cyclic collector ran inside
    it (docs/performance.md: a 32-layer Llama's 421 modules)."""

    def __init__(self, modules):
        self.paths, self.modules, self.starts = [], [], []  # per module
        self.state = []  # every module's _python_state, in order
        self.kept = []   # the objects `state` holds by id
        # Per tensor: the index of its module, kind, name, the tensor, and its
        # version (None: checked by binding; an Unchanged: by its bytes).
        self.owners, self.kinds, self.names, self.tensors, self.versions = [], [], [], [], []
        for path, m in modules:
            index = len(self.modules)
            attributes = vars(m)
            self.paths.append(path)
            self.modules.append(m)
            self.starts.append(len(self.state))
            names = []
            _python_state(attributes, self.state, self.kept, names)
            for kind, tensors in (("buffer", m._buffers), ("parameter", m._parameters),
                                  ("attribute", {k: attributes[k] for k in names})):
                for name, t in tensors.items():
                    if t is None:
                        continue
                    self.owners.append(index)
                    self.kinds.append(kind)
                    self.names.append(name)
                    self.tensors.append(t)
                    if not t.is_inference():
                        self.versions.append(t._version)
                    else:
                        self.versions.append(Unchanged(t) if kind == "buffer" else None)
        self.starts.append(len(self.state))

    def check(self):
        """Raises MergeError naming the first tensor or attribute changed."""
        for j, t in enumerate(self.tensors):
            m, kind, name = self.modules[self.owners[j]], self.kinds[j], self.names[j]
            version = self.versions[j]
            if _owned(m, kind, name) is not t:
                raise MergeError(f"{kind} {self._where(self.owners[j], name)} is shared by "
                                 f"the micro-batches and was replaced: the split result would "
                                 f"be wrong")
            if version is None:
                continue
            if not (version(t) if isinstance(version, Unchanged) else t._version == version):
                raise MergeError(f"{kind} {self._where(self.owners[j], name)} {_MODIFIED}")
        for i, m in enumerate(self.modules):
            after = []
            _python_state(vars(m), after)
            before = self.state[self.starts[i]:self.starts[i + 1]]
            name = _first_change(before, after) if after != before else None
            if name is not None:
                raise MergeError(f"attribute {self._where(i, name)} of the module was changed "
                                 f"by the call, once per micro-batch: the split result would "
                                 f"not be the unsplit call's")

    def _where(self, index, name):
        return f"{self.paths[index]}.{name}" if self.paths[index] else name

    def named_tensors(self):
        """(kind and name, tensor) of each tensor of the modules."""
        for j, t in enumerate(self.tensors):
            yield f"{self.kinds[j]} {self._where(self.owners[j], self.names[j])}", t


# A module's Python state that a call could change once per micro-batch: a
# counter (`self.calls += 1`), a flag, a list it appends to or whose entry it
# replaces (`self.cache[i] = torch.cat(...)`), an attribute it sets
# (`self.last = y`). Scalars by value, containers by their entries'
# identities (nn.Module's own tables by length), anything else by identity.
# Not tuples by value: comparing one that holds tensors would compare the
# tensors' elements.
_SCALAR_TYPES = frozenset({type(None), bool, int, float, complex, str, bytes})
_CONTAINER_TYPES = frozenset({dict, list, set, collections.OrderedDict})


def _python_state(attributes, state, kept=None, tensors=None):
    """Appends to `state` (a list) a (name, type, value) triple for every
    attribute of `vars(module)`: the value itself for a type of
    `_SCALAR_TYPES`, `_entries` for one of `_CONTAINER_TYPES` (exactly: a
    subclass is compared as an object), the object's id for any other (a
    tensor, a tuple, a config), so that rebinding, adding or deleting any
    attribute shows, and appending to a list or replacing an entry.
    References and ints only, nothing the collector tracks. With `kept` (a
    list), keeps there the objects compared by id, so that no other object
    takes an id while the state is held; with `tensors`, appends the names of
    tensor attributes."""
    import torch

    tables = _module_tables()
    for k, v in attributes.items():
        t = type(v)
        if t in _SCALAR_TYPES:
            state += (k, t, v)
        elif t in _CONTAINER_TYPES:  # most are empty hook tables
            state += (k, t, (len(v) if k in tables else _entries(v)) if v else 0)
            if kept is not None and v and k not in tables:
                # Entries compared by id: kept alive, so that an entry
                # replaced by the call cannot take a freed one's id.
                kept.extend(v.values() if isinstance(v, dict) else v)
        else:
            state += (k, t, id(v))
            if kept is not None:
                kept.append(v)
            if tensors is not None and issubclass(t, torch.Tensor):
                tensors.append(k)


@functools.cache
def _module_tables():
    """The names of the tables every nn.Module keeps (parameters, buffers,
    submodules, hooks): compared by length only, which keeps the check cheap
    (their tensors are checked by binding and version, hooks by
    check_module)."""
    from torch import nn

    return frozenset(vars(nn.Module()))


def _entries(container):
    """An int that changes when an entry of `container` is added, removed or
    replaced by another object: a hash of its length and of its entries'
    identities (a dict's keys and values), computed without keeping them."""
    if type(container) in (dict, collections.OrderedDict):
        return hash((len(container), tuple(container), tuple(map(id, container.values()))))
    if type(container) is set:
        return hash((len(container), frozenset(map(id, container))))
    return hash((len(container), tuple(map(id, container))))


def _first_change(before, after):
    """The name of the first attribute whose entry differs in two
    _python_state lists, or None when only their order differs (an
    attribute deleted and set again to the same value)."""
    def entries(state):
        return {state[k]: state[k + 1:k + 3] for k in range(0, len(state), 3)}

    b, a = entries(before), entries(after)
    return next((k for k in [*b, *a] if b.get(k) != a.get(k)), None)


class ContextState:
    """The caller's context variables (`contextvars`) as a split call must
    leave them. _apply runs each micro-batch in a copy of the caller's
    context, so a variable the call sets and does not reset would be set
    once per micro-batch, in contexts the caller never sees; a container or
    tensor a variable holds is shared by the copies, so an entry the call
    adds or replaces, or an in-place write, would be made once per
    micro-batch. Compared as `_python_state` compares a module's attributes
    (a container by its entries, one level deep), tensors also by their
    version counters. A variable the caller's context lacks that the call
    leaves holding a library's lazily made default (`_made_lazily`) is not a
    change: the caller's context makes its own when it asks."""

    def __init__(self, context):
        self.variables = dict(context.items())
        self.state, self.kept = [], []
        _python_state(self.variables, self.state, self.kept)
        self.versions = _versions(self.variables)

    def change(self, context):
        """The name of the first variable `context` holds another value of
        (or a container of changed entries, a tensor written), or None."""
        variables = {var: value for var, value in context.items()
                     if var in self.variables or not _made_lazily(var, value)}
        after = []
        _python_state(variables, after)
        var = _first_change(self.state, after) if after != self.state else None
        if var is None:
            versions = _versions(variables)
            var = next((v for v, n in self.versions.items() if versions.get(v) != n), None)
        return None if var is None else var.name

    def check(self, context):
        """Raises MergeError naming the first variable `context` changed, as
        ModuleState.check does for the modules."""
        name = self.change(context)
        if name is not None:
            raise MergeError(f"context variable {name} was changed by the call, once per "
                             f"micro-batch: the split result would not be the unsplit call's")


def _versions(variables):
    """{variable: version counter} of the variables holding a tensor that
    has one (an inference tensor has none)."""
    import torch

    return {var: value._version for var, value in variables.items()
            if isinstance(value, torch.Tensor) and not value.is_inference()}


def _made_lazily(var, value):
    """Whether `value` is what a library sets a variable to on its first use
    in a context: an empty container (torch.compile's `_vt_active_calls`, a
    set made when its get() gives None), or the decimal module's context
    (decimal.getcontext(); sympy in torch.compile's shape reasoning calls
    it)."""
    if type(value) in _CONTAINER_TYPES:
        return not value
    return var.name == "decimal_context" and isinstance(value, decimal.Context)


# torch.compile's stance while any thread runs under one of dynaflow's
# dispatch modes (watching): the stance is the process's, not a thread's, so
# the first to enter sets it and the last to leave puts the program's back.
_EAGER_LOCK = threading.Lock()
_eager = {"threads": {}, "stance": None}  # threads: ident -> its modes entered


@contextlib.contextmanager
def watching(mode):
    """Enters the dispatch mode `mode` (an audit, a warm-up's watch, the
    waits of communication overlap) with torch.compile'd code run eagerly,
    on every thread, until the last such mode is left: its operators are
    then the mode's to see, and dynamo leaves its cache alone. A function
    dynamo first runs under a dispatch mode is not compiled again, ever,
    and some fail at their next call without one (torch 2.11:
    flex_attention gives "Attempted to call function marked as skipped")."""
    import torch

    me, threads = threading.get_ident(), _eager["threads"]
    with _EAGER_LOCK:
        if not threads:
            _eager["stance"] = torch.compiler.set_stance("force_eager")
        threads[me] = threads.get(me, 0) + 1
    try:
        with mode:
            yield mode
    finally:
        with _EAGER_LOCK:
            threads[me] -= 1
            if not threads[me]:
                del threads[me]
            if not threads:
                _eager.pop("stance").__exit__(None, None, None)


def eager_after_fork_in_child():
    """In a child forked while other threads were inside `watching`: those
    threads are the parent's and never leave here, so their share of the
    stance is dropped (the child's torch.compile'd code ran eagerly for
    good), and the lock, which one of them may have held, is made anew."""
    global _EAGER_LOCK
    _EAGER_LOCK = threading.Lock()
    threads, me = _eager["threads"], threading.get_ident()
    if threads and me not in threads:
        _eager.pop("stance").__exit__(None, None, None)
    for ident in [t for t in threads if t != me]:
        del threads[ident]


def _owned(module, kind, name):
    """The tensor `module` holds now as its buffer, parameter or attribute `name`."""
    if kind == "buffer":
        return module._buffers.get(name)
    if kind == "parameter":
        return module._parameters.get(name)
    return vars(module).get(name)


class Unchanged:
    """Whether a tensor is as it was when this was made: by its version
    counter, which in-place writes through torch's operators bump; an
    inference tensor has none, so its bytes are kept and compared (shared
    inputs are small: positions, one-row masks), as they are `by_bytes`.
    A few kernels write without bumping it (batch norm's running statistics:
    refused apart, by check_module)."""

    def __init__(self, t, by_bytes=False):
        if by_bytes or t.is_inference():
            self.version = None
            self.bytes = _as_bytes(t).clone()
        else:
            self.version = t._version

    def __call__(self, t):
        if self.version is not None:
            return t._version == self.version
        import torch

        return torch.equal(_as_bytes(t), self.bytes)


def _as_bytes(t):
    """The tensor's elements as raw bytes (NaN compares equal to itself)."""
    import torch

    t = t.detach().contiguous()
    return t.reshape(-1).view(torch.uint8) if t.numel() else t.reshape(-1)


def kind_refusal(t):
    """Why tensor `t` is of a kind dynaflow cannot split or share, or "":
    a nested or sparse tensor, a subclass (whose narrow() raises or means
    another thing)."""
    import torch

    if t.layout != torch.strided or t.is_nested:
        return (f"has layout {t.layout}{' (nested)' if t.is_nested else ''}: only strided "
                f"tensors are split or shared")
    if type(t) not in (torch.Tensor, torch.nn.Parameter):
        return "is a tensor subclass, whose views and concatenation dynaflow does not know"
    return ""


class _Splitter:
    def __init__(self, module_path, batch, split):
        self.module_path = module_path
        self.batch = batch
        self.split = split

    def refuse(self, name, value, why=""):
        raise Refusal(f"{self.module_path}: argument {name} of type {type(value).__qualname__} "
                      f"{why or 'cannot be split or shared safely'}")

    def parts(self, name, value):
        """The value for each micro-batch (a list of `split.parts` values)."""
        import torch

        n = self.split.parts
        if _is_immutable(value):
            return [value] * n
        if isinstance(value, torch.Tensor):
            return self.tensor_parts(name, value)
        adapter = state_adapter(value)
        if adapter is not None:
            return self.state_parts(name, value, adapter)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return self.dataclass_parts(name, value)
        if isinstance(value, (tuple, list)):
            items = [self.parts(f"{name}[{k}]", v) for k, v in enumerate(value)]
            rebuild = _sequence_builder(value)
            return [rebuild([item[i] for item in items]) for i in range(n)]
        if isinstance(value, dict) and type(value) is dict:
            items = {k: self.parts(f"{name}[{k!r}]", v) for k, v in value.items()}
            return [{k: v[i] for k, v in items.items()} for i in range(n)]
        self.refuse(name, value)

    def tensor_parts(self, name, t):
        n = self.split.parts
        why = kind_refusal(t)
        if why:
            self.refuse(name, t, why)
        if name.endswith("position_ids") and t.dim() == 3:
            self.refuse(name, t, "has 3 dimensions: multimodal rotary positions hold the "
                                 "batch in dimension 1")
        per_row = t.dim() >= 1 and t.shape[0] == self.batch and name not in SHARED_TENSOR_NAMES
        if per_row and t.dim() == 1 and self.batch > 1:
            self.refuse(name, t, f"is 1-D with {self.batch} elements: it cannot be told "
                                 f"apart from a per-row value and a position")
        if per_row:
            views = [t.narrow(0, *self.split.rows(i)) for i in range(n)]
            for i, v in enumerate(views):
                self.split.row_views[id(v)] = (t, i)
            return views
        if t.dim() >= 1 and t.shape[0] not in (1, self.batch) and t.dim() >= 2 \
                and name not in SHARED_TENSOR_NAMES:
            self.refuse(name, t, f"has first dimension {t.shape[0]}, not the batch "
                                 f"({self.batch}) or 1")
        if t.is_inference() and _capturing(t):
            self.refuse(name, t, _UNCHECKABLE)
        self.split.share(name, t)
        return [t] * n

    def state_parts(self, name, value, adapter):
        why = adapter.refusal(value, self.batch)
        if why:
            self.refuse(name, value, why)
        views = adapter.views(value, self.split.bounds)
        self.split.states.append((adapter, value, views))
        return views

    def dataclass_parts(self, name, value):
        fields = {f.name: self.parts(f"{name}.{f.name}", getattr(value, f.name))
                  for f in dataclasses.fields(value) if f.init}
        return [dataclasses.replace(value, **{k: v[i] for k, v in fields.items()})
                for i in range(self.split.parts)]


def check_module(module_path, module):
    """Raises Refusal when running `module` once per micro-batch would not
    give the unsplit call's result whatever its arguments: a submodule that
    computes across the rows of its batch (`_check_rows_independent`), or a
    hook that would run once per micro-batch inside it (`_hook_refusal`), or,
    while a CUDA graph is captured, an inference buffer
    (`_check_buffers_checkable`); Unsplittable for this call only, while a
    lazy module has not inferred its parameters or a caller outside the unit
    collects its outputs. One walk over the submodules, on every call: hooks
    come and go. In C++ where the replay module is loaded (plugin/torch/
    call_guards.h: UnitWalk lists the modules and those that could refuse,
    which alone are looked at here), except under a capture, which looks at
    every module's buffers. Returns the (path, module) pairs it walked, for
    CallSplit.share_buffers."""
    from torch.nn.modules import module as nn_module

    collecting = _outputs_collected()
    capturing = _capture_underway()
    global_hooks = [("forward pre-", nn_module._global_forward_pre_hooks),
                    ("forward ", nn_module._global_forward_hooks),
                    ("backward pre-", nn_module._global_backward_pre_hooks),
                    ("backward ", nn_module._global_backward_hooks)]
    _check_hooks(f"{module_path} (a global module hook)", global_hooks, collecting)
    walk = None if capturing else _native_unit_walk()
    walked = None if walk is None else walk.walk(module)
    if walked is None:
        modules = looked_at = list(module.named_modules())
    else:
        modules, flagged = walked
        looked_at = [modules[i] for i in flagged]
    lazy, row_mixing = _lazy_module_type(), _row_mixing_types()
    for name, m in looked_at:
        if isinstance(m, lazy) and m.has_uninitialized_params():
            raise Unsplittable(f"{_path(module_path, name)}: {type(m).__name__} infers its "
                               f"parameters on its first call")
        if isinstance(m, row_mixing):
            _check_rows_independent(_path(module_path, name), m)
        if capturing:
            _check_buffers_checkable(_path(module_path, name), m)
        # The unit's own hooks run once, around the whole planned call.
        if m is not module and (m._forward_pre_hooks or m._forward_hooks or m._backward_pre_hooks
                     or m._backward_hooks):
            _check_hooks(_path(module_path, name), [("forward pre-", m._forward_pre_hooks),
                                                   ("forward ", m._forward_hooks),
                                                   ("backward pre-", m._backward_pre_hooks),
                                                   ("backward ", m._backward_hooks)], collecting)
    return modules


@functools.cache
def _native_unit_walk():
    """check_module's walk in C++ (plugin/torch/call_guards.h), or None
    without the replay module."""
    module = _replay_module()
    if module is None:
        return None
    from torch import nn

    return module.UnitWalk(nn.Module, (_lazy_module_type(), *_row_mixing_types()))


def _path(unit_path, name):
    """A submodule's path: `name` (from named_modules, "" for the unit) under the unit's."""
    return f"{unit_path}.{name}" if name else unit_path


def install_lazy_hooks(module):
    """Installs now what transformers 5 installs on a model's first call that
    asks for outputs (output_hidden_states, output_attentions): the output-
    capturing hooks of every PreTrainedModel in `module`, and the flag that
    says so. Done once, under transformers' lock, whichever thread calls, it
    leaves the state of the unsplit call, but as a change to the unit's
    modules inside a split call ModuleState could not tell it from a write
    repeated per micro-batch. Called when a plan is attached; the hooks do
    nothing while no call collects."""
    install = getattr(sys.modules.get(_HF_OUTPUT_CAPTURING), "maybe_install_capturing_hooks",
                      None)
    if install is None:
        return
    from transformers import PreTrainedModel

    for m in module.modules():
        if isinstance(m, PreTrainedModel):
            install(m)


def _check_hooks(where, hook_dicts, collecting):
    for kind, hooks in hook_dicts:
        for fn in hooks.values():
            why = _hook_refusal(fn, collecting)
            if why:
                name = getattr(fn, "__qualname__", type(fn).__name__)
                error = Unsplittable if why is _COLLECTED else Refusal
                raise error(f"{where}: {kind}hook {name} {why}")


def _hook_refusal(fn, collecting):
    """Why hook `fn`, run inside a split call, might not do what it does in
    the unsplit call, or None. It would run once per micro-batch and see part
    of the batch: a hook that counts calls, collects activations or moves
    weights (offloading) would be silently wrong, so only hooks known to keep
    per-thread state or none pass: dynaflow's own (module paths, segment
    turns: _apply._stage_pre_hook, around Python's or RegionTurns'), those of
    `_PER_ROW_HOOKS`, and transformers' output-capturing hook while nothing
    outside the unit collects (inside it, each micro-batch's thread collects
    its own)."""
    owner = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__name__", "")
    if owner.startswith("dynaflow.") or (owner, name) in _PER_ROW_HOOKS:
        return None
    if owner == _HF_OUTPUT_CAPTURING and name == "output_capturing_hook":
        return _COLLECTED if collecting else None
    return "would run once per micro-batch, on part of the batch"


# Why transformers' output-capturing hook stops a call from being split while
# a caller outside the unit collects: that call only (Unsplittable).
_COLLECTED = ("records outputs for the caller's output_attentions or output_hidden_states: "
              "each micro-batch would record its part of the batch apart")


# Hooks of other libraries known to act on each row alike and to keep no
# state: transformers' hook that gradient checkpointing puts on the input
# embeddings (`output.requires_grad_(True)`).
_PER_ROW_HOOKS = frozenset({("transformers.modeling_utils", "make_inputs_require_grads")})

# transformers 5's module of output-capturing hooks (install_output_capuring_hook):
# each hook appends to the collector of the context it runs in, set by the
# forward of the PreTrainedModel that was asked for those outputs.
_HF_OUTPUT_CAPTURING = "transformers.utils.output_capturing"


def _outputs_collected():
    """Whether a transformers forward running on this thread collects its
    submodules' outputs (its output_attentions or output_hidden_states)."""
    collector = getattr(sys.modules.get(_HF_OUTPUT_CAPTURING), "_active_collector", None)
    # Every capturing forward sets one: empty when its call asks for nothing.
    return collector is not None and bool(collector.get())


@functools.cache
def _lazy_module_type():
    from torch.nn.modules.lazy import LazyModuleMixin

    return LazyModuleMixin


@functools.cache
def _row_mixing_types():
    from torch import nn
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.instancenorm import _InstanceNorm

    return nn.MultiheadAttention, nn.RNNBase, _BatchNorm, _InstanceNorm


def _check_rows_independent(where, m):
    """Raises Refusal when module `m` computes across the rows of its batch:
    a batch norm that normalises by the batch's statistics (training mode,
    or no running statistics), or its dimension 0 is not the batch."""
    mha, rnn, batch_norm, instance_norm = _row_mixing_types()
    if isinstance(m, batch_norm) and (m.training or m.running_mean is None):
        raise Refusal(f"{where}: {type(m).__name__} normalises by the statistics of the "
                      f"whole batch: micro-batches would change its output")
    if isinstance(m, instance_norm) and m.training and m.track_running_stats:
        raise Refusal(f"{where}: {type(m).__name__} updates its running statistics on "
                      f"every call: each micro-batch would update them again")
    if isinstance(m, mha) and not m.batch_first:
        raise Refusal(f"{where}: {type(m).__name__} takes the sequence first "
                      f"(batch_first=False): dimension 0 is not the batch")
    if isinstance(m, rnn):
        raise Refusal(f"{where}: {type(m).__name__} returns its hidden state with the "
                      f"batch in dimension 1, and without batch_first its input too")


def _capture_underway():
    """Whether this thread's current CUDA stream is being captured into a
    CUDA graph; False, without initializing CUDA, while it is not."""
    import torch

    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def _capturing(t):
    """Whether `t` is on a CUDA device whose current stream is being captured
    into a CUDA graph: nothing runs then, so its bytes cannot be read (and
    reading them would end the capture)."""
    return t.is_cuda and _capture_underway()


# Why a shared inference tensor refuses a split under capture: it has no
# version counter, so only its bytes could show a write (Unchanged).
_UNCHECKABLE = ("is an inference tensor shared by the micro-batches: without a version "
                "counter only its bytes could show a write, and while a CUDA graph is "
                "captured nothing runs to compare")


def inference_buffers(m):
    """The names and buffers of module `m` (not of its children) that could
    be checked unchanged only by their bytes (inference tensors: no version
    counter), which nothing can compare while a CUDA graph is captured."""
    return [(name, b) for name, b in m._buffers.items() if b is not None and b.is_inference()]


def _check_buffers_checkable(where, m):
    """Raises Refusal when an inference buffer of module `m` is on a device
    whose stream is being captured into a CUDA graph."""
    for name, b in inference_buffers(m):
        if _capturing(b):
            raise Refusal(f"{where}: buffer {name} {_UNCHECKABLE}")


def _sequence_builder(value):
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return lambda items: type(value)(*items)
    if type(value) in (tuple, list):
        return type(value)
    return lambda items: type(value)(items)


def split_call(module_path, signature, args, kwargs, batch, bounds):
    """The micro-batch arguments of one call, or Refusal. `signature` (of the
    original forward, may be None) names positional arguments in messages and
    in the shared-name rules."""
    split = CallSplit(bounds)
    names = _positional_names(signature, len(args))
    s = _Splitter(module_path, batch, split)
    native = _native_splitter()
    try:
        if native is not None:  # the same walk in C++, with s for what it leaves to Python
            split.args, split.kwargs = native.split(s, names, args, kwargs)
            return split
        arg_parts = [s.parts(names[k], a) for k, a in enumerate(args)]
        kwarg_parts = {k: s.parts(k, v) for k, v in kwargs.items()}
    except RecursionError:
        raise Refusal(f"{module_path}: an argument is nested too deep to split, or holds "
                      f"itself") from None
    except Refusal:
        raise
    except Exception as e:  # noqa: BLE001 - a value's own code (its __repr__, an adapter's read)
        raise Refusal(f"{module_path}: its arguments could not be walked to split them: "
                      f"{type(e).__qualname__}: {_first_line(e)}") from None
    split.args = [tuple(p[i] for p in arg_parts) for i in range(split.parts)]
    split.kwargs = [{k: v[i] for k, v in kwarg_parts.items()} for i in range(split.parts)]
    return split


def _first_line(e):
    """The first line of exception `e`'s message, at most 200 characters."""
    text = str(e).strip()
    return (text.splitlines()[0] if text else "")[:200]


# The replay module once looked for: [the module, or None without it].
_REPLAY_MODULE = []


def _replay_module():
    """The replay module (plugin/torch/replay_module.cc), or None when it is
    not loaded (`_graphs._native` says why where graphs are asked for).
    Looked for once per process."""
    if not _REPLAY_MODULE:
        from ._graphs import NoGraph, _native

        try:
            _REPLAY_MODULE.append(_native()[0])
        except NoGraph:
            _REPLAY_MODULE.append(None)
    return _REPLAY_MODULE[0]


@functools.cache
def _native_splitter():
    """split_call's walk in C++ (plugin/torch/call_split.h: the same result,
    refusals left to _Splitter), or None without the replay module."""
    module = _replay_module()
    return None if module is None else module.CallSplitter(_immutable_types(),
                                                           SHARED_TENSOR_NAMES)


def _native_module_state():
    """ModuleState in C++ (plugin/torch/module_state.h), or None without the
    replay module."""
    module = _replay_module()
    return None if module is None else module.ModuleState


class _CheckedNatively:
    """A C++ ModuleState, checked as the Python one is: MergeError naming
    the first change."""

    def __init__(self, state):
        self.state = state

    def check(self):
        why = self.state.check()
        if why:
            raise MergeError(why)


def _positional_names(signature, count):
    names = []
    if signature is not None:
        for p in signature.parameters.values():
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                names.append(p.name)
            elif p.kind == p.VAR_POSITIONAL:
                break
    names = names[:count]
    return names + [f"args[{k}]" for k in range(len(names), count)]


def merge_outputs(split, results, states):
    """The unsplit call's output from the micro-batches' `results`. A state
    view returned by a micro-batch is replaced by its original; tensors
    each micro-batch returns at several places are merged once, so that
    they are one tensor there too."""
    view_owner = {}
    for adapter, original, views in split.states:
        for v in views:
            view_owner[id(v)] = original
    try:
        # The audit saw no output viewing another: nothing to look for.
        split.output_views = output_views(split, results) if split.aliases.viewed else {}
        native = _native_splitter()
        if native is not None and not split.output_views:
            # The same walk in C++, with _merge for what it leaves to Python.
            return native.merge(split, list(results), view_owner, _merge)
        return _merge(split, results, "output", view_owner, {})
    except RecursionError:
        raise MergeError("the output is nested too deep to merge, or holds itself") from None


# Output fields that hold one row per token of the batch, flattened
# batch-major ([rows x tokens, ...]), one tensor per layer: transformers'
# mixture-of-experts router logits (its sparse MoE blocks route
# `hidden_states.view(-1, hidden_size)`). Micro-batch i's rows come first in
# the unsplit call's flattening after those of micro-batches before it, so the
# concatenation is the unsplit call's tensor.
_PER_TOKEN_FIELDS = frozenset({"router_logits"})


def _per_token_field(output, name):
    return name in _PER_TOKEN_FIELDS and type(output).__module__.startswith("transformers.")


def _merge(split, parts, where, view_owner, merged, per_token=False):
    """`merged`: {ids of the parts: the merged tensor} of this merge."""
    import torch

    first = parts[0]
    if id(first) in view_owner:
        if any(view_owner.get(id(p)) is not view_owner[id(first)] for p in parts):
            raise MergeError(f"{where}: micro-batches return different state objects")
        return view_owner[id(first)]
    if isinstance(first, torch.Tensor):
        key = tuple(map(id, parts))  # the parts are alive: their ids are theirs
        if key not in merged:
            view = split.output_views.get(key)
            if view is not None:  # rebuilt as a view of its merged base
                base_key, bases, geometry, base_where = view
                if base_key not in merged:
                    merged[base_key] = _merge_tensors(split, bases, base_where)
                merged[key] = _view_of_merged(merged[base_key], geometry, where)
            else:
                merged[key] = (_merge_per_token if per_token else _merge_tensors)(split, parts,
                                                                                 where)
        return merged[key]
    adapter = state_adapter(first)
    if adapter is not None:
        # State made inside the call (a cache the module created because
        # none was passed): one per micro-batch, stacked by rows.
        if any(type(p) is not type(first) for p in parts):
            raise MergeError(f"{where}: micro-batches return different state types")
        return adapter.concat(parts, f"{where}")
    if _is_immutable(first):
        if any(p != first for p in parts):
            raise MergeError(f"{where}: micro-batches return different values")
        if all(_row_count_of(p) == split.rows(i)[1] for i, p in enumerate(parts)):
            # Most likely the batch size (x.shape[0], or x.shape), which the
            # unsplit call returns whole: refused rather than guessed.
            raise MergeError(f"{where}: each micro-batch returns its own row count "
                             f"({_row_count_of(first)}), likely the batch size, which the "
                             f"unsplit call returns whole")
        return first
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        fields = {f.name: _merge(split, [getattr(p, f.name) for p in parts], f"{where}.{f.name}",
                                 view_owner, merged, per_token or _per_token_field(first, f.name))
                  for f in dataclasses.fields(first) if f.init}
        return type(first)(**fields)
    if isinstance(first, (tuple, list)):
        if any(not isinstance(p, type(first)) or len(p) != len(first) for p in parts):
            raise MergeError(f"{where}: micro-batches return sequences of different lengths")
        items = [_merge(split, [p[k] for p in parts], f"{where}[{k}]", view_owner, merged,
                        per_token)
                 for k in range(len(first))]
        return _sequence_builder(first)(items)
    if type(first) is dict:
        if any(type(p) is not dict or p.keys() != first.keys() for p in parts):
            raise MergeError(f"{where}: micro-batches return dicts with different keys")
        return {k: _merge(split, [p[k] for p in parts], f"{where}[{k!r}]", view_owner, merged,
                          per_token)
                for k in first}
    raise MergeError(f"{where}: cannot merge a {type(first).__qualname__}")


def _row_count_of(value):
    """The batch size an immutable output may carry: an int, or a shape's
    first dimension; None for anything else."""
    import torch

    if type(value) is int:
        return value
    if isinstance(value, torch.Size) and len(value) > 0:
        return value[0]
    return None


def _merge_tensors(split, parts, where):
    import torch

    # Each micro-batch returns its own rows of one argument (a layer that
    # updates its input in place and returns it), where the unsplit call
    # returned that argument itself, which the views wrote through to.
    owners = [split.row_views.get(id(p)) for p in parts]
    if where in split.aliases.returned and owners[0] is not None and \
            all(o is not None and o[0] is owners[0][0] and o[1] == i for i, o in enumerate(owners)):
        return owners[0][0]

    for i, p in enumerate(parts):
        _, count = split.rows(i)
        if not isinstance(p, torch.Tensor) or p.dim() < 1 or p.shape[0] != count:
            raise MergeError(f"{where}: micro-batch {i} returns "
                             f"{tuple(p.shape) if isinstance(p, torch.Tensor) else type(p)}, "
                             f"not {count} rows")
    whole = split.slices.whole(where, parts) if split.slices is not None else None
    return whole if whole is not None else torch.cat(parts, 0)


def _merge_per_token(split, parts, where):
    """Tensors of `_PER_TOKEN_FIELDS`: micro-batch i returns rows_i x tokens
    rows, the same number of tokens for each."""
    import torch

    tokens = set()
    for i, p in enumerate(parts):
        _, count = split.rows(i)
        if not isinstance(p, torch.Tensor) or p.dim() < 1 or p.shape[0] % count:
            raise MergeError(f"{where}: micro-batch {i} returns "
                             f"{tuple(p.shape) if isinstance(p, torch.Tensor) else type(p)}, "
                             f"not one row per token of its {count} rows")
        tokens.add(p.shape[0] // count)
    if len(tokens) != 1:
        raise MergeError(f"{where}: the micro-batches return {sorted(tokens)} tokens per row")
    return torch.cat(parts, 0)


def _empty_for(stream, shape, like):
    """An empty tensor of `shape` with `like`'s dtype and device, for a
    merge: on CUDA allocated on `stream`, the caller's, which uses it after
    the call (None: the current stream), while the micro-batches' streams
    write their rows of it and record themselves on it."""
    import torch

    with torch.cuda.stream(stream) if like.is_cuda and stream is not None else \
            contextlib.nullcontext():
        return torch.empty(shape, dtype=like.dtype, device=like.device)


class SliceMerge:
    """Merges the micro-batches' tensor outputs as each micro-batch finishes,
    not by one concatenation after the last: the first micro-batch to return
    an output allocates it once at the whole batch's size, and each copies its
    rows into its slice, from its own host thread and (on CUDA) on its stream,
    beside the micro-batches still running. So when the region ends the
    output is whole, and each micro-batch's result can be freed as soon as it
    is copied. `dynaflow apply` uses it on CUDA (`_apply.SLICES_ON_CPU`).

    Contract: `put(mb, result)` takes the tensors `merge_outputs` would
    concatenate, found by the same paths (`_tensor_leaves` walks what `_merge`
    walks); `whole(where, parts)` returns the merged tensor only when every
    micro-batch put exactly the tensor `_merge` is given for that path, else
    None and the merge concatenates, as without this. Left to the
    concatenation: non-contiguous tensors (so the layout is torch.cat's), and,
    under autograd, tensors that require grad (in-place writes into one base
    from several threads would race on its autograd history)."""

    def __init__(self, split, caller_stream=None):
        self.split = split
        self.caller_stream = caller_stream  # CUDA: the stream the output is used on
        self.skip = {id(v) for _, _, views in split.states for v in views}
        self.lock = threading.Lock()
        self.outputs = {}  # where -> the whole output
        self.taken = {}    # (where, micro-batch) -> the tensor it put

    def put(self, mb, result):
        import torch

        begin, count = self.split.rows(mb)
        grad = torch.is_grad_enabled()
        done = set()  # a tensor at several places is merged once (_merge)
        for where, t in _tensor_leaves(result, "output", self.skip):
            if t.dim() < 1 or t.shape[0] != count or not t.is_contiguous() or \
                    (grad and t.requires_grad) or id(t) in done:
                continue
            done.add(id(t))
            whole = self._whole_for(where, t)
            if whole is None:
                continue
            whole.narrow(0, begin, count).copy_(t)
            if t.is_cuda:  # written on this micro-batch's stream (torch's rule)
                whole.record_stream(torch.cuda.current_stream(t.device))
            self.taken[(where, mb)] = t

    def _whole_for(self, where, t):
        """The output at `where`, allocated by the first micro-batch that
        returns it; None when `t` does not fit it (merged by concatenation)."""
        with self.lock:
            whole = self.outputs.get(where)
            if whole is None:
                whole = self.outputs[where] = _empty_for(
                    self.caller_stream, (self.split.bounds[-1],) + tuple(t.shape[1:]), t)
        if whole.dtype != t.dtype or whole.device != t.device or whole.shape[1:] != t.shape[1:]:
            return None
        return whole

    def whole(self, where, parts):
        if all(self.taken.get((where, i)) is p for i, p in enumerate(parts)):
            return self.outputs.get(where)
        return None


def _tensor_leaves(value, where, skip):
    """(path, tensor) of each tensor `_merge` would reach in `value`, with
    `_merge`'s path names; state (views in `skip`, adapted objects) is not
    walked."""
    import torch

    if id(value) in skip or _is_immutable(value):
        return
    if isinstance(value, torch.Tensor):
        yield where, value
    elif state_adapter(value) is not None:
        return
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            if f.init:
                yield from _tensor_leaves(getattr(value, f.name), f"{where}.{f.name}", skip)
    elif isinstance(value, (tuple, list)):
        for k, item in enumerate(value):
            yield from _tensor_leaves(item, f"{where}[{k}]", skip)
    elif type(value) is dict:
        for k, item in value.items():
            yield from _tensor_leaves(item, f"{where}[{k!r}]", skip)


# --- state adapters -----------------------------------------------------------


def _shallow_copy(value):
    """copy.copy(value), in a fifth of its time where the copy is the
    object's __dict__ (`_copied_by_dict`): an adapter copies every layer of a
    cache per micro-batch, on every call (32 layers: 64 copies)."""
    cls = type(value)
    if not _copied_by_dict(cls):
        return copy.copy(value)
    out = cls.__new__(cls)  # as copyreg.__newobj__
    out.__dict__.update(value.__dict__)
    return out


@functools.cache
def _copied_by_dict(cls):
    """Whether copy.copy of an instance of `cls` makes a `cls.__new__(cls)`
    and updates its __dict__ with the instance's: no class in its MRO but
    object (and abc.ABC's empty __slots__) defines how it is copied,
    reduced or pickled, or slots."""
    import abc

    own = ("__copy__", "__reduce_ex__", "__reduce__", "__getstate__", "__setstate__",
           "__getnewargs__", "__getnewargs_ex__", "__slots__")
    return not any(name in vars(c) for c in cls.__mro__ if c not in (object, abc.ABC)
                   for name in own)


class _CacheAdapter:
    """Hugging Face `transformers.cache_utils` caches made of per-layer objects
    (DynamicCache, StaticCache and what `generate()` builds from them). A
    micro-batch gets a shallow copy of the cache whose layers are views of its
    rows; after the call the views' updates are merged into the original layers
    with the layer's adapter."""

    # Cache attributes this adapter knows; any other refuses (another
    # transformers version may keep state it would not merge).
    # `_is_user_defined` is the flag generate() sets on a cache its caller
    # passed (a conversation's next turn): read by generate() outside the
    # model, never written by a forward, so the micro-batches' copies share it.
    KNOWN = frozenset({"layers", "layer_class_to_replicate", "offloading", "_is_user_defined"})

    def __init__(self, layer_adapters):
        self.layer_adapters = layer_adapters

    def refusal(self, cache, batch):
        """Why `cache` cannot be split for `batch` rows (None: any), or ""."""
        unknown = sorted(set(vars(cache)) - self.KNOWN)
        if unknown:
            return f"keeps state this version of dynaflow cannot split ({', '.join(unknown)})"
        if getattr(cache, "offloading", False):
            return "is offloaded to the host"
        for k, layer in enumerate(cache.layers):
            adapter = self.layer_adapters.get(type(layer))
            if adapter is None:
                return f"has a layer of type {type(layer).__qualname__} (layer {k})"
            why = adapter.refusal(layer, batch)
            if why:
                return f"layer {k}: {why}"
        if cache.layer_class_to_replicate is not None and \
                cache.layer_class_to_replicate not in self.layer_adapters:
            return f"grows layers of type {cache.layer_class_to_replicate.__qualname__}"
        return ""

    def row_tensors(self, cache):
        """The tensors of `cache` that hold the batch's rows (dimension 0)."""
        return [t for layer in cache.layers for t in (getattr(layer, "keys", None),
                                                     getattr(layer, "values", None))
                if t is not None and t.dim() >= 1]

    def audit_key(self, cache):
        """What of `cache` a call's path depends on (_rows.audit_key): its
        layers' types, and which hold tokens."""
        return tuple((type(layer).__name__, bool(getattr(layer, "is_initialized", False)) and
                      getattr(layer, "keys", None) is not None and layer.keys.numel() > 0)
                     for layer in cache.layers)

    def views(self, cache, bounds):
        """One shallow copy of `cache` per micro-batch of `bounds`, its layers
        the layer adapters' views of its rows, each made where the
        micro-batch first reads it (_LazyLayers): from the layers as they
        are then, so nothing may run on `cache` between the split and the
        merge (nothing does: an audited call's split is dropped, a baseline
        runs on a deep copy, a capture splits inside the graph)."""
        layer_views = _LayerViews(self.layer_adapters, cache.layers, bounds, _caller_stream())
        out = []
        for mb in range(len(bounds) - 1):
            v = _shallow_copy(cache)
            v.layers = _LazyLayers(views=layer_views, mb=mb)
            out.append(v)
        return out

    def graph_state(self, cache):
        """(fingerprint, [(name, tensor)]) of a cache whose every update is
        written in place on the device, so that a CUDA graph can replay it
        (_graphs: the tensors are the graph's own, the fingerprint is what
        its host state must stay); or a string saying why not."""
        if self.refusal(cache, None):
            return f"cannot be split ({self.refusal(cache, None)})"
        fingerprint, tensors = [], []
        for k, layer in enumerate(cache.layers):
            state = self.layer_adapters[type(layer)].graph_state(layer)
            if isinstance(state, str):
                return f"layer {k} {state}"
            fingerprint.append((type(layer).__name__,) + state[0])
            tensors += [(f"layers[{k}].{name}", t) for name, t in state[1]]
        return (tuple(fingerprint), cache.layer_class_to_replicate), tensors

    def concat(self, caches, where):
        """One cache of the micro-batches' own caches (made inside the call),
        stacked by rows."""
        if len({len(c.layers) for c in caches}) != 1:
            raise MergeError(f"{where}: micro-batches made caches of different depths")
        for c in caches:
            why = self.refusal(c, None)
            if why:
                raise MergeError(f"{where}: {type(c).__qualname__} {why}")
        out = _shallow_copy(caches[0])
        out.layers = [self.layer_adapters[type(layers[0])].concat(layers, where)
                      for layers in zip(*(c.layers for c in caches))]
        return out

    def merge(self, cache, views, bounds, lengths):
        for k, layer in enumerate(cache.layers):
            if not any(_LazyLayers.made(v.layers, k) for v in views):
                continue  # no micro-batch read the layer: it is as it was
            # A micro-batch that did not read it gets its view now, as it
            # was made (its rows, unchanged), for the layer's merge to judge.
            self.layer_adapters[type(layer)].merge(layer, [v.layers[k] for v in views], bounds,
                                                   lengths)
        grown = {len(v.layers) for v in views}
        if len(grown) != 1:
            raise MergeError("micro-batches grew the cache by different numbers of layers")
        for k in range(len(cache.layers), grown.pop()):
            new = cache.layer_class_to_replicate()
            self.layer_adapters[type(new)].merge(new, [v.layers[k] for v in views], bounds,
                                                 lengths)
            cache.layers.append(new)


class _Unmade:
    """Holds the place of a layer's view not made yet among _LazyLayers'
    own items, which only its methods read."""

    __slots__ = ()

    def __repr__(self):
        return "<cache layer view not made>"


_UNMADE = _Unmade()


class _LayerViews:
    """The views of one cache's layers in one split call, each made at a
    micro-batch's first read of the layer (_LazyLayers). A unit that is one
    decoder layer reads one layer of the cache: views of all of them, made
    on each layer's call, made a decode step's views quadratic in the depth
    (docs/performance.md).

    Contract of a layer adapter's `views(layer, bounds, stream)`: called at
    most once per layer and call, with the caller's CUDA stream (None
    without CUDA), it returns a function of a micro-batch that makes that
    micro-batch's view of the layer's rows. The function runs on the
    micro-batch's thread and stream when the micro-batch reads the layer,
    and for a micro-batch that did not, on the caller's at the merge."""

    def __init__(self, adapters, layers, bounds, stream):
        self.adapters = adapters
        self.layers = layers  # the originals, which nothing changes until the merge
        self.bounds = bounds
        self.stream = stream
        self.makers = {}  # layer index -> its adapter's function
        # The micro-batches' threads read a layer side by side.
        self.lock = threading.Lock()

    def view(self, k, mb):
        with self.lock:
            make = self.makers.get(k)
            if make is None:
                layer = self.layers[k]
                make = self.makers[k] = self.adapters[type(layer)].views(layer, self.bounds,
                                                                        self.stream)
            return make(mb)


class _LazyLayers(list):
    """A micro-batch's copy of a cache's `layers`: item k is its view of
    layer k, made (_LayerViews.view) when first read by index, as the
    cache's methods read a layer (`self.layers[layer_idx]`). Any other read
    (iteration, a slice, a search, a comparison, a copy) or change of order
    first makes every view, so that the list then holds what a list of all
    the views would; appending (a cache growing a layer) needs none. A copy
    of it (copy, deepcopy, pickle) is a plain list.

    What reads a list subclass's items in C without its methods sees the
    placeholder (`heapq` on it, torch's parser of a list of tensors): no
    cache code does, and an attribute read on the placeholder raises."""

    def __init__(self, items=(), views=None, mb=0):
        """Micro-batch `mb`'s layers of `views`; without `views`, a list of
        `items`, as generic code rebuilds a list by its type."""
        super().__init__(items if views is None else [_UNMADE] * len(views.layers))
        self._views, self._mb = views, mb

    def __getitem__(self, k):
        if isinstance(k, slice):
            self._make_all()
            return list.__getitem__(self, k)
        item = list.__getitem__(self, k)
        if item is _UNMADE:
            k = operator.index(k) % len(self)
            item = self._views.view(k, self._mb)
            list.__setitem__(self, k, item)
        return item

    def __setitem__(self, k, value):
        if isinstance(k, slice):
            self._make_all()
        list.__setitem__(self, k, value)

    def __reduce_ex__(self, _protocol):
        return list, (list(self),)

    def __radd__(self, other):  # `[...] + layers`: Python asks the subclass first
        return other + list(self)

    def _make_all(self):
        for k in range(len(self)):
            self.__getitem__(k)

    @staticmethod
    def made(layers, k):
        """Whether item k of a micro-batch's `layers` (this class, or a list
        its cache was given in the call) holds a layer, not a view unmade."""
        return not isinstance(layers, _LazyLayers) or list.__getitem__(layers, k) is not _UNMADE


def _making_all(name):
    method = getattr(list, name)

    def making_all(self, *args, **kwargs):
        for layers in (self, *args):  # both sides of a comparison or a sum
            if isinstance(layers, _LazyLayers):
                layers._make_all()
        return method(self, *args, **kwargs)
    making_all.__name__ = name
    return making_all


for _name in ("__iter__", "__reversed__", "__contains__", "__eq__", "__ne__", "__lt__", "__le__",
              "__gt__", "__ge__", "__add__", "__mul__", "__rmul__", "__iadd__", "__imul__",
              "__repr__", "__delitem__", "copy", "count", "index", "pop", "remove", "insert",
              "sort", "reverse", "extend", "clear"):
    setattr(_LazyLayers, _name, _making_all(_name))
del _name


class _EncoderDecoderCacheAdapter:
    """transformers.cache_utils.EncoderDecoderCache (BART's, T5's, Whisper's
    decoders): a self-attention and a cross-attention cache, each split and
    merged by its own adapter, and `is_updated`, a dict {layer: whether the
    cross-attention keys and values were computed}, which a decoder layer
    sets on its first call. A micro-batch gets its own copy of the dict (a
    shared one would tell micro-batch 1 that its cross-attention keys exist
    when only micro-batch 0's do); the micro-batches must agree on it, and
    the merged cache takes it."""

    # `_is_user_defined`: as in _CacheAdapter.KNOWN (a cache the caller passed
    # to generate()).
    KNOWN = frozenset({"self_attention_cache", "cross_attention_cache", "is_updated",
                       "_is_user_defined"})

    def __init__(self, caches):
        self.caches = caches  # {cache class: its adapter}

    def _parts(self, cache):
        return (("self_attention_cache", cache.self_attention_cache),
                ("cross_attention_cache", cache.cross_attention_cache))

    def refusal(self, cache, batch):
        unknown = sorted(set(vars(cache)) - self.KNOWN)
        if unknown:
            return f"keeps state this version of dynaflow cannot split ({', '.join(unknown)})"
        for name, part in self._parts(cache):
            adapter = self.caches.get(type(part))
            if adapter is None:
                return f"has a {name} of type {type(part).__qualname__}"
            why = adapter.refusal(part, batch)
            if why:
                return f"{name}: {why}"
        return ""

    def row_tensors(self, cache):
        return [t for _, part in self._parts(cache)
                for t in self.caches[type(part)].row_tensors(part)]

    def audit_key(self, cache):
        return tuple(self.caches[type(part)].audit_key(part) for _, part in self._parts(cache)) \
            + (tuple(sorted(cache.is_updated.items())),)

    def views(self, cache, bounds):
        out = [_shallow_copy(cache) for _ in range(len(bounds) - 1)]
        for name, part in self._parts(cache):
            for v, part_view in zip(out, self.caches[type(part)].views(part, bounds)):
                setattr(v, name, part_view)
        for v in out:
            v.is_updated = dict(cache.is_updated)
        return out

    def graph_state(self, cache):
        """As _CacheAdapter.graph_state, once every layer's cross-attention
        keys are computed: until then the call marks them in `is_updated`,
        on the host, which a replay would skip."""
        if self.refusal(cache, None):
            return f"cannot be split ({self.refusal(cache, None)})"
        flags = [cache.is_updated.get(k) for k in range(len(cache.cross_attention_cache.layers))]
        if not all(flags):
            return "marks its cross-attention keys computed (is_updated) on the host"
        fingerprint, tensors = [], []
        for name, part in self._parts(cache):
            state = self.caches[type(part)].graph_state(part)
            if isinstance(state, str):
                return f"{name} {state}"
            fingerprint.append(state[0])
            tensors += [(f"{name}.{n}", t) for n, t in state[1]]
        return tuple(fingerprint), tensors

    @staticmethod
    def _is_updated(caches, where):
        flags = [c.is_updated for c in caches]
        if any(f != flags[0] for f in flags):
            raise MergeError(f"{where}micro-batches computed different cross-attention layers")
        return flags[0]

    def concat(self, caches, where):
        for c in caches:
            why = self.refusal(c, None)
            if why:
                raise MergeError(f"{where}: {type(c).__qualname__} {why}")
        out = _shallow_copy(caches[0])
        for name, part in self._parts(caches[0]):
            setattr(out, name, self.caches[type(part)].concat(
                [getattr(c, name) for c in caches], f"{where}: {name}"))
        out.is_updated = dict(self._is_updated(caches, f"{where}: "))
        return out

    def merge(self, cache, views, bounds, lengths):
        is_updated = self._is_updated(views, "")
        for name, part in self._parts(cache):
            self.caches[type(part)].merge(part, [getattr(v, name) for v in views], bounds,
                                          lengths)
        cache.is_updated.clear()
        cache.is_updated.update(is_updated)


# Serialises the allocation of a grown layer's merged tensors, which the
# micro-batches' threads race to make (_GrownLayer._rows).
_GROWN_LOCK = threading.Lock()


class _GrownLayer:
    """One transformers DynamicLayer in one split call: the rows each
    micro-batch's view started with, and the merged keys and values that the
    views' updates write their rows of.

    DynamicLayer.update appends by concatenation, into a new tensor on every
    call. A view's update (where the layer's class appends as
    _appends_by_concatenation checks) writes that concatenation into its rows
    of one tensor of the whole batch's size instead, allocated by the first
    micro-batch to update (on CUDA on the caller's stream, each micro-batch's
    stream recorded on it, as SliceMerge does for outputs), so the merge
    takes that tensor as it is: the cache is copied once per call, as the
    unsplit call copies it, not a second time by concatenating the
    micro-batches' tensors. An update that cannot write there concatenates
    as the layer's own, and the merge then concatenates: with grad enabled
    (what attention saves for backward would be a view of a tensor the other
    micro-batches then write, bumping its version), under a CUDA graph
    capture, for micro-batches of other shapes or dtypes, and for a second
    update in the call.

    The view's `update` refers to its view weakly: the view holds it, and a
    cycle would keep the layer's previous tensors alive until the garbage
    collector runs (a decode step's whole cache, on the GPU)."""

    def __init__(self, bounds, stream):
        self.bounds = bounds
        self.stream = stream  # CUDA: the caller's, which uses the merged tensors
        self.whole = {}    # "keys", "values" -> the merged tensor
        self.given = {}    # (name, micro-batch) -> what its view started with
        self.written = {}  # (name, micro-batch) -> its rows of `whole`, which it holds

    def update(self, view_ref, mb, key_states, value_states, *_args, **_kwargs):
        """DynamicLayer.update of micro-batch `mb`'s view (`view_ref()`)."""
        view = view_ref()
        if not view.is_initialized:
            view.lazy_initialization(key_states, value_states)
        view.keys = self._grow("keys", mb, view.keys, key_states)
        view.values = self._grow("values", mb, view.values, value_states)
        return view.keys, view.values

    def _grow(self, name, mb, old, new):
        """`old` and `new` concatenated along the sequence (dimension -2), in
        `mb`'s rows of the merged tensor where they can be."""
        import torch

        rows = self._rows(name, mb, old, new)
        if rows is None:
            return torch.cat([old, new], dim=-2)
        held = rows.shape[-2] - new.shape[-2]
        if held:
            rows.narrow(-2, 0, held).copy_(old)
        rows.narrow(-2, held, new.shape[-2]).copy_(new)
        if rows.is_cuda:  # written on this micro-batch's stream (torch's rule)
            self.whole[name].record_stream(torch.cuda.current_stream(rows.device))
        self.written[(name, mb)] = rows
        return rows

    def _rows(self, name, mb, old, new):
        """`mb`'s rows of the merged `name`, or None where this update
        cannot write there."""
        import torch

        count = self.bounds[mb + 1] - self.bounds[mb]
        if (name, mb) in self.written or torch.is_grad_enabled() or new.dim() < 3 or \
                new.shape[0] != count or old.dtype != new.dtype or old.device != new.device:
            return None  # (an empty `old` also has a dtype, which the concatenation promotes)
        if old.numel() and (old.dim() != new.dim() or old.shape[:-2] != new.shape[:-2] or
                            old.shape[-1] != new.shape[-1]):
            return None  # the concatenation decides (it may raise, as unsplit)
        if new.is_cuda and (self.stream is None or self.stream.device != new.device or
                            torch.cuda.is_current_stream_capturing()):
            return None
        held = old.shape[-2] if old.numel() else 0
        shape = (self.bounds[-1],) + tuple(new.shape[1:-2]) + (held + new.shape[-2],
                                                                new.shape[-1])
        with _GROWN_LOCK:
            whole = self.whole.get(name)
            if whole is None:
                whole = self.whole[name] = _empty_for(self.stream, shape, new)
        if tuple(whole.shape) != shape or whole.dtype != new.dtype or whole.device != new.device:
            return None
        return whole.narrow(0, self.bounds[mb], count)

    def untouched(self, views):
        """Whether no micro-batch updated the layer: the views hold what
        they were given (an update replaces them)."""
        return all(getattr(v, name) is self.given[(name, mb)]
                   for mb, v in enumerate(views) for name in ("keys", "values"))

    def merged(self, name, views):
        """The views' `name` stacked by rows: the tensor they wrote into, where
        every one holds its rows of it, else their concatenation."""
        import torch

        whole = self.whole.get(name)
        if whole is not None and all(self.written.get((name, mb)) is getattr(v, name)
                                     for mb, v in enumerate(views)):
            return whole
        return torch.cat([getattr(v, name) for v in views], 0)


def _caller_stream():
    """The current CUDA stream of this (the caller's) thread, where CUDA is
    initialised; None where no CUDA tensor can exist yet."""
    import torch

    return torch.cuda.current_stream() if torch.cuda.is_initialized() else None


@functools.cache
def _appends_by_concatenation(cls, _update):
    """Whether `cls.update` (transformers' DynamicLayer's; `_update`, so that
    a patched update is probed anew) appends its keys and values along the
    sequence, as _GrownLayer.update writes them, and keeps nothing but what
    _DynamicLayerAdapter knows: probed once, on a layer of tiny tensors, so
    that a transformers version whose layer updates otherwise keeps its own
    update (and the merge concatenates), as does a probe that fails."""
    import torch

    try:
        layer = cls()
        k = torch.arange(8.0).view(1, 1, 2, 4)
        layer.update(k, -k)
        keys, values = layer.update(k + 8, -k - 8)
        return torch.equal(keys, torch.arange(16.0).view(1, 1, 4, 4)) and \
            torch.equal(values, -keys) and keys is layer.keys and values is layer.values and \
            set(vars(layer)) <= _DynamicLayerAdapter.KNOWN
    except Exception:  # noqa: BLE001 - any failure: the layer's own update
        return False


class _DynamicLayerAdapter:
    """transformers.cache_utils.DynamicLayer: keys and values grow by
    concatenation along the sequence, so a micro-batch's layer starts from
    its rows and the merged layer is the micro-batches' results stacked by
    row: the tensors their updates wrote into (_GrownLayer)."""

    KNOWN = frozenset({"keys", "values", "is_initialized", "dtype", "device"})
    # Whether the views' updates write into the merged tensors: not where
    # the layer keeps a window of what it appends.
    GROWS_IN_PLACE = True

    def refusal(self, layer, batch):
        unknown = sorted(set(vars(layer)) - self.KNOWN)
        if unknown:
            return f"{type(layer).__qualname__} keeps {', '.join(unknown)}"
        if batch is not None and layer.is_initialized and layer.keys is not None and \
                layer.keys.numel() and \
                (layer.keys.shape[0] != batch or layer.values.shape[0] != batch):
            return f"holds {layer.keys.shape[0]} rows for a batch of {batch}"
        return ""

    @staticmethod
    def graph_state(_layer):
        return "grows its keys and values by concatenation on every call"

    def views(self, layer, bounds, stream):
        """A function of a micro-batch that makes its view of `layer`'s rows
        (_LayerViews' contract; `stream`: the caller's, or None)."""
        grown = _GrownLayer(bounds, stream)
        in_place = self.GROWS_IN_PLACE and \
            _appends_by_concatenation(type(layer), type(layer).update)

        def view(mb):
            v = _shallow_copy(layer)
            if layer.is_initialized and layer.keys is not None and layer.keys.numel():
                v.keys = layer.keys.narrow(0, bounds[mb], bounds[mb + 1] - bounds[mb])
                v.values = layer.values.narrow(0, bounds[mb], bounds[mb + 1] - bounds[mb])
            grown.given[("keys", mb)] = getattr(v, "keys", None)
            grown.given[("values", mb)] = getattr(v, "values", None)
            if in_place:  # the instance's own, found before the class's
                v.update = functools.partial(grown.update, weakref.ref(v), mb)
            v._dynaflow_grown = grown
            return v
        return view

    def concat(self, layers, where):
        import torch

        out = _shallow_copy(layers[0])
        if not any(v.is_initialized for v in layers):
            return out
        if not all(v.is_initialized for v in layers):
            raise MergeError(f"{where}: some micro-batches initialised a cache layer and others not")
        out.keys = torch.cat([v.keys for v in layers], 0)
        out.values = torch.cat([v.values for v in layers], 0)
        return out

    def merge(self, layer, views, bounds, _lengths):
        import torch

        if not any(v.is_initialized for v in views):
            return
        if not all(v.is_initialized for v in views):
            raise MergeError("some micro-batches initialised a cache layer and others not")
        # None: layers the micro-batches' caches grew in the call.
        grown = getattr(views[0], "_dynaflow_grown", None)
        if grown is not None and grown.untouched(views):
            return  # nothing appended
        layer.dtype, layer.device = views[0].dtype, views[0].device
        for name in ("keys", "values"):
            setattr(layer, name, grown.merged(name, views) if grown is not None else
                    torch.cat([getattr(v, name) for v in views], 0))
        layer.is_initialized = True


class _DynamicSlidingWindowLayerAdapter(_DynamicLayerAdapter):
    """transformers.cache_utils.DynamicSlidingWindowLayer (Mistral, Gemma 2 and
    3, ...): a DynamicLayer that keeps the last `sliding_window - 1` positions
    and counts every position it saw in `cumulative_length`, a Python int
    that each micro-batch's copy advances on its own; the micro-batches must
    agree on it, and the merged layer takes it."""

    KNOWN = _DynamicLayerAdapter.KNOWN | {"sliding_window", "cumulative_length",
                                          "_sliding_window_tensor", "record_past"}
    GROWS_IN_PLACE = False

    @staticmethod
    def _length(layers, where):
        lengths = {v.cumulative_length for v in layers}
        if len(lengths) != 1:
            raise MergeError(f"{where}micro-batches saw different lengths {sorted(lengths)} in a "
                             f"sliding-window cache layer")
        return lengths.pop()

    def concat(self, layers, where):
        length = self._length(layers, f"{where}: ")
        out = super().concat(layers, where)
        out.cumulative_length = length
        out._sliding_window_tensor = layers[0]._sliding_window_tensor
        return out

    def merge(self, layer, views, bounds, lengths):
        length = self._length(views, "")
        super().merge(layer, views, bounds, lengths)
        layer.cumulative_length = length
        layer._sliding_window_tensor = views[0]._sliding_window_tensor


class _StaticLayerAdapter:
    """transformers.cache_utils.StaticLayer: keys and values are preallocated
    to the full batch and written in place (index_copy_) at the positions
    counted by `cumulative_length`. A micro-batch writes through a view of its
    rows and counts on its own copy of the length; the merged length must be
    the same for every micro-batch and is written back in place (its address
    is static for torch.compile and CUDA graphs)."""

    KNOWN = frozenset({"keys", "values", "is_initialized", "max_cache_len", "cumulative_length",
                       "dtype", "device", "batch_size", "num_heads", "k_head_dim", "v_head_dim"})

    def refusal(self, layer, batch):
        unknown = sorted(set(vars(layer)) - self.KNOWN)
        if unknown:
            return f"{type(layer).__qualname__} keeps {', '.join(unknown)}"
        if batch is not None and layer.is_initialized and layer.keys.shape[0] != batch:
            return f"holds {layer.keys.shape[0]} rows for a batch of {batch}"
        return ""

    @staticmethod
    def graph_state(layer):
        """The layer's tensors, once its first update has allocated them (a
        replay would not); the sequence position is the device tensor
        `cumulative_length`, advanced in place."""
        if not layer.is_initialized:
            return "allocates its keys and values at its first update (in Python)"
        return (layer.max_cache_len,), [("keys", layer.keys), ("values", layer.values),
                                        ("cumulative_length", layer.cumulative_length)]

    @staticmethod
    def views(layer, bounds, _stream):
        """A function of a micro-batch that makes its view of `layer`'s rows
        (_LayerViews' contract). Its length is its own copy, cloned on the
        micro-batch's stream, where it is then advanced."""
        def view(mb):
            begin, end = bounds[mb], bounds[mb + 1]
            v = _shallow_copy(layer)
            v.cumulative_length = layer.cumulative_length.clone()
            if layer.is_initialized:
                v.keys = layer.keys.narrow(0, begin, end - begin)
                v.values = layer.values.narrow(0, begin, end - begin)
                v.batch_size = end - begin
            return v
        return view

    def concat(self, layers, where):
        import torch

        out = _shallow_copy(layers[0])
        if not any(v.is_initialized for v in layers):
            return out
        lengths = {int(v.cumulative_length) for v in layers}
        if len(lengths) != 1 or not all(v.is_initialized for v in layers):
            raise MergeError(f"{where}: micro-batches filled their static caches differently")
        out.keys = torch.cat([v.keys for v in layers], 0)
        out.values = torch.cat([v.values for v in layers], 0)
        out.batch_size = int(out.keys.shape[0])
        out.cumulative_length = layers[0].cumulative_length.clone()
        return out

    def merge(self, layer, views, bounds, lengths):
        import torch

        if not any(v.is_initialized for v in views):
            return
        # Compared once the call's layers are merged (SameLengths); not
        # without host reads (lengths None: under a capture they are not
        # known yet): every micro-batch adds the same number of positions,
        # the sequence length, a shape they all share.
        if lengths is not None:
            lengths.add([v.cumulative_length for v in views])
        if not layer.is_initialized:
            # First write: allocate the full batch the way the layer would,
            # then take the micro-batches' rows.
            k, v0 = views[0].keys, views[0].values
            batch = bounds[-1]
            layer.lazy_initialization(k.new_empty((batch,) + tuple(k.shape[1:2]) + (0,) + (k.shape[-1],)),
                                      v0.new_empty((batch,) + tuple(v0.shape[1:2]) + (0,) + (v0.shape[-1],)))
            for i, v in enumerate(views):
                layer.keys.narrow(0, bounds[i], bounds[i + 1] - bounds[i]).copy_(v.keys)
                layer.values.narrow(0, bounds[i], bounds[i + 1] - bounds[i]).copy_(v.values)
        else:
            # The layer is written in place through the rows' views; a view
            # replaced by a new tensor would have written nothing back.
            for i, v in enumerate(views):
                rows = layer.keys.narrow(0, bounds[i], bounds[i + 1] - bounds[i])
                if v.keys.data_ptr() != rows.data_ptr() or \
                        v.values.data_ptr() != layer.values.narrow(0, bounds[i], rows.shape[0]).data_ptr():
                    raise MergeError("a micro-batch replaced its rows of a static cache layer "
                                     "instead of writing them in place")
        with torch.no_grad():
            layer.cumulative_length.copy_(views[0].cumulative_length)


class _StaticSlidingWindowLayerAdapter(_StaticLayerAdapter):
    """transformers.cache_utils.StaticSlidingWindowLayer: a StaticLayer of
    `min(sliding_window, max_cache_len)` positions, rolled in place once full,
    that also counts positions in a Python int (`cumulative_length_int`),
    advanced by each micro-batch's copy; the micro-batches must agree on it."""

    KNOWN = _StaticLayerAdapter.KNOWN | {"cumulative_length_int"}

    @staticmethod
    def graph_state(_layer):
        return "counts its positions in a Python int (cumulative_length_int) on every call"

    @staticmethod
    def _length(layers, where):
        lengths = {v.cumulative_length_int for v in layers}
        if len(lengths) != 1:
            raise MergeError(f"{where}micro-batches saw different lengths {sorted(lengths)} in a "
                             f"static sliding-window cache layer")
        return lengths.pop()

    def concat(self, layers, where):
        length = self._length(layers, f"{where}: ")
        out = super().concat(layers, where)
        out.cumulative_length_int = length
        return out

    def merge(self, layer, views, bounds, lengths):
        length = self._length(views, "")
        super().merge(layer, views, bounds, lengths)
        layer.cumulative_length_int = length


def _state_adapters():
    """{class: adapter} for the state classes the installed libraries have."""
    adapters = {}
    try:
        from transformers import cache_utils as cu
    except Exception:  # noqa: BLE001 - transformers absent or broken: no adapters
        return adapters
    layers = {}
    if hasattr(cu, "DynamicLayer"):
        layers[cu.DynamicLayer] = _DynamicLayerAdapter()
    if hasattr(cu, "StaticLayer"):
        layers[cu.StaticLayer] = _StaticLayerAdapter()
    if hasattr(cu, "DynamicSlidingWindowLayer"):
        layers[cu.DynamicSlidingWindowLayer] = _DynamicSlidingWindowLayerAdapter()
    if hasattr(cu, "StaticSlidingWindowLayer"):
        layers[cu.StaticSlidingWindowLayer] = _StaticSlidingWindowLayerAdapter()
    cache = _CacheAdapter(layers)
    for name in ("DynamicCache", "StaticCache"):
        if hasattr(cu, name):
            adapters[getattr(cu, name)] = cache
    if hasattr(cu, "EncoderDecoderCache"):
        adapters[cu.EncoderDecoderCache] = _EncoderDecoderCacheAdapter(dict(adapters))
    return adapters


_ADAPTERS = None


def state_adapter(value):
    """The adapter of `value`'s exact class, or None. Subclasses are not
    trusted: they may keep state their base's adapter does not merge."""
    global _ADAPTERS
    import sys

    if "transformers" not in sys.modules:
        return None
    if _ADAPTERS is None:
        _ADAPTERS = _state_adapters()
    return _ADAPTERS.get(type(value))


def output_refusal(value, passed, batch, where="the output", per_token=False):
    """Why the output of a call of `batch` rows, run unsplit, could not be
    merged from its micro-batches' outputs by `merge_outputs`, or "": a
    tensor without the batch's rows in dimension 0, a state object the call
    built (a cache a Hugging Face model makes when a call passes none) that
    no adapter can stack, or a value of a type `_merge` does not know.
    Asked of the audited first call of each kind, so that such calls are
    refused before any of them runs split (the merge would fail after the
    micro-batches ran). `passed`: the ids of the state objects the call was
    passed, which it may return as they are."""
    import torch

    if isinstance(value, torch.Tensor):
        if per_token or (value.dim() >= 1 and value.shape[0] == batch):
            return ""
        return f"{where} is a tensor of shape {tuple(value.shape)}, not {batch} rows"
    if id(value) in passed or _is_immutable(value):
        return ""
    adapter = state_adapter(value)
    if adapter is not None:
        why = adapter.refusal(value, None)
        return f"{where} is a {type(value).__qualname__} the call built, which {why} (a call " \
               f"with use_cache=False builds none)" if why else ""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [(f"{where}.{f.name}", getattr(value, f.name),
                  per_token or _per_token_field(value, f.name))
                 for f in dataclasses.fields(value) if f.init]
    elif isinstance(value, (tuple, list)):
        items = [(f"{where}[{k}]", v, per_token) for k, v in enumerate(value)]
    elif type(value) is dict:
        items = [(f"{where}[{k!r}]", v, per_token) for k, v in value.items()]
    else:
        return f"{where} is of type {type(value).__qualname__}, which dynaflow cannot merge"
    return next((why for w, v, t in items if (why := output_refusal(v, passed, batch, w, t))),
                "")


def alias_refusal(out, signature, args, kwargs, module_tensors):
    """Why the output of a call run unsplit could not be merged with the
    memory sharing it has, or "": a tensor of it that shares memory with an
    argument (`signature` names them, as in split_call) or one of
    `module_tensors` ((name, tensor) pairs) without being that tensor (a
    view: `x[:, :2]`, `x.view(...)`), or with another tensor of the output
    other than as a row view of it (`_row_view`: `h[:, 0]` beside `h`, which
    the merge rebuilds as a view of the merged `h`: `output_views`). Merged,
    it would be a tensor of its own, and a write through one would no
    longer reach the other, as it does in the unsplit call. An argument
    returned as it is, and one tensor returned at two places, stay
    themselves (`_merge`). The tensors of state objects (caches) are not
    compared. Asked of the audited first call of each kind, as
    output_refusal is."""
    owners = collections.defaultdict(list)  # storage address -> [(where, tensor)]
    inputs = [*zip(_positional_names(signature, len(args)), args), *kwargs.items(),
              *module_tensors]
    for name, value in inputs:
        for where, t in _tensor_leaves(value, name, ()):
            owners[_storage_address(t)].append((where, t))
    owners.pop(None, None)
    outputs = collections.defaultdict(list)  # storage address -> [(where, tensor)]
    for where, t in _tensor_leaves(out, "the output", ()):
        address = _storage_address(t)
        if address is None:
            continue
        sharing = owners[address]
        if sharing and all(u is not t for _, u in sharing):
            return _shares_memory(where, sharing[0][0])
        outputs[address].append((where, t))
    for leaves in outputs.values():
        distinct = list({id(t): (where, t) for where, t in leaves}.values())
        if len(distinct) > 1 and _row_view_base(distinct) is None:
            return _shares_memory(distinct[1][0], distinct[0][0])
    return ""


def _shares_memory(where, other):
    return (f"{where} shares memory with {other} (a view): merged from the micro-batches it "
            f"would be a tensor of its own, and a write through one would not reach the other "
            f"as it does in the unsplit call")


def _row_view(t, base):
    """(offset within a row, sizes, strides past dimension 0) of `t` as a
    row view of `base`: the same rows in dimension 0, each of t's rows
    inside that row of `base` (of t's dtype, in the same memory, its rows
    laid out as a contiguous tensor's, whatever the stride of a single row),
    and to autograd the same: both or neither recording, and then `t` a view
    of what `base` is a view of, with its own history (a detached copy of
    `h`, or a view of it made under no_grad, is not a view of it there);
    None when it is not. A merged `base` (the rows of
    each micro-batch's, contiguous) then holds the merged `t` at the same
    place of each row: `_view_of_merged`."""
    if t.dim() < 1 or base.dim() < 1 or t.shape[0] != base.shape[0] or t.numel() == 0 or \
            t.dtype != base.dtype or not _rows_contiguous(base) or \
            (t.shape[0] > 1 and t.stride(0) != base.stride(0)) or \
            _storage_address(t) is None or _storage_address(t) != _storage_address(base) or \
            t.requires_grad != base.requires_grad or \
            (t.requires_grad and (t.grad_fn is None or
                                  _autograd_root(t) is not _autograd_root(base))):
        return None
    offset = t.storage_offset() - base.storage_offset()
    row = base[0].numel()
    inner = sum((n - 1) * st for n, st in zip(t.shape[1:], t.stride()[1:]))
    if offset < 0 or offset + inner >= row:
        return None
    return offset, tuple(t.shape[1:]), tuple(t.stride()[1:])


def _rows_contiguous(t):
    """Whether `t`'s rows lie as a contiguous tensor's: its elements past
    dimension 0 contiguous, and (with more than one row) one row after the
    other."""
    return t.dim() >= 1 and t[0].is_contiguous() and \
        (t.shape[0] <= 1 or t.stride(0) == t[0].numel())


def _autograd_root(t):
    """The tensor autograd sees `t` as a view of (its `_base`), or `t`."""
    return t._base if t._base is not None else t


def _row_view_base(leaves):
    """Of (where, tensor) pairs sharing one memory, the index of the one all
    others are row views of (`_row_view`), or None."""
    for k, (_, base) in enumerate(leaves):
        if all(j == k or _row_view(t, base) is not None for j, (_, t) in enumerate(leaves)):
            return k
    return None


def output_views(split, results):
    """{ids of a view's parts: (ids of its base's parts, the base's parts,
    its `_row_view`, where the base is)} of the tensors that are row views of other tensors of
    the same output in micro-batch 0 (alias_refusal let only those through
    at the audit), each found at the same place of every micro-batch's
    output, the same view there. Raises MergeError when a micro-batch's
    output has another structure of views."""
    per_mb = []
    for i, result in enumerate(results):
        leaves = {}
        for where, t in _tensor_leaves(result, "output", ()):
            leaves.setdefault(where, t)
        per_mb.append(leaves)
    by_memory = collections.defaultdict(list)
    for where, t in per_mb[0].items():
        if _storage_address(t) is not None:
            by_memory[_storage_address(t)].append((where, t))
    views = {}
    for leaves in by_memory.values():
        distinct = list({id(t): (where, t) for where, t in leaves}.values())
        k = _row_view_base(distinct) if len(distinct) > 1 else None
        if k is None:
            continue
        base_where = distinct[k][0]
        for j, (where, t) in enumerate(distinct):
            if j == k:
                continue
            geometry = _row_view(t, distinct[k][1])
            try:
                parts = [mb[where] for mb in per_mb]
                bases = [mb[base_where] for mb in per_mb]
            except KeyError:
                raise MergeError(f"{where}: a view of {base_where} in micro-batch 0, missing "
                                 f"from another micro-batch's output") from None
            for i, (p, b) in enumerate(zip(parts, bases)):
                if _row_view(p, b) != geometry:
                    raise MergeError(f"{where}: micro-batch {i} returns another view of "
                                     f"{base_where} than micro-batch 0")
            views[tuple(map(id, parts))] = (tuple(map(id, bases)), bases, geometry, base_where)
    return views


def _view_of_merged(whole, geometry, where):
    """The merged view of a row view's parts (`_row_view`'s geometry) in the
    merged base `whole`."""
    offset, sizes, strides = geometry
    if not _rows_contiguous(whole):
        raise MergeError(f"{where}: a view of an output whose merged rows are not laid out as "
                         f"each micro-batch's")
    return whole.as_strided((whole.shape[0],) + sizes, (whole.stride(0),) + strides,
                            whole.storage_offset() + offset)


def _storage_address(t):
    """The address of `t`'s memory, or None when it has none to share (no
    elements, or a layout without one storage)."""
    try:
        storage = t.untyped_storage()
    except (NotImplementedError, RuntimeError):
        return None
    return storage.data_ptr() if storage.nbytes() else None
