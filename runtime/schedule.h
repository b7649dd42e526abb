// A schedule: a validated DAG of tasks (subgraph x micro-batch), each bound to
// a stream. Executors run it once per call; it is immutable after Build, so
// one schedule serves every call of a plan's bucket.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "analysis/base/status.h"

namespace dynaflow::runtime {

// A task's index in its schedule; builders hand them out in order from 0.
using TaskId = int32_t;

struct Task;

// What a running task learns about where it runs.
struct TaskContext {
  const Task& task;
  // The native stream the task must issue its work on: a cudaStream_t on the
  // CUDA backend, 0 on the CPU backend (the callback itself is the work).
  std::uintptr_t stream = 0;
  // CUDA backend: the cudaMemPool_t shared by every call and capture of the
  // executor, for allocations the task makes (cudaMallocFromPoolAsync). 0 on CPU.
  std::uintptr_t memory_pool = 0;
};

// The work of one task. An error stops the call: tasks not yet started are
// skipped and the executor reports the first error. Callbacks should not
// throw; an escaping exception is reported as a Failure.
using TaskFn = std::function<Status(TaskContext&)>;

struct Task {
  TaskId id = 0;
  std::string name;     // for error messages and traces, e.g. "mlp/mb1"
  int stream = 0;       // index of the stream the task runs on
  int micro_batch = 0;  // which micro-batch of the call it processes (0 if unsplit)
  // Tasks that must finish before this one starts. A task also reads its
  // dependencies' outputs: each output is released once its last dependent has
  // finished (see OutputRefCounts).
  std::vector<TaskId> deps;
  TaskFn fn;
};

class Schedule {
 public:
  int num_streams() const { return num_streams_; }
  std::span<const Task> tasks() const { return tasks_; }
  const Task& task(TaskId id) const { return tasks_[id]; }
  int size() const { return static_cast<int>(tasks_.size()); }

  // Unique per built schedule (copies share it): with a bucket, the key of a
  // captured CUDA graph. Never reused within a process, so a graph cached for a
  // destroyed schedule can never be replayed for a new one.
  std::uint64_t id() const { return id_; }

  // Every task once, dependencies first; among ready tasks the lowest id goes
  // first, so a schedule built in a topological order is issued as built.
  std::span<const TaskId> issue_order() const { return issue_order_; }
  // The tasks of `stream` in issue order: the stream's FIFO queue.
  std::span<const TaskId> stream_queue(int stream) const { return stream_queues_[stream]; }
  // Tasks that list `id` among their deps.
  std::span<const TaskId> dependents(TaskId id) const { return dependents_[id]; }
  // The dependencies of `id` on other streams that it must wait for, at most
  // one per stream: the latest in that stream's queue (the earlier ones finish
  // before it, by FIFO order). Same-stream dependencies need no wait.
  std::span<const TaskId> cross_stream_waits(TaskId id) const { return waits_[id]; }
  // Whether some task on another stream waits for `id`, i.e. whether finishing
  // `id` must signal an event.
  bool signals(TaskId id) const { return signals_[id]; }

 private:
  friend class ScheduleBuilder;
  Schedule() = default;

  std::uint64_t id_ = 0;
  int num_streams_ = 0;
  std::vector<Task> tasks_;
  std::vector<TaskId> issue_order_;
  std::vector<std::vector<TaskId>> stream_queues_;
  std::vector<std::vector<TaskId>> dependents_;
  std::vector<std::vector<TaskId>> waits_;
  std::vector<bool> signals_;
};

// The tasks on other streams that may run beside `id`: neither before nor
// after it by its dependencies and each stream's FIFO order. In id order.
std::vector<TaskId> RunsBeside(const Schedule& schedule, TaskId id);

// Collects tasks, then validates them into a Schedule.
class ScheduleBuilder {
 public:
  explicit ScheduleBuilder(int num_streams) : num_streams_(num_streams) {}

  // Adds a task and returns its id (the number of tasks added before it).
  // `deps` may name tasks added later; Build checks that they exist.
  TaskId Add(std::string name, int stream, std::vector<TaskId> deps, TaskFn fn,
             int micro_batch = 0);

  // BadInput naming the offending task when a stream is out of range, a
  // dependency is missing, repeated or the task itself, a callback is empty, or
  // the dependencies form a cycle (the message lists the cycle).
  StatusOr<Schedule> Build() &&;

 private:
  int num_streams_;
  std::vector<Task> tasks_;
};

// One subgraph of a model (a layer, or a group of ops of one class), run once
// per micro-batch by the builders below.
struct Stage {
  std::string name;
  int stream = 0;  // the stream its op class runs on
  TaskFn fn;
};

// The original path: every stage on stream 0, in order, on the whole batch
// (one micro-batch). The stages' stream assignment is ignored.
StatusOr<Schedule> BuildSequential(std::vector<Stage> stages);

// Splits the batch into `micro_batches` and runs every stage on each, on the
// stage's stream. Task (stage k, micro-batch i) has id k * micro_batches + i,
// depends on (k - 1, i), and is named "<stage>/mb<i>". Stages are issued stage
// by stage, so on each stream micro-batch i of one stage precedes micro-batch
// i + 1, and micro-batch i + 1 of stage k overlaps micro-batch i of stage k + 1
// when the two stages are on different streams (nano-batching: GEMMs on one
// stream, attention on another, collectives on a third).
StatusOr<Schedule> BuildMicroBatchSplit(std::vector<Stage> stages, int micro_batches);

// Dual-batch overlap (vLLM DBO, SGLang TBO): two micro-batches, computation on
// stream kComputeStream and communication on kCommStream, so the computation
// of one micro-batch overlaps the communication of the other. Every stage's
// stream must be one of the two.
inline constexpr int kComputeStream = 0;
inline constexpr int kCommStream = 1;
StatusOr<Schedule> BuildDualBatchOverlap(std::vector<Stage> stages);

// Nano-batch overlap across a split region (NanoFlow): the region (for a
// decoder, the whole layer stack) runs once per micro-batch, micro-batch i on
// stream i, and is cut at the plan's stage boundaries into `segments`
// consecutive segments. Task (segment j, micro-batch i) has id
// j * micro_batches + i, is named "seg<j>/mb<i>", and depends on (j - 1, i),
// its own stream's previous segment, and on (j, i - 1), the stagger: micro-
// batch i runs segment j once micro-batch i - 1 has finished it, so segment j
// of micro-batch i runs beside segment j + 1 of micro-batch i - 1 (with
// stages that alternate attention and MLP, the attention of one beside the
// MLP of the other). The issue order is segment by segment.
//
// The tasks' callbacks do nothing: the region's own code does the work, on
// one host thread per micro-batch that a RegionSequencer (sequencer.h) turns
// through this issue order. The simulator predicts this same object
// (analysis/sim/region_split.h), so prediction and execution cannot drift.
StatusOr<Schedule> BuildStaggeredRegion(int segments, int micro_batches);

// Dual-batch overlap across a split region (vLLM DBO, SGLang TBO): two
// micro-batches, each cut at its `collectives` collective calls into
// alternating parts, compute C0, collective X0, C1, X1, ..., C<collectives>.
// Part p (even: compute, odd: a collective) of micro-batch i has id
// p * 2 + i, is named "C<j>/mb<i>" or "X<j>/mb<i>", and depends on part p - 1
// of its micro-batch. Compute parts run on kComputeStream, one at a time in
// issue order, collectives on kCommStream, so one micro-batch's collective
// runs beside the other's compute. Issue order: C0/mb0, C0/mb1, X0/mb0,
// X0/mb1, C1/mb0, ...; the callbacks do nothing, as for BuildStaggeredRegion.
StatusOr<Schedule> BuildDualBatchRegion(int collectives);

// Communication overlap across a region (a module's forward, run once and
// unsplit, as `dynaflow apply` runs a comm_overlap call): its n =
// consumers.size() collectives cut it into parts C0, X0, C1, X1, ..., Cn.
// Part p has id p and is named "C<j>" or "X<j>". Compute parts run in order
// on kComputeStream. Collective X<j> runs on kCommStream, in launch order,
// after C<j> (an asynchronous launch is ordered after the work issued before
// it). consumers[j] names the first compute part that reads X<j>'s result,
// which waits for it, so X<j> runs beside C<j+1> .. C<consumers[j] - 1>;
// n + 1: no part reads it, only the region's end waits (the caller's stream
// joins every stream). The callbacks do nothing, as for
// BuildStaggeredRegion. BadInput for no collective, or a consumer outside
// [j + 1, n + 1].
StatusOr<Schedule> BuildCommOverlapRegion(const std::vector<int>& consumers);

}  // namespace dynaflow::runtime
