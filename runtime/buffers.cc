#include "runtime/buffers.h"

#include <cassert>
#include <string>

namespace dynaflow::runtime {

StatusOr<RowSplit> RowSplit::Even(std::int64_t rows, int parts) {
  if (parts < 1 || parts > rows) {
    return Status::BadInput("cannot split " + std::to_string(rows) + " rows into " +
                            std::to_string(parts) + " non-empty parts");
  }
  std::vector<std::int64_t> bounds(parts + 1, 0);
  std::int64_t base = rows / parts;
  std::int64_t larger = rows % parts;
  for (int i = 0; i < parts; ++i) bounds[i + 1] = bounds[i] + base + (i < larger ? 1 : 0);
  return RowSplit(std::move(bounds));
}

RowBuffer RowSplit::Slice(const RowBuffer& buffer, int part) const {
  assert(buffer.rows == rows());
  RowRange r = range(part);
  return RowBuffer{buffer.data + r.begin * buffer.row_bytes, r.count, buffer.row_bytes};
}

void OutputRefCounts::Reset(const Schedule& schedule) {
  std::size_t n = static_cast<std::size_t>(schedule.size());
  if (n > capacity_) {
    counts_ = std::make_unique<std::atomic<std::int32_t>[]>(n);
    capacity_ = n;
  }
  for (const Task& task : schedule.tasks()) {
    counts_[task.id].store(static_cast<std::int32_t>(schedule.dependents(task.id).size()),
                           std::memory_order_relaxed);
  }
}

void OutputRefCounts::Finished(const Task& task, const std::function<void(TaskId)>& release) {
  for (TaskId dep : task.deps) {
    // acq_rel: the releasing thread sees every other reader's work as done.
    if (counts_[dep].fetch_sub(1, std::memory_order_acq_rel) == 1) release(dep);
  }
}

}  // namespace dynaflow::runtime
