#include "runtime/cpu/cpu_executor.h"

#include <chrono>
#include <string>
#include <utility>

namespace dynaflow::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// Waiting for an event polls, then yields, then sleeps on it (a futex):
//  - a dependency running on another worker usually finishes within a
//    microsecond, far less than a futex sleep and wake-up cost;
//  - on a host with more runnable threads than cores, yielding hands the core
//    to them, often to the very worker we wait for, where polling would hold
//    the core it needs;
//  - both phases are bounded in time, so a long wait sleeps.
constexpr auto kPollFor = std::chrono::microseconds(1);
constexpr auto kYieldFor = std::chrono::microseconds(50);
constexpr int kPollsPerClockRead = 16;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

CpuExecutor::CpuExecutor(int num_streams) : num_streams_(num_streams) {
  workers_.reserve(static_cast<size_t>(num_streams_));
  try {
    for (int s = 0; s < num_streams_; ++s) workers_.emplace_back([this, s] { WorkerLoop(s); });
  } catch (...) {
    // The system refused a thread: the destructor does not run for a
    // half-built object, and a joinable std::thread destroyed unjoined calls
    // std::terminate (the abort of `splits: 100000`). Stop the workers started.
    StopWorkers();
    throw;
  }
}

CpuExecutor::~CpuExecutor() {
  if (in_flight_) (void)Wait();
  StopWorkers();
}

void CpuExecutor::StopWorkers() {
  stopping_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& worker : workers_) worker.join();
  workers_.clear();
}

Status CpuExecutor::Submit(const Schedule& schedule, const Call& call) {
  if (schedule.num_streams() > num_streams_) {
    return Status::BadInput("the schedule uses " + std::to_string(schedule.num_streams()) +
                            " streams; this CPU executor has " + std::to_string(num_streams_));
  }
  if (in_flight_) return Status::Failure("a call is in flight: Wait for it before submitting");

  schedule_ = &schedule;
  call_ = call;
  if (call_.release) refs_.Reset(schedule);
  ResetEvents(schedule.size());
  failed_.store(false, std::memory_order_relaxed);
  first_error_ = Status::Ok();
  streams_running_.store(num_streams_, std::memory_order_relaxed);
  in_flight_ = true;
  // Publishes everything above to the workers, which acquire the generation.
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  return Status::Ok();
}

Status CpuExecutor::Wait() {
  if (!in_flight_) return Status::Ok();
  for (int running = streams_running_.load(std::memory_order_acquire); running != 0;
       running = streams_running_.load(std::memory_order_acquire)) {
    streams_running_.wait(running, std::memory_order_acquire);
  }
  in_flight_ = false;
  return std::exchange(first_error_, Status::Ok());
}

void CpuExecutor::WorkerLoop(int stream) {
  // 0, not a load: Submit may bump the generation before this thread starts.
  std::uint32_t seen = 0;
  while (true) {
    generation_.wait(seen, std::memory_order_acquire);
    seen = generation_.load(std::memory_order_acquire);
    if (stopping_.load(std::memory_order_relaxed)) return;
    if (stream < schedule_->num_streams()) RunQueue(stream);
    // The last worker out wakes Wait; acq_rel orders every worker's results
    // before Wait's acquire.
    if (streams_running_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      streams_running_.notify_all();
    }
  }
}

void CpuExecutor::RunQueue(int stream) {
  for (TaskId id : schedule_->stream_queue(stream)) {
    const Task& task = schedule_->task(id);
    if (!failed_.load(std::memory_order_acquire)) RunTask(task);
    // Skipped tasks signal too, so that no other stream waits forever.
    if (schedule_->signals(id)) SignalEvent(id);
  }
}

void CpuExecutor::RunTask(const Task& task) {
  for (TaskId dep : schedule_->cross_stream_waits(task.id)) WaitForEvent(dep);
  // A dependency may have failed (or been skipped) while we waited.
  if (failed_.load(std::memory_order_acquire)) return;
  TaskContext context{task};
  Status status = InvokeTask(task, context);
  if (!status.ok()) {
    RecordError(std::move(status));
    return;
  }
  if (call_.release) refs_.Finished(task, call_.release);
}

void CpuExecutor::WaitForEvent(TaskId id) const {
  std::atomic<std::uint32_t>& event = events_[id];
  auto signaled = [&event] { return event.load(std::memory_order_acquire) != 0; };
  Clock::time_point start = Clock::now();
  do {
    for (int i = 0; i < kPollsPerClockRead; ++i) {
      if (signaled()) return;
      CpuRelax();
    }
  } while (Clock::now() - start < kPollFor);
  do {
    if (signaled()) return;
    std::this_thread::yield();
  } while (Clock::now() - start < kPollFor + kYieldFor);
  while (!signaled()) event.wait(0, std::memory_order_acquire);
}

void CpuExecutor::SignalEvent(TaskId id) {
  events_[id].store(1, std::memory_order_release);
  events_[id].notify_all();
}

void CpuExecutor::RecordError(Status status) {
  std::lock_guard<std::mutex> lock(error_mutex_);
  if (failed_.load(std::memory_order_relaxed)) return;  // the first error wins
  first_error_ = std::move(status);
  failed_.store(true, std::memory_order_release);
}

void CpuExecutor::ResetEvents(int num_tasks) {
  std::size_t n = static_cast<std::size_t>(num_tasks);
  if (n > events_capacity_) {
    events_ = std::make_unique<std::atomic<std::uint32_t>[]>(n);
    events_capacity_ = n;
  }
  for (std::size_t i = 0; i < n; ++i) events_[i].store(0, std::memory_order_relaxed);
}

}  // namespace dynaflow::runtime
