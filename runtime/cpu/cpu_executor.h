// The CPU backend: one worker thread per stream, events between streams.
// Every scheduling rule of the runtime is tested on it without a GPU.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/buffers.h"
#include "runtime/executor.h"

namespace dynaflow::runtime {

// Worker s runs stream s's queue of each call in order; before a task it waits
// for the events of its dependencies on other streams, and after the task it
// signals its own event when a task on another stream waits for it. Waiting
// polls for a microsecond, yields for up to 50, then sleeps on the event (a
// futex): it never busy-waits for long.
// One call at a time: Submit returns Failure until Wait has returned.
// Submit and Wait must be called from one thread at a time.
class CpuExecutor final : public Executor {
 public:
  // Throws std::system_error when the system refuses a thread; the workers
  // already started are stopped first.
  explicit CpuExecutor(int num_streams);
  ~CpuExecutor() override;  // waits for a call in flight, then stops the workers

  CpuExecutor(const CpuExecutor&) = delete;
  CpuExecutor& operator=(const CpuExecutor&) = delete;

  Status Submit(const Schedule& schedule, const Call& call) override;
  Status Wait() override;

 private:
  void StopWorkers();  // stops and joins every worker; no call may be in flight
  void WorkerLoop(int stream);
  void RunQueue(int stream);
  void RunTask(const Task& task);
  void WaitForEvent(TaskId id) const;
  void SignalEvent(TaskId id);
  void RecordError(Status status);
  void ResetEvents(int num_tasks);

  const int num_streams_;
  std::vector<std::thread> workers_;

  // Bumped by Submit to start a call and by the destructor to stop; workers
  // sleep on it between calls.
  std::atomic<std::uint32_t> generation_{0};
  std::atomic<bool> stopping_{false};
  // Workers still running the current call; Wait sleeps on it.
  std::atomic<int> streams_running_{0};
  bool in_flight_ = false;  // touched by the submitting thread only

  // The current call, published to the workers by the generation bump.
  const Schedule* schedule_ = nullptr;
  Call call_;
  OutputRefCounts refs_;
  std::unique_ptr<std::atomic<std::uint32_t>[]> events_;  // 1 once task i finished
  std::size_t events_capacity_ = 0;

  std::atomic<bool> failed_{false};
  std::mutex error_mutex_;
  Status first_error_;
};

}  // namespace dynaflow::runtime
