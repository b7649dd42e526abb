// The fast path that writes a whole new trace.db (schemas/trace.sql) for
// `dynaflow import`: the raw SQLite C API (no per-call mutex, statements
// prepared once, text bound without copies), no journal and no syncs, one
// transaction, into a temporary file beside the target that is renamed into
// place only when complete. Rows can be handed over while the input is still
// being parsed (Take); a second thread writes them meanwhile.
//
// Not crash-safe while it runs (a crash leaves at most the temporary file,
// never a partial target); tracers that must survive being killed use
// TraceDbWriter with TraceDbDurability::kCrashSafe instead.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "analysis/base/status.h"
#include "analysis/model/trace.h"

namespace dynaflow {

class TraceDbBulkWriter {
 public:
  // Prepares to write `path` (replaced when complete): BadInput when `path`
  // exists and is not a regular file, Failure when the temporary file cannot
  // be created. `queue_batches` bounds how many taken batches may wait for
  // the writer thread (the parser blocks beyond that).
  static StatusOr<std::unique_ptr<TraceDbBulkWriter>> Start(const std::string& path,
                                                            size_t queue_batches = 8);

  TraceDbBulkWriter(const TraceDbBulkWriter&) = delete;
  TraceDbBulkWriter& operator=(const TraceDbBulkWriter&) = delete;
  // Abort()s unless Finish() was called.
  ~TraceDbBulkWriter();

  // Moves the GPU activities, API calls, operators and ranges that `part`
  // holds so far to the writer thread (leaving those vectors empty), with the
  // strings interned since the previous call. Their StringIds and device
  // indices must be final, i.e. `part` is the trace that Finish() gets (or is
  // moved whole into it), and a single input: every taken API call, operator
  // and range gets the rank given to Finish().
  void Take(Trace* part);

  // Writes what `trace` still holds (its remaining records, then strings not
  // taken yet, devices, metadata, processes, threads and statistics), gives
  // the taken records rank `taken_rank`, commits and renames the file into
  // place; `taken_offset_ns` is added to the times of the taken records
  // (RecordSink::SetTakenTimeOffset). On failure nothing is left at the
  // target path.
  Status Finish(const Trace& trace, int32_t taken_rank = 0, int64_t taken_offset_ns = 0);

  // Stops the writer thread and removes the temporary file.
  void Abort();

  // Rows written (taken plus remaining), for messages.
  int64_t gpu_rows() const;
  int64_t api_rows() const;
  int64_t op_rows() const;

 private:
  struct Impl;
  explicit TraceDbBulkWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dynaflow
