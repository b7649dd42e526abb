// Idle-resource windows: stretches of a device's steps where one resource is
// saturated while another sits idle.
//
// One sweep over the device's activities (sorted by start) cuts each step into
// elementary segments with a constant set of running activities, and names each
// segment by the classes running (bound.h):
//   communication_exposed  only communication (maybe copies) runs: SMs idle under
//                          a collective; cause `peer` where every running
//                          collective still waits for another rank (before
//                          the latest start of the same collective, the k-th
//                          of its name, on the other ranks in the trace)
//   copy_exposed           only copies run: SMs idle under a memcpy
//   memory_bound           memory-bound kernels and no compute-bound one: tensor
//                          cores idle (decode attention, norms, elementwise)
//   compute_bound          compute-bound kernels, no memory-bound or collective
//                          one: HBM bandwidth idle under GEMMs
//   launch_bound           only short latency-bound kernels: SMs idle between
//                          launches
//   gpu_idle               nothing runs: the GPU waits, and `cause` says on what:
//                          the host (the next activity's launch call started
//                          after the GPU went idle, less the launch latency), a
//                          dependency (it was launched before and waits on an
//                          event or another stream), or unknown (no launch call
//                          in the trace)
// Consecutive segments of one kind form an interval. Intervals are grouped by
// (kind, the operator holding most of their time; for gpu_idle the operator
// the GPU waited for, and the cause), and each group is one IdleWindow.
//
// Recoverable time per step, an upper bound on what a schedule could remove
// (on the device it simulates, the advisor lowers it to what the simulator
// recovers: advisor.cc, RecoverableFromSimulation):
//   communication/copy exposed, gpu_idle: all of it (overlap on a side stream,
//     host-side fixes or CUDA graphs);
//   launch_bound: half (fusion or graphs remove launches, not the kernels);
//   memory_bound and compute_bound: overlapping the two complementary kinds
//     (nano-batches) removes at most min(memory, compute) of step time, credited
//     half to each side: window * 0.5 * min(1, other kind's total / this kind's).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "analysis/model/trace.h"
#include "analysis/roofline/bound.h"
#include "analysis/steps/steps.h"

namespace dynaflow {

enum class WindowKind : uint8_t {
  kCommExposed = 0,
  kCopyExposed = 1,
  kMemoryBound = 2,
  kComputeBound = 3,
  kLaunchBound = 4,
  kGpuIdle = 5,
};
inline constexpr int kWindowKindCount = 6;

const char* WindowKindName(WindowKind k);
const char* WindowSaturated(WindowKind k);  // the busy resource
const char* WindowIdle(WindowKind k);       // the idle one

// Why the GPU idled (gpu_idle windows), or kPeer for a communication_exposed
// window waiting for another rank; kNone otherwise.
enum class IdleCause : uint8_t { kNone = 0, kHost = 1, kDependency = 2, kPeer = 3, kUnknown = 4 };
// "", "host", "dependency", "peer", "unknown".
const char* IdleCauseName(IdleCause c);

struct KindInterval {
  WindowKind kind;
  TimeNs start;
  TimeNs end;
};

struct IdleWindow {
  WindowKind kind = WindowKind::kGpuIdle;
  IdleCause cause = IdleCause::kNone;
  std::string label;  // one line for humans
  int64_t occurrences = 0;  // intervals over all steps
  double total_us = 0;      // over all steps
  double per_step_us = 0;
  double share_of_step_pct = 0;  // of the mean step
  double recoverable_us = 0;     // per step: the upper bound below, or what the simulator recovers
  bool recoverable_simulated = false;  // set by the advisor on the device it simulates
  std::vector<std::pair<std::string, double>> operators;  // inside, by time (us per step)
  std::vector<std::pair<std::string, double>> modules;    // module paths or top-level operators
  std::vector<KindInterval> examples;  // up to three in the representative step
};

struct DeviceWindows {
  std::vector<IdleWindow> windows;  // by recoverable time, best first
  double per_step_us[kWindowKindCount] = {};  // each kind's time per step
  std::vector<KindInterval> representative;    // every interval of the representative step
};

struct WindowOptions {
  size_t max_windows = 12;
  size_t max_representative_intervals = 4000;
  // A launch this long before the GPU went idle still explains the idle (the
  // launch had not reached the GPU): CUDA launch latency is a few us.
  TimeNs launch_latency_ns = 10'000;
};

DeviceWindows FindIdleWindows(const Trace& trace, const OperatorLinks& links,
                              const DeviceResources& device, const DeviceSteps& steps,
                              const WindowOptions& options);

}  // namespace dynaflow
