#include "analysis/steps/steps.h"

#include <gtest/gtest.h>

namespace dynaflow {
namespace {

struct Builder {
  Builder() {
    d = t.DeviceIndex(0, 0);
    t.devices[d].name = "NVIDIA H200";
  }
  void Kernel(const char* name, TimeNs s, TimeNs e, int64_t corr = -1, int32_t stream = 7) {
    GpuActivity g;
    g.start = s;
    g.end = e;
    g.correlation = corr;
    g.stream = stream;
    g.device_index = d;
    g.name = t.strings.Intern(name);
    t.gpu.push_back(g);
  }
  void Range(const char* name, TimeNs s, TimeNs e, bool gpu) {
    dynaflow::Range r;
    r.start = s;
    r.end = e;
    r.name = t.strings.Intern(name);
    if (gpu) {
      r.domain = RangeDomain::kGpuUser;
      r.device_index = static_cast<int32_t>(d);
    }
    t.ranges.push_back(r);
  }
  DeviceSteps Find() {
    links = LinkOperators(t);
    res = ClassifyResources(t, links, BoundOptions{});
    return FindSteps(t, res.at(0));
  }
  Trace t;
  uint32_t d = 0;
  OperatorLinks links;
  std::vector<DeviceResources> res;
};

TEST(StepsTest, GpuAnnotationsPerStreamMergeIntoSteps) {
  Builder b;
  // Steps 5 and 6, each annotated on two streams; the GPU idles 100 us between.
  b.Range("ProfilerStep#5", 0, 1000000, true);
  b.Range("ProfilerStep#5", 200000, 900000, true);
  b.Range("ProfilerStep#6", 1100000, 2300000, true);
  b.Kernel("a", 0, 400000);
  b.Kernel("b", 500000, 1000000, -1, 20);
  b.Kernel("a", 1100000, 1600000);
  b.Kernel("b", 1600000, 2300000);
  b.Kernel("late", 3000000, 3100000);  // outside every step
  DeviceSteps s = b.Find();
  EXPECT_EQ(s.source, StepSource::kGpuAnnotation);
  ASSERT_EQ(s.steps.size(), 2u);
  EXPECT_EQ(s.steps[0].number, 5);
  EXPECT_EQ(s.steps[1].number, 6);
  // Step 5 runs until step 6's first kernel: its trailing idle time is its own.
  EXPECT_DOUBLE_EQ(s.steps[0].duration_us(), 1100);
  EXPECT_DOUBLE_EQ(s.steps[1].duration_us(), 1200);
  EXPECT_EQ(s.step_of, (std::vector<int32_t>{0, 0, 1, 1, -1}));
  EXPECT_DOUBLE_EQ(s.mean_us, 1150);
  EXPECT_DOUBLE_EQ(s.median_us, 1150);
  EXPECT_NEAR(s.stdev_us, 70.7107, 1e-3);
  EXPECT_NEAR(s.cv_pct, 100 * 70.7107 / 1150, 1e-3);
}

TEST(StepsTest, HostAnnotationsUseTheLaunchTime) {
  Builder b;
  b.Range("ProfilerStep#1", 0, 1000000, false);
  b.Range("ProfilerStep#2", 1000000, 2000000, false);
  // Launched at 900 us (step 1) but run at 1.2 ms, when the host is in step 2.
  ApiCall launch;
  launch.start = 900000;
  launch.end = 905000;
  launch.correlation = 7;
  b.t.api.push_back(launch);
  b.Kernel("k", 100000, 300000);
  b.Kernel("k", 1200000, 1400000, 7);
  b.Kernel("k", 1500000, 1600000);
  DeviceSteps s = b.Find();
  EXPECT_EQ(s.source, StepSource::kHostAnnotation);
  ASSERT_EQ(s.steps.size(), 2u);
  EXPECT_EQ(s.step_of, (std::vector<int32_t>{0, 0, 1}));
  EXPECT_EQ(s.steps[0].activities, 2);
}

TEST(StepsTest, RepeatingKernelSequenceWithoutAnnotations) {
  Builder b;
  // Four iterations of: embed, 3 x (gemm, add), loss; then a partial fifth.
  TimeNs t = 0;
  auto k = [&](const char* name) {
    b.Kernel(name, t, t + 10000);
    t += 11000;
  };
  for (int it = 0; it < 4; ++it) {
    k("embed");
    for (int l = 0; l < 3; ++l) {
      k("gemm");
      k("add");
    }
    k("loss");
    t += 50000;  // host time between iterations
  }
  k("embed");
  k("gemm");
  DeviceSteps s = b.Find();
  EXPECT_EQ(s.source, StepSource::kRepeat);
  ASSERT_EQ(s.steps.size(), 5u);
  EXPECT_EQ(s.steps[0].activities, 8);
  // A step spans 8 kernels at 11 us plus 50 us of host time.
  EXPECT_DOUBLE_EQ(s.steps[1].duration_us(), 8 * 11 + 50);
  EXPECT_DOUBLE_EQ(s.median_us, 138);
}

TEST(StepsTest, OneStepWhenNothingRepeats) {
  Builder b;
  b.Kernel("x", 0, 1000);
  b.Kernel("y", 2000, 3000);
  b.Kernel("z", 4000, 5000);
  DeviceSteps s = b.Find();
  EXPECT_EQ(s.source, StepSource::kWhole);
  ASSERT_EQ(s.steps.size(), 1u);
  EXPECT_DOUBLE_EQ(s.steps[0].duration_us(), 5);
  EXPECT_EQ(s.representative, 0u);
}

}  // namespace
}  // namespace dynaflow
