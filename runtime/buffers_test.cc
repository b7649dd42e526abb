#include "runtime/buffers.h"

#include <gtest/gtest.h>

#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/cpu/cpu_executor.h"

namespace dynaflow::runtime {
namespace {

Status Noop(TaskContext&) { return Status::Ok(); }

TEST(RowSplitTest, EvenSplitGivesTheRemainderToTheFirstParts) {
  auto split = RowSplit::Even(10, 3);
  ASSERT_TRUE(split.ok()) << split.status().message();
  EXPECT_EQ(split->parts(), 3);
  EXPECT_EQ(split->rows(), 10);
  EXPECT_EQ(split->range(0), (RowRange{0, 4}));
  EXPECT_EQ(split->range(1), (RowRange{4, 3}));
  EXPECT_EQ(split->range(2), (RowRange{7, 3}));
  auto whole = RowSplit::Even(5, 1);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->range(0), (RowRange{0, 5}));
}

TEST(RowSplitTest, RejectsEmptyParts) {
  EXPECT_EQ(RowSplit::Even(2, 3).status().code(), StatusCode::kBadInput);
  EXPECT_EQ(RowSplit::Even(4, 0).status().code(), StatusCode::kBadInput);
  EXPECT_EQ(RowSplit::Even(0, 1).status().code(), StatusCode::kBadInput);
}

TEST(RowSplitTest, SliceIsAViewOfTheSameMemory) {
  std::vector<float> data(10 * 4);
  RowBuffer buffer{reinterpret_cast<std::byte*>(data.data()), 10, 4 * sizeof(float)};
  auto split = RowSplit::Even(10, 3);
  ASSERT_TRUE(split.ok());
  RowBuffer second = split->Slice(buffer, 1);
  EXPECT_EQ(second.data, reinterpret_cast<std::byte*>(&data[4 * 4]));
  EXPECT_EQ(second.rows, 3);
  EXPECT_EQ(second.row_bytes, buffer.row_bytes);
}

// Two stages on two streams, three micro-batches: stage 1 doubles its slice
// of the input into its slice of an intermediate, stage 2 adds one into its
// slice of the output. Every task must be handed exactly the addresses of its
// slices inside the three original buffers (pointer identity: no copy), and
// the output, allocated once before the call, must hold the merged result.
TEST(ZeroCopySplitMergeTest, TasksWorkInPlaceAndTheOutputIsMergedWithoutCopies) {
  constexpr int kRows = 7;
  constexpr int kCols = 3;
  constexpr std::int64_t kRowBytes = kCols * sizeof(float);
  std::vector<float> input(kRows * kCols), middle(kRows * kCols, -1), output(kRows * kCols, -1);
  std::iota(input.begin(), input.end(), 0.0f);
  auto as_buffer = [](std::vector<float>& v) {
    return RowBuffer{reinterpret_cast<std::byte*>(v.data()), kRows, kRowBytes};
  };
  RowBuffer in = as_buffer(input), mid = as_buffer(middle), out = as_buffer(output);
  const std::byte* output_before = out.data;
  auto split = RowSplit::Even(kRows, 3);
  ASSERT_TRUE(split.ok());

  std::mutex mutex;
  std::vector<std::string> mismatches;
  auto expect_at = [&](const RowBuffer& view, const std::byte* base, RowRange r,
                       const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex);
    if (view.data != base + r.begin * kRowBytes || view.rows != r.count) mismatches.push_back(what);
  };
  auto map_rows = [&](const RowBuffer& from, const RowBuffer& to, float scale, float add) {
    const float* src = reinterpret_cast<const float*>(from.data);
    float* dst = reinterpret_cast<float*>(to.data);
    for (std::int64_t i = 0; i < from.rows * kCols; ++i) dst[i] = src[i] * scale + add;
  };
  Stage scale{"scale", 0, [&](TaskContext& ctx) {
                int mb = ctx.task.micro_batch;
                RowBuffer from = split->Slice(in, mb), to = split->Slice(mid, mb);
                expect_at(from, in.data, split->range(mb), "scale input mb" + std::to_string(mb));
                expect_at(to, mid.data, split->range(mb), "scale output mb" + std::to_string(mb));
                map_rows(from, to, 2, 0);
                return Status::Ok();
              }};
  Stage shift{"shift", 1, [&](TaskContext& ctx) {
                int mb = ctx.task.micro_batch;
                RowBuffer from = split->Slice(mid, mb), to = split->Slice(out, mb);
                expect_at(from, mid.data, split->range(mb), "shift input mb" + std::to_string(mb));
                expect_at(to, out.data, split->range(mb), "shift output mb" + std::to_string(mb));
                map_rows(from, to, 1, 1);
                return Status::Ok();
              }};
  auto schedule = BuildMicroBatchSplit({scale, shift}, 3);
  ASSERT_TRUE(schedule.ok()) << schedule.status().message();

  CpuExecutor executor(2);
  ASSERT_TRUE(executor.Submit(*schedule, Call{}).ok());
  ASSERT_TRUE(executor.Wait().ok());

  EXPECT_TRUE(mismatches.empty()) << mismatches.front();
  EXPECT_EQ(out.data, output_before);
  for (int i = 0; i < kRows * kCols; ++i) EXPECT_EQ(output[i], 2.0f * i + 1) << "element " << i;
}

// a -> {b, c} -> d, counted directly.
TEST(OutputRefCountsTest, ReleasesEachOutputOnceAtItsLastReader) {
  ScheduleBuilder builder(1);
  TaskId a = builder.Add("a", 0, {}, Noop);
  TaskId b = builder.Add("b", 0, {a}, Noop);
  TaskId c = builder.Add("c", 0, {a}, Noop);
  TaskId d = builder.Add("d", 0, {b, c}, Noop);
  auto s = std::move(builder).Build();
  ASSERT_TRUE(s.ok());
  std::vector<TaskId> released;
  auto release = [&](TaskId id) { released.push_back(id); };

  OutputRefCounts refs;
  refs.Reset(*s);
  refs.Finished(s->task(a), release);
  refs.Finished(s->task(b), release);
  EXPECT_TRUE(released.empty());  // c still reads a
  refs.Finished(s->task(c), release);
  EXPECT_EQ(released, (std::vector<TaskId>{a}));
  refs.Finished(s->task(d), release);
  EXPECT_EQ(released, (std::vector<TaskId>{a, b, c}));  // d, the result, is never released

  released.clear();
  refs.Reset(*s);  // a second call counts from the start again
  for (TaskId id : {a, c, b, d}) refs.Finished(s->task(id), release);
  EXPECT_EQ(released, (std::vector<TaskId>{a, b, c}));
}

}  // namespace
}  // namespace dynaflow::runtime
