// Chrome-trace JSON in the conventions of Kineto (the PyTorch profiler), for
// Perfetto UI, chrome://tracing and tools that read PyTorch traces (HTA,
// TraceLens, dynaflow's own Kineto importer).
//
// One document holds one rank: `distributedInfo.rank` names it, as in Kineto
// files, so a multi-rank trace is written as one file per rank.
//
// Events (ph X), times in microseconds written exactly from integer
// nanoseconds with three decimals, on the trace's own clock:
//   cpu_op               operators on (pid, tid); args External id, Sequence
//                        number, Input Dims, Input type, Module Hierarchy, and
//                        Fwd thread id on backward operators (the model keeps
//                        no forward thread: its value is 1, Kineto's first
//                        thread; the importer reads its presence). Kineto
//                        has no mark for the forward pass but a sequence
//                        number: a forward operator without one (inference
//                        mode) reads back with an unknown pass
//   cuda_runtime, cuda_driver, cuda_sync
//                        API calls on their recorded (pid, tid): the host
//                        thread, or a device and stream for Kineto's
//                        synchronization records; args External id, correlation
//   kernel, gpu_memcpy, gpu_memset
//                        on pid = device, tid = stream; args External id,
//                        device, stream, correlation, and grid, block,
//                        registers per thread, shared memory (kernels) or
//                        bytes, memory bandwidth (GB/s), kind (copies)
//   user_annotation      user ranges and NVTX ranges (Kineto has no NVTX
//                        category) on their (pid, tid)
//   gpu_user_annotation  device projections of user ranges (ProfilerStep#N),
//                        on their recorded (pid, tid), args device
// plus ac2g flow events (s at the launching API call, f at the first GPU
// activity with its correlation id), process and thread names (host processes
// labelled CPU, devices labelled "GPU N" with their streams named "stream N")
// and the devices' properties under `deviceProperties`.
//
// Strings are escaped for JSON; bytes that are not UTF-8 become U+FFFD so the
// document always parses. Stored shapes and types that are not valid JSON are
// left out.
#pragma once

#include <cstdint>
#include <ostream>
#include <vector>

#include "analysis/model/trace.h"

namespace dynaflow {

// The ranks that have any record in `trace`, ascending.
std::vector<int32_t> TraceRanks(const Trace& trace);

// Writes the records of `rank` as one JSON document. The caller checks the
// stream for write errors.
void WritePerfettoJson(const Trace& trace, int32_t rank, std::ostream& out);

}  // namespace dynaflow
