#include "runtime/schedule.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <queue>
#include <utility>

namespace dynaflow::runtime {
namespace {

std::string Describe(const Task& task) {
  return "task " + std::to_string(task.id) + " '" + task.name + "'";
}

Status CheckTask(const Task& task, int num_tasks, int num_streams) {
  if (task.stream < 0 || task.stream >= num_streams) {
    return Status::BadInput(Describe(task) + ": stream " + std::to_string(task.stream) +
                            " is out of range [0, " + std::to_string(num_streams) + ")");
  }
  if (!task.fn) return Status::BadInput(Describe(task) + " has no callback");
  std::vector<TaskId> seen;
  for (TaskId dep : task.deps) {
    if (dep < 0 || dep >= num_tasks) {
      return Status::BadInput(Describe(task) + ": dependency " + std::to_string(dep) +
                              " does not exist");
    }
    if (dep == task.id) return Status::BadInput(Describe(task) + " depends on itself");
    if (std::find(seen.begin(), seen.end(), dep) != seen.end()) {
      return Status::BadInput(Describe(task) + ": dependency " + std::to_string(dep) +
                              " is listed twice");
    }
    seen.push_back(dep);
  }
  return Status::Ok();
}

std::vector<std::vector<TaskId>> Dependents(const std::vector<Task>& tasks) {
  std::vector<std::vector<TaskId>> dependents(tasks.size());
  for (const Task& task : tasks) {
    for (TaskId dep : task.deps) dependents[dep].push_back(task.id);
  }
  return dependents;
}

// Kahn's algorithm, lowest ready id first. Returns fewer than all tasks when
// the dependencies have a cycle.
std::vector<TaskId> TopologicalOrder(const std::vector<Task>& tasks,
                                     const std::vector<std::vector<TaskId>>& dependents) {
  std::vector<int> missing(tasks.size());
  std::priority_queue<TaskId, std::vector<TaskId>, std::greater<>> ready;
  for (const Task& task : tasks) {
    missing[task.id] = static_cast<int>(task.deps.size());
    if (missing[task.id] == 0) ready.push(task.id);
  }
  std::vector<TaskId> order;
  order.reserve(tasks.size());
  while (!ready.empty()) {
    TaskId id = ready.top();
    ready.pop();
    order.push_back(id);
    for (TaskId dependent : dependents[id]) {
      if (--missing[dependent] == 0) ready.push(dependent);
    }
  }
  return order;
}

// Called when `ordered` misses some tasks: every unordered task has an
// unordered dependency, so following those from any of them must come back
// to a task already visited, which lies on a cycle.
Status CycleError(const std::vector<Task>& tasks, const std::vector<TaskId>& ordered) {
  std::vector<bool> is_ordered(tasks.size(), false);
  for (TaskId id : ordered) is_ordered[id] = true;
  auto unordered_dep = [&](TaskId id) {
    for (TaskId dep : tasks[id].deps) {
      if (!is_ordered[dep]) return dep;
    }
    return TaskId{-1};  // unreachable: see the function comment
  };
  TaskId start = static_cast<TaskId>(std::find(is_ordered.begin(), is_ordered.end(), false) -
                                     is_ordered.begin());
  std::vector<TaskId> path;
  std::vector<int> position(tasks.size(), -1);
  TaskId id = start;
  while (position[id] < 0) {
    position[id] = static_cast<int>(path.size());
    path.push_back(id);
    id = unordered_dep(id);
  }
  std::string cycle;
  for (auto it = path.begin() + position[id]; it != path.end(); ++it) {
    cycle += Describe(tasks[*it]) + " -> ";
  }
  cycle += Describe(tasks[id]);
  return Status::BadInput("dependency cycle (each task depends on the next): " + cycle);
}

std::uint64_t NextScheduleId() {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

TaskId ScheduleBuilder::Add(std::string name, int stream, std::vector<TaskId> deps, TaskFn fn,
                            int micro_batch) {
  TaskId id = static_cast<TaskId>(tasks_.size());
  tasks_.push_back(Task{.id = id,
                        .name = std::move(name),
                        .stream = stream,
                        .micro_batch = micro_batch,
                        .deps = std::move(deps),
                        .fn = std::move(fn)});
  return id;
}

StatusOr<Schedule> ScheduleBuilder::Build() && {
  if (num_streams_ < 1) return Status::BadInput("a schedule needs at least one stream");
  int num_tasks = static_cast<int>(tasks_.size());
  for (const Task& task : tasks_) DF_RETURN_IF_ERROR(CheckTask(task, num_tasks, num_streams_));

  Schedule s;
  s.dependents_ = Dependents(tasks_);
  s.issue_order_ = TopologicalOrder(tasks_, s.dependents_);
  if (static_cast<int>(s.issue_order_.size()) < num_tasks) {
    return CycleError(tasks_, s.issue_order_);
  }

  s.id_ = NextScheduleId();
  s.num_streams_ = num_streams_;
  s.tasks_ = std::move(tasks_);
  s.stream_queues_.resize(num_streams_);
  std::vector<int> queue_position(num_tasks);
  for (TaskId id : s.issue_order_) {
    auto& queue = s.stream_queues_[s.tasks_[id].stream];
    queue_position[id] = static_cast<int>(queue.size());
    queue.push_back(id);
  }

  // For each other stream keep the dependency latest in that stream's queue.
  s.waits_.resize(num_tasks);
  s.signals_.assign(num_tasks, false);
  for (const Task& task : s.tasks_) {
    std::vector<TaskId> latest(num_streams_, -1);
    for (TaskId dep : task.deps) {
      int stream = s.tasks_[dep].stream;
      if (stream == task.stream) continue;
      if (latest[stream] < 0 || queue_position[dep] > queue_position[latest[stream]]) {
        latest[stream] = dep;
      }
    }
    for (TaskId dep : latest) {
      if (dep < 0) continue;
      s.waits_[task.id].push_back(dep);
      s.signals_[dep] = true;
    }
  }
  return s;
}

std::vector<TaskId> RunsBeside(const Schedule& schedule, TaskId id) {
  const int n = schedule.size();
  // Position in its stream's queue, for the FIFO successor and predecessor.
  std::vector<int> slot(static_cast<size_t>(n), 0);
  for (int st = 0; st < schedule.num_streams(); ++st) {
    std::span<const TaskId> q = schedule.stream_queue(st);
    for (size_t i = 0; i < q.size(); ++i) slot[static_cast<size_t>(q[i])] = static_cast<int>(i);
  }
  // Marks every task reachable from `id` forwards (after) or backwards (before).
  auto reach = [&](bool forward) {
    std::vector<char> seen(static_cast<size_t>(n), 0);
    std::vector<TaskId> stack = {id};
    while (!stack.empty()) {
      const TaskId t = stack.back();
      stack.pop_back();
      std::span<const TaskId> q = schedule.stream_queue(schedule.task(t).stream);
      const int next = slot[static_cast<size_t>(t)] + (forward ? 1 : -1);
      const std::span<const TaskId> linked =
          forward ? schedule.dependents(t) : std::span<const TaskId>(schedule.task(t).deps);
      std::vector<TaskId> edges(linked.begin(), linked.end());
      if (next >= 0 && next < static_cast<int>(q.size())) {
        edges.push_back(q[static_cast<size_t>(next)]);
      }
      for (TaskId e : edges) {
        if (!seen[static_cast<size_t>(e)]) {
          seen[static_cast<size_t>(e)] = 1;
          stack.push_back(e);
        }
      }
    }
    return seen;
  };
  const std::vector<char> after = reach(true), before = reach(false);
  std::vector<TaskId> beside;
  for (TaskId t = 0; t < n; ++t) {
    if (schedule.task(t).stream != schedule.task(id).stream && !after[static_cast<size_t>(t)] &&
        !before[static_cast<size_t>(t)]) {
      beside.push_back(t);
    }
  }
  return beside;
}

StatusOr<Schedule> BuildSequential(std::vector<Stage> stages) {
  if (stages.empty()) return Status::BadInput("a schedule needs at least one stage");
  ScheduleBuilder builder(1);
  TaskId previous = -1;
  for (Stage& stage : stages) {
    std::vector<TaskId> deps;
    if (previous >= 0) deps.push_back(previous);
    previous = builder.Add(std::move(stage.name), 0, std::move(deps), std::move(stage.fn));
  }
  return std::move(builder).Build();
}

StatusOr<Schedule> BuildMicroBatchSplit(std::vector<Stage> stages, int micro_batches) {
  if (stages.empty()) return Status::BadInput("a schedule needs at least one stage");
  if (micro_batches < 1) {
    return Status::BadInput("micro-batch count must be at least 1, got " +
                            std::to_string(micro_batches));
  }
  int num_streams = 1;
  for (const Stage& stage : stages) num_streams = std::max(num_streams, stage.stream + 1);
  ScheduleBuilder builder(num_streams);
  for (int k = 0; k < static_cast<int>(stages.size()); ++k) {
    for (int i = 0; i < micro_batches; ++i) {
      std::vector<TaskId> deps;
      if (k > 0) deps.push_back((k - 1) * micro_batches + i);
      builder.Add(stages[k].name + "/mb" + std::to_string(i), stages[k].stream, std::move(deps),
                  stages[k].fn, i);
    }
  }
  return std::move(builder).Build();
}

StatusOr<Schedule> BuildDualBatchOverlap(std::vector<Stage> stages) {
  for (const Stage& stage : stages) {
    if (stage.stream != kComputeStream && stage.stream != kCommStream) {
      return Status::BadInput("dual-batch overlap: stage '" + stage.name + "' is on stream " +
                              std::to_string(stage.stream) + "; use kComputeStream (" +
                              std::to_string(kComputeStream) + ") or kCommStream (" +
                              std::to_string(kCommStream) + ")");
    }
  }
  return BuildMicroBatchSplit(std::move(stages), 2);
}

StatusOr<Schedule> BuildDualBatchRegion(int collectives) {
  if (collectives < 1) {
    return Status::BadInput("a dual-batch region needs at least one collective, got " +
                            std::to_string(collectives));
  }
  ScheduleBuilder builder(2);
  const TaskFn nothing = [](TaskContext&) { return Status::Ok(); };
  for (int p = 0; p <= 2 * collectives; ++p) {
    const bool compute = p % 2 == 0;
    for (int i = 0; i < 2; ++i) {
      std::vector<TaskId> deps;
      if (p > 0) deps.push_back((p - 1) * 2 + i);
      builder.Add((compute ? "C" : "X") + std::to_string(p / 2) + "/mb" + std::to_string(i),
                  compute ? kComputeStream : kCommStream, std::move(deps), nothing, i);
    }
  }
  return std::move(builder).Build();
}

StatusOr<Schedule> BuildCommOverlapRegion(const std::vector<int>& consumers) {
  const int n = static_cast<int>(consumers.size());
  if (n < 1) {
    return Status::BadInput("a communication-overlap region needs at least one collective");
  }
  // Per compute part C<j>, the collectives it reads first (task ids 2i + 1).
  std::vector<std::vector<TaskId>> reads(static_cast<size_t>(n) + 1);
  for (int j = 0; j < n; ++j) {
    const int c = consumers[static_cast<size_t>(j)];
    if (c < j + 1 || c > n + 1) {
      return Status::BadInput("collective X" + std::to_string(j) + " is read by compute part C" +
                              std::to_string(c) + "; a collective is read after it is launched, " +
                              "by C" + std::to_string(j + 1) + " .. C" + std::to_string(n) +
                              ", or at the end (" + std::to_string(n + 1) + ")");
    }
    if (c <= n) reads[static_cast<size_t>(c)].push_back(2 * j + 1);
  }
  ScheduleBuilder builder(2);
  const TaskFn nothing = [](TaskContext&) { return Status::Ok(); };
  for (int p = 0; p <= 2 * n; ++p) {
    const int j = p / 2;
    const bool compute = p % 2 == 0;
    std::vector<TaskId> deps;
    if (compute) {
      if (j > 0) deps.push_back(p - 2);  // C<j - 1>
      deps.insert(deps.end(), reads[static_cast<size_t>(j)].begin(),
                  reads[static_cast<size_t>(j)].end());
    } else {
      deps.push_back(p - 1);  // C<j>, what was issued before its launch
    }
    builder.Add((compute ? "C" : "X") + std::to_string(j), compute ? kComputeStream : kCommStream,
                std::move(deps), nothing);
  }
  return std::move(builder).Build();
}

StatusOr<Schedule> BuildStaggeredRegion(int segments, int micro_batches) {
  if (segments < 1 || micro_batches < 1) {
    return Status::BadInput(
        "a staggered region needs at least one segment and one micro-batch, got " +
        std::to_string(segments) + " and " + std::to_string(micro_batches));
  }
  ScheduleBuilder builder(micro_batches);
  const TaskFn nothing = [](TaskContext&) { return Status::Ok(); };
  for (int j = 0; j < segments; ++j) {
    for (int i = 0; i < micro_batches; ++i) {
      std::vector<TaskId> deps;
      if (j > 0) deps.push_back((j - 1) * micro_batches + i);
      if (i > 0) deps.push_back(j * micro_batches + i - 1);
      builder.Add("seg" + std::to_string(j) + "/mb" + std::to_string(i), i, std::move(deps),
                  nothing, i);
    }
  }
  return std::move(builder).Build();
}

}  // namespace dynaflow::runtime
