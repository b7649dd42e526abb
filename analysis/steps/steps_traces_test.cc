// Steps on the real traces in ../shared/traces: a step is one forward or one
// training iteration, never one layer. Skips where ../shared/traces is absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "analysis/importers/reader.h"
#include "analysis/importers/shared_traces_testing.h"
#include "analysis/steps/steps.h"
#include "analysis/steps/workload.h"

namespace dynaflow {
namespace {

namespace fs = std::filesystem;

struct Found {
  Trace trace;
  DeviceSteps steps;
};

// FindSteps and InferWorkloads on the first device of `name` (under
// ../shared/traces); `drop_serving` removes vLLM's step annotations first.
bool Load(const std::string& name, bool drop_serving, Found* out) {
  const fs::path f = SharedTraces() / name;
  if (!fs::exists(f)) return false;
  if (!ImportFiles({f.string()}, ImportOptions(), &out->trace).ok()) return false;
  Trace& t = out->trace;
  if (drop_serving) {
    std::erase_if(t.ranges, [&t](const Range& r) {
      ServingAnnotation a;
      return ParseServingAnnotation(t.strings.Get(r.name), &a);
    });
  }
  const OperatorLinks links = LinkOperators(t);
  const std::vector<DeviceResources> res = ClassifyResources(t, links, BoundOptions{});
  if (res.empty()) return false;
  out->steps = FindSteps(t, res[0]);
  CostCache costs(t, &links);
  InferWorkloads(t, links, res[0], &costs, &out->steps);
  return true;
}

// vLLM's prefill of one 888-token prompt through a 36-layer model (B200):
// before, 36 steps of one layer each (repeating_sequence, median 1.909 ms),
// tokens unknown to the steps.
TEST(StepsTracesTest, ServingPrefillIsOneStepOf888Tokens) {
  Found f;
  if (!Load("kineto/tracelens_b200_eager.json.gz", false, &f)) GTEST_SKIP() << "no shared trace";
  EXPECT_EQ(f.steps.source, StepSource::kServingGpu);
  ASSERT_EQ(f.steps.steps.size(), 1u);
  const Step& s = f.steps.steps[0];
  EXPECT_EQ(s.phase, StepPhase::kPrefill);
  EXPECT_EQ(s.tokens, 888);
  EXPECT_EQ(s.tokens_source, TokenSource::kAnnotation);
  // 928 of the 929 GPU activities start inside the annotation (the logits'
  // all-gather runs after it), spanning 84.044 ms.
  EXPECT_EQ(s.activities, 928);
  EXPECT_NEAR(s.duration_us(), 84044.107, 0.01);
}

// The same trace without the annotation: the 36 repeats are the layer stack
// of one forward, which stays one step; attention's rows (888) and its
// context kernels (prefill) give the workload.
TEST(StepsTracesTest, WithoutTheAnnotationTheLayerStackIsStillOneStep) {
  Found f;
  if (!Load("kineto/tracelens_b200_eager.json.gz", true, &f)) GTEST_SKIP() << "no shared trace";
  EXPECT_EQ(f.steps.source, StepSource::kWhole);
  ASSERT_EQ(f.steps.steps.size(), 1u);
  EXPECT_EQ(f.steps.layers, 36);
  EXPECT_EQ(f.steps.steps[0].phase, StepPhase::kPrefill);
  EXPECT_EQ(f.steps.steps[0].tokens, 888);
  EXPECT_EQ(f.steps.steps[0].tokens_source, TokenSource::kAttentionShapes);
}

// BERT inference on MI300 (flash attention forward, no backward): prefill.
// Training traces are training.
TEST(StepsTracesTest, PhasesOfOtherTraces) {
  Found bert;
  if (!Load("kineto/tracelens_mi300_bert_small.json.gz", false, &bert)) GTEST_SKIP() << "no shared trace";
  ASSERT_EQ(bert.steps.steps.size(), 1u);
  EXPECT_EQ(bert.steps.steps[0].phase, StepPhase::kPrefill);
  EXPECT_EQ(bert.steps.steps[0].tokens_source, TokenSource::kAttentionShapes);
  Found train;
  if (!Load("kineto/hta_v100_ns_resolution_rank0.json.gz", false, &train)) GTEST_SKIP() << "no shared trace";
  ASSERT_EQ(train.steps.steps.size(), 5u);
  for (const Step& s : train.steps.steps) EXPECT_EQ(s.phase, StepPhase::kTraining);
}

}  // namespace
}  // namespace dynaflow
