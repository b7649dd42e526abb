"""Loads the dynaflow torch extension and tells it which nn.Module runs.

The extension (plugin/torch, a C library loaded with ctypes) records every
operator with the innermost module of its thread. The hooks here keep that
per-thread module stack. A module entered while its thread's stack is empty is
a root, named by its class ("LlamaForCausalLM"). A module called by its parent
is named by the parent's path and its attribute name there
("LlamaForCausalLM.model.layers.0.attn"), so a module shared by several
parents (one rotary embedding for every layer) is named after the call. Any
other module is named by its path in the root's named_modules(), or, when it is
not registered under the root (made on the fly, say), by the caller's path and
its class name.
"""

import ctypes
import hashlib
import os
import sys
import threading
import weakref

# Results of dynaflow_torch_install (plugin/torch/dynaflow_torch.h).
RECORDING = 1
OPS_OFF = 0
NO_TRACER = -1
REFUSED = -2

_INSTALL_PROBLEMS = {
    NO_TRACER: "the dynaflow tracer is not loaded in this process",
    REFUSED: "torch refused the operator callbacks",
}


class ExtensionError(RuntimeError):
    """The extension cannot be used in this process; the message says why."""


def load_extension(path=None):
    """Loads the extension from `path` (default: env DYNAFLOW_TORCH_EXT) and
    checks that it was built for the torch that is imported."""
    import torch

    path = path or os.environ.get("DYNAFLOW_TORCH_EXT")
    if not path:
        raise ExtensionError("no torch extension (DYNAFLOW_TORCH_EXT is not set)")
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ExtensionError(f"cannot load {path}: {e}") from None
    lib.dynaflow_torch_built_version.restype = ctypes.c_char_p
    lib.dynaflow_torch_install.restype = ctypes.c_int
    lib.dynaflow_torch_intern_module_path.argtypes = [ctypes.c_char_p]
    lib.dynaflow_torch_intern_module_path.restype = ctypes.c_void_p
    lib.dynaflow_torch_enter_module.argtypes = [ctypes.c_void_p]
    lib.dynaflow_torch_enter_module.restype = None
    lib.dynaflow_torch_exit_module.restype = None
    built = lib.dynaflow_torch_built_version().decode()
    running = torch.__version__.split("+")[0]
    if built != running:
        # Its C++ ABI is torch's: another version could crash the program.
        raise ExtensionError(f"the torch extension was built for torch {built}, "
                             f"this program runs torch {running}")
    return lib


def install_recorder(lib):
    """Registers the operator recorder; RECORDING or OPS_OFF, else raises."""
    status = lib.dynaflow_torch_install()
    if status in _INSTALL_PROBLEMS:
        raise ExtensionError(_INSTALL_PROBLEMS[status])
    return status


def module_fingerprint(root):
    """A digest of `root`'s structure: every submodule's path and class, and
    the names, shapes and dtypes of its own parameters. The tracer records it
    per root class, `dynaflow advise` copies it into the plan
    (model.module_fingerprint), and `dynaflow apply` compares it with the
    program's model: one function on both sides, so they cannot disagree.
    Weights' values, devices and buffers are left out: a plan holds for any
    checkpoint of the same architecture. A lazy module's parameters, not yet
    inferred (they have no shape), count as "lazy"."""
    from torch.nn.parameter import is_lazy

    h = hashlib.sha256()
    for name, module in root.named_modules():
        h.update(f"{name}\t{type(module).__qualname__}\n".encode())
        for pname, p in module.named_parameters(recurse=False):
            shape = "lazy" if is_lazy(p) else tuple(p.shape)
            h.update(f"  {pname} {shape} {p.dtype}\n".encode())
    return h.hexdigest()[:16]


def _tracer_function(name, argtypes):
    """The tracer's C function `name` (plugin/preload/dynaflow_tracer.h), or
    None when this process has no tracer (LD_PRELOAD) or an older one."""
    try:
        fn = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = argtypes
    fn.restype = None
    return fn


def finish_trace_at_exit():
    """Registers, at interpreter exit, a device synchronize and the tracer's
    final flush (dynaflow_tracer_shutdown): Python's exit handlers run before
    torch, libcuda and libcupti tear down, the tracer's own C exit handler
    after them, when CUPTI can no longer complete its buffers. Registered
    after torch's own exit handlers, so it runs before them."""
    import atexit

    shutdown = _tracer_function("dynaflow_tracer_shutdown", [])
    if shutdown is None:
        return

    def finish():
        try:
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
        except Exception:  # noqa: BLE001 - a broken device: flush what there is
            pass
        shutdown()

    atexit.register(finish)


def watch_process_group():
    """Tells the tracer this process's torch.distributed rank as soon as the
    program initialises its default process group (init_process_group is
    wrapped; the call itself is unchanged). Ranks started by
    torch.multiprocessing have no RANK in their environment: without this
    every one of them would be traced as rank 0."""
    import functools

    try:
        import torch.distributed as dist
    except ImportError:  # a torch built without it: no process group to watch
        return
    record = _tracer_function("dynaflow_record_process_group_rank", [ctypes.c_int32])
    if record is None or not dist.is_available():
        return
    original = dist.init_process_group

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        result = original(*args, **kwargs)
        try:
            record(dist.get_rank())
        except Exception:  # noqa: BLE001 - the program goes on; the rank stays RANK's
            pass
        return result

    dist.init_process_group = init_process_group
    dist.distributed_c10d.init_process_group = init_process_group


class ModuleTracker:
    """Forward pre- and post-hooks that mirror each thread's module stack
    into the extension. Never raises into the model: a failure is reported
    once on stderr and the module is then left unattributed. While
    torch.compile traces a model the hooks do nothing, so they add no graph
    breaks; its compiled code runs as kernels, not as module calls."""

    def __init__(self, lib):
        import torch

        self._is_compiling = torch.compiler.is_compiling
        self._intern_path = lib.dynaflow_torch_intern_module_path
        self._enter = lib.dynaflow_torch_enter_module
        self._exit = lib.dynaflow_torch_exit_module
        self._local = threading.local()
        self._root_names = weakref.WeakKeyDictionary()  # root -> {module: path}
        self._children = weakref.WeakKeyDictionary()  # module -> {child: attribute name}
        self._interned = {}  # path -> the extension's pointer for it
        self._warned = False
        self._record_fingerprint = _tracer_function("dynaflow_record_module_fingerprint",
                                                    [ctypes.c_char_p, ctypes.c_char_p])
        self._fingerprinted = set()  # root classes recorded

    def pre_hook(self, module, args):
        if self._is_compiling():
            return
        try:
            stack = self._stack()
            if stack:
                path = self._path_under(stack[-1], module)
            else:
                self._local.root_names = self._names_under(module)
                path = type(module).__name__
            self._enter(self._pointer(path))
            stack.append((module, path))
        except Exception as e:  # noqa: BLE001 - the model must run on
            self._warn_once(e)

    def post_hook(self, module, args, output):
        if self._is_compiling():
            return
        try:
            stack = self._stack()
            # Another hook may have raised before ours ran: pop only our own entry.
            if stack and stack[-1][0] is module:
                stack.pop()
                self._exit()
        except Exception as e:  # noqa: BLE001
            self._warn_once(e)

    def _stack(self):
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _path_under(self, caller, module):
        caller_module, caller_path = caller
        children = self._children.get(caller_module)
        if children is None:
            children = {m: n for n, m in caller_module.named_children()}
            self._children[caller_module] = children
        name = children.get(module)
        if name is not None:
            return f"{caller_path}.{name}"
        path = self._local.root_names.get(module)
        return path if path is not None else f"{caller_path}.{type(module).__name__}"

    def _names_under(self, root):
        names = self._root_names.get(root)
        if names is None:
            prefix = type(root).__name__
            names = {m: f"{prefix}.{n}" if n else prefix for n, m in root.named_modules()}
            self._root_names[root] = names
            if self._record_fingerprint is not None and prefix not in self._fingerprinted:
                self._fingerprinted.add(prefix)
                self._record_fingerprint(prefix.encode(), module_fingerprint(root).encode())
        return names

    def _pointer(self, path):
        pointer = self._interned.get(path)
        if pointer is None:
            pointer = self._interned[path] = self._intern_path(path.encode())
        return pointer

    def _warn_once(self, error):
        if not self._warned:
            self._warned = True
            # One write: the ranks of a program share one stderr (_apply._say).
            sys.stderr.write(f"dynaflow: module paths may be incomplete after an error: "
                             f"{error!r}\n")
            sys.stderr.flush()


class HookHandles:
    """The hooks installed by enable_module_paths; remove() takes them out."""

    def __init__(self, handles):
        self._handles = handles

    def remove(self):
        for handle in self._handles:
            handle.remove()
        self._handles = []


def install_global_hooks(lib):
    """Module path hooks on every nn.Module of the process (the bootstrap's way)."""
    from torch.nn.modules import module as nn_module

    tracker = ModuleTracker(lib)
    return HookHandles([
        nn_module.register_module_forward_pre_hook(tracker.pre_hook),
        nn_module.register_module_forward_hook(tracker.post_hook, always_call=True),
    ])


def install_model_hooks(lib, model):
    """Module path hooks on `model` and its submodules only."""
    tracker = ModuleTracker(lib)
    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(tracker.pre_hook))
        handles.append(module.register_forward_hook(tracker.post_hook, always_call=True))
    return HookHandles(handles)
