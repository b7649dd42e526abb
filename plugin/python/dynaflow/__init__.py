"""dynaflow's Python side.

Under `dynaflow trace` and `dynaflow apply` nothing needs calling: the bootstrap on PYTHONPATH
(plugin/python/bootstrap/sitecustomize.py) loads the torch extension when the
program imports torch and attributes the operators of every nn.Module.

A program that runs with the tracer preloaded but without the bootstrap
(LD_PRELOAD=libdynaflow_preload.so set by hand, say) calls
enable_module_paths(model) itself.
"""

from dynaflow import _module_paths
from dynaflow._apply import PlanMismatch

__all__ = ["apply", "enable_module_paths", "PlanMismatch"]


def apply(model, plan, verify=False, runtime_lib=None, strict=False, graphs=True):
    """Runs the modules of `model` that `plan` (plan.json from `dynaflow advise
    --plan`, or its loaded dict) splits through dynaflow's overlap runtime
    (`runtime_lib`, default env DYNAFLOW_APPLY_LIB: libdynaflow_apply.so).
    Changes `model` in place and returns it. Raises PlanMismatch, naming what
    differs, when the plan does not fit the model; `model` is then unchanged.
    With strict, a plan made for another model (model.module_fingerprint)
    or one that records no fingerprint raises too; without, a different
    model is said in one line on stderr and the plan applied.
    With verify, every planned call also runs the original forward and the
    differences are kept in model._dynaflow_applier.report.
    On CUDA, with graphs, each unit's planned schedule is captured once per
    shape into a CUDA graph and replayed (dynaflow._graphs says which calls
    cannot be, and why), through the replay module named by env
    DYNAFLOW_REPLAY_EXT (_dynaflow_replay.so); without graphs, or without
    that module (said in one line), every planned call runs eagerly.
    The micro-batches run under the caller's torch state (modes, hooks,
    torch.func transforms) through that module too; without it a call under
    more than grad, inference mode and autocast runs the original way. Each
    runs in a copy of the caller's context variables (contextvars): a call
    that changes one refuses the plan, as one that changes its modules' state.
    """
    from dynaflow import _apply

    return _apply.apply(model, plan, verify=verify, runtime_lib=runtime_lib, strict=strict,
                        graphs=graphs)


def enable_module_paths(model, extension=None):
    """Records torch operators with the path of their module in `model`
    ("Llama.layers.0.mlp"): loads the torch extension (`extension`, default
    env DYNAFLOW_TORCH_EXT), registers its operator recorder and hooks on
    `model`'s modules. Returns a handle whose remove() takes the hooks out;
    None when the tracer records no operators (--ops off). Raises
    dynaflow._module_paths.ExtensionError when the extension cannot be used.
    """
    lib = _module_paths.load_extension(extension)
    if _module_paths.install_recorder(lib) == _module_paths.OPS_OFF:
        return None
    return _module_paths.install_model_hooks(lib, model)
