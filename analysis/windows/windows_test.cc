#include "analysis/windows/windows.h"

#include <gtest/gtest.h>

namespace dynaflow {
namespace {

// One step, hand-made, times in us:
//   [0, 100)    GEMM (compute)           with [60, 100) an all-reduce beside it
//   [100, 150)  all-reduce alone         -> communication_exposed 50
//   [150, 250)  decode attention alone   -> memory_bound 100
//   [250, 300)  nothing                  -> gpu_idle 50, waiting for "aten::item"
//   [300, 400)  GEMM alone               -> compute_bound 100 (with [0, 60) as well)
class WindowsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    d_ = t_.DeviceIndex(0, 0);
    t_.devices[d_].name = "NVIDIA H200";
    Kernel("aten::mm", "sm90_xmma_gemm", 0, 100, 7);
    Kernel("c10d::allreduce_", "ncclDevKernel_AllReduce", 60, 150, 20);
    Kernel("aten::_flash_attention_forward", "flash_fwd_splitkv_kernel", 150, 250, 7);
    Kernel("aten::item", "sm90_xmma_gemm", 300, 400, 7);
    Range r;
    r.start = 0;
    r.end = 400000;
    r.name = t_.strings.Intern("ProfilerStep#1");
    r.domain = RangeDomain::kGpuUser;
    r.device_index = static_cast<int32_t>(d_);
    t_.ranges.push_back(r);
  }
  void Kernel(const char* op, const char* kernel, double s, double e, int32_t stream) {
    Operator o;
    o.name = t_.strings.Intern(op);
    o.external_id = static_cast<int64_t>(t_.ops.size()) + 1;
    o.start = static_cast<TimeNs>(s * 1000) - 5000;
    o.end = o.start + 1000;
    t_.ops.push_back(o);
    GpuActivity g;
    g.start = static_cast<TimeNs>(s * 1000);
    g.end = static_cast<TimeNs>(e * 1000);
    g.external_id = o.external_id;
    g.stream = stream;
    g.device_index = d_;
    g.name = t_.strings.Intern(kernel);
    t_.gpu.push_back(g);
  }
  Trace t_;
  uint32_t d_ = 0;
};

const IdleWindow* Find(const DeviceWindows& w, WindowKind k) {
  for (const IdleWindow& x : w.windows) {
    if (x.kind == k) return &x;
  }
  return nullptr;
}

TEST_F(WindowsTest, CutsTheStepByBusyAndIdleResources) {
  const OperatorLinks links = LinkOperators(t_);
  const std::vector<DeviceResources> res = ClassifyResources(t_, links, BoundOptions{});
  ASSERT_EQ(res.size(), 1u);
  // No shapes: the kernel names decide (gemm: compute, splitkv: memory).
  ASSERT_EQ(res[0].resource[2], Resource::kMemory);
  const DeviceSteps steps = FindSteps(t_, res[0]);
  const DeviceWindows w = FindIdleWindows(t_, links, res[0], steps, WindowOptions{});

  EXPECT_DOUBLE_EQ(w.per_step_us[static_cast<int>(WindowKind::kCommExposed)], 50);
  EXPECT_DOUBLE_EQ(w.per_step_us[static_cast<int>(WindowKind::kMemoryBound)], 100);
  EXPECT_DOUBLE_EQ(w.per_step_us[static_cast<int>(WindowKind::kGpuIdle)], 50);
  EXPECT_DOUBLE_EQ(w.per_step_us[static_cast<int>(WindowKind::kComputeBound)], 160);

  const IdleWindow* comm = Find(w, WindowKind::kCommExposed);
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->operators.at(0).first, "c10d::allreduce_");
  EXPECT_DOUBLE_EQ(comm->share_of_step_pct, 100.0 * 50 / 400);
  EXPECT_DOUBLE_EQ(comm->recoverable_us, 50);  // all of it, on a side stream
  ASSERT_EQ(comm->examples.size(), 1u);
  EXPECT_EQ(comm->examples[0].start, 100000);
  EXPECT_EQ(comm->examples[0].end, 150000);

  const IdleWindow* idle = Find(w, WindowKind::kGpuIdle);
  ASSERT_NE(idle, nullptr);
  EXPECT_EQ(idle->operators.at(0).first, "aten::item");  // the launch the GPU waited for
  // No launch calls in this trace: the cause is unknown, and the label says so.
  EXPECT_EQ(idle->cause, IdleCause::kUnknown);
  EXPECT_NE(idle->label.find("no launch call"), std::string::npos) << idle->label;

  // Memory 100 and compute 160 per step: overlapping them removes at most 100,
  // credited half to each side.
  const IdleWindow* mem = Find(w, WindowKind::kMemoryBound);
  ASSERT_NE(mem, nullptr);
  EXPECT_DOUBLE_EQ(mem->recoverable_us, 0.5 * 100 * 1.0);
  const double compute_recoverable = 0.5 * 160 * (100.0 / 160.0);
  double sum = 0;
  for (const IdleWindow& x : w.windows) {
    if (x.kind == WindowKind::kComputeBound) sum += x.recoverable_us;
  }
  EXPECT_NEAR(sum, compute_recoverable, 1e-9);

  // Ranked by recoverable time.
  for (size_t i = 1; i < w.windows.size(); ++i) {
    EXPECT_GE(w.windows[i - 1].recoverable_us, w.windows[i].recoverable_us);
  }
  // The representative step's intervals tile its busy and idle time.
  double covered = 0;
  for (const KindInterval& k : w.representative) covered += static_cast<double>(k.end - k.start) / 1000;
  EXPECT_DOUBLE_EQ(covered, 50 + 100 + 50 + 160);  // all but the 40 us of GEMM with all-reduce
}

// The same step with launch calls: "aten::item"'s kernel launched at 280 us,
// after the GPU went idle at 250 (the host was late), then the same kernel
// launched at 200 us, while the GPU was busy, yet it starts at 300 (it waited
// on a GPU-side dependency).
TEST_F(WindowsTest, IdleIsAttributedToTheHostOrADependency) {
  for (double launch_us : {280.0, 200.0}) {
    SCOPED_TRACE(launch_us);
    Trace& t = t_;
    t.api.clear();
    for (size_t i = 0; i < t.gpu.size(); ++i) {
      t.gpu[i].correlation = static_cast<int64_t>(i) + 1;
      ApiCall c;
      c.correlation = t.gpu[i].correlation;
      c.start = i == 3 ? static_cast<TimeNs>(launch_us * 1000) : t.gpu[i].start - 5000;
      c.end = c.start + 2000;
      c.name = t.strings.Intern("cudaLaunchKernel");
      t.api.push_back(c);
    }
    const OperatorLinks links = LinkOperators(t);
    const std::vector<DeviceResources> res = ClassifyResources(t, links, BoundOptions{});
    const DeviceSteps steps = FindSteps(t, res[0]);
    const DeviceWindows w = FindIdleWindows(t, links, res[0], steps, WindowOptions{});
    const IdleWindow* idle = Find(w, WindowKind::kGpuIdle);
    ASSERT_NE(idle, nullptr);
    EXPECT_DOUBLE_EQ(idle->per_step_us, 50);
    if (launch_us > 250) {
      EXPECT_EQ(idle->cause, IdleCause::kHost);
      EXPECT_NE(idle->label.find("waiting on the host"), std::string::npos) << idle->label;
    } else {
      EXPECT_EQ(idle->cause, IdleCause::kDependency);
      EXPECT_NE(idle->label.find("waits on a dependency"), std::string::npos) << idle->label;
    }
  }
}

// Rank 1 starts the all-reduce at 130 us, 70 us after rank 0 (60 us): rank
// 0's collective waits for it until 130, so of its exposed 50 us ([100, 150)),
// 30 are waiting for another rank and 20 are communication.
TEST_F(WindowsTest, ACollectiveWaitingForAnotherRankIsPeerTime) {
  const uint32_t d1 = t_.DeviceIndex(1, 0);
  t_.devices[d1].name = "NVIDIA H200";
  GpuActivity g;
  g.start = 130000;
  g.end = 150000;
  g.stream = 20;
  g.device_index = d1;
  g.name = t_.strings.Intern("ncclDevKernel_AllReduce");
  t_.gpu.push_back(g);
  const OperatorLinks links = LinkOperators(t_);
  const std::vector<DeviceResources> res = ClassifyResources(t_, links, BoundOptions{});
  ASSERT_EQ(res.size(), 2u);
  ASSERT_EQ(res[0].device_index, d_);
  const DeviceSteps steps = FindSteps(t_, res[0]);
  const DeviceWindows w = FindIdleWindows(t_, links, res[0], steps, WindowOptions{});
  EXPECT_DOUBLE_EQ(w.per_step_us[static_cast<int>(WindowKind::kCommExposed)], 50);
  double peer = 0, transfer = 0;
  for (const IdleWindow& x : w.windows) {
    if (x.kind != WindowKind::kCommExposed) continue;
    if (x.cause == IdleCause::kPeer) {
      peer += x.per_step_us;
      EXPECT_NE(x.label.find("waits for another rank"), std::string::npos) << x.label;
    } else {
      transfer += x.per_step_us;
      EXPECT_NE(x.label.find("communicates"), std::string::npos) << x.label;
    }
  }
  EXPECT_DOUBLE_EQ(peer, 30);
  EXPECT_DOUBLE_EQ(transfer, 20);
}

}  // namespace
}  // namespace dynaflow
