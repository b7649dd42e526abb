#include "plugin/torch/op_recorder.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/distributed/c10d/ParamCommsUtils.hpp>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "plugin/torch/module_stack.h"

#include "plugin/torch/fake_tracer_abi_testing.h"

namespace dynaflow {
namespace {

using testing_abi::g_tracer;
using testing_abi::Recorded;

class OpRecorderTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::optional<TracerAbi> abi = FindTracerAbi();
    ASSERT_TRUE(abi.has_value());
    ASSERT_TRUE(InstallOpRecorder(*abi, OpRecorderOptions{}));
  }

  void SetUp() override {
    g_tracer.active = 1;
    std::lock_guard<std::mutex> lock(g_tracer.mutex);
    g_tracer.records.clear();
  }

  void TearDown() override {
    EXPECT_EQ(g_tracer.unbalanced.load(), 0);
    EXPECT_EQ(testing_abi::PushedOnThisThread(), 0u);
  }

  static std::vector<Recorded> Records() {
    std::lock_guard<std::mutex> lock(g_tracer.mutex);
    return g_tracer.records;
  }

  static std::optional<Recorded> Find(const std::string& name) {
    for (const Recorded& r : Records()) {
      if (r.name == name) return r;
    }
    return std::nullopt;
  }
};

TEST_F(OpRecorderTest, RecordsOperatorsWithShapesModuleAndNesting) {
  at::Tensor x = at::randn({2, 8});
  at::Tensor w = at::randn({4, 8});
  at::Tensor b = at::randn({4});
  PushModule(InternModulePath("Net.layers.0.fc"));
  at::linear(x, w, b);
  PopModule();

  std::optional<Recorded> linear = Find("aten::linear");
  ASSERT_TRUE(linear.has_value());
  EXPECT_EQ(linear->shapes, "[[2,8],[4,8],[4]]");
  EXPECT_EQ(linear->types, R"(["float","float","float"])");
  EXPECT_EQ(linear->module_path, "Net.layers.0.fc");
  EXPECT_EQ(linear->pass, DYNAFLOW_PASS_FORWARD);
  EXPECT_EQ(linear->tid, static_cast<int32_t>(syscall(SYS_gettid)));
  EXPECT_LT(linear->start_ns, linear->end_ns);

  std::optional<Recorded> addmm = Find("aten::addmm");
  ASSERT_TRUE(addmm.has_value());
  EXPECT_EQ(addmm->module_path, "Net.layers.0.fc");
  EXPECT_GT(addmm->start_ns, linear->start_ns);
  EXPECT_LT(addmm->end_ns, linear->end_ns);
  EXPECT_NE(addmm->id, linear->id);
}

TEST_F(OpRecorderTest, OutsideModulesAndAutogradThePassIsUnknown) {
  c10::InferenceMode guard;
  at::add(at::ones({3}), at::ones({3}));
  std::optional<Recorded> add = Find("aten::add");
  ASSERT_TRUE(add.has_value());
  EXPECT_EQ(add->pass, DYNAFLOW_PASS_UNKNOWN);
  EXPECT_EQ(add->sequence, -1);
  EXPECT_EQ(add->module_path, "");
}

TEST_F(OpRecorderTest, BackwardOperatorsAreMarkedBackward) {
  at::Tensor x = at::randn({4, 4}).set_requires_grad(true);
  at::Tensor loss = at::mul(x, 2.0).sum();
  torch::autograd::backward({loss});

  // Records arrive in end order: the autograd-level aten::mul (with a
  // sequence number) after the kernel-level one it calls.
  int forward_muls = 0;
  int backward_muls = 0;
  for (const Recorded& r : Records()) {
    if (r.name == "aten::mul" && r.sequence >= 0) {
      EXPECT_EQ(r.pass, DYNAFLOW_PASS_FORWARD);
      ++forward_muls;
    }
    if (r.name == "aten::mul" && r.pass == DYNAFLOW_PASS_BACKWARD) ++backward_muls;
  }
  EXPECT_EQ(forward_muls, 1);
  EXPECT_EQ(backward_muls, 2);  // MulBackward1: the gradient times 2, and its kernel

  std::optional<Recorded> node = Find("MulBackward1");
  ASSERT_TRUE(node.has_value());
  EXPECT_EQ(node->pass, DYNAFLOW_PASS_BACKWARD);
  EXPECT_GE(node->sequence, 0);
  std::optional<Recorded> engine = Find("autograd::engine::evaluate_function: MulBackward1");
  ASSERT_TRUE(engine.has_value());
  EXPECT_EQ(engine->pass, DYNAFLOW_PASS_BACKWARD);
}

// c10d's collectives open record_param_comms this way (RECORD_PARAM_COMMS in
// ProcessGroupNCCL and ProcessGroupGloo).
void AllReduceLikeC10d() {
  const std::vector<int64_t> in_splits = {512, 512};
  const std::vector<int64_t> out_splits;
  RECORD_PARAM_COMMS(static_cast<int64_t>(3),                                   // seq
                     std::make_tuple(std::string("0"), std::string("default_pg")),  // group
                     /*rank=*/1, "allreduce", /*inNelems=*/1024, /*outNelems=*/1024,
                     at::kBFloat16, in_splits, out_splits,
                     /*globalRankStart=*/0, /*globalRankStride=*/1, /*worldSize=*/2);
}

TEST_F(OpRecorderTest, RecordParamCommsCarriesItsCollectiveMetadata) {
  AllReduceLikeC10d();
  std::optional<Recorded> comms = Find("record_param_comms");
  ASSERT_TRUE(comms.has_value());
  EXPECT_EQ(comms->collective,
            R"("Collective name":"allreduce","Process Group Name":"0",)"
            R"("Process Group Description":"default_pg","In msg nelems":1024,)"
            R"("Out msg nelems":1024,"dtype":"BFloat16","Group size":2,)"
            R"("In split size":[512,512],"Out split size":[],"Global rank start":0,)"
            R"("Global rank stride":1)");
  at::add(at::ones({3}), at::ones({3}));
  std::optional<Recorded> add = Find("aten::add");
  ASSERT_TRUE(add.has_value());
  EXPECT_EQ(add->collective, "");  // other operators carry none
}

TEST_F(OpRecorderTest, InactiveTracerRecordsNothing) {
  g_tracer.active = 0;
  at::matmul(at::ones({2, 2}), at::ones({2, 2}));
  EXPECT_TRUE(Records().empty());
}

// While the tracer is inactive the recording callback (the one torch boxes
// inputs for) is off: only the nesting callback runs, and it asks the tracer
// for its state once per top-level operator, at its end. It comes back at the
// end of the first top-level operator after the tracer becomes active.
TEST_F(OpRecorderTest, WhileInactiveOnlyTheNestingCallbackRuns) {
  g_tracer.active = 0;
  at::Tensor a = at::ones({4, 4});  // its end switches the recording callback off
  g_tracer.active_queries = 0;
  at::matmul(a, a).sum();  // top-level operators that call others
  EXPECT_EQ(g_tracer.active_queries.load(), 2);  // matmul's end and sum's end only
  EXPECT_TRUE(Records().empty());

  g_tracer.active = 1;
  at::ones({2, 2});  // switches it back on at its end: itself not recorded
  EXPECT_TRUE(Records().empty());
  at::matmul(a, a);
  EXPECT_TRUE(Find("aten::matmul").has_value());
  EXPECT_TRUE(Find("aten::mm").has_value());  // with what it calls
}

TEST_F(OpRecorderTest, EachThreadHasItsOwnModuleStackAndThreadId) {
  PushModule(InternModulePath("Main"));
  int32_t worker_tid = 0;
  std::thread worker([&] {
    worker_tid = static_cast<int32_t>(syscall(SYS_gettid));
    at::sub(at::ones({2}), at::ones({2}));
  });
  worker.join();
  PopModule();
  std::optional<Recorded> sub = Find("aten::sub");
  ASSERT_TRUE(sub.has_value());
  EXPECT_EQ(sub->tid, worker_tid);
  EXPECT_EQ(sub->module_path, "");
}

TEST(ModuleStackTest, InternedPathsAreStableAndShared) {
  const char* a = InternModulePath("Net.mlp");
  EXPECT_EQ(a, InternModulePath(std::string("Net.") + "mlp"));
  EXPECT_STREQ(a, "Net.mlp");
  EXPECT_EQ(CurrentModulePath(), nullptr);
  PushModule(a);
  PushModule(InternModulePath("Net.mlp.up"));
  EXPECT_STREQ(CurrentModulePath(), "Net.mlp.up");
  EXPECT_EQ(ModuleDepth(), 2u);
  PopModule();
  PopModule();
  PopModule();  // one too many: harmless
  EXPECT_EQ(ModuleDepth(), 0u);
}

}  // namespace
}  // namespace dynaflow
