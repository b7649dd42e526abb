#include "runtime/policy.h"

#include <gtest/gtest.h>

namespace dynaflow::runtime {
namespace {

constexpr int kSeq = BucketPolicy::kSequential;

void ExpectPick(const BucketPolicy& policy, std::int64_t tokens, int schedule, int bucket,
                std::int64_t padded) {
  Choice c = policy.Pick(tokens);
  EXPECT_EQ(c.schedule, schedule) << tokens << " tokens";
  if (schedule == kSeq) return;
  EXPECT_EQ(c.bucket, bucket) << tokens << " tokens";
  EXPECT_EQ(c.padded_tokens, padded) << tokens << " tokens";
}

// A plan: sequential up to 32 tokens, DBO (schedule 0) up to 512, nano-batching
// (schedule 1) up to 8192; beyond that the plan has no measurement.
TEST(BucketPolicyTest, PicksTheFirstBucketThatHoldsTheStep) {
  auto policy = BucketPolicy::Create({{32, kSeq}, {512, 0}, {8192, 1}}, 2);
  ASSERT_TRUE(policy.ok()) << policy.status().message();
  ExpectPick(*policy, 0, kSeq, 0, 0);
  ExpectPick(*policy, 32, kSeq, 0, 0);
  ExpectPick(*policy, 33, 0, 1, 512);
  ExpectPick(*policy, 512, 0, 1, 512);
  ExpectPick(*policy, 513, 1, 2, 8192);
  ExpectPick(*policy, 8192, 1, 2, 8192);
  ExpectPick(*policy, 8193, kSeq, 0, 0);
}

TEST(BucketPolicyTest, SequentialBucketsBetweenOverlappedOnes) {
  auto policy = BucketPolicy::Create({{16, 0}, {64, kSeq}, {256, 0}}, 1);
  ASSERT_TRUE(policy.ok()) << policy.status().message();
  ExpectPick(*policy, 1, 0, 0, 16);
  ExpectPick(*policy, 16, 0, 0, 16);
  ExpectPick(*policy, 17, kSeq, 0, 0);
  ExpectPick(*policy, 64, kSeq, 0, 0);
  ExpectPick(*policy, 65, 0, 2, 256);
}

TEST(BucketPolicyTest, NoBucketsMeansTheOriginalPathAlways) {
  auto policy = BucketPolicy::Create({}, 0);
  ASSERT_TRUE(policy.ok());
  ExpectPick(*policy, 0, kSeq, 0, 0);
  ExpectPick(*policy, 1 << 20, kSeq, 0, 0);
}

TEST(BucketPolicyTest, RejectsUnsortedBucketsAndUnknownSchedules) {
  struct Case {
    std::vector<Bucket> buckets;
    std::string expected;
  };
  std::vector<Case> cases = {
      {{{64, 0}, {64, 0}}, "bucket 1 (max_tokens 64): max_tokens must be positive"},
      {{{64, 0}, {32, 0}}, "bucket 1 (max_tokens 32): max_tokens must be positive"},
      {{{0, 0}}, "bucket 0 (max_tokens 0): max_tokens must be positive"},
      {{{64, 2}}, "bucket 0 (max_tokens 64): schedule 2 is out of range [-1, 2)"},
      {{{64, -2}}, "bucket 0 (max_tokens 64): schedule -2 is out of range [-1, 2)"},
  };
  for (const Case& c : cases) {
    Status st = BucketPolicy::Create(c.buckets, 2).status();
    EXPECT_EQ(st.code(), StatusCode::kBadInput);
    EXPECT_EQ(st.message().rfind(c.expected, 0), 0u) << st.message();
  }
}

}  // namespace
}  // namespace dynaflow::runtime
