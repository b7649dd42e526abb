#include "analysis/store/trace_db_writer.h"

#include <SQLiteCpp/SQLiteCpp.h>

#include <cstdio>
#include <filesystem>
#include <utility>

#include "analysis/store/store_enums.h"
#include "schemas/trace_sql.h"

namespace dynaflow {
namespace {

// How long a write waits for a reader holding a lock (e.g. the final switch
// out of WAL while `dynaflow info` reads the file) before failing.
constexpr int kBusyTimeoutMs = 5000;

int64_t DeviceKey(int32_t rank, int32_t device) {
  return (static_cast<int64_t>(rank) << 32) | static_cast<uint32_t>(device);
}

// Binds an optional id: negative values mean "absent" and are stored as NULL.
void BindOptional(SQLite::Statement& st, int index, int64_t value) {
  if (value < 0) {
    st.bind(index);
  } else {
    st.bind(index, value);
  }
}

void Run(SQLite::Statement& st) {
  st.exec();
  st.reset();
}

void RemoveStoreFiles(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
    std::remove((path + suffix).c_str());
  }
}

std::string StagingPath(const std::string& path) { return path + ".new"; }

// The schema, and the empty string as StringId 0 of every batch.
void WriteSchema(SQLite::Database& db) {
  SQLite::Transaction tx(db);
  db.exec(kTraceSql);
  db.exec("INSERT INTO strings VALUES (0, '')");
  tx.commit();
}

// The schema is written to a staging file that is renamed into place, so
// that `path`, whenever the process dies, either does not exist or is a store
// with its schema. WAL mode is a property of the file and survives the move.
std::unique_ptr<SQLite::Database> CreateCrashSafe(const std::string& path) {
  const std::string staging = StagingPath(path);
  RemoveStoreFiles(staging);
  {
    SQLite::Database db(staging, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db.exec("PRAGMA journal_mode = WAL");
    WriteSchema(db);
  }  // the last connection closing folds the WAL back in and deletes it
  std::filesystem::rename(staging, path);
  auto db = std::make_unique<SQLite::Database>(path, SQLite::OPEN_READWRITE);
  db->exec("PRAGMA synchronous = NORMAL");
  db->setBusyTimeout(kBusyTimeoutMs);
  return db;
}

std::unique_ptr<SQLite::Database> CreateBulk(const std::string& path) {
  auto db = std::make_unique<SQLite::Database>(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
  db->exec("PRAGMA journal_mode = OFF");
  db->exec("PRAGMA synchronous = OFF");
  db->exec("PRAGMA locking_mode = EXCLUSIVE");
  WriteSchema(*db);
  return db;
}

}  // namespace

struct TraceDbWriter::Statements {
  explicit Statements(SQLite::Database& db)
      : meta(db, "INSERT INTO meta VALUES (?, ?) "
                 "ON CONFLICT (key) DO UPDATE SET value = excluded.value"),
        string(db, "INSERT INTO strings VALUES (?, ?)"),
        device(db, kUpsertDevice),
        process(db, kInsertProcess),
        process_meta(db, kUpsertProcessMeta),
        distributed_info(db, kUpsertDistributedInfo),
        thread(db, "INSERT OR IGNORE INTO threads VALUES (?, ?, ?, ?)"),
        kernel(db, "INSERT INTO kernels VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"),
        memcpy(db, "INSERT INTO memcpy VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"),
        memset(db, "INSERT INTO memset VALUES (?,?,?,?,?,?,?,?,?,?,?)"),
        api(db, "INSERT INTO api_calls VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)"),
        range(db, "INSERT INTO ranges VALUES (?,?,?,?,?,?,?,?)"),
        op(db, "INSERT INTO operators VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"),
        stat(db, "INSERT INTO import_stats VALUES (?, ?, ?, ?) "
                 "ON CONFLICT (name) DO UPDATE SET count = count + excluded.count") {}

  // After a failed statement: makes every statement executable again.
  void ResetAll() {
    for (SQLite::Statement* st :
         {&meta, &string, &device, &process, &process_meta, &distributed_info, &thread, &kernel,
          &memcpy, &memset, &api, &range, &op, &stat}) {
      st->tryReset();
    }
  }

  SQLite::Statement meta, string, device, process, process_meta, distributed_info, thread, kernel,
      memcpy, memset, api, range, op, stat;
};

StatusOr<std::unique_ptr<TraceDbWriter>> TraceDbWriter::Create(const std::string& path,
                                                               TraceDbDurability durability) {
  RemoveStoreFiles(path);
  try {
    std::unique_ptr<SQLite::Database> db =
        durability == TraceDbDurability::kCrashSafe ? CreateCrashSafe(path) : CreateBulk(path);
    std::unique_ptr<TraceDbWriter> writer(new TraceDbWriter(path, std::move(db)));
    return writer;
  } catch (const std::exception& e) {
    RemoveStoreFiles(path);
    RemoveStoreFiles(StagingPath(path));
    return Status::Failure(path + ": cannot create trace store: " + e.what());
  }
}

TraceDbWriter::TraceDbWriter(std::string path, std::unique_ptr<SQLite::Database> db)
    : path_(std::move(path)), db_(std::move(db)), st_(std::make_unique<Statements>(*db_)) {
  string_ids_.emplace("", 0);
}

TraceDbWriter::~TraceDbWriter() { (void)Close(); }

Status TraceDbWriter::Failed(std::string_view what, const std::exception& e) const {
  return Status::Failure(path_ + ": cannot " + std::string(what) + ": " + e.what());
}

Status TraceDbWriter::Write(const Trace& batch) {
  if (!db_) return Status::Failure(path_ + ": trace store already closed");
  try {
    SQLite::Transaction tx(*db_);
    std::vector<int64_t> strings;
    std::vector<int64_t> devices;
    MapStrings(batch, &strings);
    MapDevices(batch, &devices);
    WriteRecords(batch, strings, devices);
    tx.commit();
  } catch (const std::exception& e) {
    st_->ResetAll();
    RollbackIds();
    return Failed("write a batch", e);
  }
  CommitIds();
  return Status::Ok();
}

Status TraceDbWriter::SetMeta(std::string_view key, std::string_view value) {
  if (!db_) return Status::Failure(path_ + ": trace store already closed");
  try {
    st_->meta.bind(1, std::string(key));
    st_->meta.bind(2, std::string(value));
    Run(st_->meta);
  } catch (const std::exception& e) {
    st_->ResetAll();
    return Failed("write metadata", e);
  }
  return Status::Ok();
}

Status TraceDbWriter::Close() {
  if (!db_) return Status::Failure(path_ + ": trace store already closed");
  Status status;
  try {
    st_.reset();  // finalized statements, so that journal_mode may change
    db_->exec("PRAGMA wal_checkpoint(TRUNCATE)");
    db_->exec("PRAGMA journal_mode = DELETE");
  } catch (const std::exception& e) {
    status = Failed("finish the trace store", e);
  }
  db_.reset();
  return status;
}

void TraceDbWriter::MapStrings(const Trace& batch, std::vector<int64_t>* ids) {
  ids->resize(batch.strings.size());
  for (size_t i = 0; i < ids->size(); ++i) {
    const std::string_view s = batch.strings.Get(static_cast<StringId>(i));
    auto [it, inserted] =
        string_ids_.try_emplace(std::string(s), static_cast<int64_t>(string_ids_.size()));
    (*ids)[i] = it->second;
    if (!inserted) continue;
    new_strings_.push_back(it->first);
    st_->string.bind(1, it->second);
    st_->string.bind(2, it->first);  // TEXT, not BLOB
    Run(st_->string);
  }
}

void TraceDbWriter::MapDevices(const Trace& batch, std::vector<int64_t>* ids) {
  SQLite::Statement& st = st_->device;
  ids->resize(batch.devices.size());
  for (size_t i = 0; i < ids->size(); ++i) {
    const DeviceInfo& d = batch.devices[i];
    const int64_t key = DeviceKey(d.rank, d.device);
    auto [it, inserted] = device_ids_.try_emplace(key, static_cast<int64_t>(device_ids_.size()));
    if (inserted) new_devices_.push_back(key);
    (*ids)[i] = it->second;
    st.bind(1, it->second);
    st.bind(2, d.rank);
    st.bind(3, d.device);
    st.bind(4, d.name);
    st.bind(5, d.sm_count);
    st.bind(6, d.cc_major);
    st.bind(7, d.cc_minor);
    st.bind(8, d.memory_bytes);
    st.bind(9, d.clock_khz);
    st.bind(10, d.memory_bandwidth_gbps);
    st.bind(11, d.peak_tflops_fp32);
    st.bind(12, d.peak_tflops_bf16);
    st.bind(13, d.peak_tflops_fp8);
    st.bind(14, d.properties_json);
    Run(st);
  }
}

void TraceDbWriter::CommitIds() {
  new_strings_.clear();
  new_devices_.clear();
}

void TraceDbWriter::RollbackIds() {
  for (const std::string& s : new_strings_) string_ids_.erase(s);
  for (int64_t key : new_devices_) device_ids_.erase(key);
  CommitIds();
}

void TraceDbWriter::WriteRecords(const Trace& t, const std::vector<int64_t>& str,
                                 const std::vector<int64_t>& dev) {
  Statements& st = *st_;
  for (const auto& [key, value] : t.metadata) {
    st.meta.bind(1, key);
    st.meta.bind(2, value);
    Run(st.meta);
  }
  for (const ProcessInfo& p : t.processes) {
    st.process.bind(1, p.rank);
    st.process.bind(2, p.pid);
    st.process.bind(3, p.name);
    st.process.bind(4, p.label);
    Run(st.process);
    for (const auto& [key, value] : p.metadata) {
      st.process_meta.bind(1, p.rank);
      st.process_meta.bind(2, p.pid);
      st.process_meta.bind(3, key);
      st.process_meta.bind(4, value);
      Run(st.process_meta);
    }
  }
  for (const auto& [rank, json] : t.distributed_info) {
    st.distributed_info.bind(1, rank);
    st.distributed_info.bind(2, json);
    Run(st.distributed_info);
  }
  for (const ThreadInfo& th : t.threads) {
    st.thread.bind(1, th.rank);
    st.thread.bind(2, th.pid);
    st.thread.bind(3, th.tid);
    st.thread.bind(4, th.name);
    Run(st.thread);
  }

  for (const GpuActivity& g : t.gpu) {
    switch (g.kind) {
      case GpuKind::kKernel:
        st.kernel.bind(1, dev[g.device_index]);
        st.kernel.bind(2, g.stream);
        st.kernel.bind(3, g.start);
        st.kernel.bind(4, g.end);
        st.kernel.bind(5, str[g.name]);
        BindOptional(st.kernel, 6, g.correlation);
        BindOptional(st.kernel, 7, g.external_id);
        for (int i = 0; i < 3; ++i) st.kernel.bind(8 + i, g.grid[i]);
        for (int i = 0; i < 3; ++i) st.kernel.bind(11 + i, g.block[i]);
        st.kernel.bind(14, g.registers);
        st.kernel.bind(15, g.shared_memory);
        BindOptional(st.kernel, 16, g.graph_id);
        BindOptional(st.kernel, 17, g.graph_node);
        BindOptional(st.kernel, 18, g.pid);
        st.kernel.bind(19, str[g.collective]);
        Run(st.kernel);
        break;
      case GpuKind::kMemcpy:
        st.memcpy.bind(1, dev[g.device_index]);
        st.memcpy.bind(2, g.stream);
        st.memcpy.bind(3, g.start);
        st.memcpy.bind(4, g.end);
        st.memcpy.bind(5, str[g.name]);
        st.memcpy.bind(6, std::string(t.strings.Get(g.copy_kind)));
        st.memcpy.bind(7, g.bytes);
        BindOptional(st.memcpy, 8, g.correlation);
        BindOptional(st.memcpy, 9, g.external_id);
        BindOptional(st.memcpy, 10, g.graph_id);
        BindOptional(st.memcpy, 11, g.graph_node);
        BindOptional(st.memcpy, 12, g.pid);
        Run(st.memcpy);
        break;
      case GpuKind::kMemset:
        st.memset.bind(1, dev[g.device_index]);
        st.memset.bind(2, g.stream);
        st.memset.bind(3, g.start);
        st.memset.bind(4, g.end);
        st.memset.bind(5, str[g.name]);
        st.memset.bind(6, g.bytes);
        BindOptional(st.memset, 7, g.correlation);
        BindOptional(st.memset, 8, g.external_id);
        BindOptional(st.memset, 9, g.graph_id);
        BindOptional(st.memset, 10, g.graph_node);
        BindOptional(st.memset, 11, g.pid);
        Run(st.memset);
        break;
    }
  }

  for (const ApiCall& a : t.api) {
    st.api.bind(1, a.rank);
    st.api.bind(2, a.pid);
    st.api.bind(3, a.tid);
    st.api.bind(4, ApiKindName(a.kind));
    st.api.bind(5, a.start);
    st.api.bind(6, a.end);
    st.api.bind(7, str[a.name]);
    BindOptional(st.api, 8, a.correlation);
    BindOptional(st.api, 9, a.external_id);
    BindOptional(st.api, 10, a.sync_device);
    BindOptional(st.api, 11, a.sync_stream);
    BindOptional(st.api, 12, a.wait_on_stream);
    BindOptional(st.api, 13, a.wait_event_id);
    BindOptional(st.api, 14, a.wait_event_correlation);
    Run(st.api);
  }

  for (const Range& r : t.ranges) {
    st.range.bind(1, r.rank);
    st.range.bind(2, r.pid);
    st.range.bind(3, r.tid);
    BindOptional(st.range, 4, r.device_index < 0 ? -1 : dev[r.device_index]);
    st.range.bind(5, DomainName(r.domain));
    st.range.bind(6, r.start);
    st.range.bind(7, r.end);
    st.range.bind(8, str[r.name]);
    Run(st.range);
  }

  for (const Operator& o : t.ops) {
    st.op.bind(1, o.rank);
    st.op.bind(2, o.pid);
    st.op.bind(3, o.tid);
    st.op.bind(4, o.start);
    st.op.bind(5, o.end);
    st.op.bind(6, str[o.name]);
    BindOptional(st.op, 7, o.sequence);
    st.op.bind(8, PassName(o.pass));
    st.op.bind(9, str[o.input_shapes]);
    st.op.bind(10, str[o.input_types]);
    st.op.bind(11, str[o.module_path]);
    BindOptional(st.op, 12, o.external_id);
    st.op.bind(13, str[o.collective]);
    st.op.bind(14, str[o.concrete_inputs]);
    st.op.bind(15, str[o.input_strides]);
    st.op.bind(16, o.in_graph_capture ? 1 : 0);
    Run(st.op);
  }

  for (const ImportStat& s : t.stats.all()) {
    st.stat.bind(1, s.name);
    st.stat.bind(2, s.severity);
    st.stat.bind(3, s.count);
    st.stat.bind(4, s.description);
    Run(st.stat);
  }
}

}  // namespace dynaflow
