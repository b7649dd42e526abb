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

namespace dynaflow {
namespace {

// An FP32 GEMM is measured against the FP32 peak (67 TFLOP/s on an H200),
// not the BF16 tensor cores' 989.4; a BF16 one against BF16.
TEST(BoundTest, ComputePeakFollowsThePrecision) {
  TinyTrace tt;
  const size_t fp32 = tt.Op("aten::mm", "[[4096,4096],[4096,4096]]", R"(["float","float"])", 0, 10);
  tt.Kernel("sm90_gemm_fp32", tt.t.ops[fp32].external_id, 1000, 4001000);  // 4 ms
  const OperatorLinks links = LinkOperators(tt.t);
  const DeviceResources d = ClassifyResources(tt.t, links, BoundOptions{})[0];
  const double flops = 2.0 * 4096 * 4096 * 4096;
  ASSERT_EQ(d.operators.size(), 1u);
  EXPECT_EQ(d.operators[0].resource, Resource::kCompute);
  EXPECT_NEAR(d.operators[0].pct_of_peak, 100.0 * flops / 4e-3 / 67e12, 1e-9);  // 51.3%
  EXPECT_NEAR(d.totals[static_cast<int>(Resource::kCompute)].pct_of_peak, d.operators[0].pct_of_peak, 1e-9);
  const PeakRates h200 = PeakRatesFor(DeviceInfo{0, 0, "NVIDIA H200"});
  EXPECT_DOUBLE_EQ(h200.Flops(Precision::kFp32), 67e12);
  EXPECT_DOUBLE_EQ(h200.Flops(Precision::kTf32), 494.7e12);
  EXPECT_DOUBLE_EQ(h200.Flops(Precision::kHalf), 989.4e12);
  EXPECT_DOUBLE_EQ(h200.Flops(Precision::kFp8), 1978.9e12);
  // V100 has no TF32: cuDNN's FP32 convolutions run at the FP32 peak.
  EXPECT_DOUBLE_EQ(PeakRatesFor(DeviceInfo{0, 0, "Tesla V100-SXM2-32GB"}).Flops(Precision::kTf32), 15.7e12);
}

// A device-to-device copy under aten::copy_ moves its recorded bytes at HBM
// speed: 64 MiB in 100 us is 671 GB/s, 14% of the H200's 4.8 TB/s (against
// PCIe, as before, it read 1220%).
TEST(BoundTest, DeviceToDeviceCopiesAreRatedAgainstHbm) {
  TinyTrace tt;
  const size_t copy = tt.Op("aten::copy_", "[[4096,8192],[4096,8192]]", R"(["c10::BFloat16","c10::BFloat16"])", 0, 10);
  tt.Kernel("Memcpy DtoD (Device -> Device)", tt.t.ops[copy].external_id, 1000, 101000, 7, GpuKind::kMemcpy);
  tt.t.gpu.back().bytes = 64 << 20;
  tt.t.gpu.back().copy_kind = tt.t.strings.Intern("DtoD");
  const OperatorLinks links = LinkOperators(tt.t);
  const DeviceResources d = ClassifyResources(tt.t, links, BoundOptions{})[0];
  ASSERT_EQ(d.operators.size(), 1u);
  EXPECT_EQ(d.operators[0].resource, Resource::kCopy);
  EXPECT_DOUBLE_EQ(d.operators[0].bytes, 64 << 20);
  EXPECT_NEAR(d.operators[0].pct_of_peak, 100.0 * (64 << 20) / 100e-6 / 4.8e12, 1e-9);
  EXPECT_NEAR(d.totals[static_cast<int>(Resource::kCopy)].pct_of_peak, d.operators[0].pct_of_peak, 1e-9);
}

// Shapes first: a decode GEMM (M = 8) under a hipBLASLt Cijk_ kernel is
// memory bound; names second: an nvjet GEMM with no operator is compute bound.
TEST(BoundTest, GemmClassFromShapesThenNames) {
  TinyTrace tt;
  tt.t.devices[0].name = "AMD Instinct MI300X";
  const size_t mm = tt.Op("aten::mm", "[[8,8192],[8192,8192]]", R"(["c10::BFloat16","c10::BFloat16"])", 0, 10);
  tt.Kernel("Cijk_Alik_Bljk_BBS_BH_MT64x16x128_MI16x16x16", tt.t.ops[mm].external_id, 1000, 101000);
  tt.Kernel("nvjet_tst_192x192_64x3_2x1_v_bz_coopB_TNT", -1, 102000, 202000);
  const DeviceResources d = ClassifyResources(tt.t, LinkOperators(tt.t), BoundOptions{})[0];
  EXPECT_EQ(d.resource[0], Resource::kMemory);
  EXPECT_EQ(d.resource[1], Resource::kCompute);
  EXPECT_EQ(ClassifyKernelName("nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NNT"), Resource::kCompute);
}

// Older Kineto traces write the correlation id into "External id" of kernels
// and runtime calls (hta_a100_alexnet, hta_sampled_rank-*): kernels link
// through the runtime call to the innermost operator around it, even where
// the correlation id happens to equal some operator's external id.
TEST(BoundTest, LinksThroughTheRuntimeCallsCorrelation) {
  TinyTrace tt;
  const size_t outer = tt.Op("aten::conv2d", "", "", 0, 1000);            // external id 100
  const size_t inner = tt.Op("aten::cudnn_convolution", "", "", 100, 900);  // 101
  const size_t other = tt.Op("aten::add", "", "", 2000, 2100);               // 102
  // Correlation 100 is aten::conv2d's external id, 101 cudnn_convolution's.
  for (int64_t corr : {100, 101}) {
    ApiCall call;
    call.start = corr == 100 ? 200 : 2010;
    call.end = call.start + 20;
    call.tid = 1;
    call.correlation = corr;
    call.external_id = corr;
    tt.t.api.push_back(call);
    tt.Kernel("kernel", corr, 5000 + corr * 10, 5005 + corr * 10);
    tt.t.gpu.back().correlation = corr;
  }
  const OperatorLinks links = LinkOperators(tt.t);
  EXPECT_EQ(links.activity_op[0], static_cast<int32_t>(inner));
  EXPECT_EQ(links.activity_op[1], static_cast<int32_t>(other));
  EXPECT_EQ(links.op_parent[inner], static_cast<int32_t>(outer));
}

// A current trace links by external id; a kernel without one still links
// through its runtime call.
TEST(BoundTest, ExternalIdFirstThenCorrelation) {
  TinyTrace tt;
  const size_t a = tt.Op("aten::mm", "", "", 0, 100);     // 100
  const size_t b = tt.Op("aten::add", "", "", 200, 300);  // 101
  tt.Kernel("k0", tt.t.ops[a].external_id, 1000, 1010);
  tt.t.gpu.back().correlation = 7;
  ApiCall call;
  call.start = 210;
  call.end = 220;
  call.tid = 1;
  call.correlation = 8;
  tt.t.api.push_back(call);
  tt.Kernel("k1", -1, 1020, 1030);
  tt.t.gpu.back().correlation = 8;
  const OperatorLinks links = LinkOperators(tt.t);
  EXPECT_EQ(links.activity_op[0], static_cast<int32_t>(a));
  EXPECT_EQ(links.activity_op[1], static_cast<int32_t>(b));
}

// Issue 10, item 1: the SMs a grid occupies, from the launch configuration and
// the part's per-SM limits (H200: compute capability 9.0, 132 SMs).
TEST(BoundTest, GridWavesFromTheLaunchConfiguration) {
  const PeakRates h200 = PeakRatesFor(DeviceInfo{0, 0, "NVIDIA H200"});
  ASSERT_EQ(h200.max_threads_per_sm, 2048);
  ASSERT_EQ(h200.shared_memory_per_sm, 228 * 1024);
  GpuActivity k;
  k.kind = GpuKind::kKernel;
  k.grid[0] = 16;  // 16 blocks of 256 threads: 8 fit per SM by threads
  k.block[0] = 256;
  EXPECT_NEAR(GridWaves(k, h200), 16.0 / (8 * 132), 1e-12);
  k.registers = 128;  // 128 x 256 registers: 2 blocks per SM
  EXPECT_NEAR(GridWaves(k, h200), 16.0 / (2 * 132), 1e-12);
  k.shared_memory = 200 * 1024;  // one block per SM by shared memory
  EXPECT_NEAR(GridWaves(k, h200), 16.0 / 132, 1e-12);
  k.grid[0] = 1000;  // more than a wave: the whole device, for 1000 / 132 waves
  EXPECT_NEAR(GridWaves(k, h200), 1000.0 / 132, 1e-12);
  k.grid[0] = 0;  // no launch configuration recorded
  EXPECT_DOUBLE_EQ(GridWaves(k, h200), 0.0);
  k.grid[0] = 16;
  k.kind = GpuKind::kMemcpy;
  EXPECT_DOUBLE_EQ(GridWaves(k, h200), 0.0);
  // AMD compute units follow other residency rules: unknown.
  k.kind = GpuKind::kKernel;
  EXPECT_DOUBLE_EQ(GridWaves(k, PeakRatesFor(DeviceInfo{0, 0, "AMD Instinct MI300X"})), 0.0);
}

}  // namespace
}  // namespace dynaflow

namespace dynaflow {
namespace {

// A GEMM captured into a CUDA graph and replayed three times: the replays'
// kernels link to the capture-time aten::mm (the tracer's graph attribution),
// one replay per cudaGraphLaunch correlation. Each replay executes the whole
// GEMM, so each is credited with its FLOPs; an ordinary operator's two kernels
// share its one execution's.
TEST(BoundTest, EachReplayOfACaptureTimeOperatorExecutesItsWholeCost) {
  TinyTrace tt;
  const char* bf16 = R"(["c10::BFloat16","c10::BFloat16"])";
  const size_t mm = tt.Op("aten::mm", "[[8192,4096],[4096,4096]]", bf16, 0, 1000);
  tt.t.ops[mm].in_graph_capture = true;
  const double flops = 2.0 * 8192 * 4096 * 4096;
  for (int replay = 0; replay < 3; ++replay) {
    const TimeNs start = 100000 + replay * 1000000;
    for (int half = 0; half < 2; ++half) {  // split-K: two kernels per GEMM
      tt.Kernel("sm90_xmma_gemm", tt.t.ops[mm].external_id, start + half * 200000,
                start + (half + 1) * 200000);
      tt.t.gpu.back().correlation = 50 + replay;
    }
  }
  const size_t eager = tt.Op("aten::mm", "[[8192,4096],[4096,4096]]", bf16, 5000000, 5001000);
  for (int half = 0; half < 2; ++half) {
    tt.Kernel("sm90_xmma_gemm", tt.t.ops[eager].external_id, 5100000 + half * 200000,
              5100000 + (half + 1) * 200000);
    tt.t.gpu.back().correlation = 60 + half;  // a launch each
  }
  const OperatorLinks links = LinkOperators(tt.t);
  OperatorGpuTime time(tt.t);
  for (size_t i = 0; i < tt.t.gpu.size(); ++i) time.Add(links.activity_op[i], tt.t.gpu[i]);
  EXPECT_DOUBLE_EQ(time.Of(static_cast<int32_t>(mm), tt.t.gpu[0]), 400000);  // one replay
  EXPECT_DOUBLE_EQ(time.Of(static_cast<int32_t>(eager), tt.t.gpu[6]), 400000);

  const DeviceResources d = ClassifyResources(tt.t, links, BoundOptions{})[0];
  const ResourceTotals& c = d.totals[static_cast<int>(Resource::kCompute)];
  EXPECT_DOUBLE_EQ(c.time_us, 4 * 400);
  EXPECT_NEAR(c.flops, 4 * flops, 1e-3 * flops);  // three replays and the eager GEMM
  EXPECT_NEAR(c.achieved_tflops, flops / 400e-6 / 1e12, 1e-6);
}

}  // namespace
}  // namespace dynaflow
