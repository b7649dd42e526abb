#include "analysis/timeline/timeline.h"

#include <gtest/gtest.h>

namespace dynaflow {
namespace {

constexpr TimeNs kUs = 1000;

class TimelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dev_ = trace_.DeviceIndex(0, 0);
    trace_.devices[dev_].name = "NVIDIA H200";
    Kernel("sm90_gemm", 7, 0, 10, 1);
    Launch(1, 0);
    Kernel("sm90_gemm", 7, 20, 30, 2);
    Launch(2, 15);  // launched after stream 7 went idle at 10: host wait
    Add(GpuKind::kMemset, "Memset", 7, 30, 32, -1);
    Kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 20, 5, 25, 3);
    Add(GpuKind::kMemcpy, "Memcpy HtoD", 24, 28, 40, 4);
    Add(GpuKind::kMemcpy, "Memcpy HtoD", 24, 50, 60, 5);
    Launch(5, 30);  // launched while stream 24 was busy: not host wait
    Kernel("zero_length", 7, 70, 70, 6);  // ignored
  }

  void Add(GpuKind kind, const char* name, int32_t stream, TimeNs start_us, TimeNs end_us,
           int64_t correlation) {
    GpuActivity g;
    g.kind = kind;
    g.device_index = dev_;
    g.stream = stream;
    g.start = start_us * kUs;
    g.end = end_us * kUs;
    g.name = trace_.strings.Intern(name);
    g.correlation = correlation;
    trace_.gpu.push_back(g);
  }
  void Kernel(const char* name, int32_t stream, TimeNs s, TimeNs e, int64_t corr) {
    Add(GpuKind::kKernel, name, stream, s, e, corr);
  }
  void Launch(int64_t correlation, TimeNs start_us) {
    ApiCall a;
    a.correlation = correlation;
    a.start = start_us * kUs;
    a.end = a.start + 2 * kUs;
    a.name = trace_.strings.Intern("cudaLaunchKernel");
    trace_.api.push_back(a);
  }

  Trace trace_;
  uint32_t dev_ = 0;
};

TEST_F(TimelineTest, BreakdownFollowsTheExactDefinitions) {
  auto devices = AnalyzeTimelines(trace_, TimelineOptions());
  ASSERT_EQ(devices.size(), 1u);
  const DeviceTimeline& d = devices[0];
  EXPECT_EQ(d.name, "NVIDIA H200");
  EXPECT_EQ(d.events, 6);
  const TimelineBreakdown& t = d.timeline;
  EXPECT_DOUBLE_EQ(t.computation_us, 22);   // [0,10) [20,32)
  EXPECT_DOUBLE_EQ(t.total_comm_us, 20);    // [5,25)
  EXPECT_DOUBLE_EQ(t.exposed_comm_us, 10);  // [10,20)
  EXPECT_DOUBLE_EQ(t.total_memcpy_us, 22);  // [28,40) [50,60)
  EXPECT_DOUBLE_EQ(t.exposed_memcpy_us, 18);
  EXPECT_DOUBLE_EQ(t.busy_us, 50);
  EXPECT_DOUBLE_EQ(t.total_us, 60);
  EXPECT_DOUBLE_EQ(t.idle_us, 10);
  ASSERT_TRUE(t.comm_hidden_pct.has_value());
  EXPECT_DOUBLE_EQ(*t.comm_hidden_pct, 50);
  EXPECT_DOUBLE_EQ(t.computation_us + t.exposed_comm_us + t.exposed_memcpy_us + t.idle_us,
                   t.total_us);
}

TEST_F(TimelineTest, ProfilerStepWindowKeepsOnlyEventsStartingInside) {
  Range step;
  step.domain = RangeDomain::kGpuUser;
  step.device_index = static_cast<int32_t>(dev_);
  step.start = 0;
  step.end = 45 * kUs;
  step.name = trace_.strings.Intern("ProfilerStep#3");
  trace_.ranges.push_back(step);
  step.end = 20 * kUs;  // the same step annotated again on another stream
  trace_.ranges.push_back(step);
  auto devices = AnalyzeTimelines(trace_, TimelineOptions());
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].profiler_steps, 1);
  EXPECT_EQ(devices[0].events, 5);
  EXPECT_DOUBLE_EQ(devices[0].timeline.total_us, 40);
  EXPECT_DOUBLE_EQ(devices[0].timeline.idle_us, 0);
  EXPECT_DOUBLE_EQ(devices[0].timeline.exposed_memcpy_us, 8);
}

TEST_F(TimelineTest, NoCommunicationGivesNullHiddenShare) {
  trace_.gpu.erase(trace_.gpu.begin() + 3);  // the NCCL kernel
  auto devices = AnalyzeTimelines(trace_, TimelineOptions());
  EXPECT_FALSE(devices[0].timeline.comm_hidden_pct.has_value());
  EXPECT_DOUBLE_EQ(devices[0].timeline.total_comm_us, 0);
}

TEST_F(TimelineTest, StreamIdleBreakdown) {
  auto devices = AnalyzeTimelines(trace_, TimelineOptions());
  const auto& streams = devices[0].streams;
  ASSERT_EQ(streams.size(), 3u);
  EXPECT_EQ(streams[0].stream, 7);
  EXPECT_EQ(streams[0].kernels, 2);
  EXPECT_EQ(streams[0].memsets, 1);
  EXPECT_DOUBLE_EQ(streams[0].busy_us, 22);
  EXPECT_DOUBLE_EQ(streams[0].span_us, 32);
  EXPECT_DOUBLE_EQ(streams[0].host_wait_us, 10);
  EXPECT_DOUBLE_EQ(streams[0].kernel_wait_us, 0);
  EXPECT_EQ(streams[2].stream, 24);
  EXPECT_DOUBLE_EQ(streams[2].kernel_wait_us, 10);  // a 10 us gap, under the 30 us default
  EXPECT_DOUBLE_EQ(streams[2].host_wait_us, 0);

  TimelineOptions strict;
  strict.kernel_wait_threshold_ns = 5 * kUs;
  auto again = AnalyzeTimelines(trace_, strict);
  EXPECT_DOUBLE_EQ(again[0].streams[2].kernel_wait_us, 0);
  EXPECT_DOUBLE_EQ(again[0].streams[2].other_wait_us, 10);
  EXPECT_DOUBLE_EQ(again[0].streams[0].host_wait_us, 10);
}

TEST_F(TimelineTest, ClassesAndTopKernels) {
  auto devices = AnalyzeTimelines(trace_, TimelineOptions());
  const auto& classes = devices[0].classes;
  ASSERT_EQ(classes.size(), 4u);
  EXPECT_EQ(classes[0].name, "computation");
  EXPECT_EQ(classes[0].count, 2);
  EXPECT_DOUBLE_EQ(classes[0].time_us, 20);
  EXPECT_EQ(classes[1].count, 1);
  EXPECT_EQ(classes[2].count, 2);
  EXPECT_DOUBLE_EQ(classes[2].time_us, 22);
  EXPECT_EQ(classes[3].name, "memset");
  EXPECT_EQ(classes[3].count, 1);

  const auto& top = devices[0].top_kernels;
  ASSERT_EQ(top.size(), 2u);
  // Both total 20 us: ties on total time break by name.
  EXPECT_EQ(top[0].name, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL");
  EXPECT_EQ(top[0].gpu_class, GpuClass::kCommunication);
  EXPECT_DOUBLE_EQ(top[0].share_pct, 40);  // 20 of 50 busy
  EXPECT_EQ(top[1].name, "sm90_gemm");
  EXPECT_EQ(top[1].count, 2);
  EXPECT_DOUBLE_EQ(top[1].mean_us, 10);
}

TEST_F(TimelineTest, DevicesSortedByRankThenDeviceAndEmptyOnesSkipped) {
  Trace t;
  auto add = [&](int32_t rank, int32_t device) {
    GpuActivity g;
    g.device_index = t.DeviceIndex(rank, device);
    g.start = 0;
    g.end = 5;
    t.gpu.push_back(g);
  };
  add(1, 0);
  add(0, 1);
  add(0, 0);
  t.DeviceIndex(2, 0);  // a device with no activity
  auto devices = AnalyzeTimelines(t, TimelineOptions());
  ASSERT_EQ(devices.size(), 3u);
  EXPECT_EQ(devices[0].rank, 0);
  EXPECT_EQ(devices[0].device, 0);
  EXPECT_EQ(devices[1].device, 1);
  EXPECT_EQ(devices[2].rank, 1);
}

TEST(ClassifyTest, CommunicationByNameAnyCase) {
  Trace t;
  GpuActivity g;
  g.name = t.strings.Intern("void RCCLKernel_AllReduce");
  EXPECT_EQ(ClassifyActivity(t, g), GpuClass::kCommunication);
  g.name = t.strings.Intern("ampere_sgemm");
  EXPECT_EQ(ClassifyActivity(t, g), GpuClass::kComputation);
  g.kind = GpuKind::kMemset;
  EXPECT_EQ(ClassifyActivity(t, g), GpuClass::kComputation);
  g.kind = GpuKind::kMemcpy;
  EXPECT_EQ(ClassifyActivity(t, g), GpuClass::kMemcpy);
}

}  // namespace
}  // namespace dynaflow
