/* The C entry points of _dynaflow_torch, called through ctypes by the Python
 * side (plugin/python/dynaflow). A C interface keeps the extension free of
 * Python headers and of any one Python version. Every function is safe to
 * call from any thread and never throws. */
#ifndef DYNAFLOW_PLUGIN_TORCH_DYNAFLOW_TORCH_H_
#define DYNAFLOW_PLUGIN_TORCH_DYNAFLOW_TORCH_H_

#ifdef __cplusplus
extern "C" {
#endif

#if defined(DYNAFLOW_TORCH_EXPORT)
#define DYNAFLOW_TORCH_API __attribute__((visibility("default")))
#else
#define DYNAFLOW_TORCH_API
#endif

/* Results of dynaflow_torch_install. */
enum DynaflowTorchInstall {
  DYNAFLOW_TORCH_RECORDING = 1,  /* operators are recorded while the tracer is active */
  DYNAFLOW_TORCH_OPS_OFF = 0,    /* the tracer records no operators (--ops off) */
  DYNAFLOW_TORCH_NO_TRACER = -1, /* no tracer ABI in this process: nothing recorded */
  DYNAFLOW_TORCH_REFUSED = -2    /* torch refused the RecordFunction callbacks */
};

/* The torch version the extension was built against, e.g. "2.11.0". Callers
 * load it only into that torch: its C++ ABI is not stable across versions. */
DYNAFLOW_TORCH_API const char* dynaflow_torch_built_version(void);

/* Finds the tracer and registers the operator recorder once per process
 * (later calls return the first result). Env DYNAFLOW_OPS_SAMPLE=N records
 * one top-level operator in N per thread (default 1: all). */
DYNAFLOW_TORCH_API int dynaflow_torch_install(void);

/* A stable pointer for a module path, to pass to dynaflow_torch_enter_module. */
DYNAFLOW_TORCH_API const char* dynaflow_torch_intern_module_path(const char* path);

/* Enters and leaves an nn.Module's forward on the calling thread. */
DYNAFLOW_TORCH_API void dynaflow_torch_enter_module(const char* interned_path);
DYNAFLOW_TORCH_API void dynaflow_torch_exit_module(void);

#ifdef __cplusplus
}
#endif

#endif /* DYNAFLOW_PLUGIN_TORCH_DYNAFLOW_TORCH_H_ */
