#include "analysis/steps/steps.h"

#include <gtest/gtest.h>

#include <string>

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

// Three kernels: one in the first step, one launched at 900 us (in the first
// step) that runs at 1.2 ms (in the second), one in the second.
void LaunchLateInTheFirstStep(Builder& b) {
  ApiCall launch;
  launch.start = 900000;
  launch.end = 905000;
  launch.correlation = 7;
  b.t.api.push_back(launch);
  b.Kernel("k", 100000, 300000);
  b.Kernel("k", 1200000, 1400000, 7);
  b.Kernel("k", 1500000, 1600000);
}

TEST(StepsTest, HostAnnotationsUseTheLaunchTime) {
  Builder b;
  b.Range("ProfilerStep#1", 0, 1000000, false);
  b.Range("ProfilerStep#2", 1000000, 2000000, false);
  // Launched at 900 us (step 1) but run at 1.2 ms, when the host is in step 2.
  LaunchLateInTheFirstStep(b);
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

TEST(StepsTest, ParsesServingAnnotations) {
  ServingAnnotation a;
  // vLLM with the sum of squared prompt lengths after the token count.
  ASSERT_TRUE(ParseServingAnnotation("execute_context_1(888_788544)_generation_0(0)", &a));
  EXPECT_EQ(a.context_requests, 1);
  EXPECT_EQ(a.context_tokens, 888);
  EXPECT_EQ(a.generation_requests, 0);
  EXPECT_EQ(a.phase(), StepPhase::kPrefill);
  EXPECT_EQ(a.tokens(), 888);
  ASSERT_TRUE(ParseServingAnnotation("execute_context_0(0)_generation_32(32)", &a));
  EXPECT_EQ(a.phase(), StepPhase::kDecode);
  EXPECT_EQ(a.tokens(), 32);
  ASSERT_TRUE(ParseServingAnnotation("execute_context_2(300)_generation_30(30)", &a));
  EXPECT_EQ(a.phase(), StepPhase::kMixed);
  EXPECT_EQ(a.tokens(), 330);
  // TensorRT-LLM's PyTorch backend: requests only, tokens left to the shapes.
  ASSERT_TRUE(ParseServingAnnotation("[Executor] _forward_step 17: 0 ctx reqs, 64 gen reqs", &a));
  EXPECT_EQ(a.generation_requests, 64);
  EXPECT_EQ(a.phase(), StepPhase::kDecode);
  EXPECT_EQ(a.tokens(), 0);
  ASSERT_TRUE(ParseServingAnnotation("[Executor] _forward_step: 3 ctx reqs, 0 gen reqs", &a));
  EXPECT_EQ(a.phase(), StepPhase::kPrefill);
  ASSERT_TRUE(ParseServingAnnotation("_forward_step: 2 ctx reqs, 5 gen reqs", &a));
  EXPECT_EQ(a.phase(), StepPhase::kMixed);
  // SGLang's scheduler: one forward, phase and tokens unknown.
  ASSERT_TRUE(ParseServingAnnotation("scheduler.run_batch", &a));
  EXPECT_EQ(a.phase(), StepPhase::kUnknown);
  EXPECT_EQ(a.tokens(), 0);
  ServingAnnotation untouched;
  untouched.context_tokens = 7;
  for (const char* bad : {"ProfilerStep#1", "execute_context_", "execute_context_1(", "execute_context_1(5",
                          "execute_context_1(5)", "execute_context_1(5)_generation_x(1)",
                          "execute_context_(5)_generation_1(1)", "",
                          "execute_context_1(12345678901234567890)_generation_0(0)",
                          "[Executor] _forward_step 17: 0 ctx reqs, 64 gen reqs extra",
                          "[Executor] _forward_step x: 0 ctx reqs, 64 gen reqs",
                          "_forward_step: ctx reqs, 1 gen reqs", "scheduler.run_batch_x",
                          "scheduler.recv_requests"}) {
    EXPECT_FALSE(ParseServingAnnotation(bad, &untouched)) << bad;
  }
  EXPECT_EQ(untouched.context_tokens, 7);
}

TEST(StepsTest, ServingAnnotationsAreOneStepPerForwardWithPhaseAndTokens) {
  Builder b;
  b.Range("execute_context_1(888_788544)_generation_0(0)", 0, 1000000, true);
  b.Range("execute_context_0(0)_generation_32(32)", 1100000, 1500000, true);
  for (TimeNs t = 0; t < 1000000; t += 100000) b.Kernel("layer", t, t + 90000);
  for (TimeNs t = 1100000; t < 1500000; t += 100000) b.Kernel("layer", t, t + 50000);
  DeviceSteps s = b.Find();
  EXPECT_EQ(s.source, StepSource::kServingGpu);
  EXPECT_STREQ(StepSourceName(s.source), "serving_step_gpu");
  ASSERT_EQ(s.steps.size(), 2u);
  EXPECT_EQ(s.steps[0].activities, 10);
  EXPECT_EQ(s.steps[0].phase, StepPhase::kPrefill);
  EXPECT_EQ(s.steps[0].tokens, 888);
  EXPECT_EQ(s.steps[0].tokens_source, TokenSource::kAnnotation);
  EXPECT_EQ(s.steps[1].phase, StepPhase::kDecode);
  EXPECT_EQ(s.steps[1].tokens, 32);
  EXPECT_DOUBLE_EQ(s.steps[0].duration_us(), 1100);
}

// TensorRT-LLM's and SGLang's host ranges: one step per forward; TensorRT-LLM's
// says the phase, neither says the tokens.
TEST(StepsTest, TrtLlmAndSglangForwardsAreOneStepEach) {
  Builder b;
  b.Range("[Executor] _forward_step 0: 4 ctx reqs, 0 gen reqs", 0, 1000000, false);
  b.Range("[Executor] _forward_step 1: 0 ctx reqs, 4 gen reqs", 1000000, 1400000, false);
  b.Range("scheduler.run_batch", 1400000, 1800000, false);
  for (TimeNs t = 0; t < 1800000; t += 100000) b.Kernel("layer", t + 10000, t + 60000);
  DeviceSteps s = b.Find();
  EXPECT_EQ(s.source, StepSource::kServingHost);
  ASSERT_EQ(s.steps.size(), 3u);
  EXPECT_EQ(s.steps[0].activities, 10);
  EXPECT_EQ(s.steps[0].phase, StepPhase::kPrefill);
  EXPECT_EQ(s.steps[1].activities, 4);
  EXPECT_EQ(s.steps[1].phase, StepPhase::kDecode);
  EXPECT_EQ(s.steps[2].activities, 4);
  EXPECT_EQ(s.steps[2].phase, StepPhase::kUnknown);
  for (const Step& step : s.steps) EXPECT_EQ(step.tokens, 0);
}

TEST(StepsTest, ProfilerStepsKeepTheirWindowsAndTakeTheServingPhase) {
  Builder b;
  b.Range("ProfilerStep#3", 0, 1000000, true);
  b.Range("execute_context_0(0)_generation_32(32)", 10000, 900000, true);
  b.Range("ProfilerStep#4", 1000000, 2000000, true);  // no serving annotation
  b.Kernel("a", 10000, 400000);
  b.Kernel("a", 1100000, 1400000);
  DeviceSteps s = b.Find();
  EXPECT_EQ(s.source, StepSource::kGpuAnnotation);
  ASSERT_EQ(s.steps.size(), 2u);
  EXPECT_EQ(s.steps[0].number, 3);
  EXPECT_EQ(s.steps[0].phase, StepPhase::kDecode);
  EXPECT_EQ(s.steps[0].tokens, 32);
  EXPECT_EQ(s.steps[1].phase, StepPhase::kUnknown);
  EXPECT_EQ(s.steps[1].tokens, 0);
  EXPECT_EQ(s.steps[1].tokens_source, TokenSource::kNone);
}

// Kernels of one forward: an embedding, `layers` layers of six kernels, the
// head and sampling.
void Forward(Builder& b, TimeNs* t, int layers) {
  auto k = [&](const char* name) {
    b.Kernel(name, *t, *t + 10000);
    *t += 11000;
  };
  k("embed");
  for (int l = 0; l < layers; ++l) {
    // Two norms and three GEMMs of one kernel name: the anchor is attention,
    // mid-layer, the only name at a constant period.
    for (const char* name : {"norm", "gemm", "attn", "gemm", "norm", "gemm"}) k(name);
  }
  k("lm_head");
  k("argmax");
}

TEST(StepsTest, LayerStackOfOneForwardIsOneStepNotOnePerLayer) {
  Builder b;
  TimeNs t = 0;
  Forward(b, &t, 36);
  DeviceSteps s = b.Find();
  // Before: 36 steps of one layer each (source repeating_sequence).
  EXPECT_EQ(s.source, StepSource::kWhole);
  ASSERT_EQ(s.steps.size(), 1u);
  EXPECT_EQ(s.steps[0].activities, 36 * 6 + 3);
  EXPECT_EQ(s.layers, 36);
}

TEST(StepsTest, RepeatedForwardsAreOneStepEach) {
  Builder b;
  TimeNs t = 0;
  for (int f = 0; f < 3; ++f) {
    Forward(b, &t, 4);
    t += 200000;  // the host samples and schedules the next forward
  }
  DeviceSteps s = b.Find();
  EXPECT_EQ(s.source, StepSource::kRepeat);
  ASSERT_EQ(s.steps.size(), 3u);
  EXPECT_EQ(s.steps[0].activities, 4 * 6 + 3);
  EXPECT_EQ(s.layers, 0);
}

TEST(StepsTest, HostServingAnnotationsUseTheLaunchTime) {
  Builder b;
  // Only host ranges: vLLM's annotations enclose the launches, not the GPU work.
  b.Range("execute_context_0(0)_generation_8(8)", 0, 1000000, false);
  b.Range("execute_context_0(0)_generation_9(9)", 1000000, 2000000, false);
  LaunchLateInTheFirstStep(b);
  DeviceSteps s = b.Find();
  EXPECT_EQ(s.source, StepSource::kServingHost);
  ASSERT_EQ(s.steps.size(), 2u);
  EXPECT_EQ(s.step_of, (std::vector<int32_t>{0, 0, 1}));
  EXPECT_EQ(s.steps[0].tokens, 8);
  EXPECT_EQ(s.steps[1].tokens, 9);
  EXPECT_EQ(s.steps[1].phase, StepPhase::kDecode);
}

}  // namespace
}  // namespace dynaflow

namespace dynaflow {
namespace {

// A program that runs its forward (gemm, add, norm, act) eagerly once, captures it
// into a CUDA graph (capture-time operators, whose launches ran nothing), then
// replays the graph twice: each replay's kernels carry the cudaGraphLaunch's
// correlation and link to the capture-time operators (the tracer's graph
// attribution), whose time is the capture's, not the replay's.
struct CapturedForward {
  explicit CapturedForward(bool annotated) {
    const char* kernels[] = {"gemm", "add", "norm", "act"};
    TimeNs host = 0;
    auto step = [&](int64_t n) {
      if (!annotated) return;
      b.Range(("ProfilerStep#" + std::to_string(n)).c_str(), host, host + 1000000, false);
    };
    step(1);  // eager
    for (int k = 0; k < 4; ++k) {
      const int64_t ext = Op(host + 10000 * k, false);
      Launch("cudaLaunchKernel", host + 10000 * k + 1000, ++corr);
      b.Kernel(kernels[k], host + 100000 + 20000 * k, host + 110000 + 20000 * k, corr);
      b.t.gpu.back().external_id = ext;
    }
    host += 1000000;
    step(2);  // capture: launches, no kernels
    int64_t captured[4];
    for (int k = 0; k < 4; ++k) {
      captured[k] = Op(host + 10000 * k, true);
      Launch("cudaLaunchKernel", host + 10000 * k + 1000, ++corr);
    }
    host += 1000000;
    for (int64_t n : {3, 4}) {  // replays
      step(n);
      Launch("cudaGraphLaunch", host + 1000, ++corr);
      for (int k = 0; k < 4; ++k) {
        b.Kernel(kernels[k], host + 100000 + 20000 * k, host + 110000 + 20000 * k, corr);
        b.t.gpu.back().external_id = captured[k];
      }
      host += 1000000;
    }
  }
  int64_t Op(TimeNs start, bool in_graph_capture) {
    Operator o;
    o.start = start;
    o.end = start + 5000;
    o.tid = 1;
    o.name = b.t.strings.Intern("aten::op");
    o.external_id = static_cast<int64_t>(b.t.ops.size()) + 1;
    o.in_graph_capture = in_graph_capture;
    b.t.ops.push_back(o);
    return o.external_id;
  }
  void Launch(const char* name, TimeNs start, int64_t correlation) {
    ApiCall a;
    a.start = start;
    a.end = start + 500;
    a.tid = 1;
    a.correlation = correlation;
    a.name = b.t.strings.Intern(name);
    b.t.api.push_back(a);
  }
  Builder b;
  int64_t corr = 0;
};

TEST(StepsTest, AGraphCaptureIsNoStepAndReplaysAreStepsOfTheirLaunch) {
  CapturedForward f(/*annotated=*/true);
  DeviceSteps s = f.b.Find();
  EXPECT_EQ(s.source, StepSource::kHostAnnotation);
  ASSERT_EQ(s.steps.size(), 3u);
  std::vector<int64_t> numbers;
  for (const Step& step : s.steps) {
    numbers.push_back(step.number);
    EXPECT_EQ(step.activities, 4);
    EXPECT_GT(step.busy_end, step.start);
  }
  EXPECT_EQ(numbers, (std::vector<int64_t>{1, 3, 4}));
  // Replayed kernels link to the capture-time operators yet belong to the
  // step that launched them.
  EXPECT_EQ(s.step_of, (std::vector<int32_t>{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}));
  EXPECT_FALSE(f.b.t.ops[static_cast<size_t>(f.b.links.activity_op[0])].in_graph_capture);
  EXPECT_TRUE(f.b.t.ops[static_cast<size_t>(f.b.links.activity_op[4])].in_graph_capture);
}

TEST(StepsTest, AGraphCaptureAddsNoIterationToTheRepeatingSequence) {
  CapturedForward f(/*annotated=*/false);
  DeviceSteps s = f.b.Find();
  // The eager forward and the two replays; the capture ran no kernel.
  EXPECT_EQ(s.source, StepSource::kRepeat);
  ASSERT_EQ(s.steps.size(), 3u);
  for (const Step& step : s.steps) EXPECT_EQ(step.activities, 4);
  EXPECT_EQ(s.steps[1].start, 2000000 + 100000);  // the first replay's first kernel
}

}  // namespace
}  // namespace dynaflow
