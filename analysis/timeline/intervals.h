// Interval algebra on half-open nanosecond intervals [start, end).
#pragma once

#include <vector>

#include "analysis/model/trace.h"

namespace dynaflow {

struct Interval {
  TimeNs start = 0;
  TimeNs end = 0;
  friend bool operator==(const Interval&, const Interval&) = default;
};

// A union of intervals kept sorted and disjoint: overlapping or touching
// inputs are merged and empty ones (end <= start) dropped.
class IntervalSet {
 public:
  IntervalSet() = default;
  static IntervalSet FromUnsorted(std::vector<Interval> intervals);

  IntervalSet Union(const IntervalSet& other) const;
  // This set minus `other`.
  IntervalSet Subtract(const IntervalSet& other) const;
  IntervalSet Intersect(const IntervalSet& other) const;

  // Total covered length.
  TimeNs Length() const;
  bool empty() const { return intervals_.empty(); }
  TimeNs first_start() const { return intervals_.front().start; }
  TimeNs last_end() const { return intervals_.back().end; }
  const std::vector<Interval>& intervals() const { return intervals_; }

 private:
  std::vector<Interval> intervals_;
};

}  // namespace dynaflow
