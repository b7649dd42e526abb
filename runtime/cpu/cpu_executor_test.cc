#include "runtime/cpu/cpu_executor.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace dynaflow::runtime {
namespace {

using namespace std::chrono_literals;

Status Noop(TaskContext&) { return Status::Ok(); }

// Two tasks meet here; each returns only once both have arrived. Tasks that
// rendezvous complete only if they run at the same time: serialized, the first
// would wait forever. It gives up after a timeout, so that such an executor
// fails the test instead of hanging it.
class Rendezvous {
 public:
  Status Arrive() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (++arrived_ == 2) {
      met_.notify_all();
      return Status::Ok();
    }
    if (!met_.wait_for(lock, 10s, [this] { return arrived_ == 2; })) {
      return Status::Failure("rendezvous timed out: the other task did not run concurrently");
    }
    return Status::Ok();
  }

 private:
  std::mutex mutex_;
  std::condition_variable met_;
  int arrived_ = 0;
};

Status RunOnce(Executor& executor, const Schedule& schedule, const Call& call = {}) {
  DF_RETURN_IF_ERROR(executor.Submit(schedule, call));
  return executor.Wait();
}

// Random DAGs over four streams; every task stamps a shared clock when it
// starts and ends. Each dependency must end before its dependent starts, and
// tasks of one stream must run one at a time in queue order.
TEST(CpuExecutorTest, RunsDependenciesFirstAndEachStreamInOrder) {
  constexpr int kStreams = 4;
  constexpr int kTasks = 200;
  std::mt19937 rng(7);
  std::atomic<int> clock{0};
  std::vector<int> start(kTasks), end(kTasks);
  ScheduleBuilder builder(kStreams);
  for (TaskId id = 0; id < kTasks; ++id) {
    std::vector<TaskId> deps;
    for (int d = 0; id > 0 && d < 3; ++d) {
      TaskId dep = static_cast<TaskId>(rng() % id);
      if (std::find(deps.begin(), deps.end(), dep) == deps.end()) deps.push_back(dep);
    }
    builder.Add("t" + std::to_string(id), static_cast<int>(rng() % kStreams), deps,
                [&, id](TaskContext&) {
                  start[id] = clock.fetch_add(1);
                  if (id % 7 == 0) std::this_thread::yield();
                  end[id] = clock.fetch_add(1);
                  return Status::Ok();
                });
  }
  auto schedule = std::move(builder).Build();
  ASSERT_TRUE(schedule.ok()) << schedule.status().message();

  CpuExecutor executor(kStreams);
  for (int call = 0; call < 20; ++call) {
    ASSERT_TRUE(RunOnce(executor, *schedule).ok());
    for (const Task& task : schedule->tasks()) {
      for (TaskId dep : task.deps) {
        ASSERT_LT(end[dep], start[task.id]) << "call " << call << ": " << task.name;
      }
    }
    for (int s = 0; s < kStreams; ++s) {
      auto queue = schedule->stream_queue(s);
      for (std::size_t i = 1; i < queue.size(); ++i) {
        ASSERT_LT(end[queue[i - 1]], start[queue[i]]) << "call " << call << ", stream " << s;
      }
    }
  }
}

TEST(CpuExecutorTest, StreamsRunConcurrently) {
  Rendezvous rendezvous;
  auto meet = [&](TaskContext&) { return rendezvous.Arrive(); };
  ScheduleBuilder builder(2);
  builder.Add("left", 0, {}, meet);
  builder.Add("right", 1, {}, meet);
  auto schedule = std::move(builder).Build();
  ASSERT_TRUE(schedule.ok());
  CpuExecutor executor(2);
  Status st = RunOnce(executor, *schedule);
  EXPECT_TRUE(st.ok()) << st.message();
}

// The point of DBO: the all-reduce of micro-batch 0 runs while micro-batch 1
// computes.
TEST(CpuExecutorTest, DualBatchOverlapOverlapsCommunicationWithComputation) {
  Rendezvous rendezvous;
  auto stage = [&](TaskContext& ctx) {
    const std::string& name = ctx.task.name;
    if (name == "all_reduce/mb0" || name == "attn/mb1") return rendezvous.Arrive();
    return Status::Ok();
  };
  auto schedule = BuildDualBatchOverlap({{"attn", kComputeStream, stage},
                                         {"all_reduce", kCommStream, stage},
                                         {"mlp", kComputeStream, stage}});
  ASSERT_TRUE(schedule.ok());
  CpuExecutor executor(2);
  Status st = RunOnce(executor, *schedule);
  EXPECT_TRUE(st.ok()) << st.message();
}

TEST(CpuExecutorTest, AnErrorStopsTheCallAndSkipsTheTasksNotStarted) {
  std::atomic<int> ran_after_failure{0};
  auto count = [&](TaskContext&) {
    ++ran_after_failure;
    return Status::Ok();
  };
  ScheduleBuilder builder(2);
  TaskId fail = builder.Add("fail", 0, {}, [](TaskContext&) { return Status::Failure("boom"); });
  builder.Add("same-stream-after", 0, {}, count);
  TaskId dependent = builder.Add("dependent", 1, {fail}, count);
  builder.Add("behind-dependent", 1, {dependent}, count);
  auto schedule = std::move(builder).Build();
  ASSERT_TRUE(schedule.ok());

  CpuExecutor executor(2);
  Status st = RunOnce(executor, *schedule);
  EXPECT_EQ(st.code(), StatusCode::kFailure);
  EXPECT_EQ(st.message(), "boom");
  EXPECT_EQ(ran_after_failure.load(), 0);

  // The executor is usable again, and the error does not leak into the next call.
  auto fine = BuildSequential({{"fine", 0, Noop}});
  ASSERT_TRUE(fine.ok());
  EXPECT_TRUE(RunOnce(executor, *fine).ok());
}

TEST(CpuExecutorTest, TheFirstErrorWins) {
  Rendezvous rendezvous;
  std::atomic<bool> first_failing{false};
  ScheduleBuilder builder(2);
  builder.Add("first", 0, {}, [&](TaskContext&) {
    DF_RETURN_IF_ERROR(rendezvous.Arrive());
    first_failing = true;
    return Status::Failure("first");
  });
  builder.Add("second", 1, {}, [&](TaskContext&) {
    DF_RETURN_IF_ERROR(rendezvous.Arrive());
    while (!first_failing) std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(200ms);  // ample time for "first" to be recorded
    return Status::Failure("second");
  });
  auto schedule = std::move(builder).Build();
  ASSERT_TRUE(schedule.ok());
  CpuExecutor executor(2);
  EXPECT_EQ(RunOnce(executor, *schedule).message(), "first");
}

TEST(CpuExecutorTest, AnExceptionBecomesAFailure) {
  auto schedule = BuildSequential(
      {{"throws", 0, [](TaskContext&) -> Status { throw std::runtime_error("kaput"); }}});
  ASSERT_TRUE(schedule.ok());
  CpuExecutor executor(1);
  Status st = RunOnce(executor, *schedule);
  EXPECT_EQ(st.code(), StatusCode::kFailure);
  EXPECT_EQ(st.message(), "task 0 'throws' threw: kaput");
}

// a -> {b on the other stream, c} -> d: a is released once b and c are done,
// b and c once d is done, d (the result) never.
TEST(CpuExecutorTest, ReleasesEachIntermediateAfterItsLastReader) {
  std::mutex mutex;
  std::vector<std::string> log;
  auto note = [&](std::string entry) {
    std::lock_guard<std::mutex> lock(mutex);
    log.push_back(std::move(entry));
  };
  auto task = [&](TaskContext& ctx) {
    note("done " + ctx.task.name);
    return Status::Ok();
  };
  ScheduleBuilder builder(2);
  TaskId a = builder.Add("a", 0, {}, task);
  TaskId b = builder.Add("b", 1, {a}, task);
  TaskId c = builder.Add("c", 0, {a}, task);
  builder.Add("d", 1, {b, c}, task);
  auto schedule = std::move(builder).Build();
  ASSERT_TRUE(schedule.ok());

  CpuExecutor executor(2);
  for (int call = 0; call < 50; ++call) {
    log.clear();
    Call call_args{.release = [&](TaskId id) { note("release " + schedule->task(id).name); }};
    ASSERT_TRUE(RunOnce(executor, *schedule, call_args).ok());
    auto at = [&](const std::string& entry) {
      auto it = std::find(log.begin(), log.end(), entry);
      EXPECT_NE(it, log.end()) << entry;
      return it - log.begin();
    };
    EXPECT_EQ(log.size(), 7u);  // four tasks, three releases
    EXPECT_GT(at("release a"), std::max(at("done b"), at("done c")));
    EXPECT_GT(at("release b"), at("done d"));
    EXPECT_GT(at("release c"), at("done d"));
    EXPECT_EQ(std::count(log.begin(), log.end(), "release d"), 0);
  }
}

// A worker waiting for a slow task on another stream, and the caller in
// Wait, must sleep rather than spin: the call may cost little CPU time.
TEST(CpuExecutorTest, WaitingDoesNotBurnCpu) {
  ScheduleBuilder builder(2);
  TaskId slow = builder.Add("slow", 0, {}, [](TaskContext&) {
    std::this_thread::sleep_for(300ms);
    return Status::Ok();
  });
  builder.Add("waits", 1, {slow}, Noop);
  auto schedule = std::move(builder).Build();
  ASSERT_TRUE(schedule.ok());
  CpuExecutor executor(2);
  std::clock_t cpu_before = std::clock();
  ASSERT_TRUE(RunOnce(executor, *schedule).ok());
  double cpu_ms = 1000.0 * static_cast<double>(std::clock() - cpu_before) / CLOCKS_PER_SEC;
  EXPECT_LT(cpu_ms, 100.0);
}

TEST(CpuExecutorTest, RefusesTooManyStreamsAndASecondCallInFlight) {
  auto two_streams = BuildMicroBatchSplit({{"a", 0, Noop}, {"b", 1, Noop}}, 1);
  ASSERT_TRUE(two_streams.ok());
  CpuExecutor one(1);
  EXPECT_EQ(one.Submit(*two_streams, {}).code(), StatusCode::kBadInput);
  EXPECT_TRUE(one.Wait().ok());  // nothing in flight

  CpuExecutor two(2);
  ASSERT_TRUE(two.Submit(*two_streams, {}).ok());
  EXPECT_EQ(two.Submit(*two_streams, {}).code(), StatusCode::kFailure);
  EXPECT_TRUE(two.Wait().ok());
}

// The system refusing a thread (here: an address-space limit with room for a
// few thread stacks only) is an exception from the constructor, after the
// workers started are stopped; it used to be std::terminate (exit 134 of the
// program `dynaflow apply` ran a plan with `splits: 100000` in).
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define DYNAFLOW_CLANG_ASAN 1
#endif
#endif
#ifndef DYNAFLOW_CLANG_ASAN
#define DYNAFLOW_CLANG_ASAN 0
#endif

// In a child process: 0 when CpuExecutor(100000) throws under an address-space
// limit with 64 MB to spare.
[[noreturn, maybe_unused]] void ConstructUnderAnAddressSpaceLimit() {
  long pages = 0;
  std::ifstream("/proc/self/statm") >> pages;
  const rlim_t room = static_cast<rlim_t>(pages) * sysconf(_SC_PAGESIZE) + (64 << 20);
  rlimit limit{};
  limit.rlim_cur = limit.rlim_max = room;
  if (setrlimit(RLIMIT_AS, &limit) != 0) std::_Exit(3);
  try {
    CpuExecutor many(100000);
    std::_Exit(4);  // 100000 stacks in 64 MB: not expected
  } catch (const std::exception&) {
    std::_Exit(0);
  }
}

TEST(CpuExecutorTest, ARefusedThreadIsAnExceptionNotAnAbort) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || DYNAFLOW_CLANG_ASAN
  GTEST_SKIP() << "sanitizers reserve address space that a limit would break";
#else
  EXPECT_EXIT(ConstructUnderAnAddressSpaceLimit(), ::testing::ExitedWithCode(0), "");
#endif
}

}  // namespace
}  // namespace dynaflow::runtime
