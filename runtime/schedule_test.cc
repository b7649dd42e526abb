#include "runtime/schedule.h"

#include <gtest/gtest.h>

#include <vector>

namespace dynaflow::runtime {
namespace {

using Ids = std::vector<TaskId>;

Status Noop(TaskContext&) { return Status::Ok(); }

Ids ToVector(std::span<const TaskId> ids) { return Ids(ids.begin(), ids.end()); }

Status BuildStatus(ScheduleBuilder builder) { return std::move(builder).Build().status(); }

TEST(ScheduleTest, DetectsCycleAndNamesItsTasks) {
  ScheduleBuilder b(1);
  b.Add("root", 0, {}, Noop);
  b.Add("a", 0, {0, 3}, Noop);  // 1 -> 3 -> 2 -> 1
  b.Add("b", 0, {1}, Noop);
  b.Add("c", 0, {2}, Noop);
  b.Add("downstream", 0, {3}, Noop);  // blocked by the cycle, not on it
  Status st = BuildStatus(std::move(b));
  EXPECT_EQ(st.code(), StatusCode::kBadInput);
  EXPECT_NE(st.message().find("dependency cycle"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("task 1 'a' -> task 3 'c' -> task 2 'b' -> task 1 'a'"),
            std::string::npos)
      << st.message();
  EXPECT_EQ(st.message().find("downstream"), std::string::npos) << st.message();
}

TEST(ScheduleTest, RejectsInvalidTasksNamingThem) {
  struct Case {
    int stream;
    Ids deps;
    bool has_fn;
    std::string expected;
  };
  std::vector<Case> cases = {
      {2, {}, true, "task 1 'bad': stream 2 is out of range [0, 2)"},
      {-1, {}, true, "task 1 'bad': stream -1 is out of range [0, 2)"},
      {0, {7}, true, "task 1 'bad': dependency 7 does not exist"},
      {0, {1}, true, "task 1 'bad' depends on itself"},
      {0, {0, 0}, true, "task 1 'bad': dependency 0 is listed twice"},
      {0, {}, false, "task 1 'bad' has no callback"},
  };
  for (const Case& c : cases) {
    ScheduleBuilder b(2);
    b.Add("ok", 0, {}, Noop);
    b.Add("bad", c.stream, c.deps, c.has_fn ? TaskFn(Noop) : TaskFn());
    Status st = BuildStatus(std::move(b));
    EXPECT_EQ(st.code(), StatusCode::kBadInput);
    EXPECT_EQ(st.message(), c.expected);
  }
  EXPECT_EQ(BuildStatus(ScheduleBuilder(0)).code(), StatusCode::kBadInput);
}

TEST(ScheduleTest, IssueOrderIsTopologicalLowestIdFirst) {
  ScheduleBuilder b(2);
  b.Add("needs-2", 0, {2}, Noop);  // 0
  b.Add("free", 1, {}, Noop);      // 1
  b.Add("first", 0, {}, Noop);     // 2
  auto s = std::move(b).Build();
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(ToVector(s->issue_order()), (Ids{1, 2, 0}));
  EXPECT_EQ(ToVector(s->stream_queue(0)), (Ids{2, 0}));
  EXPECT_EQ(ToVector(s->stream_queue(1)), (Ids{1}));
  EXPECT_EQ(ToVector(s->dependents(2)), (Ids{0}));
}

TEST(ScheduleTest, WaitsOnlyForTheLatestDependencyOfEachOtherStream) {
  ScheduleBuilder b(3);
  b.Add("s1-early", 1, {}, Noop);        // 0
  b.Add("s1-late", 1, {}, Noop);         // 1
  b.Add("s2", 2, {}, Noop);              // 2
  b.Add("s0-prev", 0, {}, Noop);         // 3
  b.Add("join", 0, {0, 1, 2, 3}, Noop);  // 4
  auto s = std::move(b).Build();
  ASSERT_TRUE(s.ok()) << s.status().message();
  // 0 precedes 1 on stream 1 and 3 precedes 4 on stream 0: no wait for them.
  EXPECT_EQ(ToVector(s->cross_stream_waits(4)), (Ids{1, 2}));
  EXPECT_FALSE(s->signals(0));
  EXPECT_TRUE(s->signals(1));
  EXPECT_TRUE(s->signals(2));
  EXPECT_FALSE(s->signals(3));
  EXPECT_FALSE(s->signals(4));
}

TEST(ScheduleTest, IdsAreUniquePerBuildAndSharedByCopies) {
  auto a = BuildSequential({{"x", 0, Noop}});
  auto b = BuildSequential({{"x", 0, Noop}});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->id(), b->id());
  Schedule copy = *a;
  EXPECT_EQ(copy.id(), a->id());
}

TEST(ScheduleBuildersTest, SequentialRunsStagesInOrderOnStreamZero) {
  auto s = BuildSequential({{"embed", 1, Noop}, {"attn", 2, Noop}, {"mlp", 0, Noop}});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->num_streams(), 1);
  ASSERT_EQ(s->size(), 3);
  for (const Task& t : s->tasks()) {
    EXPECT_EQ(t.stream, 0);
    EXPECT_EQ(t.micro_batch, 0);
    EXPECT_EQ(t.deps, t.id == 0 ? Ids{} : Ids{t.id - 1});
  }
  EXPECT_EQ(s->task(1).name, "attn");
  EXPECT_EQ(BuildSequential({}).status().code(), StatusCode::kBadInput);
}

// Nano-batching: GEMMs on stream 0, attention on stream 1, three micro-batches.
TEST(ScheduleBuildersTest, MicroBatchSplitAssignsStreamsAndChainsEachMicroBatch) {
  auto s = BuildMicroBatchSplit({{"qkv", 0, Noop}, {"attn", 1, Noop}, {"out", 0, Noop}}, 3);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->num_streams(), 2);
  ASSERT_EQ(s->size(), 9);
  const Task& attn_mb2 = s->task(1 * 3 + 2);
  EXPECT_EQ(attn_mb2.name, "attn/mb2");
  EXPECT_EQ(attn_mb2.stream, 1);
  EXPECT_EQ(attn_mb2.micro_batch, 2);
  EXPECT_EQ(attn_mb2.deps, (Ids{0 * 3 + 2}));
  // Stream 0 runs every micro-batch of qkv before any of out; stream 1 runs
  // attention mb0 (after qkv mb0) while stream 0 runs qkv mb1 and mb2.
  EXPECT_EQ(ToVector(s->stream_queue(0)), (Ids{0, 1, 2, 6, 7, 8}));
  EXPECT_EQ(ToVector(s->stream_queue(1)), (Ids{3, 4, 5}));
  EXPECT_EQ(ToVector(s->cross_stream_waits(6)), (Ids{3}));
  EXPECT_EQ(BuildMicroBatchSplit({{"x", 0, Noop}}, 0).status().code(), StatusCode::kBadInput);
  EXPECT_EQ(BuildMicroBatchSplit({{"x", -1, Noop}}, 2).status().code(), StatusCode::kBadInput);
}

TEST(ScheduleBuildersTest, DualBatchOverlapPutsCommunicationOnItsOwnStream) {
  auto s = BuildDualBatchOverlap({{"attn", kComputeStream, Noop},
                                  {"all_reduce", kCommStream, Noop},
                                  {"mlp", kComputeStream, Noop}});
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_EQ(s->size(), 6);
  // Compute: attn mb0, attn mb1, mlp mb0, mlp mb1; communication: ar mb0, ar mb1.
  EXPECT_EQ(ToVector(s->stream_queue(kComputeStream)), (Ids{0, 1, 4, 5}));
  EXPECT_EQ(ToVector(s->stream_queue(kCommStream)), (Ids{2, 3}));
  Status st = BuildDualBatchOverlap({{"attn", 0, Noop}, {"moe", 2, Noop}}).status();
  EXPECT_EQ(st.code(), StatusCode::kBadInput);
  EXPECT_NE(st.message().find("'moe' is on stream 2"), std::string::npos) << st.message();
}

TEST(ScheduleBuildersTest, DualBatchRegionAlternatesComputeAndCollectives) {
  auto s = BuildDualBatchRegion(2);  // C0 X0 C1 X1 C2 per micro-batch
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_EQ(s->size(), 10);
  EXPECT_EQ(s->task(3).name, "X0/mb1");
  EXPECT_EQ(s->task(3).stream, kCommStream);
  EXPECT_EQ(s->task(3).deps, (Ids{1}));
  EXPECT_EQ(ToVector(s->issue_order()), (Ids{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  // Both micro-batches' compute shares one stream; their collectives another.
  EXPECT_EQ(ToVector(s->stream_queue(kComputeStream)), (Ids{0, 1, 4, 5, 8, 9}));
  EXPECT_EQ(ToVector(s->stream_queue(kCommStream)), (Ids{2, 3, 6, 7}));
  EXPECT_EQ(ToVector(s->cross_stream_waits(4)), (Ids{2}));  // C1/mb0 after X0/mb0
  EXPECT_EQ(ToVector(s->cross_stream_waits(2)), (Ids{0}));  // X0/mb0 after C0/mb0
  EXPECT_EQ(BuildDualBatchRegion(0).status().code(), StatusCode::kBadInput);
}

TEST(ScheduleBuildersTest, CommOverlapRegionWaitsForEachCollectiveWhereItIsRead) {
  // C0 X0 C1 X1 C2 X2 C3: X0 read by C2, X1 by C2, X2 only at the end (4).
  auto s = BuildCommOverlapRegion({2, 2, 4});
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_EQ(s->size(), 7);
  EXPECT_EQ(s->task(3).name, "X1");
  EXPECT_EQ(s->task(4).name, "C2");
  EXPECT_EQ(ToVector(s->stream_queue(kComputeStream)), (Ids{0, 2, 4, 6}));
  EXPECT_EQ(ToVector(s->stream_queue(kCommStream)), (Ids{1, 3, 5}));
  EXPECT_EQ(s->task(2).deps, (Ids{0}));        // C1 runs beside X0
  EXPECT_EQ(s->task(4).deps, (Ids{2, 1, 3}));  // C2 reads X0 and X1
  EXPECT_EQ(s->task(6).deps, (Ids{4}));        // nothing in the region reads X2
  EXPECT_EQ(ToVector(s->cross_stream_waits(4)), (Ids{3}));  // X1 implies X0 (FIFO)
  EXPECT_EQ(ToVector(s->cross_stream_waits(5)), (Ids{4}));  // X2 launched after C2
  EXPECT_FALSE(s->signals(5));

  EXPECT_EQ(RunsBeside(*s, 1), (Ids{2}));     // X0 beside C1
  EXPECT_EQ(RunsBeside(*s, 3), (Ids{}));      // X1 read by the next part
  EXPECT_EQ(RunsBeside(*s, 5), (Ids{6}));     // X2 beside C3, up to the end
  EXPECT_EQ(RunsBeside(*s, 2), (Ids{1}));     // and C1 beside X0 only (X1 is after it)

  // Read right after it is launched: the collective runs beside nothing.
  auto next = BuildCommOverlapRegion({1});
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->task(2).deps, (Ids{0, 1}));
  EXPECT_EQ(RunsBeside(*next, 1), (Ids{}));

  EXPECT_EQ(BuildCommOverlapRegion({}).status().code(), StatusCode::kBadInput);
  Status early = BuildCommOverlapRegion({2, 1}).status();  // X1 read by C1, before its launch
  EXPECT_EQ(early.code(), StatusCode::kBadInput);
  EXPECT_NE(early.message().find("collective X1 is read by compute part C1"), std::string::npos)
      << early.message();
  EXPECT_EQ(BuildCommOverlapRegion({3}).status().code(), StatusCode::kBadInput);  // past the end
}

TEST(ScheduleBuildersTest, StaggeredRegionRunsEachMicroBatchOnItsStreamOneSegmentBehind) {
  auto s = BuildStaggeredRegion(3, 2);
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_EQ(s->size(), 6);
  EXPECT_EQ(s->task(3).name, "seg1/mb1");
  EXPECT_EQ(s->task(3).stream, 1);
  EXPECT_EQ(s->task(3).micro_batch, 1);
  EXPECT_EQ(s->task(3).deps, (Ids{1, 2}));  // its own previous segment, then the stagger
  EXPECT_EQ(ToVector(s->issue_order()), (Ids{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(ToVector(s->stream_queue(0)), (Ids{0, 2, 4}));
  EXPECT_EQ(ToVector(s->stream_queue(1)), (Ids{1, 3, 5}));
  EXPECT_EQ(ToVector(s->cross_stream_waits(3)), (Ids{2}));
  EXPECT_TRUE(s->signals(2));
  EXPECT_FALSE(s->signals(3));
  EXPECT_EQ(BuildStaggeredRegion(0, 2).status().code(), StatusCode::kBadInput);
  EXPECT_EQ(BuildStaggeredRegion(2, 0).status().code(), StatusCode::kBadInput);
}

}  // namespace
}  // namespace dynaflow::runtime
