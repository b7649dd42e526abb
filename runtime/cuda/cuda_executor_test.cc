#include "runtime/cuda/cuda_executor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "runtime/cuda/cudart_api.h"
#include "runtime/cuda/fake_cuda_api.h"

namespace dynaflow::runtime::cuda {
namespace {

using Calls = std::vector<std::string>;

Call InBucket(int bucket) {
  Call call;
  call.bucket = bucket;
  return call;
}

class CudaExecutorTest : public ::testing::Test {
 protected:
  // A task that stands in for a kernel on its stream.
  TaskFn Kernel() {
    return [this](TaskContext& ctx) {
      ++callbacks_;
      pools_seen_.insert(ctx.memory_pool);
      fake_.LaunchKernel(ctx.task.name, Stream{ctx.stream});
      return Status::Ok();
    };
  }

  // a (stream 0) -> b (stream 1) -> c (stream 0), on a three-stream schedule
  // whose stream 2 is unused. `b` defaults to a kernel.
  Schedule ForkJoin(TaskFn b = nullptr) {
    ScheduleBuilder builder(3);
    TaskId a = builder.Add("a", 0, {}, Kernel());
    TaskId b_id = builder.Add("b", 1, {a}, b ? std::move(b) : Kernel());
    builder.Add("c", 0, {b_id}, Kernel());
    auto schedule = std::move(builder).Build();
    EXPECT_TRUE(schedule.ok()) << schedule.status().message();
    return *schedule;
  }

  // Submits and returns the calls the submission made.
  Calls SubmitAndLog(CudaExecutor& executor, const Schedule& schedule, int bucket) {
    fake_.ClearCalls();
    Status st = executor.Submit(schedule, InBucket(bucket));
    EXPECT_TRUE(st.ok()) << st.message();
    return fake_.calls();
  }

  FakeCudaApi fake_;
  int callbacks_ = 0;
  std::set<std::uintptr_t> pools_seen_;
};

// Created lazily: streams s1 (the origin) to s3; events e1 enter, e2 fork, e3
// exit, e4 and e5 join streams 1 and 2, e6 to e8 the tasks a, b, c; pool p1.
constexpr const char* kEnter[] = {"RecordEvent(e1, s0)", "StreamWaitEvent(s1, e1)"};
constexpr const char* kExit[] = {"RecordEvent(e3, s1)", "StreamWaitEvent(s0, e3)"};
const Calls kForkTasksJoin = {
    "RecordEvent(e2, s1)",     "StreamWaitEvent(s2, e2)",  // fork to the used side stream only
    "Kernel(a, s1)",           "RecordEvent(e6, s1)",      // a signals b
    "StreamWaitEvent(s2, e6)", "Kernel(b, s2)",
    "RecordEvent(e7, s2)",     "StreamWaitEvent(s1, e7)",  // b signals c
    "Kernel(c, s1)",           "RecordEvent(e4, s2)",      // join stream 1 back
    "StreamWaitEvent(s1, e4)",
};

Calls Concat(std::initializer_list<Calls> parts) {
  Calls all;
  for (const Calls& part : parts) all.insert(all.end(), part.begin(), part.end());
  return all;
}
Calls Pair(const char* const (&calls)[2]) { return {calls[0], calls[1]}; }

TEST_F(CudaExecutorTest, CreatesNothingUntilTheFirstSubmit) {
  { CudaExecutor executor(fake_, 3); }
  EXPECT_TRUE(fake_.calls().empty());
}

TEST_F(CudaExecutorTest, EagerCallForksFromTheOriginAndJoinsBack) {
  Schedule schedule = ForkJoin();
  CudaExecutor executor(fake_, 3);
  Calls calls = SubmitAndLog(executor, schedule, -1);
  // Drop the creation calls: eight events, three streams, one pool.
  ASSERT_GT(calls.size(), 12u);
  calls.erase(calls.begin(), calls.begin() + 12);
  EXPECT_EQ(calls, Concat({Pair(kEnter), kForkTasksJoin, Pair(kExit)}));
  EXPECT_EQ(callbacks_, 3);

  fake_.ClearCalls();
  EXPECT_TRUE(executor.Wait().ok());
  EXPECT_EQ(fake_.calls(), (Calls{"SynchronizeEvent(e3)"}));
}

TEST_F(CudaExecutorTest, CapturesTheWholeScheduleAsOneGraphThenReplaysIt) {
  Schedule schedule = ForkJoin();
  CudaExecutor executor(fake_, 3);
  Calls calls = SubmitAndLog(executor, schedule, 0);
  calls.erase(calls.begin(), calls.begin() + 12);
  EXPECT_EQ(calls, Concat({{"BeginCapture(s1)"},
                           kForkTasksJoin,
                           {"EndCapture(s1) = g1", "InstantiateGraph(g1) = x1", "DestroyGraph(g1)"},
                           Pair(kEnter),
                           {"LaunchGraph(x1, s1)"},
                           Pair(kExit)}));
  EXPECT_EQ(fake_.kernels(GraphExec{1}), (Calls{"a@s1", "b@s2", "c@s1"}));
  EXPECT_EQ(callbacks_, 3);

  // Same schedule and bucket: replay, no capture, no callback.
  EXPECT_EQ(SubmitAndLog(executor, schedule, 0),
            Concat({Pair(kEnter), {"LaunchGraph(x1, s1)"}, Pair(kExit)}));
  EXPECT_EQ(callbacks_, 3);
  EXPECT_TRUE(executor.Wait().ok());
}

// Nothing on the origin waits for b, so only the join lets the capture end.
TEST_F(CudaExecutorTest, CaptureJoinsASideStreamThatEndsTheSchedule) {
  ScheduleBuilder builder(2);
  TaskId a = builder.Add("a", 0, {}, Kernel());
  builder.Add("b", 1, {a}, Kernel());
  auto schedule = std::move(builder).Build();
  ASSERT_TRUE(schedule.ok());
  CudaExecutor executor(fake_, 2);
  Calls calls = SubmitAndLog(executor, *schedule, 0);
  EXPECT_NE(std::find(calls.begin(), calls.end(), "EndCapture(s1) = g1"), calls.end());
  EXPECT_EQ(fake_.kernels(GraphExec{1}), (Calls{"a@s1", "b@s2"}));
}

TEST_F(CudaExecutorTest, OneGraphPerScheduleAndBucket) {
  Schedule schedule = ForkJoin();
  Schedule rebuilt = ForkJoin();  // same shape, another schedule
  CudaExecutor executor(fake_, 3);
  auto launched = [](const Calls& calls) {
    for (const std::string& call : calls) {
      if (call.rfind("LaunchGraph", 0) == 0) return call;
    }
    return std::string("no launch");
  };
  auto captured = [](const Calls& calls) {
    return std::count(calls.begin(), calls.end(), "BeginCapture(s1)");
  };

  Calls first = SubmitAndLog(executor, schedule, 0);
  EXPECT_EQ(captured(first), 1);
  EXPECT_EQ(launched(first), "LaunchGraph(x1, s1)");
  Calls other_bucket = SubmitAndLog(executor, schedule, 1);
  EXPECT_EQ(captured(other_bucket), 1);
  EXPECT_EQ(launched(other_bucket), "LaunchGraph(x2, s1)");
  Calls back = SubmitAndLog(executor, schedule, 0);
  EXPECT_EQ(captured(back), 0);
  EXPECT_EQ(launched(back), "LaunchGraph(x1, s1)");
  Calls other_schedule = SubmitAndLog(executor, rebuilt, 0);
  EXPECT_EQ(captured(other_schedule), 1);
  EXPECT_EQ(launched(other_schedule), "LaunchGraph(x3, s1)");
  EXPECT_EQ(launched(SubmitAndLog(executor, rebuilt, 1)), "LaunchGraph(x4, s1)");
}

TEST_F(CudaExecutorTest, EveryCallAndCaptureSharesOneMemoryPool) {
  Schedule schedule = ForkJoin();
  CudaExecutor executor(fake_, 3);
  for (int bucket : {-1, 0, 1, 2}) SubmitAndLog(executor, schedule, bucket);
  EXPECT_EQ(pools_seen_, (std::set<std::uintptr_t>{1}));  // p1
  EXPECT_EQ(callbacks_, 4 * 3);
}

TEST_F(CudaExecutorTest, ATaskErrorEndsTheCaptureAndCachesNothing) {
  bool fail = true;
  Schedule schedule = ForkJoin([&](TaskContext& ctx) {
    if (fail) return Status::Failure("b failed");
    fake_.LaunchKernel("b", Stream{ctx.stream});
    return Status::Ok();
  });
  CudaExecutor executor(fake_, 3);
  fake_.ClearCalls();
  Status st = executor.Submit(schedule, InBucket(0));
  EXPECT_EQ(st.message(), "b failed");
  Calls calls = fake_.calls();
  calls.erase(calls.begin(), calls.begin() + 12);
  // c is not issued; the side stream is still joined so that capture can end.
  EXPECT_EQ(calls, (Calls{"BeginCapture(s1)", "RecordEvent(e2, s1)", "StreamWaitEvent(s2, e2)",
                          "Kernel(a, s1)", "RecordEvent(e6, s1)", "StreamWaitEvent(s2, e6)",
                          "RecordEvent(e4, s2)", "StreamWaitEvent(s1, e4)", "EndCapture(s1) = g1",
                          "DestroyGraph(g1)"}));

  fail = false;
  Calls retry = SubmitAndLog(executor, schedule, 0);
  EXPECT_EQ(retry.front(), "BeginCapture(s1)");
  EXPECT_EQ(fake_.kernels(GraphExec{1}), (Calls{"a@s1", "b@s2", "c@s1"}));
}

TEST_F(CudaExecutorTest, AnEagerTaskErrorStillJoinsAndOrdersTheCaller) {
  Schedule schedule = ForkJoin([](TaskContext&) { return Status::Failure("b failed"); });
  CudaExecutor executor(fake_, 3);
  fake_.ClearCalls();
  EXPECT_EQ(executor.Submit(schedule, Call{}).message(), "b failed");
  Calls calls = fake_.calls();
  EXPECT_EQ(Calls(calls.end() - 4, calls.end()),
            (Calls{"RecordEvent(e4, s2)", "StreamWaitEvent(s1, e4)", kExit[0], kExit[1]}));
}

TEST_F(CudaExecutorTest, ADriverErrorIsReportedWithTheCallAndCachesNothing) {
  Schedule schedule = ForkJoin();
  CudaExecutor executor(fake_, 3);
  fake_.FailNext("InstantiateGraph");
  Status st = executor.Submit(schedule, InBucket(0));
  EXPECT_EQ(st.code(), StatusCode::kFailure);
  EXPECT_EQ(st.message(), "InstantiateGraph(g1): cudaErrorUnknown");
  Calls calls = fake_.calls();
  EXPECT_EQ(calls.back(), "DestroyGraph(g1)");

  Calls retry = SubmitAndLog(executor, schedule, 0);
  EXPECT_EQ(retry.front(), "BeginCapture(s1)");
}

TEST_F(CudaExecutorTest, ReleasesIntermediatesAsTheirReadersAreIssuedButNotOnReplay) {
  Schedule schedule = ForkJoin();
  CudaExecutor executor(fake_, 3);
  std::vector<TaskId> released;
  Call call{.bucket = 0, .release = [&](TaskId id) { released.push_back(id); }};
  ASSERT_TRUE(executor.Submit(schedule, call).ok());  // capture: callbacks run
  EXPECT_EQ(released, (std::vector<TaskId>{0, 1}));   // a after b, b after c; c is the result
  ASSERT_TRUE(executor.Submit(schedule, call).ok());  // replay
  EXPECT_EQ(released.size(), 2u);
}

TEST_F(CudaExecutorTest, RefusesAScheduleWithMoreStreamsThanTheExecutor) {
  Schedule schedule = ForkJoin();
  CudaExecutor executor(fake_, 2);
  EXPECT_EQ(executor.Submit(schedule, Call{}).code(), StatusCode::kBadInput);
  EXPECT_TRUE(fake_.calls().empty());
}

TEST_F(CudaExecutorTest, DestructionReleasesEveryHandle) {
  {
    Schedule schedule = ForkJoin();
    CudaExecutor executor(fake_, 3);
    for (int bucket : {-1, 0, 1}) SubmitAndLog(executor, schedule, bucket);
    EXPECT_GT(fake_.live_handles(), 0);
  }
  EXPECT_EQ(fake_.live_handles(), 0);
  for (const std::string& call : fake_.calls()) {
    EXPECT_EQ(call.find("->"), std::string::npos) << call;
  }
}

// The fake must reject what CUDA rejects, or the tests above prove nothing.
TEST(FakeCudaApiTest, EnforcesTheRulesOfStreamCapture) {
  FakeCudaApi fake;
  Stream origin = *fake.CreateStream();
  Stream side = *fake.CreateStream();
  Event fork = *fake.CreateEvent();
  Event outside = *fake.CreateEvent();

  EXPECT_FALSE(fake.BeginCapture(Stream{0}).ok());  // the legacy stream

  ASSERT_TRUE(fake.RecordEvent(outside, origin).ok());
  ASSERT_TRUE(fake.BeginCapture(origin).ok());
  EXPECT_EQ(fake.StreamWaitEvent(origin, outside).message(),
            "StreamWaitEvent(s1, e2): cudaErrorStreamCaptureIsolation");
  ASSERT_TRUE(fake.RecordEvent(fork, origin).ok());
  ASSERT_TRUE(fake.StreamWaitEvent(side, fork).ok());  // side joins the capture
  fake.LaunchKernel("k", side);
  EXPECT_EQ(fake.EndCapture(side).status().message(),
            "EndCapture(s2): cudaErrorStreamCaptureUnmatched");
  EXPECT_EQ(fake.EndCapture(origin).status().message(),
            "EndCapture(s1): cudaErrorStreamCaptureUnjoined");  // k is not joined back

  EXPECT_EQ(fake.StreamWaitEvent(side, fork).message(),
            "StreamWaitEvent(s2, e1): cudaErrorCapturedEvent");  // its capture has ended
  EXPECT_EQ(fake.SynchronizeEvent(fork).message(), "SynchronizeEvent(e1): cudaErrorCapturedEvent");
}

// The real CUDA API compiles and links; without a GPU it is only constructed,
// which, like the executor, touches no CUDA.
TEST(CudartApiTest, LinksAndTouchesNoCudaUntilUsed) {
  CudartApi api;
  CudaExecutor executor(api, 2);
}

}  // namespace
}  // namespace dynaflow::runtime::cuda
