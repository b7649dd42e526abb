// The Executor interface: runs one call of a Schedule on a backend's streams.
//
// Both backends follow CUDA's stream semantics: a stream runs its tasks one at
// a time in issue order (FIFO), and a task waits for its dependencies on other
// streams through events recorded when they finish. So a schedule that is
// correct on the CPU backend is correct on the CUDA backend.
#pragma once

#include <cstdint>
#include <functional>

#include "analysis/base/status.h"
#include "runtime/schedule.h"

namespace dynaflow::runtime {

// The per-call arguments of Submit.
struct Call {
  // Calls with the same schedule and bucket (>= 0) do identical work on
  // identical buffers (the caller pads steps to the bucket's size), so the
  // CUDA backend captures the first as a graph and replays it for the rest.
  // -1: run eagerly, e.g. inside a caller's own graph capture, or for warm-up
  // calls that must run before capture (lazy library initialisation).
  int bucket = -1;
  // CUDA backend: the stream the call is ordered after and joined back into,
  // usually the framework's current stream (0: the legacy default stream).
  // The CPU backend ignores it.
  std::uintptr_t caller_stream = 0;
  // Receives each task whose output nobody needs any more: every task that
  // depends on it has finished (CPU) or been issued to its stream (CUDA; the
  // memory owner must make reuse stream-safe, e.g. torch's record_stream). Not
  // called when a CUDA graph is replayed (no callback runs then), nor, after a
  // failure, for outputs whose readers were skipped. May run on any worker
  // thread. Empty: no reference counting at all.
  std::function<void(TaskId)> release;
};

class Executor {
 public:
  virtual ~Executor() = default;

  // Starts one call of `schedule`, which must stay alive and unchanged until
  // the call has finished. Returns BadInput when the schedule uses more
  // streams than the executor has, Failure when the backend cannot accept the
  // call, and, on backends that run callbacks inside Submit (CUDA), the first
  // task or driver error; nothing is then left to wait for.
  virtual Status Submit(const Schedule& schedule, const Call& call) = 0;

  // Blocks until all work submitted so far has finished, and returns the first
  // error of work that ran asynchronously (CPU: task errors; CUDA: errors the
  // device reports at synchronization). After a task error, the call's tasks
  // not yet started were skipped. OK when nothing was submitted.
  virtual Status Wait() = 0;
};

// Runs `task` with `context`, turning an exception that escapes the callback
// into a Failure naming the task, so that no exception crosses an executor.
Status InvokeTask(const Task& task, TaskContext& context) noexcept;

}  // namespace dynaflow::runtime
