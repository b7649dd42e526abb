// Chrome-trace JSON in the conventions of Kineto (the PyTorch profiler), for
// Perfetto UI, chrome://tracing and tools that read PyTorch traces (HTA,
// TraceLens, dynaflow's own Kineto importer).
//
// One document holds one rank: `distributedInfo` is the rank's as its file
// wrote it (backend, world_size, pg_config...; {"rank":N} when none was read)
// with `rank` set to the rank, so a multi-rank trace is written as one file
// per rank. `deviceProperties` are the entries the file had, every field
// kept, else built from the model.
//
// Events (ph X), times in microseconds written exactly from integer
// nanoseconds with three decimals, relative to the top-level
// `baseTimeNanoseconds` as recent torch.profiler writes them (so a double
// holds every nanosecond); the base is the same for every rank of a trace
// (ExportBaseTimeNs):
//   cpu_op               operators on (pid, tid); args External id, Sequence
//                        number, Input Dims, Input type, Module Hierarchy, and
//                        Fwd thread id on backward operators (the model keeps
//                        no forward thread: its value is 1, Kineto's first
//                        thread; the importer reads its presence). Kineto
//                        has no mark for the forward pass but a sequence
//                        number: a forward operator without one (inference
//                        mode) reads back with an unknown pass. Also Input
//                        Strides, Concrete Inputs and the collective metadata
//                        of record_param_comms when read
//   cuda_sync            synchronization records on their recorded (pid, tid)
//                        (device and stream in Kineto files), args
//                        External id, cuda_sync_kind, wait_on_stream,
//                        wait_on_cuda_event_record_corr_id,
//                        wait_on_cuda_event_id, stream, correlation, device
//   cuda_runtime, cuda_driver
//                        API calls on their recorded (pid, tid); args
//                        External id, correlation
//   kernel, gpu_memcpy, gpu_memset
//                        on pid = device, tid = stream; args External id,
//                        device, stream, correlation, and grid, block,
//                        registers per thread, shared memory, NCCL collective
//                        metadata when read (kernels) or
//                        bytes, memory bandwidth (GB/s), kind (copies)
//   user_annotation      user ranges and NVTX ranges (Kineto has no NVTX
//                        category) on their (pid, tid)
//   gpu_user_annotation  device projections of user ranges (ProfilerStep#N),
//                        on their recorded (pid, tid), args device
// plus ac2g flow events (s at the launching API call, f at the first GPU
// activity or the synchronization record with its correlation id),
// cuda_stream_wait flows for cross-stream dependencies (stream_dependencies.h:
// s at the last activity on the recorded event's stream before the
// cudaEventRecord, f at the first activity on the waiting stream after the
// cudaStreamWaitEvent, id the wait's correlation id), fwdbwd
// flows from forward to backward operators of one sequence number, one
// process label and sort index per pid (the label the file had, else "GPU N"
// for a device's pid and "CPU" for any other), and the process and thread
// names the trace has (none invented, so a round trip keeps the store's rows).
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

// The baseTimeNanoseconds of every document of `trace`: the earliest start of
// any record, rounded down to a whole second; 0 for an empty trace.
TimeNs ExportBaseTimeNs(const Trace& trace);

// Writes the records of `rank` as one JSON document. The caller checks the
// stream for write errors.
void WritePerfettoJson(const Trace& trace, int32_t rank, std::ostream& out);

}  // namespace dynaflow
