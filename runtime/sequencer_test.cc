#include "runtime/sequencer.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace dynaflow::runtime {
namespace {

using Ids = std::vector<TaskId>;

Schedule Region(int segments, int micro_batches) {
  auto s = BuildStaggeredRegion(segments, micro_batches);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return *std::move(s);
}

// Each micro-batch's thread starts, crosses `boundaries` stage boundaries and
// finishes, logging the task it holds at each step; threads start in reverse
// order so that the sequencer, not start-up order, decides the interleaving.
std::vector<Ids> RunThreads(RegionSequencer& seq, int boundaries) {
  std::vector<Ids> seen(static_cast<size_t>(seq.micro_batches()));
  std::vector<std::thread> threads;
  for (int mb = seq.micro_batches() - 1; mb >= 0; --mb) {
    threads.emplace_back([&seq, &seen, mb, boundaries] {
      auto turn = seq.Begin(mb);
      ASSERT_TRUE(turn.ok()) << turn.status().message();
      seen[static_cast<size_t>(mb)].push_back(turn->task);
      for (int b = 0; b < boundaries; ++b) {
        auto next = seq.Next(mb);
        ASSERT_TRUE(next.ok()) << next.status().message();
        seen[static_cast<size_t>(mb)].push_back(next->task);
      }
      seq.Finish(mb);
    });
  }
  for (std::thread& t : threads) t.join();
  return seen;
}

TEST(RegionSequencerTest, IssuesSegmentsInTheScheduleIssueOrder) {
  const Schedule s = Region(3, 2);
  RegionSequencer seq(s);
  const auto seen = RunThreads(seq, 2);
  EXPECT_EQ(seen[0], (Ids{0, 2, 4}));
  EXPECT_EQ(seen[1], (Ids{1, 3, 5}));
  EXPECT_EQ(seq.executed(), Ids(s.issue_order().begin(), s.issue_order().end()));
  EXPECT_EQ(seq.executed(), (Ids{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(seq.skipped(), 0);
  EXPECT_EQ(seq.extra_boundaries(), 0);
}

TEST(RegionSequencerTest, TurnsNameTheEventsToRecordAndWaitFor) {
  const Schedule s = Region(2, 2);  // seg0/mb0=0 seg0/mb1=1 seg1/mb0=2 seg1/mb1=3
  RegionSequencer seq(s);
  std::vector<RegionSequencer::Turn> turns(4);
  std::thread second([&] {
    auto a = seq.Begin(1);
    ASSERT_TRUE(a.ok());
    turns[1] = *a;
    auto b = seq.Next(1);
    ASSERT_TRUE(b.ok());
    turns[3] = *b;
    seq.Finish(1);
  });
  auto a = seq.Begin(0);
  ASSERT_TRUE(a.ok());
  turns[0] = *a;
  auto b = seq.Next(0);
  ASSERT_TRUE(b.ok());
  turns[2] = *b;
  seq.Finish(0);
  second.join();
  // mb1 waits for mb0's segment, so mb0's segments signal; nothing waits for mb1.
  EXPECT_TRUE(turns[0].signal);
  EXPECT_TRUE(turns[2].signal);
  EXPECT_FALSE(turns[1].signal);
  EXPECT_FALSE(turns[3].signal);
  EXPECT_EQ(turns[1].waits, (Ids{0}));
  EXPECT_EQ(turns[3].waits, (Ids{2}));
  EXPECT_TRUE(turns[0].waits.empty());
}

TEST(RegionSequencerTest, FewerBoundariesSkipAndMoreStayInTheLastSegment) {
  const Schedule s = Region(3, 2);
  RegionSequencer seq(s);
  RunThreads(seq, 0);  // each micro-batch ran only its first segment
  EXPECT_EQ(seq.executed(), (Ids{0, 1}));
  EXPECT_EQ(seq.skipped(), 4);

  seq.Reset();
  const auto seen = RunThreads(seq, 4);  // two boundaries more than the schedule has
  EXPECT_EQ(seen[0], (Ids{0, 2, 4, -1, -1}));
  EXPECT_EQ(seq.executed(), (Ids{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(seq.extra_boundaries(), 4);
  EXPECT_EQ(seq.skipped(), 0);
}

TEST(RegionSequencerTest, AFailedMicroBatchReleasesTheOthers) {
  const Schedule s = Region(3, 2);
  RegionSequencer seq(s);
  std::thread second([&] {
    auto a = seq.Begin(1);  // waits for seg0/mb0, then runs to the end
    ASSERT_TRUE(a.ok());
    while (true) {
      auto n = seq.Next(1);
      ASSERT_TRUE(n.ok());
      if (n->task < 0) break;
    }
    seq.Finish(1);
  });
  ASSERT_TRUE(seq.Begin(0).ok());
  seq.Finish(0);  // mb0 raised in its first segment
  second.join();
  EXPECT_EQ(seq.executed(), (Ids{0, 1, 3, 5}));
  EXPECT_EQ(seq.skipped(), 2);
}

TEST(RegionSequencerTest, AbortWakesWaitersWithItsReason) {
  const Schedule s = Region(2, 2);
  RegionSequencer seq(s);
  Status seen = Status::Ok();
  std::thread waiter([&] { seen = seq.Begin(1).status(); });  // mb0 never begins
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  seq.Abort("rank 1 failed");
  waiter.join();
  EXPECT_EQ(seen.code(), StatusCode::kFailure);
  EXPECT_EQ(seen.message(), "rank 1 failed");
  EXPECT_EQ(seq.Next(0).status().code(), StatusCode::kBadInput);  // never began
  EXPECT_EQ(seq.Begin(0).status().code(), StatusCode::kFailure);
}

TEST(RegionSequencerTest, RefusesMicroBatchesOutsideTheScheduleOrBegunTwice) {
  const Schedule s = Region(1, 2);
  RegionSequencer seq(s);
  EXPECT_EQ(seq.Begin(2).status().code(), StatusCode::kBadInput);
  EXPECT_EQ(seq.Begin(-1).status().code(), StatusCode::kBadInput);
  ASSERT_TRUE(seq.Begin(0).ok());
  EXPECT_EQ(seq.Begin(0).status().message(), "micro-batch 0 began twice in one call");
}

}  // namespace
}  // namespace dynaflow::runtime
