// The bucket policy: which of a plan's schedules runs a call, chosen per call
// from the number of tokens in the step.
#pragma once

#include <cstdint>
#include <vector>

#include "analysis/base/status.h"

namespace dynaflow::runtime {

// One bucket of a plan: steps of up to `max_tokens` tokens (and more than the
// previous bucket's max_tokens) run `schedule`, an index into the plan's
// schedules, or BucketPolicy::kSequential for the original path. max_tokens
// is also the size a step is padded to, so that every call of the bucket has
// the same shapes and can replay one captured CUDA graph.
struct Bucket {
  std::int64_t max_tokens = 0;
  int schedule = 0;
};

struct Choice {
  int schedule = 0;  // a schedule index, or BucketPolicy::kSequential
  // Meaningful only when schedule is not kSequential:
  int bucket = 0;                  // index of the bucket: the graph-cache key's bucket
  std::int64_t padded_tokens = 0;  // the bucket's max_tokens
};

class BucketPolicy {
 public:
  static constexpr int kSequential = -1;

  // Buckets sorted by strictly increasing max_tokens > 0, each schedule in
  // [kSequential, num_schedules); BadInput naming the bucket otherwise. No
  // buckets at all means every call runs the original path.
  static StatusOr<BucketPolicy> Create(std::vector<Bucket> buckets, int num_schedules);

  // The choice for a step of `tokens` >= 0 tokens: the first bucket whose
  // max_tokens >= tokens, found by binary search (O(log buckets)); steps beyond
  // the last bucket, which the plan did not cover, run the original path. Steps
  // small enough to fall in the leading run of sequential buckets, where
  // overlap does not pay, return after a single comparison.
  Choice Pick(std::int64_t tokens) const {
    if (tokens <= sequential_up_to_) return Choice{kSequential};
    return PickBucket(tokens);
  }

 private:
  BucketPolicy() = default;
  Choice PickBucket(std::int64_t tokens) const;

  // Largest token count whose bucket, and every bucket before it, is
  // sequential; -1 when the first bucket overlaps.
  std::int64_t sequential_up_to_ = -1;
  std::vector<std::int64_t> max_tokens_;  // searched; kept apart for locality
  std::vector<int> schedules_;
};

}  // namespace dynaflow::runtime
