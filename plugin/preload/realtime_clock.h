// The clock of every record the tracer writes.
#pragma once

#include <time.h>

#include <cstdint>

namespace dynaflow {

// CLOCK_REALTIME in nanoseconds: the clock of operators (dynaflow_now_ns)
// and of CUPTI's records (CuptiSession registers it with CUPTI).
// Async-signal-safe.
inline int64_t RealtimeNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace dynaflow
