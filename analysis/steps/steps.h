// Training or serving steps of one device, found in this order:
//   1. ProfilerStep#N ranges projected on the device (gpu_user_annotation):
//      an activity belongs to the step whose window its start falls in;
//   2. ProfilerStep#N ranges on the host of the same rank: an activity belongs
//      to the step during which its launch call started (correlation id), or
//      whose range its start falls in when the launch is unknown;
//   3. the repeating kernel sequence: the rarest kernel name that recurs at a
//      constant period (in kernels) covering most of the trace marks the step
//      boundaries;
//   4. otherwise the whole trace is one step.
// A step's window runs from its first activity's start to the next step's
// first start (the last step ends at its last activity's end), so the steps
// tile the device's timeline and GPU idle time between steps, while the host
// prepares the next one, belongs to the step that waits.
#pragma once

#include <cstdint>
#include <vector>

#include "analysis/model/trace.h"
#include "analysis/roofline/bound.h"

namespace dynaflow {

enum class StepSource { kGpuAnnotation = 0, kHostAnnotation = 1, kRepeat = 2, kWhole = 3 };

// "profiler_step_gpu", "profiler_step_host", "repeating_sequence", "whole_trace".
const char* StepSourceName(StepSource s);

struct Step {
  int64_t number = 0;  // N of ProfilerStep#N, else the ordinal
  TimeNs start = 0;    // first activity's start
  TimeNs end = 0;      // next step's first start, or the last activity's end
  TimeNs busy_end = 0;  // the step's last activity's end
  int64_t activities = 0;
  double duration_us() const { return static_cast<double>(end - start) / 1000.0; }
};

struct DeviceSteps {
  StepSource source = StepSource::kWhole;
  std::vector<Step> steps;  // by start
  // Step index of each activity of DeviceResources::order; -1 outside every step.
  std::vector<int32_t> step_of;
  size_t representative = 0;  // the step of median duration
  double mean_us = 0;
  double median_us = 0;
  double min_us = 0;
  double max_us = 0;
  double stdev_us = 0;
  double cv_pct = 0;  // stdev / mean
};

DeviceSteps FindSteps(const Trace& trace, const DeviceResources& device);

}  // namespace dynaflow
