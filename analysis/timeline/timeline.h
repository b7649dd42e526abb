// The GPU timeline of each device, with exactly the definitions of DESIGN.md
// ("GPU timeline: exact definitions"), plus per-stream busy time and idle
// breakdown, the breakdown by class and the top kernels.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "analysis/model/trace.h"

namespace dynaflow {

enum class GpuClass { kComputation = 0, kCommunication = 1, kMemcpy = 2 };

// communication: a kernel whose name contains "nccl" or "rccl" (any case);
// memcpy: memcpy events; computation: every other kernel, and memsets.
GpuClass ClassifyActivity(const Trace& trace, const GpuActivity& activity);

// All times in microseconds.
struct TimelineBreakdown {
  double computation_us = 0;
  double exposed_comm_us = 0;
  double exposed_memcpy_us = 0;
  double busy_us = 0;
  double idle_us = 0;
  double total_us = 0;
  double total_comm_us = 0;
  double total_memcpy_us = 0;
  std::optional<double> comm_hidden_pct;  // absent without communication
};

// Idle time of one stream between its first start and last end, split as
// Holistic Trace Analysis does.
struct StreamStats {
  int32_t stream = 0;
  int64_t kernels = 0;
  int64_t memcpys = 0;
  int64_t memsets = 0;
  double busy_us = 0;   // union of the stream's activity
  double span_us = 0;   // last end - first start
  double idle_us = 0;   // span - busy
  double host_wait_us = 0;    // the launch call started after the stream went idle
  double kernel_wait_us = 0;  // other gaps shorter than the threshold
  double other_wait_us = 0;
};

struct ClassStats {
  std::string name;  // computation | communication | memcpy | memset
  int64_t count = 0;
  double time_us = 0;  // sum of durations (not a union)
};

struct KernelStats {
  std::string name;
  GpuClass gpu_class = GpuClass::kComputation;
  int64_t count = 0;
  double total_us = 0;
  double mean_us = 0;
  double min_us = 0;
  double max_us = 0;
  double share_pct = 0;  // of the device's busy time
};

struct DeviceTimeline {
  uint32_t device_index = 0;
  int32_t rank = 0;
  int32_t device = 0;
  std::string name;
  int64_t events = 0;     // GPU events counted (inside the step window)
  int32_t profiler_steps = 0;  // ProfilerStep#N windows used, 0 when none
  TimelineBreakdown timeline;
  std::vector<StreamStats> streams;
  std::vector<ClassStats> classes;
  std::vector<KernelStats> top_kernels;
};

struct TimelineOptions {
  // Gaps shorter than this between consecutive activities on a stream count as
  // kernel wait (launch overhead) unless the host was late.
  TimeNs kernel_wait_threshold_ns = 30000;
  size_t top_kernels = 10;
};

// One entry per device that has GPU activity, sorted by (rank, device).
std::vector<DeviceTimeline> AnalyzeTimelines(const Trace& trace, const TimelineOptions& options);

}  // namespace dynaflow
