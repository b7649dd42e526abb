#include "analysis/steps/workload.h"

#include <gtest/gtest.h>

namespace dynaflow {
namespace {

// One device; each kernel launched by its own operator (linked by External id).
struct Builder {
  Builder() {
    d = t.DeviceIndex(0, 0);
    t.devices[d].name = "NVIDIA H200";
  }
  void Launch(const char* op, const char* shapes, const char* kernel, TimeNs s, Pass pass = Pass::kForward) {
    Operator o;
    o.start = s;
    o.end = s + 5000;
    o.external_id = next_ext;
    o.name = t.strings.Intern(op);
    o.input_shapes = t.strings.Intern(shapes);
    o.input_types = t.strings.Intern(R"(["c10::BFloat16","c10::BFloat16","c10::BFloat16"])");
    o.pass = pass;
    t.ops.push_back(o);
    GpuActivity g;
    g.start = s + 10000;
    g.end = s + 60000;
    g.external_id = next_ext++;
    g.stream = 7;
    g.device_index = d;
    g.name = t.strings.Intern(kernel);
    t.gpu.push_back(g);
  }
  DeviceSteps Infer() {
    links = LinkOperators(t);
    res = ClassifyResources(t, links, BoundOptions{});
    DeviceSteps s = FindSteps(t, res.at(0));
    CostCache costs(t, &links);
    InferWorkloads(t, links, res.at(0), &costs, &s);
    return s;
  }
  Trace t;
  uint32_t d = 0;
  int64_t next_ext = 1;
  OperatorLinks links;
  std::vector<DeviceResources> res;
};

constexpr const char* kSdpa = "aten::_scaled_dot_product_flash_attention";

TEST(WorkloadTest, DecodeFromAttentionShapesTokensAreTheBatch) {
  Builder b;
  // Batch 32, one query token against 512 cached ones, in two layers.
  b.Launch(kSdpa, "[[32,32,1,128],[32,8,512,128],[32,8,512,128]]", "flash_fwd_kernel", 0);
  b.Launch(kSdpa, "[[32,32,1,128],[32,8,512,128],[32,8,512,128]]", "flash_fwd_kernel", 100000);
  DeviceSteps s = b.Infer();
  ASSERT_EQ(s.steps.size(), 1u);
  EXPECT_EQ(s.steps[0].phase, StepPhase::kDecode);
  EXPECT_EQ(s.steps[0].tokens, 32);
  EXPECT_EQ(s.steps[0].tokens_source, TokenSource::kAttentionShapes);
}

TEST(WorkloadTest, PrefillFromAttentionShapesTokensAreBatchTimesSequence) {
  Builder b;
  b.Launch(kSdpa, "[[4,32,512,128],[4,8,512,128],[4,8,512,128]]", "flash_fwd_kernel", 0);
  // flash_attn's own entry point takes [B, S, H, D].
  b.Launch("aten::_flash_attention_forward", "[[4,512,32,128],[4,512,8,128],[4,512,8,128]]",
           "flash_fwd_kernel", 100000);
  DeviceSteps s = b.Infer();
  ASSERT_EQ(s.steps.size(), 1u);
  EXPECT_EQ(s.steps[0].phase, StepPhase::kPrefill);
  EXPECT_EQ(s.steps[0].tokens, 4 * 512);
}

TEST(WorkloadTest, PhaseFromKernelNamesWhenShapesDoNotTell) {
  // A variable-length call without sequence offsets: rows, but no phase.
  Builder b;
  b.Launch("vllm::unified_attention_with_output", "[[888,8,64],[888,1,64],[888,1,64],[888,8,64]]",
           "fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKvCausalP16VarSeqQ128Kv128PersistentContext", 0);
  DeviceSteps s = b.Infer();
  EXPECT_EQ(s.steps[0].phase, StepPhase::kPrefill);
  EXPECT_EQ(s.steps[0].tokens, 888);
  Builder d;
  d.Launch("vllm::unified_attention_with_output", "[[32,8,64],[32,1,64],[32,1,64],[32,8,64]]",
           "void vllm::paged_attention_v2_kernel<__nv_bfloat16, 128>(...)", 0);
  EXPECT_EQ(d.Infer().steps[0].phase, StepPhase::kDecode);
}

TEST(WorkloadTest, ABackwardPassMakesATrainingStep) {
  Builder b;
  b.Launch(kSdpa, "[[4,32,512,128],[4,8,512,128],[4,8,512,128]]", "flash_fwd_kernel", 0);
  b.Launch("aten::_scaled_dot_product_flash_attention_backward",
           "[[4,32,512,128],[4,32,512,128],[4,8,512,128],[4,8,512,128]]", "flash_bwd_kernel", 100000,
           Pass::kBackward);
  DeviceSteps s = b.Infer();
  EXPECT_EQ(s.steps[0].phase, StepPhase::kTraining);
  EXPECT_EQ(s.steps[0].tokens, 4 * 512);
}

TEST(WorkloadTest, NoAttentionLeavesTheStepUnknown) {
  Builder b;
  b.Launch("aten::mm", "[[64,4096],[4096,4096]]", "sm90_xmma_gemm_bf16bf16", 0);
  DeviceSteps s = b.Infer();
  EXPECT_EQ(s.steps[0].phase, StepPhase::kUnknown);
  EXPECT_EQ(s.steps[0].tokens, 0);
  EXPECT_EQ(s.steps[0].tokens_source, TokenSource::kNone);
}

TEST(WorkloadTest, AnnotatedPhaseAndTokensAreKept) {
  Builder b;
  Range r;
  r.start = 0;
  r.end = 1000000;
  r.name = b.t.strings.Intern("execute_context_0(0)_generation_30(30)");
  r.domain = RangeDomain::kGpuUser;
  r.device_index = 0;
  b.t.ranges.push_back(r);
  // Shapes of a padded batch of 32 (a CUDA graph's size): the annotation's 30 wins.
  b.Launch(kSdpa, "[[32,32,1,128],[32,8,512,128],[32,8,512,128]]", "flash_fwd_kernel", 0);
  DeviceSteps s = b.Infer();
  EXPECT_EQ(s.steps[0].phase, StepPhase::kDecode);
  EXPECT_EQ(s.steps[0].tokens, 30);
  EXPECT_EQ(s.steps[0].tokens_source, TokenSource::kAnnotation);
}

TEST(WorkloadTest, AttentionKernelNames) {
  EXPECT_EQ(AttentionKernelPhase("void flash::flash_fwd_splitkv_kernel<...>"), StepPhase::kDecode);
  EXPECT_EQ(AttentionKernelPhase("BatchDecodeWithPagedKVCacheKernel<...>"), StepPhase::kDecode);
  EXPECT_EQ(AttentionKernelPhase("BatchPrefillWithPagedKVCacheKernel<...>"), StepPhase::kPrefill);
  EXPECT_EQ(AttentionKernelPhase("fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKvCausalP16VarSeqQ128Kv128PersistentContext"),
            StepPhase::kPrefill);
  EXPECT_EQ(AttentionKernelPhase("void flash::flash_fwd_kernel<...>"), StepPhase::kUnknown);
  // "decode" outside attention (a video decoder's kernel) says nothing.
  EXPECT_EQ(AttentionKernelPhase("nvjpeg_decode_kernel"), StepPhase::kUnknown);
  EXPECT_EQ(AttentionKernelPhase("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn"), StepPhase::kUnknown);
}

}  // namespace
}  // namespace dynaflow
