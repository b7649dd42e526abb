#include "runtime/policy.h"

#include <algorithm>
#include <string>

namespace dynaflow::runtime {

StatusOr<BucketPolicy> BucketPolicy::Create(std::vector<Bucket> buckets, int num_schedules) {
  BucketPolicy policy;
  std::int64_t previous_max = 0;
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    const Bucket& b = buckets[i];
    std::string where =
        "bucket " + std::to_string(i) + " (max_tokens " + std::to_string(b.max_tokens) + ")";
    if (b.max_tokens <= previous_max) {
      return Status::BadInput(where +
                              ": max_tokens must be positive and larger than the "
                              "previous bucket's");
    }
    if (b.schedule < kSequential || b.schedule >= num_schedules) {
      return Status::BadInput(where + ": schedule " + std::to_string(b.schedule) +
                              " is out of range [" + std::to_string(kSequential) + ", " +
                              std::to_string(num_schedules) + ")");
    }
    previous_max = b.max_tokens;
    policy.max_tokens_.push_back(b.max_tokens);
    policy.schedules_.push_back(b.schedule);
  }
  for (std::size_t i = 0; i < buckets.size() && buckets[i].schedule == kSequential; ++i) {
    policy.sequential_up_to_ = buckets[i].max_tokens;
  }
  return policy;
}

Choice BucketPolicy::PickBucket(std::int64_t tokens) const {
  auto it = std::lower_bound(max_tokens_.begin(), max_tokens_.end(), tokens);
  if (it == max_tokens_.end()) return Choice{kSequential};
  int bucket = static_cast<int>(it - max_tokens_.begin());
  return Choice{schedules_[bucket], bucket, *it};
}

}  // namespace dynaflow::runtime
