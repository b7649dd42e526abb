// One measured step of one device as a task graph the simulator can replay
// under other schedules.
//
// Every GPU activity of the step is a task, with its measured duration, bound
// resource, share of its operator's FLOPs and bytes, and names in the user's
// terms (operator, top-level operator, module). Constraints:
//   * stream order: each task follows the previous task of its stream;
//   * cross-stream waits: a task that starts after its own stream went idle,
//     within `wait_window_us` of the end of a task on another stream, while the
//     host had already launched it, waits on that task (cudaStreamWaitEvent);
//   * GPU-side latency: the measured gap between a task's last dependency and
//     its start, when the host does not explain it, is kept as `delay_us`;
//   * the host: launches are issued in their measured order, each after the
//     host time measured since the previous launch (`host_delta_us`, without
//     time blocked in synchronizing calls); a launch that followed a blocking
//     call of its thread (cudaStreamSynchronize, a synchronous memcpy...) is
//     issued only once the task the call waited for finished (`sync_task`:
//     the last task, issued before, to finish inside the thread's last
//     blocking call since its previous launch during which one finished),
//     plus the host time measured from that task's end to the launch
//     (`post_sync_us`). A blocking call with no task finishing during it
//     waited on nothing on this GPU and counts as host time. A task starts no
//     earlier than its launch plus `launch_latency_us` (at most the call's
//     duration plus `max_launch_latency_us`);
//   * the step's end: the host's issue of the next step's first activity
//     (`end`), or the last task's end if later; `tail_us` (measured) only
//     where that launch is unknown.
// Replaying the graph with the measured durations and no co-running penalty
// reproduces the measured start times; what a faster GPU schedule gains, the
// host model passes on to the launches that waited on it.
#pragma once

#include <string>
#include <vector>

#include "analysis/model/trace.h"
#include "analysis/roofline/bound.h"
#include "analysis/steps/steps.h"

namespace dynaflow {

struct SimTask {
  Resource resource = Resource::kMemory;
  OpKind kind = OpKind::kUnknown;
  double dur_us = 0;          // measured
  double start_us = 0;        // measured, from the step's start
  double flops = 0;           // this task's share of its operator's cost; 0 unknown
  double bytes = 0;
  double weight_bytes = 0;
  double rows = 0;            // the operator's token rows (GEMM M), 0 unknown
  double grid_waves = 0;      // its grid in waves of the device (GridWaves), 0 unknown
  double delay_us = 0;        // GPU-side latency after its last dependency
  bool launched = false;      // its launch call is known (host model applies)
  double host_delta_us = 0;   // host time since the previous launch (first: offset from step start)
  double post_sync_us = -1;   // >= 0: issued after a blocking call, this long after it returned
  int32_t sync_task = -1;     // ... which returned when this task finished (-1: all launched work)
  double launch_latency_us = 0;  // from launch call to the earliest GPU start
  bool token_scaled = true;   // false for per-step work: optimizer, gradient zeroing
  bool deferrable = false;    // a collective whose result is needed only at the step's end
  int32_t lane = 0;           // index into StepGraph::lane_streams
  StringId kernel = 0;        // kernel name
  StringId op = 0;            // launching operator (0 none)
  StringId top = 0;           // its outermost operator (0 none)
  StringId module = 0;        // module path, or top-level operator when no path (0 none)
};

// How the host issues one launch (the fields of SimTask of the same names).
struct HostIssue {
  double host_delta_us = 0;
  double post_sync_us = -1;
  int32_t sync_task = -1;
  double latency_us = 0;
};

struct StepGraph {
  uint32_t device_index = 0;
  size_t step_index = 0;
  TimeNs start = 0;          // absolute start of the step
  double measured_us = 0;    // the step window's duration
  // The step ends when the host issues the next step's first activity
  // (`end`, after the step's last launch, as the tasks' launches are issued),
  // or when its last task ends if that is later. Without that launch
  // (`end_known` false: the last step, or no launch calls) it ends `tail_us`
  // (measured) after the last task.
  bool end_known = false;
  HostIssue end;
  double tail_us = 0;        // idle after the last task, inside the window (0 when end_known)
  // Tokens per step: the step's own (Step::tokens: the serving annotation,
  // attention shapes), else the most common GEMM M, else a convolution's
  // batch or an embedding's rows; 0 unknown. `tokens_source` says which.
  double tokens = 0;
  TokenSource tokens_source = TokenSource::kNone;
  StepPhase phase = StepPhase::kUnknown;  // Step::phase
  double launch_cost_us = 4;  // median host time of one launch call
  bool truncated = false;    // more tasks than the cap: only the first ones are kept
  std::vector<int32_t> lane_streams;  // stream id of each lane
  std::vector<SimTask> tasks;         // by measured start
  std::vector<int32_t> dep_begin;     // CSR: deps of task i are deps[dep_begin[i]..dep_begin[i+1])
  std::vector<int32_t> deps;
  std::vector<int32_t> host_order;    // launched tasks in launch order

  size_t size() const { return tasks.size(); }
};

struct GraphOptions {
  double wait_window_us = 30.0;  // how late after a producer a waiting task may start
  double idle_epsilon_us = 1.0;  // gaps shorter than this are back-to-back launches
  // The most a kernel waits for the GPU after its launch call returns, on an
  // idle stream (CUDA launch latency is a few microseconds); a longer wait is
  // GPU-side latency (`delay_us`). Added to the call's own duration: a call
  // held up by lazy module loading or JIT releases its kernel at its return.
  double max_launch_latency_us = 10.0;
  size_t max_tasks = 20000;
};

StepGraph BuildStepGraph(const Trace& trace, const OperatorLinks& links,
                         const DeviceResources& device, const DeviceSteps& steps,
                         size_t step_index, CostCache* costs, const GraphOptions& options);

}  // namespace dynaflow
