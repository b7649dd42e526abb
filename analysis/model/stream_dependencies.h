// Cross-stream dependency edges: cudaStreamWaitEvent(B, e) after
// cudaEventRecord(e, A) orders the work launched on stream B after the wait
// behind the work launched on stream A before the record.
#pragma once

#include <cstdint>
#include <vector>

#include "analysis/model/trace.h"

namespace dynaflow {

struct StreamDependency {
  size_t wait = 0;    // into Trace::api: the synchronization record of the wait
  int64_t from = -1;  // into Trace::gpu: the last activity launched on the event's
                      // stream before the cudaEventRecord; -1 when the trace has none
  int64_t to = -1;    // into Trace::gpu: the first activity launched on the waiting
                      // stream after the wait; -1 when the trace has none
};

// One edge per synchronization record that waits on stream A for an event
// recorded on another stream B of the same rank (ApiCall::sync_stream,
// wait_on_stream and wait_event_correlation all known, as the tracer and
// Kineto's cuda_sync records give them), in the order of Trace::api. Launch
// order is correlation order: CUDA hands out correlation ids in increasing
// order within a process, so "before the record" is a smaller correlation id
// than the record's and "after the wait" a larger one than the wait's. GPU
// activities are matched on the wait's device when it is known (sync_device),
// else on any device of its rank; several activities of one correlation id
// (a graph launch) give the one that ends last (from) or starts first (to).
// Correlation ids are unique only within a process: the activities are those
// the wait's process launched (GpuActivity::pid), or, where GPU rows name no
// process (Kineto files, one process each), any of its rank's.
std::vector<StreamDependency> CrossStreamDependencies(const Trace& trace);

}  // namespace dynaflow
