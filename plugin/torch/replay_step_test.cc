#include "plugin/torch/replay_step.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>

namespace dynaflow {
namespace {

constexpr int64_t kRows = ReplayStep::kRows;
constexpr int64_t kBound = ReplayStep::kBound;

// A step of a graph captured at 4 rows: a row leaf [4, 3], a shared leaf [2]
// and a bound leaf (the program's own [4, 3] tensor, written in place).
struct Fixture {
  at::Tensor row_static = at::full({4, 3}, -1.0);
  at::Tensor shared_static = at::zeros({2});
  at::Tensor program = at::zeros({4, 3});
  ReplayStep step{{row_static, shared_static, program}, {kRows, 0, kRows | kBound}, 4};
};

TEST(ReplayStepTest, CopiesTheCallsRowsIntoTheFirstRowsOfTheStaticInputs) {
  Fixture f;
  const at::Tensor x = at::arange(9, at::kFloat).reshape({3, 3});
  const at::Tensor shared = at::tensor({5.0f, 6.0f});
  const at::Tensor ignored = at::full({3, 3}, 42.0);
  f.step.CopyIn({x, shared, ignored}, 3);
  EXPECT_TRUE(at::equal(f.row_static.narrow(0, 0, 3), x));
  // The padding row keeps what the capture put there.
  EXPECT_TRUE(at::equal(f.row_static[3], at::full({3}, -1.0)));
  EXPECT_TRUE(at::equal(f.shared_static, shared));
  // A bound leaf is the program's tensor: nothing is copied into it.
  EXPECT_TRUE(at::equal(f.program, at::zeros({4, 3})));
}

TEST(ReplayStepTest, CopiesAFullCallWhole) {
  Fixture f;
  const at::Tensor x = at::randn({4, 3});
  f.step.CopyIn({x, at::ones({2}), f.program}, 4);
  EXPECT_TRUE(at::equal(f.row_static, x));
}

TEST(ReplayStepTest, CopiesTheFirstRowsOfEachOutputOut) {
  Fixture f;
  // A [4, 2] output and a flattened [4 * 2, 5] one.
  const at::Tensor a = at::arange(8, at::kFloat).reshape({4, 2});
  const at::Tensor b = at::arange(40, at::kFloat).reshape({8, 5});
  f.step.SetOutputs({a, b});
  std::vector<at::Tensor> out = f.step.CopyOut(3);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(at::equal(out[0], a.narrow(0, 0, 3)));
  EXPECT_EQ(out[1].size(0), 6);
  EXPECT_TRUE(at::equal(out[1], b.narrow(0, 0, 6)));
  // A copy: the next replay overwrites the static outputs, not these.
  a.fill_(0);
  EXPECT_EQ(out[0][2][1].item<float>(), 5.0f);
}

std::string MessageOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

TEST(ReplayStepTest, RefusesWhatDoesNotFitTheCapture) {
  Fixture f;
  EXPECT_NE(MessageOf([&] { f.step.CopyIn({at::zeros({5, 3}), at::zeros({2}), f.program}, 5); })
                .find("a call of 5 rows cannot replay a graph of 4"),
            std::string::npos);
  EXPECT_NE(MessageOf([&] { f.step.CopyIn({at::zeros({3, 3})}, 3); })
                .find("1 leaves for a graph of 3"),
            std::string::npos);
  EXPECT_NE(MessageOf([&] { f.step.SetOutputs({at::zeros({6, 2})}); })
                .find("output 0 does not hold a multiple of 4 rows"),
            std::string::npos);
  EXPECT_NE(MessageOf([] { ReplayStep({at::zeros({3, 2})}, {kRows}, 4); })
                .find("leaf 0's static input does not hold 4 rows"),
            std::string::npos);
  EXPECT_NE(MessageOf([] { ReplayStep({at::zeros({3, 2})}, {kRows, 0}, 4); })
                .find("1 inputs and 2 flags"),
            std::string::npos);
  EXPECT_NE(MessageOf([&] { f.step.CopyOut(0); }).find("a call of 0 rows"), std::string::npos);
}

}  // namespace
}  // namespace dynaflow
