// The CUDA backend: issues a schedule's tasks on CUDA streams with events
// between them, and captures the whole multi-stream schedule as one CUDA graph
// per (schedule, bucket), replayed on later calls.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "runtime/buffers.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/executor.h"

namespace dynaflow::runtime::cuda {

// A call runs on the executor's own streams; stream 0 is the origin. In order:
//   enter  the origin waits for an event recorded on the caller's stream;
//   fork   an event recorded on the origin is waited for by every other stream
//          the schedule uses (during capture this pulls them into it);
//   tasks  in the schedule's issue order, each on its stream after waiting for
//          the events of its dependencies on other streams; a task that another
//          stream waits for records its event after its work;
//   join   each of those streams records an event the origin waits for;
//   exit   the caller's stream waits for an event recorded on the origin.
// Eager calls (bucket < 0) issue fork, tasks and join directly. A call with a
// bucket replays the graph cached for (schedule, bucket); on a miss, fork,
// tasks and join are first captured from the origin (capture cannot begin on
// the legacy stream, which is why the executor has its own origin) into one
// graph, instantiated and cached. Between enter and exit the launch takes the
// place of the tasks. Task callbacks run on the submitting thread during
// eager calls and captures only.
//
// Every call and capture hands tasks the same memory pool (TaskContext::
// memory_pool). Graphs are launched only on the origin stream, so they never
// run concurrently and CUDA may share physical memory between the graphs'
// allocations.
//
// Cached graphs live as long as the executor: a plan's schedules are built
// once, and schedule ids are never reused, so a stale graph cannot be
// replayed. Submit and Wait must be called from one thread at a time, with the
// same device current on every call.
class CudaExecutor final : public Executor {
 public:
  // Creates nothing yet: streams, events and the pool are created at the first
  // Submit (CUDA is initialised lazily, on the device current then).
  CudaExecutor(CudaApi& api, int num_streams);
  ~CudaExecutor() override;  // destroys graphs, events, streams and the pool

  CudaExecutor(const CudaExecutor&) = delete;
  CudaExecutor& operator=(const CudaExecutor&) = delete;

  // Issues the call (or replays its graph) and returns once everything is
  // enqueued; the caller's stream is then ordered after the call. A task error
  // stops issuing, still joins the streams and ends a capture, caches nothing
  // and is returned here. Another Submit may follow without Wait: stream order
  // serializes calls.
  Status Submit(const Schedule& schedule, const Call& call) override;
  // Synchronizes the host with the end of the last submitted call. (An eager
  // call issued into the caller's own capture has not run; Wait then returns
  // CUDA's error for synchronizing a captured event.)
  Status Wait() override;

 private:
  Status CreateResources(int num_tasks);
  Status Enter(Stream caller);
  Status Exit(Stream caller);
  Status IssueCall(const Schedule& schedule, const Call& call);
  Status Fork(const Schedule& schedule);
  Status IssueTasks(const Schedule& schedule, const Call& call);
  Status Join(const Schedule& schedule);
  StatusOr<GraphExec> FindOrCapture(const Schedule& schedule, const Call& call);
  StatusOr<GraphExec> Capture(const Schedule& schedule, const Call& call);

  CudaApi& api_;
  const int num_streams_;
  std::vector<Stream> streams_;  // [0] is the origin
  Event enter_event_;
  Event fork_event_;
  Event exit_event_;
  std::vector<Event> join_events_;  // per stream; [0] unused
  std::vector<Event> task_events_;  // per task id, for the largest schedule so far
  MemPool pool_;
  bool exit_recorded_ = false;  // whether Wait has something to wait for
  OutputRefCounts refs_;
  std::map<std::pair<std::uint64_t, int>, GraphExec> graphs_;  // (schedule id, bucket)
};

}  // namespace dynaflow::runtime::cuda
