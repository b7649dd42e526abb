#include "analysis/roofline/bound.h"

#include <gtest/gtest.h>

namespace dynaflow {
namespace {

class TinyTrace {
 public:
  TinyTrace() {
    d_ = t.DeviceIndex(0, 0);
    t.devices[d_].name = "NVIDIA H200";
  }
  // An operator [start, end] on the host with one kernel [ks, ke] on `stream`.
  size_t Op(const char* name, const char* shapes, const char* types, TimeNs start, TimeNs end) {
    Operator o;
    o.start = start;
    o.end = end;
    o.tid = 1;
    o.name = t.strings.Intern(name);
    o.input_shapes = t.strings.Intern(shapes);
    o.input_types = t.strings.Intern(types);
    o.external_id = next_ext_++;
    t.ops.push_back(o);
    return t.ops.size() - 1;
  }
  void Kernel(const char* name, int64_t ext, TimeNs s, TimeNs e, int32_t stream = 7,
              GpuKind kind = GpuKind::kKernel) {
    GpuActivity g;
    g.start = s;
    g.end = e;
    g.external_id = ext;
    g.stream = stream;
    g.kind = kind;
    g.device_index = d_;
    g.name = t.strings.Intern(name);
    t.gpu.push_back(g);
  }
  Trace t;

 private:
  uint32_t d_ = 0;
  int64_t next_ext_ = 100;
};

TEST(BoundTest, KernelNameRules) {
  EXPECT_EQ(ClassifyKernelName("ncclDevKernel_AllReduce_Sum_bf16_RING_LL"), Resource::kCommunication);
  EXPECT_EQ(ClassifyKernelName("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"), Resource::kCompute);
  EXPECT_EQ(ClassifyKernelName("void cutlass::Kernel2<cutlass_80_wmma_tensorop>"), Resource::kCompute);
  EXPECT_EQ(ClassifyKernelName("void gemv2T_kernel_val<int, int, __nv_bfloat16>"), Resource::kMemory);
  EXPECT_EQ(ClassifyKernelName("void pytorch_flash::flash_fwd_kernel<...>"), Resource::kCompute);
  EXPECT_EQ(ClassifyKernelName("void pytorch_flash::flash_fwd_splitkv_kernel<...>"), Resource::kMemory);
  EXPECT_EQ(ClassifyKernelName("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float>"), Resource::kMemory);
  EXPECT_EQ(ClassifyKernelName("sm80_xmma_fprop_implicit_gemm_tf32f32"), Resource::kCompute);
  EXPECT_EQ(ClassifyKernelName("void at::native::vectorized_elementwise_kernel<4, add>"), Resource::kMemory);
  EXPECT_EQ(ClassifyKernelName("triton_poi_fused_add_mul_0"), Resource::kMemory);
  EXPECT_EQ(ClassifyKernelName("triton_tem_fused_mm_0"), Resource::kCompute);
  EXPECT_EQ(ClassifyKernelName("Cijk_Ailk_Bljk_BBS_BH_MT128x128x64"), Resource::kCompute);
  EXPECT_EQ(ClassifyKernelName("Memcpy HtoD (Pinned -> Device)"), Resource::kCopy);
}

TEST(BoundTest, RooflineSeparatesGemmsFromDecodeGemvs) {
  const PeakRates h200 = PeakRatesFor(DeviceInfo{0, 0, "NVIDIA H200"});
  EXPECT_TRUE(h200.known);
  EXPECT_NEAR(h200.Ridge(), 206, 1);
  const char* bf16 = R"(["c10::BFloat16","c10::BFloat16"])";
  // M = 8192: intensity ~ 2000 FLOP/byte, far above the ridge.
  EXPECT_EQ(ResourceFromCost(EstimateOpCost("aten::mm", "[[8192,4096],[4096,4096]]", bf16), h200,
                             Resource::kMemory),
            Resource::kCompute);
  // M = 8 (decode): intensity ~ 8: the weight read bounds it.
  EXPECT_EQ(ResourceFromCost(EstimateOpCost("aten::mm", "[[8,4096],[4096,4096]]", bf16), h200,
                             Resource::kCompute),
            Resource::kMemory);
  // Unknown cost: the fallback.
  EXPECT_EQ(ResourceFromCost(OpCost{}, h200, Resource::kLatency), Resource::kLatency);
  // An unknown part gets assumed peaks.
  const PeakRates unknown = PeakRatesFor(DeviceInfo{0, 0, "Mystery GPU"});
  EXPECT_FALSE(unknown.known);
  EXPECT_GT(unknown.flops_half, 0);
}

TEST(BoundTest, LinksAndClassifiesAndMeasuresAchievedRates) {
  TinyTrace tt;
  const char* bf16 = R"(["c10::BFloat16","c10::BFloat16"])";
  // aten::linear encloses aten::mm, which launches the GEMM.
  const size_t lin = tt.Op("aten::linear", "", "", 0, 50000);
  const size_t mm = tt.Op("aten::mm", "[[8192,4096],[4096,4096]]", bf16, 1000, 40000);
  const double flops = 2.0 * 8192 * 4096 * 4096;
  // 400 us: 275 TFLOP/s achieved, 27.8% of the H200's 989.4.
  tt.Kernel("sm90_xmma_gemm", tt.t.ops[mm].external_id, 100000, 500000);
  const size_t add = tt.Op("aten::add", "[[4,2048,4096],[4,2048,4096]]", bf16, 60000, 70000);
  tt.Kernel("elementwise_add", tt.t.ops[add].external_id, 502000, 522000);
  tt.Kernel("ncclDevKernel_AllReduce", -1, 523000, 600000, 20);
  tt.Kernel("Memcpy HtoD", -1, 600000, 610000, 24, GpuKind::kMemcpy);
  tt.t.gpu.back().bytes = 1 << 20;
  // A 3 us kernel after a 20 us idle gap on its stream: latency bound.
  tt.Kernel("tiny_kernel", -1, 630000, 633000);

  const OperatorLinks links = LinkOperators(tt.t);
  EXPECT_EQ(links.activity_op[0], static_cast<int32_t>(mm));
  EXPECT_EQ(links.activity_op[2], -1);
  EXPECT_EQ(links.op_top[mm], static_cast<int32_t>(lin));
  EXPECT_EQ(links.op_top[lin], static_cast<int32_t>(lin));
  EXPECT_EQ(links.op_top[add], static_cast<int32_t>(add));

  const std::vector<DeviceResources> devs = ClassifyResources(tt.t, links, BoundOptions{});
  ASSERT_EQ(devs.size(), 1u);
  const DeviceResources& d = devs[0];
  ASSERT_EQ(d.resource.size(), 5u);
  EXPECT_EQ(d.resource[0], Resource::kCompute);
  EXPECT_EQ(d.resource[1], Resource::kMemory);
  EXPECT_EQ(d.resource[2], Resource::kCommunication);
  EXPECT_EQ(d.resource[3], Resource::kCopy);
  EXPECT_EQ(d.resource[4], Resource::kLatency);
  EXPECT_EQ(d.linked_kernels, 2);
  EXPECT_EQ(d.costed_kernels, 2);
  const ResourceTotals& c = d.totals[static_cast<int>(Resource::kCompute)];
  EXPECT_DOUBLE_EQ(c.time_us, 400);
  EXPECT_DOUBLE_EQ(c.flops, flops);
  EXPECT_NEAR(c.achieved_tflops, flops / 400e-6 / 1e12, 1e-9);
  EXPECT_NEAR(c.pct_of_peak, 100.0 * flops / 400e-6 / 989.4e12, 1e-9);
  const ResourceTotals& m = d.totals[static_cast<int>(Resource::kMemory)];
  const double add_bytes = 3.0 * 4 * 2048 * 4096 * 2;
  EXPECT_NEAR(m.achieved_gbps, add_bytes / 20e-6 / 1e9, 1e-6);
  EXPECT_NEAR(m.pct_of_peak, 100.0 * add_bytes / 20e-6 / 4.8e12, 1e-9);
  const ResourceTotals& copy = d.totals[static_cast<int>(Resource::kCopy)];
  EXPECT_NEAR(copy.achieved_gbps, (1 << 20) / 10e-6 / 1e9, 1e-9);
  // A host-to-device copy is measured against PCIe (55 GB/s on Hopper).
  EXPECT_NEAR(copy.pct_of_peak, 100.0 * (1 << 20) / 10e-6 / 55e9, 1e-9);
  // Kernels without a known cost count in the time, not in the rates.
  EXPECT_DOUBLE_EQ(d.totals[static_cast<int>(Resource::kCommunication)].costed_time_us, 0);
  ASSERT_FALSE(d.operators.empty());
  EXPECT_EQ(d.operators[0].name, "aten::mm");
  EXPECT_EQ(d.operators[0].resource, Resource::kCompute);
  EXPECT_NEAR(d.operators[0].pct_of_peak, c.pct_of_peak, 1e-9);
}

}  // namespace
}  // namespace dynaflow
