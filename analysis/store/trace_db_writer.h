// Incremental writer of a trace.db (schemas/trace.sql): batches appended
// while the traced program runs, each one transaction.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "analysis/base/status.h"
#include "analysis/model/trace.h"

namespace SQLite {
class Database;
}

namespace dynaflow {

// How a new store trades durability for speed.
enum class TraceDbDurability {
  // WAL journal, synchronous=NORMAL: every committed Write()/SetMeta()
  // survives the process being killed (SIGKILL included) at any moment, and
  // other processes can read committed batches while the writer is open.
  kCrashSafe,
  // No journal, no syncs, exclusive lock: a crash leaves garbage, so only for
  // a temporary file that is renamed into place once complete.
  kBulk,
};

// Not thread-safe: one thread at a time may use a writer.
class TraceDbWriter {
 public:
  // Creates a new, empty store at `path` with the schema of schemas/trace.sql,
  // replacing any file there together with its -wal and -shm companions.
  // With kCrashSafe, `path` appears only once the schema is complete.
  static StatusOr<std::unique_ptr<TraceDbWriter>> Create(
      const std::string& path, TraceDbDurability durability = TraceDbDurability::kCrashSafe);

  TraceDbWriter(const TraceDbWriter&) = delete;
  TraceDbWriter& operator=(const TraceDbWriter&) = delete;
  // Close()s a writer still open, ignoring errors.
  ~TraceDbWriter();

  // Appends every record of `batch` in one transaction, through statements
  // prepared once. The batch's own StringTable is re-interned into the
  // store's `strings` table (ids stay stable across batches); devices are
  // upserted by (rank, device), a non-zero number or non-empty name replacing
  // the stored one and zero keeping it; import statistics add their counts to
  // stored ones of the same name; metadata values replace stored ones;
  // processes and threads already stored are kept. On failure the whole batch
  // is rolled back and the writer stays usable (with kBulk, which keeps no
  // journal, the file is then undefined and should be discarded).
  Status Write(const Trace& batch);

  // Inserts or replaces one metadata entry, committed at once.
  Status SetMeta(std::string_view key, std::string_view value);

  // Checkpoints the WAL into the database and switches it to
  // journal_mode=DELETE, so one self-contained file remains, then closes it.
  // Every later call fails.
  Status Close();

 private:
  struct Statements;
  TraceDbWriter(std::string path, std::unique_ptr<SQLite::Database> db);

  Status Failed(std::string_view what, const std::exception& e) const;
  // Store ids of the batch's strings and devices, interning new ones; the
  // additions are remembered until CommitIds() or RollbackIds().
  void MapStrings(const Trace& batch, std::vector<int64_t>* ids);
  void MapDevices(const Trace& batch, std::vector<int64_t>* ids);
  void CommitIds();
  void RollbackIds();
  void WriteRecords(const Trace& batch, const std::vector<int64_t>& strings,
                    const std::vector<int64_t>& devices);

  std::string path_;
  std::unique_ptr<SQLite::Database> db_;
  std::unique_ptr<Statements> st_;
  std::unordered_map<std::string, int64_t> string_ids_;
  std::unordered_map<int64_t, int64_t> device_ids_;  // (rank << 32 | device) -> devices.id
  std::vector<std::string> new_strings_;
  std::vector<int64_t> new_devices_;
};

}  // namespace dynaflow
