// The C ABI on the CPU backend, called as the Python side calls it.
#include "plugin/apply/dynaflow_apply.h"

#include <gtest/gtest.h>

#include <climits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Recorder {
  std::mutex mu;
  std::vector<std::pair<int, int>> ran;  // (task, micro-batch) in completion order
  int fail_task = -1;
};

int Record(void* user, int task, int micro_batch, uintptr_t stream) {
  auto* r = static_cast<Recorder*>(user);
  if (stream != 0) return 1;  // the CPU backend has no native stream
  if (task == r->fail_task) return 1;
  std::lock_guard<std::mutex> lock(r->mu);
  r->ran.emplace_back(task, micro_batch);
  return 0;
}

int IndexOf(const Recorder& r, int task) {
  for (size_t i = 0; i < r.ran.size(); ++i) {
    if (r.ran[i].first == task) return static_cast<int>(i);
  }
  return -1;
}

// Two micro-batches of two stages each, on two streams: stage 1 of a
// micro-batch after its stage 0.
struct TwoByTwo {
  int streams[4] = {0, 1, 0, 1};
  int micro_batches[4] = {0, 1, 0, 1};
  int dep_begin[5] = {0, 0, 0, 1, 2};
  int deps[2] = {0, 1};
};

TEST(ApplyAbiTest, RunsEveryTaskAfterItsDependencies) {
  char err[256] = "";
  void* exec = dynaflow_apply_executor_new(DYNAFLOW_APPLY_CPU, 2, err, sizeof(err));
  ASSERT_NE(exec, nullptr) << err;
  Recorder rec;
  TwoByTwo s;
  void* sched = dynaflow_apply_schedule_new("layer", 2, 4, s.streams, s.micro_batches,
                                            s.dep_begin, s.deps, &Record, &rec, err, sizeof(err));
  ASSERT_NE(sched, nullptr) << err;
  for (int call = 0; call < 3; ++call) {
    rec.ran.clear();
    ASSERT_EQ(dynaflow_apply_run(exec, sched, 0, 1, err, sizeof(err)), DYNAFLOW_APPLY_OK) << err;
    ASSERT_EQ(rec.ran.size(), 4u);
    EXPECT_LT(IndexOf(rec, 0), IndexOf(rec, 2));
    EXPECT_LT(IndexOf(rec, 1), IndexOf(rec, 3));
    for (const auto& [task, mb] : rec.ran) EXPECT_EQ(mb, s.micro_batches[task]);
  }
  dynaflow_apply_schedule_free(sched);
  dynaflow_apply_executor_free(exec);
}

TEST(ApplyAbiTest, AFailingTaskFailsTheCallAndSkipsItsDependents) {
  char err[256] = "";
  void* exec = dynaflow_apply_executor_new(DYNAFLOW_APPLY_CPU, 2, err, sizeof(err));
  ASSERT_NE(exec, nullptr);
  Recorder rec;
  rec.fail_task = 0;
  TwoByTwo s;
  void* sched = dynaflow_apply_schedule_new("layer", 2, 4, s.streams, s.micro_batches,
                                            s.dep_begin, s.deps, &Record, &rec, err, sizeof(err));
  ASSERT_NE(sched, nullptr);
  EXPECT_EQ(dynaflow_apply_run(exec, sched, 0, 1, err, sizeof(err)), DYNAFLOW_APPLY_FAILED);
  EXPECT_NE(std::string(err).find("layer/mb0"), std::string::npos) << err;
  EXPECT_EQ(IndexOf(rec, 2), -1);  // depends on the failed task: never ran
  dynaflow_apply_schedule_free(sched);
  dynaflow_apply_executor_free(exec);
}

TEST(ApplyAbiTest, MalformedSchedulesAreRefusedWithTheReason) {
  char err[256] = "";
  Recorder rec;
  int streams[2] = {0, 0};
  int mbs[2] = {0, 1};
  int dep_begin[3] = {0, 1, 2};
  int cycle[2] = {1, 0};
  EXPECT_EQ(dynaflow_apply_schedule_new("c", 1, 2, streams, mbs, dep_begin, cycle, &Record, &rec,
                                        err, sizeof(err)),
            nullptr);
  EXPECT_NE(std::string(err).find("cycle"), std::string::npos) << err;

  int far_stream[2] = {0, 3};
  int none_begin[3] = {0, 0, 0};
  EXPECT_EQ(dynaflow_apply_schedule_new("s", 2, 2, far_stream, mbs, none_begin, nullptr, &Record,
                                        &rec, err, sizeof(err)),
            nullptr);
  EXPECT_NE(std::string(err).find("s/mb1"), std::string::npos) << err;

  EXPECT_EQ(dynaflow_apply_schedule_new("n", 1, 1, streams, mbs, none_begin, nullptr, nullptr,
                                        &rec, err, sizeof(err)),
            nullptr);
  EXPECT_EQ(dynaflow_apply_executor_new(DYNAFLOW_APPLY_CPU, 0, err, sizeof(err)), nullptr);
  // 100000 streams (a plan's `splits: 100000`) are refused, not started.
  EXPECT_EQ(dynaflow_apply_executor_new(DYNAFLOW_APPLY_CPU, 100000, err, sizeof(err)), nullptr);
  EXPECT_EQ(std::string(err), "an executor has 1 to 64 streams, not 100000");
  EXPECT_EQ(dynaflow_apply_schedule_new("n", 100000, 1, streams, mbs, none_begin, nullptr, &Record,
                                        &rec, err, sizeof(err)),
            nullptr);
  EXPECT_EQ(std::string(err), "a schedule has at most 64 streams, not 100000");
  EXPECT_EQ(dynaflow_apply_executor_new(7, 1, err, sizeof(err)), nullptr);
  EXPECT_NE(std::string(err).find("unknown backend"), std::string::npos) << err;
  // A one-byte buffer still gets its terminator.
  char tiny[1] = {'x'};
  EXPECT_EQ(dynaflow_apply_executor_new(7, 1, tiny, sizeof(tiny)), nullptr);
  EXPECT_EQ(tiny[0], '\0');
}

TEST(ApplyAbiTest, PolicyPicksTheBucketOfTheTokenCount) {
  char err[256] = "";
  // Sequential up to 256 tokens, schedule 0 up to 4096, schedule 1 beyond.
  const int64_t max_tokens[3] = {256, 4096, INT64_MAX};
  const int schedules[3] = {-1, 0, 1};
  void* policy = dynaflow_apply_policy_new(3, max_tokens, schedules, 2, err, sizeof(err));
  ASSERT_NE(policy, nullptr) << err;
  EXPECT_EQ(dynaflow_apply_policy_pick(policy, 1), -1);
  EXPECT_EQ(dynaflow_apply_policy_pick(policy, 256), -1);
  EXPECT_EQ(dynaflow_apply_policy_pick(policy, 257), 0);
  EXPECT_EQ(dynaflow_apply_policy_pick(policy, 4096), 0);
  EXPECT_EQ(dynaflow_apply_policy_pick(policy, 1 << 20), 1);
  EXPECT_EQ(dynaflow_apply_policy_pick(policy, -5), -1);
  dynaflow_apply_policy_free(policy);

  const int64_t unsorted[2] = {4096, 256};
  const int two[2] = {0, 0};
  EXPECT_EQ(dynaflow_apply_policy_new(2, unsorted, two, 1, err, sizeof(err)), nullptr);
  EXPECT_NE(std::string(err), "");
}

}  // namespace

namespace {

// Two host threads turned through a 2-segment, 2-micro-batch region as the
// Python side turns them: the turns come in the schedule's issue order.
TEST(ApplyAbiTest, RegionTurnsThreadsThroughItsIssueOrder) {
  char err[256] = "";
  void* region = dynaflow_apply_region_new(DYNAFLOW_APPLY_STAGGERED, 2, 2, err, sizeof err);
  ASSERT_NE(region, nullptr) << err;
  int streams[4], segments[4], mbs[4], order[4];
  ASSERT_EQ(dynaflow_apply_region_tasks(region, streams, segments, mbs, order, 4), 4);
  EXPECT_EQ(std::vector<int>(segments, segments + 4), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(std::vector<int>(streams, streams + 4), (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(std::vector<int>(order, order + 4), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(dynaflow_apply_region_tasks(region, nullptr, nullptr, nullptr, nullptr, 3), 4);

  dynaflow_apply_region_reset(region);
  auto run = [region](int mb, std::vector<int>* waited) {
    char e[128];
    int task = -1, signal = 0, waits[4], n = 0;
    for (int first = 1;; first = 0) {
      ASSERT_EQ(dynaflow_apply_region_turn(region, mb, first, &task, &signal, waits, 4, &n, e,
                                           sizeof e),
                DYNAFLOW_APPLY_OK)
          << e;
      if (task < 0) break;
      waited->insert(waited->end(), waits, waits + n);
    }
    dynaflow_apply_region_finish(region, mb);
  };
  std::vector<int> waited0, waited1;
  std::thread second(run, 1, &waited1);
  run(0, &waited0);
  second.join();
  int executed[4], skipped = -1, extra = -1;
  ASSERT_EQ(dynaflow_apply_region_executed(region, executed, 4, &skipped, &extra), 4);
  EXPECT_EQ(std::vector<int>(executed, executed + 4), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(waited1, (std::vector<int>{0, 2}));
  EXPECT_TRUE(waited0.empty());
  EXPECT_EQ(skipped, 0);
  EXPECT_EQ(extra, 2);  // each thread's last Next fell past its last segment

  int task = 0, signal = 0, n = 0;
  EXPECT_EQ(dynaflow_apply_region_turn(region, 0, 0, &task, &signal, nullptr, 0, &n, err, sizeof err),
            DYNAFLOW_APPLY_BAD_INPUT);  // finished

  // The same edges, for a caller that issues the tasks itself: mb1's
  // segments wait for mb0's same segment, whose ends signal.
  std::vector<int> signals, edges;
  for (int t = 0; t < 4; ++t) {
    int waits[4];
    ASSERT_EQ(dynaflow_apply_region_edges(region, t, &signal, waits, 4, &n, err, sizeof err),
              DYNAFLOW_APPLY_OK)
        << err;
    signals.push_back(signal);
    for (int k = 0; k < n; ++k) edges.push_back(t * 10 + waits[k]);
  }
  EXPECT_EQ(signals, (std::vector<int>{1, 0, 1, 0}));
  EXPECT_EQ(edges, (std::vector<int>{10, 32}));  // task 1 waits for 0, task 3 for 2
  EXPECT_EQ(dynaflow_apply_region_edges(region, 4, &signal, nullptr, 0, &n, err, sizeof err),
            DYNAFLOW_APPLY_BAD_INPUT);
  EXPECT_NE(std::string(err).find("task 4 is not in the region's 4 tasks"), std::string::npos)
      << err;
  dynaflow_apply_region_free(region);
  EXPECT_EQ(dynaflow_apply_region_new(DYNAFLOW_APPLY_STAGGERED, 0, 2, err, sizeof err), nullptr);
  EXPECT_NE(std::string(err).find("at least one segment"), std::string::npos) << err;
  EXPECT_EQ(dynaflow_apply_region_new(DYNAFLOW_APPLY_STAGGERED, 2, 65, err, sizeof err), nullptr);
  EXPECT_EQ(dynaflow_apply_region_new(DYNAFLOW_APPLY_DUAL_BATCH, 2, 3, err, sizeof err), nullptr);
  EXPECT_NE(std::string(err).find("runs 2 micro-batches, not 3"), std::string::npos) << err;
  EXPECT_EQ(dynaflow_apply_region_new(7, 2, 2, err, sizeof err), nullptr);

  // A dual-batch region: compute parts on stream 0, collectives on stream 1.
  region = dynaflow_apply_region_new(DYNAFLOW_APPLY_DUAL_BATCH, 1, 2, err, sizeof err);
  ASSERT_NE(region, nullptr) << err;
  int s6[6], g6[6], m6[6], o6[6];
  ASSERT_EQ(dynaflow_apply_region_tasks(region, s6, g6, m6, o6, 6), 6);
  EXPECT_EQ(std::vector<int>(s6, s6 + 6), (std::vector<int>{0, 0, 1, 1, 0, 0}));
  EXPECT_EQ(std::vector<int>(g6, g6 + 6), (std::vector<int>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(std::vector<int>(m6, m6 + 6), (std::vector<int>{0, 1, 0, 1, 0, 1}));
  dynaflow_apply_region_free(region);
}

TEST(ApplyAbiTest, CommOverlapCountsTheComputePartsBesideItsCollectives) {
  char err[256] = "";
  // Three collectives: X0 read by C2 (beside C1), X1 by C2 (beside nothing),
  // X2 at the end (beside C3).
  const int consumers[] = {2, 2, 4};
  EXPECT_EQ(dynaflow_apply_comm_overlap_beside(consumers, 3, err, sizeof err), 2) << err;
  const int read_next[] = {1, 2, 3};
  EXPECT_EQ(dynaflow_apply_comm_overlap_beside(read_next, 3, err, sizeof err), 0) << err;
  const int at_end[] = {3, 3};  // C1 and C2 beside X0, C2 beside X1
  EXPECT_EQ(dynaflow_apply_comm_overlap_beside(at_end, 2, err, sizeof err), 3) << err;
  const int early[] = {1, 1};
  EXPECT_EQ(dynaflow_apply_comm_overlap_beside(early, 2, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("collective X1 is read by compute part C1"), std::string::npos)
      << err;
  EXPECT_EQ(dynaflow_apply_comm_overlap_beside(consumers, 0, err, sizeof err), -1);
}

}  // namespace
