#include "plugin/torch/input_encoding.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

namespace dynaflow {
namespace {

EncodedInputs Encode(const std::vector<c10::IValue>& inputs) {
  return EncodeInputs(c10::ArrayRef<const c10::IValue>(inputs.data(), inputs.size()));
}

TEST(InputEncodingTest, TensorsGiveSizesAndDtypeNames) {
  EncodedInputs e =
      Encode({at::zeros({2, 8}), at::zeros({4}, at::kBFloat16), at::zeros({}, at::kLong)});
  EXPECT_EQ(e.shapes, "[[2,8],[4],[]]");
  EXPECT_EQ(e.types, R"(["float","c10::BFloat16","long int"])");
}

TEST(InputEncodingTest, ScalarsListsAndOthersFollowKineto) {
  EncodedInputs e = Encode({c10::IValue(int64_t{3}), c10::IValue(2.5), c10::IValue(true),
                            c10::IValue(std::vector<int64_t>{8, 4}), c10::IValue(),
                            c10::IValue(std::string("mean"))});
  EXPECT_EQ(e.shapes, "[[],[],[],[],[],[]]");
  EXPECT_EQ(e.types, R"(["Scalar","Scalar","Scalar","ScalarList","",""])");
}

TEST(InputEncodingTest, TensorListsNestSizes) {
  EncodedInputs e = Encode({c10::IValue(std::vector<at::Tensor>{at::zeros({2, 4}), at::zeros({3})}),
                            c10::IValue(int64_t{1})});
  EXPECT_EQ(e.shapes, "[[[2,4],[3]],[]]");
  EXPECT_EQ(e.types, R"(["TensorList","Scalar"])");
}

TEST(InputEncodingTest, OptionalTensorListsKeepNonePositions) {
  c10::List<std::optional<at::Tensor>> indices;
  indices.push_back(std::nullopt);
  indices.push_back(at::zeros({5}, at::kLong));
  EncodedInputs e = Encode({c10::IValue(indices)});
  EXPECT_EQ(e.shapes, "[[[],[5]]]");
  EXPECT_EQ(e.types, R"(["TensorList"])");
}

TEST(InputEncodingTest, UndefinedTensorAndNoInputs) {
  EncodedInputs e = Encode({c10::IValue(at::Tensor())});
  EXPECT_EQ(e.shapes, "[[]]");
  EXPECT_EQ(e.types, R"([""])");
  EncodedInputs none = Encode({});
  EXPECT_EQ(none.shapes, "[]");
  EXPECT_EQ(none.types, "[]");
}

}  // namespace
}  // namespace dynaflow
