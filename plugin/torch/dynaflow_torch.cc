#include "plugin/torch/dynaflow_torch.h"

#include <cstdlib>
#include <mutex>

#include "plugin/torch/module_stack.h"
#include "plugin/torch/op_recorder.h"

namespace dynaflow {
namespace {

// DYNAFLOW_OPS_SAMPLE as a positive integer; 1 when unset or malformed.
int64_t SampleEveryFromEnv() {
  const char* text = std::getenv("DYNAFLOW_OPS_SAMPLE");
  if (text == nullptr || *text == '\0') return 1;
  char* end = nullptr;
  const long long n = std::strtoll(text, &end, 10);
  return (*end == '\0' && n >= 1) ? n : 1;
}

int Install() {
  std::optional<TracerAbi> abi = FindTracerAbi();
  if (!abi) return DYNAFLOW_TORCH_NO_TRACER;
  if (abi->record_ops() == 0) return DYNAFLOW_TORCH_OPS_OFF;
  OpRecorderOptions options;
  options.sample_every = SampleEveryFromEnv();
  return InstallOpRecorder(*abi, options) ? DYNAFLOW_TORCH_RECORDING : DYNAFLOW_TORCH_REFUSED;
}

}  // namespace
}  // namespace dynaflow

extern "C" {

const char* dynaflow_torch_built_version(void) { return DYNAFLOW_TORCH_VERSION; }

int dynaflow_torch_install(void) {
  static std::once_flag once;
  static int result = DYNAFLOW_TORCH_NO_TRACER;
  std::call_once(once, [] { result = dynaflow::Install(); });
  return result;
}

const char* dynaflow_torch_intern_module_path(const char* path) {
  try {
    return dynaflow::InternModulePath(path == nullptr ? "" : path);
  } catch (...) {
    return nullptr;  // out of memory: the module is then entered without a name
  }
}

void dynaflow_torch_enter_module(const char* interned_path) {
  try {
    dynaflow::PushModule(interned_path);
  } catch (...) {
    // Out of memory: the stack stays as it was, and the matching exit pops
    // the enclosing module early; paths are then coarser, never wrong memory.
  }
}

void dynaflow_torch_exit_module(void) { dynaflow::PopModule(); }

}  // extern "C"
