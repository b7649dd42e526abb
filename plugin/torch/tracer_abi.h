// The tracer's C ABI (plugin/preload/dynaflow_tracer.h) as found at run time.
//
// The extension never links the tracer: libdynaflow_preload.so is loaded by
// LD_PRELOAD into the traced process, and its functions are looked up with
// dlsym(RTLD_DEFAULT). Without it the extension records nothing.
#pragma once

#include <cstdint>
#include <optional>

#include "plugin/preload/dynaflow_tracer.h"

namespace dynaflow {

struct TracerAbi {
  int (*active)();
  int (*record_ops)();
  int64_t (*now_ns)();
  uint64_t (*next_operator_id)();
  void (*push_operator)(uint64_t id);
  void (*pop_operator)();
  void (*record_operator)(const DynaflowOperatorRecord* record);
};

// Every function of the ABI, or nullopt when one is missing or the loaded
// tracer speaks another DYNAFLOW_TRACER_ABI_VERSION.
std::optional<TracerAbi> FindTracerAbi();

}  // namespace dynaflow
