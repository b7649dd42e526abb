"""dynaflow's bootstrap: `dynaflow trace` puts this directory first on
PYTHONPATH, so every Python process of the traced program imports it at
start-up (site.py imports the first sitecustomize on sys.path).

It does three things and never stops the program (unless `dynaflow apply
--strict` refuses a plan):
1. runs the sitecustomize that it shadows (the next one on sys.path), as
   Python would have without it;
2. waits for `import torch` with a meta path finder that costs one string
   comparison per import, so a program that never imports torch never loads
   torch or the extension;
3. right after torch is imported, installs the plan of `dynaflow apply` (env
   DYNAFLOW_PLAN, see dynaflow/_apply.py), and, when tracing, has the tracer
   told the torch.distributed rank once the program initialises it, CUPTI
   lent to torch.profiler for its windows and taken back after, and its
   trace finished at interpreter exit after a device synchronize, loads the
   dynaflow torch extension (env DYNAFLOW_TORCH_EXT) and installs the module
   path hooks on every nn.Module.
Any failure prints one "dynaflow: ..." line on stderr; the program then runs
as it would untraced (with operators not recorded).

Environment: DYNAFLOW_TORCH_EXT (the extension), DYNAFLOW_OPS=off (skip the
recorder; the torch.profiler watch stays, for the tracer's GPU activity),
DYNAFLOW_OUTPUT_DIR (the tracer's), set by `dynaflow trace`; DYNAFLOW_PLAN and DYNAFLOW_APPLY_*, set by
`dynaflow apply` (which runs without the recorder unless DYNAFLOW_TORCH_EXT is
set, as when `dynaflow trace` runs `dynaflow apply`).
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _warn(message):
    try:
        # One write: the ranks of a program share one stderr, and print
        # writes the newline apart.
        sys.stderr.write(f"dynaflow: {message}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - stderr may be closed; stay silent then
        pass


def _run_shadowed_sitecustomize():
    search = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", search)
    if spec is None or spec.loader is None:
        return
    try:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    except Exception as e:  # noqa: BLE001 - Python itself reports and goes on
        _warn(f"error in {spec.origin}: {e!r}")


def _tracing():
    return os.environ.get("DYNAFLOW_OPS", "on") != "off" and not (
        os.environ.get("DYNAFLOW_PLAN") and not os.environ.get("DYNAFLOW_TORCH_EXT"))


def _under_tracer():
    """Under `dynaflow trace`, --ops off included: the tracer records GPU
    activity, which torch.profiler would take from it."""
    return bool(os.environ.get("DYNAFLOW_OUTPUT_DIR"))


def _on_torch_imported():
    """Installs the plan (under `dynaflow apply`), the torch.profiler watch
    and the operator recorder (under `dynaflow trace`); one line on any
    failure."""
    # The dynaflow package sits beside this directory. Appended, so it
    # shadows none of the program's modules.
    sys.path.append(os.path.dirname(_HERE))
    if os.environ.get("DYNAFLOW_PLAN"):
        try:
            from dynaflow import _apply

            _apply.install_from_env()
        except Exception as e:  # noqa: BLE001 - the program must run on
            _warn(f"{e!r}; the plan is not applied")
    if _under_tracer() or _tracing():
        try:
            from dynaflow import _torch_profiler

            _torch_profiler.watch_torch_profiler()
        except Exception as e:  # noqa: BLE001 - the program must run on
            _warn(f"{e!r}; GPU activity after a torch.profiler window is not recorded")
        # --ops off included: without it the tracer's last flush is its C exit
        # handler's, after torch, libcuda and libcupti have torn down.
        try:
            from dynaflow import _module_paths

            _module_paths.finish_trace_at_exit()
        except Exception as e:  # noqa: BLE001 - the program must run on
            _warn(f"{e!r}; the tracer flushes at exit after CUDA's teardown")
    if not _tracing():
        return
    try:
        from dynaflow import _module_paths

        _module_paths.watch_process_group()
    except Exception as e:  # noqa: BLE001 - the program must run on
        _warn(f"{e!r}; ranks come from the environment only")
    try:
        lib = _module_paths.load_extension()
        if _module_paths.install_recorder(lib) == _module_paths.RECORDING:
            _module_paths.install_global_hooks(lib)
    except Exception as e:  # noqa: BLE001 - the program must run on
        _warn(f"{e}; operators are not recorded")


class _ThenInstall(importlib.abc.Loader):
    """torch's own loader, followed by _on_torch_imported once torch/__init__
    has run. A failed import of torch propagates unchanged."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _on_torch_imported()


class _TorchImportWatcher(importlib.abc.MetaPathFinder):
    """Wraps the loader of the first `import torch`, then steps aside."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        try:
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec("torch")
        except Exception:  # noqa: BLE001 - let the normal import report it
            return None
        if spec is None or spec.loader is None:
            return None
        spec.loader = _ThenInstall(spec.loader)
        return spec


def _install():
    _run_shadowed_sitecustomize()
    if not _tracing() and not os.environ.get("DYNAFLOW_PLAN") and not _under_tracer():
        return
    if "torch" in sys.modules:  # imported by the shadowed sitecustomize
        _on_torch_imported()
    else:
        sys.meta_path.insert(0, _TorchImportWatcher())


_install()
