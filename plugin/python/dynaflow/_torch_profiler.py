"""The tracer beside torch.profiler in the same program.

CUPTI has one set of buffer callbacks per process. When torch.profiler
prepares a trace, its Kineto registers its own callbacks and clock with CUPTI
(CuptiActivityApi::enableCuptiActivities); when it stops, it disables its
activity kinds (disableCuptiActivities), which are the tracer's too. Without
help the tracer would record nothing from the profiler's first window on.

watch_torch_profiler wraps the three functions every Kineto-based profiler of
torch calls (torch.autograd.profiler's _prepare_profiler, _enable_profiler
and _disable_profiler; torch.profiler.profile reaches them through
torch.autograd.profiler.profile): before a Kineto profiler prepares or starts
it synchronises the device and lends CUPTI (dynaflow_tracer_lend_cupti, which
flushes the tracer's buffers first); after the profiler stops it reclaims
CUPTI (dynaflow_tracer_reclaim_cupti: callbacks, clock and kinds again). The
tracer records each window and the operators launched in it in its
metadata (plugin/preload/tracer.h, Tracer::LendCupti).
"""

import functools

from dynaflow import _module_paths


def _synchronize_device():
    """Waits for the device so that the records of launched work are complete
    before the tracer flushes them. A broken device: flush what there is."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - the profiler must start regardless
        pass


def watch_torch_profiler(lend=None, reclaim=None):
    """Wraps torch's profiler entry points so that the tracer lends CUPTI to a
    Kineto profiler and takes it back after. `lend` and `reclaim` default to
    the tracer's C functions; without a tracer nothing is wrapped. Returns a
    function that restores the originals, or None when nothing was wrapped.
    The profiler's own calls, results and exceptions are unchanged."""
    lend = lend or _module_paths._tracer_function("dynaflow_tracer_lend_cupti", [])
    reclaim = reclaim or _module_paths._tracer_function("dynaflow_tracer_reclaim_cupti", [])
    if lend is None or reclaim is None:
        return None
    import torch.autograd
    import torch.autograd.profiler as autograd_profiler

    def lend_for(activities):
        # ITT and NVTX annotation (emit_itt, emit_nvtx) pass no activities and
        # leave CUPTI alone.
        if not activities:
            return
        _synchronize_device()
        try:
            lend()
        except Exception:  # noqa: BLE001 - the profiler must start regardless
            pass

    def before_kineto(original):
        @functools.wraps(original)
        def wrapper(config, activities, *args, **kwargs):
            lend_for(activities)
            return original(config, activities, *args, **kwargs)

        return wrapper

    def after_stop(original):
        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            try:
                return original(*args, **kwargs)
            finally:
                try:
                    reclaim()
                except Exception:  # noqa: BLE001 - the program goes on
                    pass

        return wrapper

    names = {"_prepare_profiler": before_kineto, "_enable_profiler": before_kineto,
             "_disable_profiler": after_stop}
    modules = [autograd_profiler, torch.autograd]
    originals = {(m, n): getattr(m, n) for m in modules for n in names if hasattr(m, n)}
    for (module, name), original in originals.items():
        setattr(module, name, names[name](original))

    def restore():
        for (module, name), original in originals.items():
            setattr(module, name, original)

    return restore

