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
     values, an argument returned as the output, or an output that is a
     view of another (merged eagerly as a view: _split.output_views) keeps
     the key eager;
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
     compared with their state after the capture (_snapshot): a tensor
     rebound or given other memory (`.data =`), an attribute set, a field
     of an object the modules keep (a config) changed, a submodule replaced
     drops the graph, and the key is warmed up and captured again. What the
     forward reads outside its modules and arguments (a global) is baked
     into the graph.

Padding. The rows are padded to the next power of two when the padded call
falls in the same bucket of the plan (same schedule), so a server's varying
batch sizes share a few graphs. The audit proved that no operator of the
call mixes rows, so the padded rows (copies of the first row at capture, of
earlier calls afterwards) cannot change the real rows' results; every
tensor output holds rows (the merge refuses any other) and is cut back.

The graph's memory: torch.cuda.CUDAGraph is at::cuda::CUDAGraph, and each
graph's allocations come from its own pool of torch's caching allocator, so
torch's rules for memory under capture and replay hold (the micro-batches'
tensors are record_stream'ed on the caller's stream as in an eager call).

C++. What a replay does per call beside the key and its lookup runs in the
replay module, _dynaflow_replay (plugin/torch/replay_module.cc, loaded from
env DYNAFLOW_REPLAY_EXT): the copies into the static inputs and out of the
static outputs (ReplayStep) and the comparison of the unit's modules with
their snapshot (ModuleSnapshot). Without that module no graph is made (on
CUDA, apply says so in one line)."""

import collections
import contextlib
import dataclasses
import functools
import importlib.machinery
import importlib.util
import os
import threading

from ._rows import native_keys
from ._split import (_CONTAINER_TYPES, _SCALAR_TYPES, _as_bytes, _capture_underway, _first_line,
                     _is_immutable, _module_tables, _replay_module, _sequence_builder,
                     state_adapter, watching)

# Graphs one unit keeps (one per padded shape and kind): beyond, new shapes
# run eagerly. A decode server padded to powers of two needs about
# log2(largest batch) + 1 per phase; each graph holds its own memory pool.
MAX_GRAPHS_PER_UNIT = 16
# Keys of one unit warmed up and never seen again: beyond, a new key is
# warmed up only at its second call (a position passed as a Python int makes
# every decode step a new key, and each warm-up runs under a dispatch mode,
# issued from one thread).
MAX_UNREPEATED_KEYS = 8
# Keys remembered as seen once, after that (then forgotten, all at once).
_MAX_SEEN_ONCE = 1024

# Operators that read a device value on the host (a capture cannot: it would
# fail, and on torch 2.11 a failed capture leaves the caching allocator
# believing it still underway). The warm-up looks for them, so that such a
# call runs eagerly without a capture being tried.
_HOST_READS = frozenset({
    "aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::masked_select",
    "aten::unique_consecutive", "aten::_unique", "aten::_unique2", "aten::unique_dim",
    "aten::equal", "aten::is_nonzero", "aten::allclose", "aten::bincount"})

# What UnitGraphs.call returns when the caller runs the call eagerly (a
# module may return None).
EAGER = object()


class NoGraph(Exception):
    """Why a call cannot be replayed from a graph (it runs eagerly)."""


class CudaGraphs:
    """The graph backend on CUDA: torch.cuda.CUDAGraph, captured on a side
    stream of the call's device after a device synchronize (as
    torch.cuda.graph does), in "thread_local" mode so that other threads of
    the program (a data loader's) may keep calling CUDA, into a memory pool
    of its own. torch.cuda.graph itself is not used: a body that fails
    leaves its capture stream current."""

    def __init__(self):
        """Raises NoGraph when the replay module cannot be loaded."""
        _native()
        self.streams = {}  # device index -> capture stream

    @staticmethod
    def accepts(t):
        return t.is_cuda

    @staticmethod
    def in_capture():
        """Whether the caller is capturing a graph of its own (which then
        takes the planned call in as it is issued)."""
        return _capture_underway()

    def capture(self, fn, device):
        """(graph, fn's result), fn run once under capture on `device`;
        raises what fn or the capture raised, with the capture ended."""
        import torch

        with torch.cuda.device(device):
            index = torch.cuda.current_device()
            if index not in self.streams:
                self.streams[index] = torch.cuda.Stream()
            stream = self.streams[index]
            caller = torch.cuda.current_stream()
            torch.cuda.synchronize()
            stream.wait_stream(caller)
            graph = torch.cuda.CUDAGraph()
            pool = torch.cuda.graph_pool_handle()
            with torch.cuda.stream(stream):
                graph.capture_begin(pool, capture_error_mode="thread_local")
                try:
                    out = fn()
                    graph.capture_end()
                except BaseException:
                    _end_failed_capture(graph, index, pool)
                    raise
            caller.wait_stream(stream)
            graph.dynaflow_done = torch.cuda.Event()  # recorded after each replay's copies
        return graph, out

    @staticmethod
    def replay(graph, copy_in, copy_out):
        """copy_out()'s result after copy_in(), the replay and copy_out(), on
        the current stream, ordered after the previous replay's copy_out
        wherever it ran (the static inputs and outputs are shared)."""
        import torch

        stream = torch.cuda.current_stream()
        stream.wait_event(graph.dynaflow_done)
        copy_in()
        graph.replay()
        out = copy_out()
        graph.dynaflow_done.record(stream)
        return out


def _end_failed_capture(graph, device, pool):
    """Ends a capture that failed. torch 2.11's capture_end checks
    cudaStreamEndCapture before it ends the caching allocator's allocation
    to the graph's pool, so after an invalidated capture the allocator would
    go on believing a capture underway (torch fixed the order later): that
    allocation is ended here, and the pool released."""
    import torch

    try:
        graph.capture_end()
        return
    except RuntimeError:
        pass
    for end in (torch._C._cuda_endAllocateToPool, torch._C._cuda_releasePool):
        try:
            end(device, pool)
        except Exception:  # noqa: BLE001 - already ended by a torch that has the fix
            pass


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
    Raises NoGraph for anything else. Walked in C++ where the replay module
    is loaded (plugin/torch/call_keys.h, the same result), else by
    _Flattening.walk."""
    f = _Flattening(batch)
    native = native_keys()
    if native is not None:
        native.flatten(f, args, kwargs)
    else:
        for k, v in enumerate(args):
            f.walk(v, f"argument {k}")
        for k, v in kwargs.items():
            f.walk(v, f"argument {k}")
    return tuple(f.parts), f.leaves, f.stateful


class _Flattening:
    """One flatten_inputs: what its walk appends."""

    Leaf = Leaf

    def __init__(self, batch):
        self.batch = batch
        self.parts = []
        self.leaves = []
        self.stateful = False

    def tensor(self, value, where, state):
        rows = value.dim() >= 1 and value.shape[0] == self.batch
        shape = tuple(value.shape[1:]) if rows else tuple(value.shape)
        self.parts.append((rows, shape, value.dtype, value.device))
        self.leaves.append(Leaf(value, rows, where, state))

    def walk(self, value, where):
        import torch

        if isinstance(value, torch.Tensor):
            self.tensor(value, where, False)
        elif _is_immutable(value):
            self.parts.append((type(value), value))
        elif type(value) in (tuple, list):
            self.parts.append((type(value), len(value)))
            for k, v in enumerate(value):
                self.walk(v, f"{where}[{k}]")
        elif type(value) is dict:
            self.parts.append((dict, tuple(value)))
            for k, v in value.items():
                self.walk(v, f"{where}[{k!r}]")
        elif _plain_dataclass(value):
            self.parts.append((type(value),))
            for f in dataclasses.fields(value):
                self.walk(getattr(value, f.name), f"{where}.{f.name}")
        elif state_adapter(value) is not None:
            state = state_adapter(value).graph_state(value)
            if isinstance(state, str):
                raise NoGraph(f"{where} is a {type(value).__name__} that {state}: a replay "
                              f"would skip what the call does to it on the host")
            self.stateful = True
            self.parts.append((type(value), state[0]))
            for name, t in state[1]:
                self.tensor(t, f"{where}.{name}", True)
        else:
            raise NoGraph(f"{where} is a {type(value).__qualname__}: a replay would skip what "
                          f"the call does to it on the host")


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
    """A captured call: the graph, its ReplayStep (the copies in and out of
    its static inputs and outputs, in C++), the static input of each leaf
    (its own copy; None for a bound leaf, which is the program's tensor),
    the addresses of the bound leaves, the output its capture returned, at
    `step.padded` rows, and the unit's modules as the capture left them
    (_snapshot): the graph holds their tensors' memory and what their
    Python attributes made the call do."""

    def __init__(self, graph, step, static, bound, out, snapshot):
        self.graph = graph
        self.step = step
        self.static = static
        self.bound = bound  # leaf index -> _address of the program's tensor
        self.out = out
        self.snapshot = snapshot


def _address(t):
    """What a graph that uses `t` itself depends on."""
    return t.data_ptr(), t.dtype, tuple(t.shape), t.stride()


def _watch(accepts):
    """A dispatch mode for a warm-up. It collects, in its `written` set, the
    storages (data pointers) the operators run under it write in place or
    into (an in-place operator's self, an `out=`, an index write): what a
    call writes of its arguments, whether they have version counters
    (inference tensors have none) or not, and without copying them. And it
    keeps in `host_read` the first operator that reads a value of a tensor
    the backend `accepts` on the host (_HOST_READS, or a copy of one to the
    CPU), which a capture cannot."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    def on_device(value):
        return isinstance(value, torch.Tensor) and accepts(value)

    class Watch(TorchDispatchMode):
        supports_higher_order_operators = True  # else torch raises on one

        def __init__(self):
            super().__init__()
            self.written = set()
            self.host_read = ""
            self.unseen = ""  # a higher-order operator, whose body runs unwatched

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if isinstance(func, torch._ops.HigherOrderOperator):
                self.unseen = self.unseen or func.name()
                return func(*args, **kwargs)
            name = func._schema.name
            if not self.host_read and not getattr(_UNWATCHED, "on", False) and (
                    (name in _HOST_READS and any(on_device(a) for a in args)) or
                    _sized_by_values(func, args, kwargs, on_device) or
                    _copy_between_host_and_device(name, args, kwargs, on_device)):
                self.host_read = name
            for k, a in enumerate(func._schema.arguments):
                if a.alias_info is not None and a.alias_info.is_write:
                    value = args[k] if k < len(args) else kwargs.get(a.name)
                    for t in value if isinstance(value, (list, tuple)) else (value,):
                        if isinstance(t, torch.Tensor):
                            self.written.add(t.untyped_storage().data_ptr())
            return func(*args, **kwargs)

    return Watch()


def _sized_by_values(func, args, kwargs, on_device):
    """Whether `func`'s output size is read from a device tensor's values:
    repeat_interleave with tensor repeats and no output size, indexing by
    a boolean mask (`x[mask]`, `x[mask] = v`: a nonzero inside)."""
    import torch

    name = func._schema.name
    if name == "aten::repeat_interleave":
        return func._schema.overload_name != "self_int" and \
            kwargs.get("output_size") is None and any(on_device(a) for a in args)
    if name in ("aten::index", "aten::index_put", "aten::index_put_") and len(args) > 1:
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool and on_device(i)
                   for i in args[1] or ())
    return False


def _copy_between_host_and_device(name, args, kwargs, on_device):
    """Whether operator `name` copies a device tensor to the CPU (`.cpu()`,
    `.tolist()`, `.numpy()` after it, printing), or a CPU tensor in pageable
    memory to the device (waits for the host)."""
    import torch

    def pageable(t):
        return isinstance(t, torch.Tensor) and t.device.type == "cpu" and not t.is_pinned() \
            and t.dim() > 0

    if name == "aten::_to_copy":
        device = kwargs.get("device")
        if device is None:
            return False
        if str(device) == "cpu":
            return on_device(args[0])
        return pageable(args[0]) and not on_device(args[0])
    if name == "aten::copy_":
        dst, src = args[0], args[1]
        if on_device(src) and not on_device(dst) and dst.device.type == "cpu":
            return True
        return on_device(dst) and pageable(src) and not on_device(src)
    return False


# Set while dynaflow itself reads device values on the host after an eager
# call's micro-batches (comparing a shared inference tensor's bytes), which
# the capture does not do: not the call's own host reads.
_UNWATCHED = threading.local()


@contextlib.contextmanager
def unwatched():
    """Operators run inside are not looked at by a warm-up's watch."""
    _UNWATCHED.on = True
    try:
        yield
    finally:
        _UNWATCHED.on = False


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
    outputs, memories = set(), set()

    def check(o):
        if id(o) in inputs:
            raise NoGraph("the call returns an argument: a replay would return a copy")
        if id(o) in outputs:
            raise NoGraph("the call returns one tensor at two places: a replay would return "
                          "two copies")
        if not isinstance(o, torch.Tensor) or o.dim() < 1:
            raise NoGraph("an output has no rows")
        memory = o.untyped_storage().data_ptr()
        if memory and memory in memories:
            raise NoGraph("an output is a view of another (`h[:, 0]` beside `h`): a replay "
                          "would return two copies")
        outputs.add(id(o))
        memories.add(memory)
        return o

    map_outputs(out, check)
    return bound


def _snapshot(modules):
    """What a graph assumes of the unit's modules (`modules`: (path, module)
    pairs), taken after its warm-up and again after its capture, and
    compared at every replay (`.same(modules)`): the modules, their
    attributes and containers' entries by identity, the fields of objects
    they keep (a config), and their tensors' memory (a `.data` swap moves it
    without rebinding). An in-place write to a weight needs no new graph: the
    graph reads that memory. plugin/torch/module_snapshot.h says exactly what
    is compared; this walk is done in C++, as it runs at every replay.
    Raises NoGraph when an object of the modules cannot be read (its fields
    raise)."""
    module, kinds = _native()
    try:
        return module.ModuleSnapshot(modules, kinds, _module_tables())
    except Exception as e:  # noqa: BLE001 - what the program's objects raise
        raise NoGraph(f"its modules cannot be compared with a graph's ({type(e).__name__}: "
                      f"{_first_line(e)})") from None


def _unchanged(snapshot, modules):
    """snapshot.same(modules); False when the walk raises (an object of the
    modules can no longer be read: the graph cannot be shown current)."""
    try:
        return snapshot.same(modules)
    except Exception:  # noqa: BLE001 - what the program's objects raise
        return False


# Kinds of attribute value, by type (_kind): compared by identity alone, a
# container (its entries too), a tensor (its memory too), an object whose
# fields are compared (a config). The replay module asks once per type.
_IDENTITY, _CONTAINER, _TENSOR, _FIELDS = range(4)


def _kind(t):
    import torch

    if t in _CONTAINER_TYPES or t in (tuple, frozenset):
        return _CONTAINER
    if issubclass(t, torch.Tensor):
        return _TENSOR
    if t in _SCALAR_TYPES or issubclass(t, (torch.nn.Module, type)) or \
            any("__call__" in vars(c) for c in t.__mro__) or not t.__dictoffset__ or \
            t.__module__.startswith(__package__):  # the applier itself
        return _IDENTITY
    return _FIELDS


# The replay module and its TypeKinds, once loaded (_native).
_NATIVE = []


def _native():
    """(the _dynaflow_replay module, its TypeKinds of _kind): the C++ side of
    a replay (plugin/torch/replay_module.cc), loaded once from env
    DYNAFLOW_REPLAY_EXT (`dynaflow apply` sets it). Raises NoGraph saying why
    it cannot be loaded."""
    if not _NATIVE:
        path = os.environ.get("DYNAFLOW_REPLAY_EXT", "")
        if not path:
            raise NoGraph("no replay module (DYNAFLOW_REPLAY_EXT is not set; build the "
                          "dynaflow_replay target)")
        importlib.import_module("torch")  # loads the libraries the module links

        loader = importlib.machinery.ExtensionFileLoader("_dynaflow_replay", path)
        spec = importlib.util.spec_from_loader("_dynaflow_replay", loader)
        try:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except (ImportError, OSError) as e:
            raise NoGraph(f"cannot load the replay module {path}: {_first_line(e)}") from None
        _NATIVE[:] = [module, module.TypeKinds(_kind)]
    return _NATIVE[0], _NATIVE[1]


class _Ready:
    """A key warmed up and not captured yet: the leaves the graph must use
    as they are (_bound), and the modules as the warm-up left them."""

    def __init__(self, bound, snapshot):
        self.bound = bound
        self.snapshot = snapshot


class UnitGraphs:
    """One planned unit's graphs, by key (see the module comment)."""

    def __init__(self, path, backend, report, say):
        self.path = path
        self.backend = backend
        self.report = report
        self.say = say  # prints one line
        self.entries = {}  # key -> _Ready, a _Graph, or why it runs eagerly
        self.said = set()
        self.graphs = 0
        self.unrepeated = 0  # _Ready entries
        # Once MAX_UNREPEATED_KEYS were: the keys seen once since, each
        # warmed up at its second call only.
        self.seen_once = None

    def clear(self):
        self.entries = {}
        self.graphs = self.unrepeated = 0
        self.seen_once = None

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
            modes = torch_modes()
            if modes:
                raise NoGraph(f"{modes}, which a replay would not see")
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
        modules changed since its capture (_snapshot) is dropped and
        captured again, since it would replay what they were."""
        import torch

        if torch.is_grad_enabled() or self.backend.in_capture() or torch_modes():
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
        """The entry of `key`; one whose modules changed since its warm-up or
        capture is dropped first (said, and counted as this call's)."""
        entry = self.entries.get(key)
        if isinstance(entry, (_Ready, _Graph)) and not _unchanged(entry.snapshot, modules):
            del self.entries[key]
            if isinstance(entry, _Graph):
                self.graphs -= 1
                self.eager("its modules changed since its graph was captured (a tensor rebound "
                           "or moved, an attribute set): captured again")
            else:
                self.unrepeated -= 1
            return None
        return entry

    def call(self, prepared, split, modules, warm_up, capture):
        """The call's output: replayed, or captured and replayed, or EAGER
        when the caller runs it eagerly. `warm_up()` runs it eagerly, issued
        from this thread (so that every operator runs under the dispatch
        mode that watches it): the first call of a key, whose output this
        returns. `modules`: as for replay_hit. `capture(static, padded)`
        runs the planned call on the static inputs (one per leaf, in order)
        under the backend's capture and returns (graph, output); it raises
        NoGraph for a call it cannot capture."""
        key, leaves, padded = prepared
        entry = self._entry(key, modules)
        rows = split.bounds[-1]
        if entry is None:
            return self._warm_up(key, leaves, modules, warm_up)
        if isinstance(entry, str):
            self.eager(entry)
            return EAGER
        why = _unbindable(leaves, entry.bound, rows, padded)
        if why:  # this call only: the next may pass the bound memory again
            self.eager(why)
            return EAGER
        if isinstance(entry, _Graph):
            return self._replay(entry, leaves, rows)
        self.unrepeated -= 1
        entry = self._capture(key, entry, leaves, rows, padded, modules, capture)
        if entry is None:
            return EAGER
        out = self._replay(entry, leaves, rows)
        self._check_unseen_writes(key, entry, leaves, rows)
        return out

    def _warm_up(self, key, leaves, modules, warm_up):
        if self.graphs >= MAX_GRAPHS_PER_UNIT:
            self.eager(f"more than {MAX_GRAPHS_PER_UNIT} shapes of its calls")
            return EAGER
        if self.seen_once is None and self.unrepeated >= MAX_UNREPEATED_KEYS:
            self.seen_once = set()
        if self.seen_once is not None and key not in self.seen_once:
            if len(self.seen_once) >= _MAX_SEEN_ONCE:
                self.seen_once.clear()
            self.seen_once.add(key)
            self.eager(f"its calls' shapes or plain values keep changing ({MAX_UNREPEATED_KEYS} "
                       f"kinds seen once and never again: a position passed as a Python int, "
                       f"say); from then on a kind is warmed up at its second call")
            return EAGER
        watch = _watch(self.backend.accepts)
        with watching(watch):
            out = warm_up()
        try:
            if watch.host_read:
                raise NoGraph(f"it reads a device value on the host ({watch.host_read}), which "
                              f"a capture cannot")
            if watch.unseen:
                raise NoGraph(f"it runs {watch.unseen}, a higher-order operator whose reads and "
                              f"writes the warm-up cannot see")
            self.entries[key] = _Ready(_bound(leaves, watch.written, out), _snapshot(modules))
            self.unrepeated += 1
        except NoGraph as e:
            self.entries[key] = str(e)
            self.eager(str(e))
        return out

    def _capture(self, key, ready, leaves, rows, padded, modules, capture):
        import torch

        bound = ready.bound
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
        native, _ = _native()
        flags = [(native.ReplayStep.BOUND if k in bound else 0) |
                 (native.ReplayStep.ROWS if leaf.rows else 0) for k, leaf in enumerate(leaves)]
        step = native.ReplayStep(static, flags, padded)
        step.copy_in([leaf.tensor for leaf in leaves], rows)
        try:
            graph, out = capture(static, padded)
            outputs = []

            def collect(o):
                outputs.append(_check_rows(o, padded))
                return o  # a dataclass output is rebuilt: its fields must be tensors

            map_outputs(out, collect)
            step.set_outputs(outputs)
            snapshot = _snapshot(modules)
        except NoGraph as e:
            self.entries[key] = str(e)
            self.eager(str(e))
            return None
        except Exception as e:  # noqa: BLE001 - a capture that fails runs eagerly
            why = f"its capture failed: {type(e).__name__}: {_first_line(e)}"
            self.entries[key] = why
            self.eager(why)
            return None
        # The program's tensors the graph uses as they are are not kept
        # alive by it: a replay checks that the call passes their memory.
        static = [None if k in bound else s for k, s in enumerate(static)]
        entry = _Graph(graph, step, static, bound, out, snapshot)
        self.entries[key] = entry
        self.graphs += 1
        self.report.graph_captured()
        return entry

    def _check_unseen_writes(self, key, entry, leaves, rows):
        """After a graph's first replay: an argument the graph wrote through
        its own copy (the warm-up's dispatch mode saw no write: a kernel
        outside torch's dispatcher) is written back, and the key runs
        eagerly from then on."""
        import torch

        for k, leaf in enumerate(leaves):
            s = entry.static[k]
            if s is None:
                continue
            copy = s.narrow(0, 0, rows) if leaf.rows and rows != s.shape[0] else s
            if not torch.equal(_as_bytes(copy), _as_bytes(leaf.tensor)):
                leaf.tensor.copy_(copy)
                why = (f"{leaf.where} is written by the call outside torch's dispatcher, which "
                       f"a graph would write into its own copy")
                self.entries[key] = why
                self.graphs -= 1
                self.eager(why)
                return

    def _replay(self, entry, leaves, rows):
        step = entry.step
        tensors = [leaf.tensor for leaf in leaves]

        def copy_out():
            copies = iter(step.copy_out(rows))
            return map_outputs(entry.out, lambda _o: next(copies))

        out = self.backend.replay(entry.graph, lambda: step.copy_in(tensors, rows), copy_out)
        self.report.graph_replayed()
        return out


def _global_modes():
    """What torch's global settings make a call's CUDA kernels do, beside
    its arguments: autocast's dtypes, the default dtype, float32 matmul
    precision and TF32, cuBLAS's reduced-precision reductions and fp16
    accumulation, the attention backends allowed, determinism (and whether
    it only warns, which a replay, running no operator, would not). Read
    in C++ where the replay module is loaded (plugin/torch/call_guards.h:
    GlobalModes, another value equal under the same settings)."""
    import torch

    native = _native_global_modes()
    if native is not None:
        return native()
    b = torch.backends
    return (tuple((d, torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")
                  if torch.is_autocast_enabled(d)), torch.is_autocast_cache_enabled(),
            torch.get_default_dtype(), torch.get_float32_matmul_precision(),
            b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32,
            b.cuda.matmul.allow_fp16_reduced_precision_reduction,
            b.cuda.matmul.allow_bf16_reduced_precision_reduction,
            b.cuda.matmul.allow_fp16_accumulation, b.cuda.flash_sdp_enabled(),
            b.cuda.mem_efficient_sdp_enabled(), b.cuda.math_sdp_enabled(),
            b.cuda.cudnn_sdp_enabled(), torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled())


@functools.cache
def _native_global_modes():
    """GlobalModes (plugin/torch/call_guards.h), or None without the replay
    module."""
    module = _replay_module()
    return None if module is None else module.global_modes


def torch_modes():
    """What torch state of this thread beyond grad, inference mode and
    autocast is set, or "": what an operator does under it (a torch function
    or dispatch mode, saved-tensor hooks, a torch.func transform) a replay,
    which runs no operator, would not do; nor would a micro-batch on another
    thread that does not carry it (_apply's CallerState does)."""
    import torch

    if torch._C._len_torch_function_stack():
        return "a torch function mode is active (a TorchFunctionMode, torch.device)"
    if torch._C._len_torch_dispatch_stack():
        return "a torch dispatch mode is active"
    if torch._C._autograd._top_saved_tensors_default_hooks(False) is not None:
        return "saved-tensor hooks are active"
    if torch._C._functorch.peek_interpreter_stack() is not None:
        return "a torch.func transform is active"
    return ""


def _key(kind, args, kwargs, rows, fits):
    """(graph key, leaves, padded rows) of a call of `kind` with `rows` rows:
    padded to a power of two within the call's bucket (`fits`), unless a
    state object's tensors, which the graph uses as they are, hold them."""
    parts, leaves, stateful = flatten_inputs(args, kwargs, rows)
    padded = rows if stateful else padded_rows(rows, fits)
    return (kind, _global_modes(), padded, parts), leaves, padded


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


def _check_rows(o, padded):
    if o.dim() < 1 or o.shape[0] % padded:
        raise NoGraph("an output does not hold the call's rows")
    return o


