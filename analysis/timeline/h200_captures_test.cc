// Traces that dynaflow's tracer captured on an NVIDIA H200 (tests/data/*_h200.db,
// written by scripts/device/trace_check.py on 2026-12-04; docs/performance.md
// has the run): real CUPTI records, read back through the trace.db reader.
// Checked: the device, kernel <-> operator links, CUDA graph attribution and
// NVTX ranges, and the GPU timeline against its definition computed here.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "analysis/importers/captured_traces_testing.h"
#include "analysis/roofline/bound.h"
#include "analysis/timeline/timeline.h"

namespace dynaflow {
namespace {

size_t CountKernels(const Trace& t) {
  return std::count_if(t.gpu.begin(), t.gpu.end(),
                       [](const GpuActivity& a) { return a.kind == GpuKind::kKernel; });
}

// Every kernel links to an operator that started before it, on the tracer's
// own pid; returns the fraction linked.
double LinkedFraction(const Trace& t, const OperatorLinks& links) {
  size_t kernels = 0, linked = 0;
  for (size_t i = 0; i < t.gpu.size(); ++i) {
    const GpuActivity& a = t.gpu[i];
    if (a.kind != GpuKind::kKernel) continue;
    ++kernels;
    const int32_t op = links.activity_op[i];
    if (op < 0) continue;
    ++linked;
    const Operator& o = t.ops[static_cast<size_t>(op)];
    EXPECT_LE(o.start, a.start) << t.strings.Get(o.name) << " -> " << t.strings.Get(a.name);
    EXPECT_EQ(o.pid, a.pid);
  }
  return kernels == 0 ? 0.0 : static_cast<double>(linked) / static_cast<double>(kernels);
}

// The timeline's definitions (DESIGN.md), computed directly: busy is the union
// of the device's activities, idle the rest of the span from the first start
// to the last end.
void ExpectTimelineByDefinition(const Trace& t) {
  const std::vector<DeviceTimeline> timelines = AnalyzeTimelines(t, {});
  ASSERT_EQ(timelines.size(), 1u);
  const DeviceTimeline& d = timelines[0];
  ASSERT_EQ(d.profiler_steps, 0);  // no ProfilerStep: the whole trace
  std::vector<std::pair<TimeNs, TimeNs>> spans;
  for (const GpuActivity& a : t.gpu) spans.emplace_back(a.start, a.end);
  std::sort(spans.begin(), spans.end());
  TimeNs busy = 0, cover_end = spans.front().first, last_end = 0;
  for (const auto& [start, end] : spans) {
    const TimeNs from = std::max(start, cover_end);
    if (end > from) busy += end - from;
    cover_end = std::max(cover_end, end);
    last_end = std::max(last_end, end);
  }
  const double total_us = static_cast<double>(last_end - spans.front().first) / 1000.0;
  EXPECT_EQ(d.events, static_cast<int64_t>(t.gpu.size()));
  EXPECT_NEAR(d.timeline.busy_us, static_cast<double>(busy) / 1000.0, 1e-3);
  EXPECT_NEAR(d.timeline.total_us, total_us, 1e-3);
  EXPECT_NEAR(d.timeline.idle_us, total_us - d.timeline.busy_us, 1e-3);
  EXPECT_NEAR(d.timeline.computation_us + d.timeline.exposed_comm_us +
                  d.timeline.exposed_memcpy_us,
              d.timeline.busy_us, 1e-3);
}

TEST(H200CapturesTest, DecodeStepsLinkEveryKernelToItsOperator) {
  const Trace t = LoadCapturedTrace("llama_decode_h200.db");
  ASSERT_EQ(t.devices.size(), 1u);
  EXPECT_EQ(t.devices[0].name, "NVIDIA H200");
  EXPECT_EQ(PeakRatesFor(t.devices[0]).sm_count, 132);
  EXPECT_EQ(CountKernels(t), 750u);
  EXPECT_EQ(t.ops.size(), 3317u);
  const OperatorLinks links = LinkOperators(t);
  EXPECT_EQ(LinkedFraction(t, links), 1.0);
  // The tracer records each kernel's launch configuration.
  for (const GpuActivity& a : t.gpu) {
    if (a.kind != GpuKind::kKernel) continue;
    EXPECT_GT(a.grid[0] * a.grid[1] * a.grid[2], 0) << t.strings.Get(a.name);
    EXPECT_GT(a.block[0] * a.block[1] * a.block[2], 0) << t.strings.Get(a.name);
    EXPECT_LT(a.start, a.end);
  }
  ExpectTimelineByDefinition(t);
}

TEST(H200CapturesTest, TrainingStepsLinkBackwardKernelsToBackwardOperators) {
  const Trace t = LoadCapturedTrace("train_step_h200.db");
  EXPECT_EQ(CountKernels(t), 608u);
  const OperatorLinks links = LinkOperators(t);
  EXPECT_EQ(LinkedFraction(t, links), 1.0);
  size_t backward = 0;
  for (size_t i = 0; i < t.gpu.size(); ++i) {
    const int32_t op = links.activity_op[i];
    if (op >= 0 && t.ops[static_cast<size_t>(op)].pass == Pass::kBackward) ++backward;
  }
  // The autograd thread's kernels: more than the forward's.
  EXPECT_GT(backward, CountKernels(t) / 3);
  ExpectTimelineByDefinition(t);
}

TEST(H200CapturesTest, GraphReplaysAttributeToTheCapturedOperators) {
  const Trace t = LoadCapturedTrace("graph_replay_h200.db");
  const OperatorLinks links = LinkOperators(t);
  std::map<int64_t, int> per_launch;  // cudaGraphLaunch correlation -> kernels
  for (size_t i = 0; i < t.gpu.size(); ++i) {
    const GpuActivity& a = t.gpu[i];
    if (a.kind != GpuKind::kKernel) continue;
    const int32_t op = links.activity_op[i];
    ASSERT_GE(op, 0) << t.strings.Get(a.name);
    const Operator& o = t.ops[static_cast<size_t>(op)];
    if (a.graph_id >= 0) {
      ++per_launch[a.correlation];
      EXPECT_TRUE(o.in_graph_capture) << t.strings.Get(o.name);
    } else {
      EXPECT_FALSE(o.in_graph_capture) << t.strings.Get(o.name);
    }
  }
  // Five replays of the eager step's four kernels.
  ASSERT_EQ(per_launch.size(), 5u);
  for (const auto& [correlation, kernels] : per_launch) EXPECT_EQ(kernels, 4) << correlation;
  std::map<std::string, int> ranges;
  for (const Range& r : t.ranges) {
    if (r.domain == RangeDomain::kNvtx) ++ranges[std::string(t.strings.Get(r.name))];
  }
  EXPECT_EQ(ranges, (std::map<std::string, int>{{"dynaflow-check/eager", 1},
                                                {"dynaflow-check/last", 1},
                                                {"dynaflow-check/replay", 5}}));
}

}  // namespace
}  // namespace dynaflow
