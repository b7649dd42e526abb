// The operator recorder with sampling (sample_every = 3), in its own
// executable: the recorder is installed once per process, with its options.
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "plugin/torch/fake_tracer_abi_testing.h"
#include "plugin/torch/op_recorder.h"

namespace dynaflow {
namespace {

using testing_abi::g_tracer;

constexpr int64_t kSampleEvery = 3;

// What torch decided for each top-level operator of the observed thread:
// whether it boxes inputs (some enabled callback needs them) and its name.
struct TopLevel {
  std::string name;
  bool boxes_inputs;
};

thread_local bool t_observed = false;
thread_local int t_depth = 0;
std::vector<TopLevel> g_top_level;  // written by the observed thread only

std::unique_ptr<at::ObserverContext> ObserveStart(const at::RecordFunction& fn) {
  if (t_observed && t_depth++ == 0) g_top_level.push_back({fn.name(), fn.needsInputs()});
  return nullptr;
}

void ObserveEnd(const at::RecordFunction&, at::ObserverContext*) {
  if (t_observed) --t_depth;
}

class OpRecorderSamplingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::optional<TracerAbi> abi = FindTracerAbi();
    ASSERT_TRUE(abi.has_value());
    ASSERT_TRUE(InstallOpRecorder(*abi, OpRecorderOptions{.sample_every = kSampleEvery}));
    // Asks for no inputs itself: it only reads torch's decision.
    at::addGlobalCallback(at::RecordFunctionCallback(&ObserveStart, &ObserveEnd)
                              .needsInputs(false)
                              .scopes({at::RecordScope::FUNCTION}));
  }
};

// Runs `body` on a new thread (fresh sampling state) with its top-level
// operators observed.
template <typename Body>
void OnObservedThread(Body body) {
  std::thread worker([&] {
    t_observed = true;
    body();
    t_observed = false;
  });
  worker.join();
}

TEST_F(OpRecorderSamplingTest, SkippedOperatorsBoxNoInputsAndSampledOnesAreWhole) {
  g_top_level.clear();
  {
    std::lock_guard<std::mutex> lock(g_tracer.mutex);
    g_tracer.records.clear();
  }
  OnObservedThread([] {
    at::Tensor a = at::ones({4, 4});
    for (int i = 0; i < 9; ++i) at::matmul(a, a);  // each calls aten::mm
  });
  // ones, then nine matmuls: the 2nd, 5th, 8th top-level operators are sampled.
  ASSERT_EQ(g_top_level.size(), 10u);
  std::vector<std::string> sampled;
  for (size_t i = 0; i < g_top_level.size(); ++i) {
    const bool expect_sampled = i % kSampleEvery == 1;
    EXPECT_EQ(g_top_level[i].boxes_inputs, expect_sampled) << i << " " << g_top_level[i].name;
    if (expect_sampled) sampled.push_back(g_top_level[i].name);
  }
  EXPECT_EQ(sampled, (std::vector<std::string>{"aten::matmul", "aten::matmul", "aten::matmul"}));
  // Recorded: the three sampled matmuls with everything each calls (mm and
  // whatever else this torch runs inside), nothing of the skipped ones.
  std::map<std::string, int> count;
  for (const testing_abi::Recorded& r : g_tracer.records) {
    ++count[r.name];
    EXPECT_EQ(r.shapes.rfind("[[4,4]", 0), 0u) << r.name << " " << r.shapes;
  }
  EXPECT_EQ(count["aten::matmul"], 3);
  EXPECT_EQ(count["aten::mm"], 3);
  EXPECT_EQ(count.count("aten::ones"), 0u);
  for (const auto& [name, n] : count) EXPECT_EQ(n % 3, 0) << name;  // three whole trees
  EXPECT_EQ(g_tracer.unbalanced.load(), 0);
}

TEST_F(OpRecorderSamplingTest, InactiveTracerBoxesNothingEvenWhenSampled) {
  g_tracer.active = 0;
  at::ones({1});  // its end switches the recording callback off
  g_top_level.clear();
  OnObservedThread([] {
    at::Tensor a = at::ones({2, 2});
    for (int i = 0; i < 6; ++i) at::add(a, a);
  });
  g_tracer.active = 1;
  ASSERT_EQ(g_top_level.size(), 7u);
  for (const TopLevel& op : g_top_level) EXPECT_FALSE(op.boxes_inputs) << op.name;
}

}  // namespace
}  // namespace dynaflow
