#include "runtime/cuda/cuda_executor.h"

#include <string>

namespace dynaflow::runtime::cuda {
namespace {

template <typename H, typename Create>
Status CreateIfMissing(H& handle, Create create) {
  if (handle) return Status::Ok();
  StatusOr<H> created = create();
  if (!created.ok()) return created.status();
  handle = *created;
  return Status::Ok();
}

}  // namespace

CudaExecutor::CudaExecutor(CudaApi& api, int num_streams)
    : api_(api), num_streams_(num_streams), streams_(num_streams), join_events_(num_streams) {}

CudaExecutor::~CudaExecutor() {
  for (auto& [key, exec] : graphs_) api_.DestroyGraphExec(exec);
  for (Event event : task_events_) {
    if (event) api_.DestroyEvent(event);
  }
  for (Event event : join_events_) {
    if (event) api_.DestroyEvent(event);
  }
  for (Event event : {enter_event_, fork_event_, exit_event_}) {
    if (event) api_.DestroyEvent(event);
  }
  for (Stream stream : streams_) {
    if (stream) api_.DestroyStream(stream);
  }
  if (pool_) api_.DestroyMemPool(pool_);
}

Status CudaExecutor::Submit(const Schedule& schedule, const Call& call) {
  if (schedule.num_streams() > num_streams_) {
    return Status::BadInput("the schedule uses " + std::to_string(schedule.num_streams()) +
                            " streams; this CUDA executor has " + std::to_string(num_streams_));
  }
  DF_RETURN_IF_ERROR(CreateResources(schedule.size()));
  Stream caller{call.caller_stream};
  if (call.bucket < 0) {
    DF_RETURN_IF_ERROR(Enter(caller));
    Status issued = IssueCall(schedule, call);
    Status exited = Exit(caller);  // even after a failure: keep the caller ordered
    return issued.ok() ? exited : issued;
  }
  StatusOr<GraphExec> exec = FindOrCapture(schedule, call);
  if (!exec.ok()) return exec.status();
  DF_RETURN_IF_ERROR(Enter(caller));
  DF_RETURN_IF_ERROR(api_.LaunchGraph(*exec, streams_[0]));
  return Exit(caller);
}

Status CudaExecutor::Wait() {
  if (!exit_recorded_) return Status::Ok();
  return api_.SynchronizeEvent(exit_event_);
}

// Creates only what is missing, so a Submit after a failed one resumes where
// creation stopped, and a larger schedule adds task events.
Status CudaExecutor::CreateResources(int num_tasks) {
  auto create_event = [this] { return api_.CreateEvent(); };
  for (Stream& stream : streams_) {
    DF_RETURN_IF_ERROR(CreateIfMissing(stream, [this] { return api_.CreateStream(); }));
  }
  for (Event* event : {&enter_event_, &fork_event_, &exit_event_}) {
    DF_RETURN_IF_ERROR(CreateIfMissing(*event, create_event));
  }
  for (int s = 1; s < num_streams_; ++s) {
    DF_RETURN_IF_ERROR(CreateIfMissing(join_events_[s], create_event));
  }
  if (static_cast<int>(task_events_.size()) < num_tasks) task_events_.resize(num_tasks);
  for (int i = 0; i < num_tasks; ++i) {
    DF_RETURN_IF_ERROR(CreateIfMissing(task_events_[i], create_event));
  }
  return CreateIfMissing(pool_, [this] { return api_.CreateMemPool(); });
}

Status CudaExecutor::Enter(Stream caller) {
  DF_RETURN_IF_ERROR(api_.RecordEvent(enter_event_, caller));
  return api_.StreamWaitEvent(streams_[0], enter_event_);
}

Status CudaExecutor::Exit(Stream caller) {
  DF_RETURN_IF_ERROR(api_.RecordEvent(exit_event_, streams_[0]));
  exit_recorded_ = true;
  return api_.StreamWaitEvent(caller, exit_event_);
}

// Fork, tasks, join. The join runs even after a task failed, because a capture
// cannot end with streams not joined back to the origin.
Status CudaExecutor::IssueCall(const Schedule& schedule, const Call& call) {
  DF_RETURN_IF_ERROR(Fork(schedule));
  Status issued = IssueTasks(schedule, call);
  Status joined = Join(schedule);
  return issued.ok() ? joined : issued;
}

Status CudaExecutor::Fork(const Schedule& schedule) {
  DF_RETURN_IF_ERROR(api_.RecordEvent(fork_event_, streams_[0]));
  for (int s = 1; s < schedule.num_streams(); ++s) {
    if (schedule.stream_queue(s).empty()) continue;
    DF_RETURN_IF_ERROR(api_.StreamWaitEvent(streams_[s], fork_event_));
  }
  return Status::Ok();
}

Status CudaExecutor::IssueTasks(const Schedule& schedule, const Call& call) {
  if (call.release) refs_.Reset(schedule);
  for (TaskId id : schedule.issue_order()) {
    const Task& task = schedule.task(id);
    Stream stream = streams_[task.stream];
    for (TaskId dep : schedule.cross_stream_waits(id)) {
      DF_RETURN_IF_ERROR(api_.StreamWaitEvent(stream, task_events_[dep]));
    }
    TaskContext context{task, stream.value, pool_.value};
    DF_RETURN_IF_ERROR(InvokeTask(task, context));
    if (schedule.signals(id)) DF_RETURN_IF_ERROR(api_.RecordEvent(task_events_[id], stream));
    if (call.release) refs_.Finished(task, call.release);
  }
  return Status::Ok();
}

Status CudaExecutor::Join(const Schedule& schedule) {
  for (int s = 1; s < schedule.num_streams(); ++s) {
    if (schedule.stream_queue(s).empty()) continue;
    DF_RETURN_IF_ERROR(api_.RecordEvent(join_events_[s], streams_[s]));
    DF_RETURN_IF_ERROR(api_.StreamWaitEvent(streams_[0], join_events_[s]));
  }
  return Status::Ok();
}

StatusOr<GraphExec> CudaExecutor::FindOrCapture(const Schedule& schedule, const Call& call) {
  auto key = std::make_pair(schedule.id(), call.bucket);
  if (auto it = graphs_.find(key); it != graphs_.end()) return it->second;
  StatusOr<GraphExec> exec = Capture(schedule, call);
  if (exec.ok()) graphs_.emplace(key, *exec);
  return exec;
}

StatusOr<GraphExec> CudaExecutor::Capture(const Schedule& schedule, const Call& call) {
  Stream origin = streams_[0];
  DF_RETURN_IF_ERROR(api_.BeginCapture(origin));
  Status issued = IssueCall(schedule, call);
  StatusOr<Graph> graph = api_.EndCapture(origin);  // always: the stream must not stay capturing
  if (!issued.ok()) {
    if (graph.ok()) api_.DestroyGraph(*graph);
    return issued;
  }
  if (!graph.ok()) return graph.status();
  StatusOr<GraphExec> exec = api_.InstantiateGraph(*graph);
  api_.DestroyGraph(*graph);  // the executable does not need it
  return exec;
}

}  // namespace dynaflow::runtime::cuda
