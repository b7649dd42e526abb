#include "plugin/apply/dynaflow_apply.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "runtime/cpu/cpu_executor.h"
#include "runtime/executor.h"
#include "runtime/policy.h"
#include "runtime/schedule.h"
#include "runtime/sequencer.h"
#ifdef DYNAFLOW_APPLY_WITH_CUDA
#include "runtime/cuda/cuda_executor.h"
#include "runtime/cuda/cudart_api.h"
#endif

namespace dynaflow::apply {
namespace {

void SetError(char* err, size_t err_len, const std::string& message) {
  if (err == nullptr || err_len == 0) return;
  const size_t n = std::min(message.size(), err_len - 1);
  std::memcpy(err, message.data(), n);
  err[n] = '\0';
}

// An executor and, for CUDA, the API object it calls, which must outlive it.
struct ExecutorHandle {
#ifdef DYNAFLOW_APPLY_WITH_CUDA
  std::unique_ptr<runtime::cuda::CudartApi> cuda_api;
#endif
  std::unique_ptr<runtime::Executor> executor;
};

StatusOr<runtime::Schedule> BuildSchedule(const char* name, int num_streams, int num_tasks,
                                          const int* streams, const int* micro_batches,
                                          const int* dep_begin, const int* deps,
                                          dynaflow_apply_task_fn fn, void* user) {
  if (num_streams < 1 || num_tasks < 1 || fn == nullptr || streams == nullptr ||
      micro_batches == nullptr || dep_begin == nullptr) {
    return Status::BadInput("a schedule needs at least one stream, one task and a callback");
  }
  if (num_streams > DYNAFLOW_APPLY_MAX_STREAMS) {
    return Status::BadInput("a schedule has at most " + std::to_string(DYNAFLOW_APPLY_MAX_STREAMS) +
                            " streams, not " + std::to_string(num_streams));
  }
  runtime::ScheduleBuilder builder(num_streams);
  for (int i = 0; i < num_tasks; ++i) {
    if (dep_begin[i] < 0 || dep_begin[i + 1] < dep_begin[i] ||
        (dep_begin[i + 1] > dep_begin[i] && deps == nullptr)) {
      return Status::BadInput("task " + std::to_string(i) + ": malformed dependency offsets");
    }
    std::vector<runtime::TaskId> task_deps(deps + dep_begin[i], deps + dep_begin[i + 1]);
    const int mb = micro_batches[i];
    builder.Add(std::string(name == nullptr ? "task" : name) + "/mb" + std::to_string(mb),
                streams[i], std::move(task_deps),
                [fn, user](runtime::TaskContext& ctx) -> Status {
                  const int rc = fn(user, ctx.task.id, ctx.task.micro_batch, ctx.stream);
                  return rc == 0 ? Status::Ok()
                                 : Status::Failure("task " + ctx.task.name + " failed");
                },
                mb);
  }
  return std::move(builder).Build();
}

// A staggered region's schedule and the sequencer over it (which refers to it).
struct RegionHandle {
  explicit RegionHandle(runtime::Schedule s) : schedule(std::move(s)), sequencer(schedule) {}
  runtime::Schedule schedule;
  runtime::RegionSequencer sequencer;
};

}  // namespace
}  // namespace dynaflow::apply

using dynaflow::Status;
using dynaflow::StatusOr;
using dynaflow::apply::ExecutorHandle;
using dynaflow::apply::RegionHandle;
using dynaflow::apply::SetError;
namespace runtime = dynaflow::runtime;

extern "C" {

void* dynaflow_apply_executor_new(int backend, int num_streams, char* err, size_t err_len) {
  if (num_streams < 1 || num_streams > DYNAFLOW_APPLY_MAX_STREAMS) {
    SetError(err, err_len, "an executor has 1 to " + std::to_string(DYNAFLOW_APPLY_MAX_STREAMS) +
                               " streams, not " + std::to_string(num_streams));
    return nullptr;
  }
  try {
    auto handle = std::make_unique<ExecutorHandle>();
    if (backend == DYNAFLOW_APPLY_CPU) {
      handle->executor = std::make_unique<runtime::CpuExecutor>(num_streams);
    } else if (backend == DYNAFLOW_APPLY_CUDA) {
#ifdef DYNAFLOW_APPLY_WITH_CUDA
      handle->cuda_api = std::make_unique<runtime::cuda::CudartApi>();
      handle->executor =
          std::make_unique<runtime::cuda::CudaExecutor>(*handle->cuda_api, num_streams);
#else
      SetError(err, err_len, "this dynaflow was built without CUDA");
      return nullptr;
#endif
    } else {
      SetError(err, err_len, "unknown backend " + std::to_string(backend));
      return nullptr;
    }
    return handle.release();
  } catch (const std::exception& e) {
    SetError(err, err_len, std::string("cannot create the executor: ") + e.what());
    return nullptr;
  }
}

void dynaflow_apply_executor_free(void* executor) {
  delete static_cast<ExecutorHandle*>(executor);
}

void* dynaflow_apply_schedule_new(const char* name, int num_streams, int num_tasks,
                                  const int* streams, const int* micro_batches,
                                  const int* dep_begin, const int* deps,
                                  dynaflow_apply_task_fn fn, void* user, char* err,
                                  size_t err_len) {
  try {
    StatusOr<runtime::Schedule> schedule = dynaflow::apply::BuildSchedule(
        name, num_streams, num_tasks, streams, micro_batches, dep_begin, deps, fn, user);
    if (!schedule.ok()) {
      SetError(err, err_len, schedule.status().message());
      return nullptr;
    }
    return new runtime::Schedule(std::move(*schedule));
  } catch (const std::exception& e) {
    SetError(err, err_len, std::string("cannot build the schedule: ") + e.what());
    return nullptr;
  }
}

void dynaflow_apply_schedule_free(void* schedule) {
  delete static_cast<runtime::Schedule*>(schedule);
}

int dynaflow_apply_run(void* executor, void* schedule, uintptr_t caller_stream, int wait,
                       char* err, size_t err_len) {
  if (executor == nullptr || schedule == nullptr) {
    SetError(err, err_len, "no executor or no schedule");
    return DYNAFLOW_APPLY_BAD_INPUT;
  }
  try {
    runtime::Executor& exec = *static_cast<ExecutorHandle*>(executor)->executor;
    runtime::Call call;
    call.caller_stream = caller_stream;
    Status status = exec.Submit(*static_cast<const runtime::Schedule*>(schedule), call);
    if (status.ok() && wait != 0) status = exec.Wait();
    if (status.ok()) return DYNAFLOW_APPLY_OK;
    SetError(err, err_len, status.message());
    return status.code() == dynaflow::StatusCode::kBadInput ? DYNAFLOW_APPLY_BAD_INPUT
                                                            : DYNAFLOW_APPLY_FAILED;
  } catch (const std::exception& e) {
    SetError(err, err_len, std::string("run: ") + e.what());
    return DYNAFLOW_APPLY_FAILED;
  }
}

void* dynaflow_apply_policy_new(int num_buckets, const int64_t* max_tokens, const int* schedules,
                                int num_schedules, char* err, size_t err_len) {
  try {
    std::vector<runtime::Bucket> buckets;
    for (int i = 0; i < num_buckets; ++i) buckets.push_back({max_tokens[i], schedules[i]});
    StatusOr<runtime::BucketPolicy> policy =
        runtime::BucketPolicy::Create(std::move(buckets), num_schedules);
    if (!policy.ok()) {
      SetError(err, err_len, policy.status().message());
      return nullptr;
    }
    return new runtime::BucketPolicy(std::move(*policy));
  } catch (const std::exception& e) {
    SetError(err, err_len, std::string("cannot build the policy: ") + e.what());
    return nullptr;
  }
}

int dynaflow_apply_policy_pick(const void* policy, int64_t tokens) {
  if (policy == nullptr || tokens < 0) return runtime::BucketPolicy::kSequential;
  return static_cast<const runtime::BucketPolicy*>(policy)->Pick(tokens).schedule;
}

void dynaflow_apply_policy_free(void* policy) {
  delete static_cast<runtime::BucketPolicy*>(policy);
}

void* dynaflow_apply_region_new(int kind, int n, int micro_batches, char* err, size_t err_len) {
  if (micro_batches > DYNAFLOW_APPLY_MAX_STREAMS) {
    SetError(err, err_len, "a region has at most " + std::to_string(DYNAFLOW_APPLY_MAX_STREAMS) +
                               " micro-batches, not " + std::to_string(micro_batches));
    return nullptr;
  }
  if (kind != DYNAFLOW_APPLY_STAGGERED && kind != DYNAFLOW_APPLY_DUAL_BATCH) {
    SetError(err, err_len, "unknown region kind " + std::to_string(kind));
    return nullptr;
  }
  if (kind == DYNAFLOW_APPLY_DUAL_BATCH && micro_batches != 2) {
    SetError(err, err_len, "dual-batch overlap runs 2 micro-batches, not " +
                               std::to_string(micro_batches));
    return nullptr;
  }
  try {
    StatusOr<runtime::Schedule> schedule = kind == DYNAFLOW_APPLY_STAGGERED
                                               ? runtime::BuildStaggeredRegion(n, micro_batches)
                                               : runtime::BuildDualBatchRegion(n);
    if (!schedule.ok()) {
      SetError(err, err_len, schedule.status().message());
      return nullptr;
    }
    return new RegionHandle(std::move(*schedule));
  } catch (const std::exception& e) {
    SetError(err, err_len, std::string("cannot build the region: ") + e.what());
    return nullptr;
  }
}

void dynaflow_apply_region_free(void* region) { delete static_cast<RegionHandle*>(region); }

int dynaflow_apply_region_tasks(const void* region, int* streams, int* segments,
                                int* micro_batches, int* issue_order, int capacity) {
  if (region == nullptr) return 0;
  const runtime::Schedule& s = static_cast<const RegionHandle*>(region)->schedule;
  if (capacity < s.size()) return s.size();
  const int mbs = static_cast<const RegionHandle*>(region)->sequencer.micro_batches();
  for (const runtime::Task& t : s.tasks()) {
    if (streams != nullptr) streams[t.id] = t.stream;
    if (segments != nullptr) segments[t.id] = t.id / mbs;
    if (micro_batches != nullptr) micro_batches[t.id] = t.micro_batch;
  }
  if (issue_order != nullptr) {
    std::copy(s.issue_order().begin(), s.issue_order().end(), issue_order);
  }
  return s.size();
}

void dynaflow_apply_region_reset(void* region) {
  if (region != nullptr) static_cast<RegionHandle*>(region)->sequencer.Reset();
}

int dynaflow_apply_region_turn(void* region, int mb, int first, int* task, int* signal, int* waits,
                               int max_waits, int* num_waits, char* err, size_t err_len) {
  if (region == nullptr || task == nullptr || signal == nullptr || num_waits == nullptr ||
      (max_waits > 0 && waits == nullptr)) {
    SetError(err, err_len, "no region or no output");
    return DYNAFLOW_APPLY_BAD_INPUT;
  }
  try {
    runtime::RegionSequencer& seq = static_cast<RegionHandle*>(region)->sequencer;
    StatusOr<runtime::RegionSequencer::Turn> turn = first != 0 ? seq.Begin(mb) : seq.Next(mb);
    if (!turn.ok()) {
      SetError(err, err_len, turn.status().message());
      return turn.status().code() == dynaflow::StatusCode::kBadInput ? DYNAFLOW_APPLY_BAD_INPUT
                                                                     : DYNAFLOW_APPLY_FAILED;
    }
    *task = turn->task;
    *signal = turn->signal ? 1 : 0;
    const int n = std::min(static_cast<int>(turn->waits.size()), std::max(0, max_waits));
    std::copy_n(turn->waits.begin(), n, waits == nullptr ? nullptr : waits);
    *num_waits = n;
    return DYNAFLOW_APPLY_OK;
  } catch (const std::exception& e) {
    SetError(err, err_len, std::string("region turn: ") + e.what());
    return DYNAFLOW_APPLY_FAILED;
  }
}

int dynaflow_apply_region_edges(const void* region, int task, int* signal, int* waits,
                                int max_waits, int* num_waits, char* err, size_t err_len) {
  if (region == nullptr || signal == nullptr || num_waits == nullptr ||
      (max_waits > 0 && waits == nullptr)) {
    SetError(err, err_len, "no region or no output");
    return DYNAFLOW_APPLY_BAD_INPUT;
  }
  const runtime::Schedule& s = static_cast<const RegionHandle*>(region)->schedule;
  if (task < 0 || task >= s.size()) {
    SetError(err, err_len, "task " + std::to_string(task) + " is not in the region's " +
                               std::to_string(s.size()) + " tasks");
    return DYNAFLOW_APPLY_BAD_INPUT;
  }
  *signal = s.signals(task) ? 1 : 0;
  const std::span<const runtime::TaskId> all = s.cross_stream_waits(task);
  const int n = std::min(static_cast<int>(all.size()), std::max(0, max_waits));
  std::copy_n(all.begin(), n, waits == nullptr ? nullptr : waits);
  *num_waits = n;
  return DYNAFLOW_APPLY_OK;
}

void dynaflow_apply_region_finish(void* region, int mb) {
  if (region != nullptr) static_cast<RegionHandle*>(region)->sequencer.Finish(mb);
}

void dynaflow_apply_region_abort(void* region, const char* why) {
  if (region != nullptr) {
    static_cast<RegionHandle*>(region)->sequencer.Abort(why == nullptr ? "" : why);
  }
}

int dynaflow_apply_region_executed(const void* region, int* tasks, int capacity, int* skipped,
                                   int* extra_boundaries) {
  if (region == nullptr) return 0;
  const runtime::RegionSequencer& seq = static_cast<const RegionHandle*>(region)->sequencer;
  const std::vector<runtime::TaskId> executed = seq.executed();
  if (tasks != nullptr) {
    const int n = std::min(static_cast<int>(executed.size()), std::max(0, capacity));
    std::copy_n(executed.begin(), n, tasks);
  }
  if (skipped != nullptr) *skipped = seq.skipped();
  if (extra_boundaries != nullptr) *extra_boundaries = seq.extra_boundaries();
  return static_cast<int>(executed.size());
}

int dynaflow_apply_comm_overlap_beside(const int* consumers, int n, char* err, size_t err_len) {
  if (n < 1 || consumers == nullptr) {
    SetError(err, err_len, "a communication-overlap call needs at least one collective");
    return -1;
  }
  try {
    StatusOr<runtime::Schedule> s =
        runtime::BuildCommOverlapRegion(std::vector<int>(consumers, consumers + n));
    if (!s.ok()) {
      SetError(err, err_len, s.status().message());
      return -1;
    }
    int beside = 0;
    for (int j = 0; j < n; ++j) {
      beside += static_cast<int>(runtime::RunsBeside(*s, 2 * j + 1).size());  // X<j> has id 2j + 1
    }
    return beside;
  } catch (const std::exception& e) {
    SetError(err, err_len,
             std::string("cannot build the communication-overlap schedule: ") + e.what());
    return -1;
  }
}

}  // extern "C"
