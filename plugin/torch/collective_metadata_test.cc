#include "plugin/torch/collective_metadata.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/ParamCommsUtils.hpp>

namespace dynaflow {
namespace {

TEST(CollectiveMetadataTest, NamesAreEscapedForJson) {
  const torch::ParamCommsDebugInfo info(
      std::make_tuple(std::string("pg\"1\\"), std::string("a\nb")), /*rank=*/0,
      std::string("all_gather"), /*inNelems=*/8, /*outNelems=*/16, at::kFloat, {}, {},
      /*globalRankStart=*/4, /*globalRankStride=*/2, /*worldSize=*/4);
  EXPECT_EQ(EncodeCollective(info),
            R"("Collective name":"all_gather","Process Group Name":"pg\"1\\",)"
            R"("Process Group Description":"a\u000ab","In msg nelems":8,"Out msg nelems":16,)"
            R"("dtype":"Float","Group size":4,"In split size":[],"Out split size":[],)"
            R"("Global rank start":4,"Global rank stride":2)");
}

}  // namespace
}  // namespace dynaflow
