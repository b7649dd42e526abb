// Zero-copy micro-batch split and merge over contiguous buffers, and reference
// counts that release intermediates at their last reader.
//
// Splitting is taking views: micro-batch i reads rows [begin, begin + count)
// of the input in place. Merging is allocation, not copying: the caller
// allocates the whole output once and micro-batch i writes its result through
// its slice of it, so when every micro-batch is done the output is complete
// and no concatenation ever runs. A framework maps RowRange onto its own views
// (torch: tensor.narrow(0, range.begin, range.count)); RowBuffer is the same
// for raw memory.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "analysis/base/status.h"
#include "runtime/schedule.h"

namespace dynaflow::runtime {

// Rows [begin, begin + count) along the batch or token dimension.
struct RowRange {
  std::int64_t begin = 0;
  std::int64_t count = 0;
  friend bool operator==(const RowRange&, const RowRange&) = default;
};

// A contiguous buffer of `rows` rows of `row_bytes` bytes each (one row per
// sample or token). Does not own its memory, and never dereferences `data`,
// which may be a device pointer.
struct RowBuffer {
  std::byte* data = nullptr;
  std::int64_t rows = 0;
  std::int64_t row_bytes = 0;
};

// A partition of `rows` rows into consecutive, non-overlapping parts that
// cover them in order: part i is micro-batch i.
class RowSplit {
 public:
  // `parts` parts of as equal a size as possible (the first rows % parts parts
  // have one row more). BadInput unless 1 <= parts <= rows.
  static StatusOr<RowSplit> Even(std::int64_t rows, int parts);

  int parts() const { return static_cast<int>(bounds_.size()) - 1; }
  std::int64_t rows() const { return bounds_.back(); }
  RowRange range(int part) const { return {bounds_[part], bounds_[part + 1] - bounds_[part]}; }

  // Part `part` of `buffer` as a view of the same memory: no copy. Precondition:
  // buffer.rows == rows().
  RowBuffer Slice(const RowBuffer& buffer, int part) const;

 private:
  explicit RowSplit(std::vector<std::int64_t> bounds) : bounds_(std::move(bounds)) {}
  std::vector<std::int64_t> bounds_;  // parts() + 1 row offsets, from 0 to rows()
};

// Reference counts of the task outputs of one call. A task's output is read
// by the tasks that depend on it, so it holds one reference per dependent and
// is released when the last of them finishes; outputs of tasks without
// dependents (the call's results, written into caller-owned buffers) are never
// released. Executors keep one instance and Reset it per call.
class OutputRefCounts {
 public:
  // Sets every count of `schedule` to its number of dependents.
  void Reset(const Schedule& schedule);

  // `task` has finished with its inputs: drops one reference to the output of
  // each of its dependencies and passes each output whose count reaches zero to
  // `release`. Safe to call from several threads at once; each output is
  // released exactly once, by the thread that drops its last reference.
  void Finished(const Task& task, const std::function<void(TaskId)>& release);

 private:
  std::unique_ptr<std::atomic<std::int32_t>[]> counts_;
  std::size_t capacity_ = 0;
};

}  // namespace dynaflow::runtime
