#include "plugin/torch/tracer_abi.h"

#include <dlfcn.h>

namespace dynaflow {
namespace {

// Looks `name` up in the global scope; false when it is absent.
template <typename Fn>
bool Resolve(const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
  return *out != nullptr;
}

}  // namespace

std::optional<TracerAbi> FindTracerAbi() {
  int (*abi_version)() = nullptr;
  if (!Resolve("dynaflow_tracer_abi_version", &abi_version) ||
      abi_version() != DYNAFLOW_TRACER_ABI_VERSION) {
    return std::nullopt;
  }
  TracerAbi abi{};
  const bool complete = Resolve("dynaflow_tracer_active", &abi.active) &&
                        Resolve("dynaflow_tracer_record_ops", &abi.record_ops) &&
                        Resolve("dynaflow_now_ns", &abi.now_ns) &&
                        Resolve("dynaflow_next_operator_id", &abi.next_operator_id) &&
                        Resolve("dynaflow_push_operator", &abi.push_operator) &&
                        Resolve("dynaflow_pop_operator", &abi.pop_operator) &&
                        Resolve("dynaflow_record_operator", &abi.record_operator);
  if (!complete) return std::nullopt;
  return abi;
}

}  // namespace dynaflow
