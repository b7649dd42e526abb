"""CUDA graphs of planned calls: a unit's whole split schedule, every
micro-batch on its stream with the schedule's events, captured once per
shape and replayed on later calls (issue 9, item 4).

Which calls. A planned call (its split proved safe, its kind audited) is
graphed when everything it reads from the program is a tensor, a plain
value, or a state object whose adapter says every update it gets is written
in place on the device (`_split._CacheAdapter.graph_state`: a transformers
StaticCache, whose tensors the graph then uses as they are; a DynamicCache
grows by concatenation on the host, which a replay would skip). Calls run
eagerly while autograd records (a replay returns outputs without their
backward), for a dual-batch region (its micro-batches are issued from one
host thread each, which one capture cannot follow), and for a unit with an
inference buffer (only its bytes could show a write, and nothing runs during
a capture to compare them). Each such reason is said once per unit, in one
line, and the call runs the planned schedule eagerly. A program capturing
its own graph gets the planned call issued into it, as eagerly.

Per unit and graph key (the call's kind, `_rows.audit_key`, every tensor's
shape with the rows padded, and every plain value):
  1. the first call runs eagerly, issued from this thread as the capture
     will be: the warm-up torch asks for before a capture (lazy library
     state, such as a cuBLAS workspace per stream, is made outside it). A
     dispatch mode watches which tensor arguments it writes (a preallocated
     KV cache; inference tensors have no version counter to show it): the
     graph uses those tensors themselves, not copies, as it does a state
     object's, and replays only for calls that pass that same memory,
     unpadded (others run eagerly). An output that is not tensors and plain
     values, or an argument returned as the output, keeps the key eager;
  2. the second is captured (`CudaGraphs.capture`): the call runs once, on
     static copies of its tensors, with the planned schedule issued from
     this thread into the capture; then it is replayed. A capture that fails
     (a host read of a device value, `.item()` or `nonzero`, inside the
     call) is said once and the key runs eagerly from then on. The failed
     capture ran the unit's Python once without running its device work;
     the warm-up showed that the call changes no Python state of its
     modules (ModuleState), so running it eagerly next leaves the program
     as one call would;
  3. later calls are replayed: their tensors are copied into the static
     inputs, the graph replayed on the caller's stream, and the outputs
     cloned out of the static outputs (the next replay overwrites those).
     A replay is looked up before the call's split is made
     (`UnitGraphs.replay_hit`): the key holds the structure, shapes and
     values the capture's split was proved for. The unit's modules are
     compared with their state after the capture (ModuleState): a tensor
     rebound or written in place, an attribute set, a submodule replaced
     drops the graph, and the key is warmed up and captured again. What the
     forward reads outside its modules and arguments (a config's fields, a
     global) is baked into the graph.

Padding. The rows are padded to the next power of two when the padded call
falls in the same bucket of the plan (same schedule), so a server's varying
batch sizes share a few graphs. The audit proved that no operator of the
call mixes rows, so the padded rows (copies of the first row at capture, of
earlier calls afterwards) cannot change the real rows' results; every
tensor output holds rows (the merge refuses any other) and is cut back.

The graph's memory: torch.cuda.CUDAGraph is at::cuda::CUDAGraph, and each
graph's allocations come from its own pool of torch's caching allocator, so
torch's rules for memory under capture and replay hold (the micro-batches'
tensors are record_stream'ed on the caller's stream as in an eager call)."""

import collections
import dataclasses

from ._split import MergeError, _capture_underway, _is_immutable, _sequence_builder, state_adapter

# Graphs one unit keeps (one per padded shape and kind): beyond, new shapes
# run eagerly. A decode server padded to powers of two needs about
# log2(largest batch) + 1 per phase; each graph holds its own memory pool.
MAX_GRAPHS_PER_UNIT = 16

# A graph key whose first call ran (checked) and whose graph is not yet captured.
_READY = "ready"

# What UnitGraphs.call returns when the caller runs the call eagerly (a
# module may return None).
EAGER = object()


class NoGraph(Exception):
    """Why a call cannot be replayed from a graph (it runs eagerly)."""


class CudaGraphs:
    """The graph backend on CUDA: torch.cuda.CUDAGraph, captured on a side
    stream after a device synchronize (as torch.cuda.graph does), in
    "thread_local" mode so that other threads of the program (a data
    loader's) may keep calling CUDA. torch.cuda.graph itself is not used: a
    body that fails leaves its capture stream current."""

    def __init__(self):
        self.stream = None

    @staticmethod
    def accepts(t):
        return t.is_cuda

    @staticmethod
    def in_capture():
        """Whether the caller is capturing a graph of its own (which then
        takes the planned call in as it is issued)."""
        return _capture_underway()

    def capture(self, fn):
        """(graph, fn's result), fn run once under capture; raises what fn
        or the capture raised, with the capture ended."""
        import torch

        if self.stream is None:
            self.stream = torch.cuda.Stream()
        caller = torch.cuda.current_stream()
        torch.cuda.synchronize()
        self.stream.wait_stream(caller)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(self.stream):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                out = fn()
            except BaseException:
                try:
                    graph.capture_end()
                except RuntimeError:
                    pass  # the capture was invalidated: ended all the same
                raise
            graph.capture_end()
        caller.wait_stream(self.stream)
        return graph, out

    @staticmethod
    def replay(graph):
        graph.replay()  # on the current stream: the caller's


def padded_rows(rows, fits):
    """`rows` rounded up to a power of two when `fits(padded)` (the padded
    call falls in the same bucket), else `rows`."""
    padded = 1 << (rows - 1).bit_length()
    return padded if padded != rows and fits(padded) else rows


class Leaf(collections.namedtuple("Leaf", "tensor rows where state")):
    """A tensor of a call's arguments: whether its first dimension holds the
    batch's rows, where it is ("argument mask", "argument cache.k[0]"), and
    whether it belongs to a state object (a static KV cache), whose tensors
    the graph uses as they are."""


def flatten_inputs(args, kwargs, batch):
    """(parts, leaves, stateful) of a call: `leaves` every tensor of the
    arguments in walk order (Leaf), `parts` their structure, shapes (a row
    tensor's rows left out: the graph key pads them), dtypes and devices,
    every plain value, and what the host state of a state object must stay
    (its adapter's graph_state); `stateful` whether there is one. The
    tensors that hold rows are those whose first dimension is the batch's
    `batch` rows: those the split cuts (UnitGraphs.prepare checks that).
    Raises NoGraph for anything else."""
    import torch

    parts, leaves = [], []
    stateful = False

    def tensor(value, where, state):
        rows = value.dim() >= 1 and value.shape[0] == batch
        shape = tuple(value.shape[1:]) if rows else tuple(value.shape)
        parts.append((rows, shape, value.dtype, value.device))
        leaves.append(Leaf(value, rows, where, state))

    def walk(value, where):
        nonlocal stateful
        if isinstance(value, torch.Tensor):
            tensor(value, where, False)
        elif _is_immutable(value):
            parts.append((type(value), value))
        elif type(value) in (tuple, list):
            parts.append((type(value), len(value)))
            for k, v in enumerate(value):
                walk(v, f"{where}[{k}]")
        elif type(value) is dict:
            parts.append((dict, tuple(value)))
            for k, v in value.items():
                walk(v, f"{where}[{k!r}]")
        elif _plain_dataclass(value):
            parts.append((type(value),))
            for f in dataclasses.fields(value):
                walk(getattr(value, f.name), f"{where}.{f.name}")
        elif state_adapter(value) is not None:
            state = state_adapter(value).graph_state(value)
            if isinstance(state, str):
                raise NoGraph(f"{where} is a {type(value).__name__} that {state}: a replay "
                              f"would skip what the call does to it on the host")
            stateful = True
            parts.append((type(value), state[0]))
            for name, t in state[1]:
                tensor(t, f"{where}.{name}", True)
        else:
            raise NoGraph(f"{where} is a {type(value).__qualname__}: a replay would skip what "
                          f"the call does to it on the host")

    for k, v in enumerate(args):
        walk(v, f"argument {k}")
    for k, v in kwargs.items():
        walk(v, f"argument {k}")
    return tuple(parts), leaves, stateful


def rebuild(value, tensors):
    """`value` (arguments) with its tensors replaced, in walk order, by the
    next items of the iterator `tensors`; a state object stays itself (its
    tensors are the graph's), its items skipped."""
    import torch

    if isinstance(value, torch.Tensor):
        return next(tensors)
    if type(value) in (tuple, list):
        return type(value)(rebuild(v, tensors) for v in value)
    if type(value) is dict:
        return {k: rebuild(v, tensors) for k, v in value.items()}
    if _plain_dataclass(value):
        return dataclasses.replace(value, **{f.name: rebuild(getattr(value, f.name), tensors)
                                             for f in dataclasses.fields(value)})
    if state_adapter(value) is not None:
        for _ in state_adapter(value).graph_state(value)[1]:
            next(tensors)
    return value


def _plain_dataclass(value):
    """A dataclass instance whose fields are all set by its constructor (a
    container of tensors such as a hand-written KV cache), walked field by
    field."""
    return dataclasses.is_dataclass(value) and not isinstance(value, type) and \
        all(f.init for f in dataclasses.fields(value))


def map_outputs(value, fn, where="output"):
    """`value` (a call's output) with every tensor t replaced by fn(t): the
    structures a merge builds (tuples, named tuples, lists, dicts,
    dataclasses such as transformers' outputs); NoGraph for any other
    object."""
    import torch

    if isinstance(value, torch.Tensor):
        return fn(value)
    if _is_immutable(value):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value)(**{f.name: map_outputs(getattr(value, f.name), fn, f"{where}.{f.name}")
                              for f in dataclasses.fields(value) if f.init})
    if isinstance(value, (tuple, list)):
        return _sequence_builder(value)([map_outputs(v, fn, f"{where}[{k}]")
                                         for k, v in enumerate(value)])
    if type(value) is dict:
        return {k: map_outputs(v, fn, f"{where}[{k!r}]") for k, v in value.items()}
    raise NoGraph(f"{where} is a {type(value).__qualname__}, which a replay cannot return anew")


class _Graph:
    """A captured call: the graph, the static input of each leaf (its own
    copy, or the program's tensor itself for a bound leaf), the addresses
    of the bound leaves, the output its capture returned, at `padded` rows,
    and the unit's modules as the capture left them: the graph holds their
    tensors' memory and what their Python attributes made the call do."""

    def __init__(self, graph, static, bound, out, padded, state):
        self.graph = graph
        self.static = static
        self.bound = bound  # leaf index -> _address of the program's tensor
        self.out = out
        self.padded = padded
        self.state = state  # _split.ModuleState of the unit after the capture


def _address(t):
    """What a graph that uses `t` itself depends on."""
    return t.data_ptr(), t.dtype, tuple(t.shape), t.stride()


def _watch_writes():
    """A dispatch mode that collects, in its `written` set, the storages
    (data pointers) the operators run under it write in place or into (an
    in-place operator's self, an `out=`, an index write): what a call writes
    of its arguments, whether they have version counters (inference tensors
    have none) or not, and without copying them."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class WatchWrites(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.written = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            for k, a in enumerate(func._schema.arguments):
                if a.alias_info is not None and a.alias_info.is_write:
                    value = args[k] if k < len(args) else kwargs.get(a.name)
                    for t in value if isinstance(value, (list, tuple)) else (value,):
                        if hasattr(t, "untyped_storage"):
                            self.written.add(t.untyped_storage().data_ptr())
            return func(*args, **kwargs)

    return WatchWrites()


def _bound(leaves, written, out):
    """{leaf index: address} of the tensors a graph must use as they are:
    the arguments the warm-up call wrote (storages in `written`; a graph
    writes only memory it captured) and the state objects' tensors. Raises
    NoGraph when a replay would not give what the call gave (`out`, its
    output)."""
    import torch

    bound = {k: _address(leaf.tensor) for k, leaf in enumerate(leaves)
             if leaf.state or leaf.tensor.untyped_storage().data_ptr() in written}
    inputs = {id(leaf.tensor) for leaf in leaves}

    def check(o):
        if id(o) in inputs:
            raise NoGraph("the call returns an argument: a replay would return a copy")
        if not isinstance(o, torch.Tensor) or o.dim() < 1:
            raise NoGraph("an output has no rows")
        return o

    map_outputs(out, check)
    return bound


class UnitGraphs:
    """One planned unit's graphs, by key (see the module comment)."""

    def __init__(self, path, backend, report, say):
        self.path = path
        self.backend = backend
        self.report = report
        self.say = say  # prints one line
        # key -> _READY (with self.bound[key]), a _Graph, or why it runs eagerly
        self.entries = {}
        self.bound = {}  # key -> _bound of its first call
        self.said = set()
        self.graphs = 0

    def clear(self):
        self.entries = {}
        self.bound = {}
        self.graphs = 0

    def eager(self, why):
        """A call runs eagerly for `why`: counted, and said once."""
        self.report.graph_eager(f"{self.path}: {why}")
        if why not in self.said:
            self.said.add(why)
            self.say(f"{self.path}: runs eagerly, not as a CUDA graph: {why}")

    def prepare(self, kind, split, args, kwargs, fits):
        """This call's graph key and leaves: (key, leaves, padded), or None
        when it cannot be graphed (said, unless the caller's own capture
        is underway: that graph takes the call in). `kind` is the call's
        `_rows.audit_key`, `fits(padded)` whether a padded call falls in
        this call's bucket."""
        import torch

        if self.backend.in_capture():
            return None
        try:
            if torch.is_grad_enabled():
                raise NoGraph("autograd is recording, and a replay returns outputs without "
                              "their backward (torch.no_grad() or torch.inference_mode() "
                              "around inference lets it replay)")
            rows = split.bounds[-1]
            key, leaves, padded = _key(kind, args, kwargs, rows, fits)
            cut = {id(owner) for owner, _ in split.row_views.values()}
            if any((id(leaf.tensor) in cut) != leaf.rows for leaf in leaves if not leaf.state):
                raise NoGraph("its split does not cut every tensor whose first dimension is "
                              "the batch")
            for leaf in leaves:
                if not self.backend.accepts(leaf.tensor):
                    raise NoGraph(f"{leaf.where} is on {leaf.tensor.device}: a graph would keep "
                                  f"its first value")
            return key, leaves, padded
        except NoGraph as e:
            self.eager(str(e))
            return None

    def replay_hit(self, kind, batch, args, kwargs, fits, modules):
        """The output of a call of `kind` replayed from the graph of its
        shape, before its split is made: EAGER when there is none or it
        cannot be used (the planned path then says why, or captures it).
        `modules` are the unit's (path, module) pairs now: a graph whose
        modules changed since its capture (a tensor rebound or written, an
        attribute set, a submodule replaced) is dropped and captured again,
        since it would replay what they were."""
        import torch

        if torch.is_grad_enabled() or self.backend.in_capture():
            return EAGER
        try:
            key, leaves, padded = _key(kind, args, kwargs, batch, fits)
        except NoGraph:
            return EAGER
        entry = self._entry(key, modules)
        if not isinstance(entry, _Graph) or _unbindable(leaves, entry.bound, batch, padded):
            return EAGER
        return self._replay(entry, leaves, batch)

    def _entry(self, key, modules):
        """The entry of `key`; a graph whose modules changed since its
        capture is dropped first (said, and counted as this call's)."""
        entry = self.entries.get(key)
        if isinstance(entry, _Graph) and not _same_modules(entry.state, modules):
            del self.entries[key]
            self.graphs -= 1
            self.eager("its modules changed since its graph was captured (a tensor rebound or "
                       "written, an attribute set): captured again")
            return None
        return entry

    def call(self, prepared, split, modules, warm_up, capture):
        """The call's output: replayed, or captured and replayed, or EAGER
        when the caller runs it eagerly. `warm_up()` runs it eagerly, issued
        from this thread (so that every operator runs under the dispatch
        mode that watches its writes): the first call of a key, whose output
        this returns. `modules`: as for replay_hit. `capture(static,
        padded)` runs the planned call on the static inputs (one per leaf,
        in order) under the backend's capture and returns (graph, output,
        the unit's ModuleState after it); it raises NoGraph for a call it
        cannot capture."""
        key, leaves, padded = prepared
        entry = self._entry(key, modules)
        rows = split.bounds[-1]
        if entry is None:
            if self.graphs >= MAX_GRAPHS_PER_UNIT:
                self.eager(f"more than {MAX_GRAPHS_PER_UNIT} shapes of its calls")
                return EAGER
            watch = _watch_writes()
            with watch:
                out = warm_up()
            try:
                self.bound[key] = _bound(leaves, watch.written, out)
                self.entries[key] = _READY
            except NoGraph as e:
                self.entries[key] = str(e)
                self.eager(str(e))
            return out
        if isinstance(entry, str) and entry != _READY:
            self.eager(entry)
            return EAGER
        bound = self.bound[key] if entry == _READY else entry.bound
        why = _unbindable(leaves, bound, rows, padded)
        if why:  # this call only: the next may pass the bound memory again
            self.eager(why)
            return EAGER
        if entry == _READY:
            entry = self._capture(key, leaves, rows, padded, capture)
            if entry is None:
                return EAGER
        return self._replay(entry, leaves, rows)

    def _capture(self, key, leaves, rows, padded, capture):
        import torch

        bound = self.bound.pop(key)
        static = []
        with torch.inference_mode(False):  # version counters: checkable under capture
            for k, (t, is_row, _, _) in enumerate(leaves):
                if k in bound:
                    static.append(t)
                    continue
                shape = (padded,) + tuple(t.shape[1:]) if is_row else tuple(t.shape)
                s = torch.empty(shape, dtype=t.dtype, device=t.device)
                if is_row and padded > rows:
                    s.narrow(0, rows, padded - rows).copy_(t[:1].expand(padded - rows,
                                                                       *t.shape[1:]))
                static.append(s)
        self._copy_in(static, bound, leaves, rows)
        try:
            graph, out, state = capture(static, padded)
            map_outputs(out, lambda o: _check_rows(o, padded))
        except NoGraph as e:
            self.entries[key] = str(e)
            self.eager(str(e))
            return None
        except Exception as e:  # noqa: BLE001 - a capture that fails runs eagerly
            why = f"its capture failed: {type(e).__name__}: {_first_line(e)}"
            self.entries[key] = why
            self.eager(why)
            return None
        entry = _Graph(graph, static, bound, out, padded, state)
        self.entries[key] = entry
        self.graphs += 1
        self.report.graph_captured()
        return entry

    @staticmethod
    def _copy_in(static, bound, leaves, rows):
        for k, ((t, is_row, _, _), s) in enumerate(zip(leaves, static)):
            if k not in bound:
                (s.narrow(0, 0, rows) if is_row and rows != s.shape[0] else s).copy_(t)

    def _replay(self, entry, leaves, rows):
        self._copy_in(entry.static, entry.bound, leaves, rows)
        self.backend.replay(entry.graph)
        self.report.graph_replayed()
        padded = entry.padded
        return map_outputs(entry.out,
                           lambda o: o.narrow(0, 0, rows * (o.shape[0] // padded)).clone())


def _key(kind, args, kwargs, rows, fits):
    """(graph key, leaves, padded rows) of a call of `kind` with `rows` rows:
    padded to a power of two within the call's bucket (`fits`), unless a
    state object's tensors, which the graph uses as they are, hold them."""
    parts, leaves, stateful = flatten_inputs(args, kwargs, rows)
    padded = rows if stateful else padded_rows(rows, fits)
    return (kind, padded, parts), leaves, padded


def _unbindable(leaves, bound, rows, padded):
    """Why this call cannot use a graph whose `bound` leaves are the
    program's own tensors, or ""."""
    for k, address in bound.items():
        t, is_row, where, _ = leaves[k]
        if _address(t) != address:
            return (f"{where}, which the call writes in place, is not the memory its graph "
                    f"was captured with")
        if is_row and rows != padded:
            return f"{where}, which the call writes in place, would need its rows padded"
    return ""


def _same_modules(state, modules):
    """Whether the unit's modules (path, module pairs) are those of
    ModuleState `state`, as it recorded them."""
    if len(modules) != len(state.modules) or \
            any(m is not n for (_, m), n in zip(modules, state.modules)):
        return False
    try:
        state.check()
    except MergeError:
        return False
    return True


def _check_rows(o, padded):
    if o.dim() < 1 or o.shape[0] % padded:
        raise NoGraph("an output does not hold the call's rows")
    return o


def _first_line(e):
    text = str(e).strip()
    return (text.splitlines()[0] if text else "")[:200]
