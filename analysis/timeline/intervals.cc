#include "analysis/timeline/intervals.h"

#include <algorithm>

namespace dynaflow {

IntervalSet IntervalSet::FromUnsorted(std::vector<Interval> in) {
  in.erase(std::remove_if(in.begin(), in.end(), [](const Interval& i) { return i.end <= i.start; }),
           in.end());
  std::sort(in.begin(), in.end(),
            [](const Interval& a, const Interval& b) { return a.start < b.start; });
  IntervalSet out;
  for (const Interval& i : in) {
    if (!out.intervals_.empty() && i.start <= out.intervals_.back().end) {
      out.intervals_.back().end = std::max(out.intervals_.back().end, i.end);
    } else {
      out.intervals_.push_back(i);
    }
  }
  return out;
}

IntervalSet IntervalSet::Union(const IntervalSet& other) const {
  std::vector<Interval> all = intervals_;
  all.insert(all.end(), other.intervals_.begin(), other.intervals_.end());
  return FromUnsorted(std::move(all));
}

IntervalSet IntervalSet::Subtract(const IntervalSet& other) const {
  IntervalSet out;
  size_t j = 0;
  const auto& b = other.intervals_;
  for (Interval cur : intervals_) {
    while (j < b.size() && b[j].end <= cur.start) ++j;
    size_t k = j;
    while (k < b.size() && b[k].start < cur.end) {
      if (b[k].start > cur.start) out.intervals_.push_back({cur.start, b[k].start});
      cur.start = std::max(cur.start, b[k].end);
      if (cur.start >= cur.end) break;
      ++k;
    }
    if (cur.start < cur.end) out.intervals_.push_back(cur);
  }
  return out;
}

IntervalSet IntervalSet::Intersect(const IntervalSet& other) const {
  IntervalSet out;
  size_t i = 0;
  size_t j = 0;
  const auto& a = intervals_;
  const auto& b = other.intervals_;
  while (i < a.size() && j < b.size()) {
    TimeNs s = std::max(a[i].start, b[j].start);
    TimeNs e = std::min(a[i].end, b[j].end);
    if (s < e) out.intervals_.push_back({s, e});
    if (a[i].end < b[j].end) {
      ++i;
    } else {
      ++j;
    }
  }
  return out;
}

TimeNs IntervalSet::Length() const {
  TimeNs total = 0;
  for (const Interval& i : intervals_) total += i.end - i.start;
  return total;
}

}  // namespace dynaflow
