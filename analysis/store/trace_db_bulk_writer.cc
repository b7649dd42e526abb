#include "analysis/store/trace_db_bulk_writer.h"

#include <sqlite3.h>
#include <unistd.h>

#include <cstdio>
#include <deque>
#include <filesystem>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "analysis/store/bounded_queue.h"
#include "analysis/store/store_enums.h"
#include "schemas/trace_sql.h"

namespace dynaflow {
namespace {

// Pages of the SQLite page cache (negative: KiB). The tables are append-only
// rowid tables, so a cache much larger than the default 2 MB buys little.
constexpr const char* kPragmas =
    "PRAGMA journal_mode = OFF;"
    "PRAGMA synchronous = OFF;"
    "PRAGMA locking_mode = EXCLUSIVE;"
    "PRAGMA temp_store = MEMORY;"
    "PRAGMA cache_size = -16384;"
    // The CHECKs of api_calls.kind, ranges.domain and operators.pass hold by
    // construction (the names come from store_enums), and each statement
    // would build an ephemeral index for their IN lists. They are back on,
    // for import_stats among others, before the small tables (WriteRest).
    "PRAGMA ignore_check_constraints = ON;";

class SqlError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void RemoveStoreFiles(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
    std::remove((path + suffix).c_str());
  }
}

// A prepared statement, bound by position (1-based) and run once per row.
class Stmt {
 public:
  Stmt() = default;
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    if (sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st_, nullptr) != SQLITE_OK) {
      throw SqlError(sqlite3_errmsg(db));
    }
  }
  Stmt(Stmt&& o) noexcept { *this = std::move(o); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  Stmt& operator=(Stmt&& o) noexcept {
    std::swap(db_, o.db_);
    std::swap(st_, o.st_);
    return *this;
  }
  ~Stmt() { sqlite3_finalize(st_); }

  void Int(int i, int64_t v) { sqlite3_bind_int64(st_, i, v); }
  void Real(int i, double v) { sqlite3_bind_double(st_, i, v); }
  void Null(int i) { sqlite3_bind_null(st_, i); }
  // Negative values mean "absent" and are stored as NULL.
  void Optional(int i, int64_t v) {
    if (v < 0) {
      sqlite3_bind_null(st_, i);
    } else {
      sqlite3_bind_int64(st_, i, v);
    }
  }
  // The text must stay alive until Run() returns.
  void Text(int i, std::string_view v) {
    sqlite3_bind_text(st_, i, v.data(), static_cast<int>(v.size()), SQLITE_STATIC);
  }
  void Run() {
    const int rc = sqlite3_step(st_);
    sqlite3_reset(st_);
    if (rc != SQLITE_DONE) throw SqlError(sqlite3_errmsg(db_));
  }

 private:
  sqlite3* db_ = nullptr;
  sqlite3_stmt* st_ = nullptr;
};

// "INSERT INTO table VALUES (?,...),(?,...),..." for `rows` rows of `cols`.
std::string InsertSql(const char* table, int cols, int rows) {
  std::string row = "(";
  for (int c = 0; c < cols; ++c) row += c == 0 ? "?" : ",?";
  row += ")";
  std::string sql = std::string("INSERT INTO ") + table + " VALUES ";
  for (int r = 0; r < rows; ++r) {
    if (r > 0) sql += ',';
    sql += row;
  }
  return sql;
}

// Rows of one table, inserted kRows at a time by one multi-row statement
// (SQLite's per-statement cost dominates one-row INSERTs), the rest one by
// one at Flush(). Rows keep their order, so rowids are those of one-row
// INSERTs. Bind(stmt, base, record) binds parameters base + 1 ... base + kCols.
template <typename Record, int kCols, typename Binder>
class Inserter {
 public:
  static constexpr int kRows = 64;

  Inserter() = default;
  Inserter(sqlite3* db, const char* table, Binder bind)
      : one_(db, InsertSql(table, kCols, 1).c_str()),
        many_(db, InsertSql(table, kCols, kRows).c_str()),
        bind_(bind) {
    pending_.reserve(kRows);
  }

  void Add(const Record& r) {
    pending_.push_back(r);
    if (pending_.size() < kRows) return;
    for (int i = 0; i < kRows; ++i) bind_(many_, i * kCols, pending_[i]);
    pending_.clear();
    many_.Run();
  }

  void Flush() {
    for (const Record& r : pending_) {
      bind_(one_, 0, r);
      one_.Run();
    }
    pending_.clear();
  }

 private:
  Stmt one_, many_;
  Binder bind_{};
  std::vector<Record> pending_;
};

void Exec(sqlite3* db, const char* sql) {
  char* error = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &error) != SQLITE_OK) {
    std::string message = error ? error : sqlite3_errmsg(db);
    sqlite3_free(error);
    throw SqlError(message);
  }
}

// Records moved out of a parser's trace, with the strings new since the last.
struct Batch {
  std::vector<std::string> strings;  // ids first_string, first_string + 1, ...
  int64_t first_string = 0;
  std::vector<GpuActivity> gpu;
  std::vector<ApiCall> api;
  std::vector<Operator> ops;
  std::vector<Range> ranges;
};

struct Memcpy {
  GpuActivity g;
  std::string_view copy_kind;  // into TraceDbBulkWriter::Impl::strings
};

void BindKernel(Stmt& st, int b, const GpuActivity& g) {
  st.Int(b + 1, g.device_index);
  st.Int(b + 2, g.stream);
  st.Int(b + 3, g.start);
  st.Int(b + 4, g.end);
  st.Int(b + 5, g.name);
  st.Optional(b + 6, g.correlation);
  st.Optional(b + 7, g.external_id);
  for (int i = 0; i < 3; ++i) st.Int(b + 8 + i, g.grid[i]);
  for (int i = 0; i < 3; ++i) st.Int(b + 11 + i, g.block[i]);
  st.Int(b + 14, g.registers);
  st.Int(b + 15, g.shared_memory);
  st.Optional(b + 16, g.graph_id);
  st.Optional(b + 17, g.graph_node);
  st.Optional(b + 18, g.pid);
  st.Int(b + 19, g.collective);
}

void BindMemcpy(Stmt& st, int b, const Memcpy& m) {
  const GpuActivity& g = m.g;
  st.Int(b + 1, g.device_index);
  st.Int(b + 2, g.stream);
  st.Int(b + 3, g.start);
  st.Int(b + 4, g.end);
  st.Int(b + 5, g.name);
  st.Text(b + 6, m.copy_kind);
  st.Int(b + 7, g.bytes);
  st.Optional(b + 8, g.correlation);
  st.Optional(b + 9, g.external_id);
  st.Optional(b + 10, g.graph_id);
  st.Optional(b + 11, g.graph_node);
  st.Optional(b + 12, g.pid);
}

void BindMemset(Stmt& st, int b, const GpuActivity& g) {
  st.Int(b + 1, g.device_index);
  st.Int(b + 2, g.stream);
  st.Int(b + 3, g.start);
  st.Int(b + 4, g.end);
  st.Int(b + 5, g.name);
  st.Int(b + 6, g.bytes);
  st.Optional(b + 7, g.correlation);
  st.Optional(b + 8, g.external_id);
  st.Optional(b + 9, g.graph_id);
  st.Optional(b + 10, g.graph_node);
  st.Optional(b + 11, g.pid);
}

void BindApi(Stmt& st, int b, const ApiCall& a) {
  st.Int(b + 1, a.rank);
  st.Int(b + 2, a.pid);
  st.Int(b + 3, a.tid);
  st.Text(b + 4, ApiKindName(a.kind));
  st.Int(b + 5, a.start);
  st.Int(b + 6, a.end);
  st.Int(b + 7, a.name);
  st.Optional(b + 8, a.correlation);
  st.Optional(b + 9, a.external_id);
  st.Optional(b + 10, a.sync_device);
  st.Optional(b + 11, a.sync_stream);
  st.Optional(b + 12, a.wait_on_stream);
  st.Optional(b + 13, a.wait_event_id);
  st.Optional(b + 14, a.wait_event_correlation);
}

void BindRange(Stmt& st, int b, const Range& r) {
  st.Int(b + 1, r.rank);
  st.Int(b + 2, r.pid);
  st.Int(b + 3, r.tid);
  st.Optional(b + 4, r.device_index);
  st.Text(b + 5, DomainName(r.domain));
  st.Int(b + 6, r.start);
  st.Int(b + 7, r.end);
  st.Int(b + 8, r.name);
}

void BindOperator(Stmt& st, int b, const Operator& o) {
  st.Int(b + 1, o.rank);
  st.Int(b + 2, o.pid);
  st.Int(b + 3, o.tid);
  st.Int(b + 4, o.start);
  st.Int(b + 5, o.end);
  st.Int(b + 6, o.name);
  st.Optional(b + 7, o.sequence);
  st.Text(b + 8, PassName(o.pass));
  st.Int(b + 9, o.input_shapes);
  st.Int(b + 10, o.input_types);
  st.Int(b + 11, o.module_path);
  st.Optional(b + 12, o.external_id);
  st.Int(b + 13, o.collective);
  st.Int(b + 14, o.concrete_inputs);
  st.Int(b + 15, o.input_strides);
  st.Int(b + 16, o.in_graph_capture ? 1 : 0);
}

template <typename Record>
using BindFn = void (*)(Stmt&, int, const Record&);

}  // namespace

struct TraceDbBulkWriter::Impl {
  explicit Impl(size_t queue_batches) : queue(queue_batches) {}
  ~Impl() { Close(); }

  std::string path;
  std::string tmp;
  sqlite3* db = nullptr;
  Stmt meta, string, device, process, process_meta, distributed_info, thread, stat;
  Inserter<GpuActivity, 19, BindFn<GpuActivity>> kernels;
  Inserter<Memcpy, 12, BindFn<Memcpy>> memcpys;
  Inserter<GpuActivity, 11, BindFn<GpuActivity>> memsets;
  Inserter<ApiCall, 14, BindFn<ApiCall>> apis;
  Inserter<Range, 8, BindFn<Range>> ranges;
  Inserter<Operator, 16, BindFn<Operator>> ops;

  BoundedQueue<std::unique_ptr<Batch>> queue;
  std::thread worker;
  std::mutex error_mu;
  std::string error;  // first failure of the writer thread
  bool finished = false;

  // Strings written so far, by id: memcpy rows store their copy kind as text.
  std::deque<std::string> strings{""};  // stable: bound as text until flushed
  int64_t taken_strings = 1;  // id 0, the empty string, comes with the schema
  bool taken_records = false;
  int64_t gpu_rows = 0, api_rows = 0, op_rows = 0;

  void Open() {
    RemoveStoreFiles(tmp);
    if (sqlite3_open_v2(tmp.c_str(), &db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        nullptr) != SQLITE_OK) {
      throw SqlError(db ? sqlite3_errmsg(db) : "out of memory");
    }
    Exec(db, kPragmas);
    Exec(db, "BEGIN");
    Exec(db, kTraceSql);
    Exec(db, "INSERT INTO strings VALUES (0, '')");
    meta = Stmt(db, "INSERT INTO meta VALUES (?, ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value");
    string = Stmt(db, "INSERT INTO strings VALUES (?, ?)");
    device = Stmt(db, kUpsertDevice);
    process = Stmt(db, kInsertProcess);
    process_meta = Stmt(db, kUpsertProcessMeta);
    distributed_info = Stmt(db, kUpsertDistributedInfo);
    thread = Stmt(db, "INSERT OR IGNORE INTO threads VALUES (?, ?, ?, ?)");
    kernels = {db, "kernels", BindKernel};
    memcpys = {db, "memcpy", BindMemcpy};
    memsets = {db, "memset", BindMemset};
    apis = {db, "api_calls", BindApi};
    ranges = {db, "ranges", BindRange};
    ops = {db, "operators", BindOperator};
    stat = Stmt(db, "INSERT INTO import_stats VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (name) DO UPDATE SET count = count + excluded.count");
    worker = std::thread([this] { WorkerLoop(); });
  }

  // Finalizes the statements and closes the connection (no commit).
  void Close() {
    if (worker.joinable()) {
      queue.Close();
      worker.join();
    }
    meta = Stmt(), string = Stmt(), device = Stmt(), process = Stmt(), thread = Stmt();
    process_meta = Stmt(), distributed_info = Stmt();
    stat = Stmt();
    kernels = {}, memcpys = {}, memsets = {}, apis = {}, ranges = {}, ops = {};
    if (db) sqlite3_close_v2(db);
    db = nullptr;
  }

  void WorkerLoop() {
    std::unique_ptr<Batch> batch;
    while (queue.Pop(&batch)) {
      {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error.empty()) continue;  // drain, write nothing more
      }
      try {
        WriteStrings(batch->first_string, batch->strings);
        WriteRecords(batch->gpu, batch->api, batch->ops, batch->ranges);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(error_mu);
        error = e.what();
      }
      batch.reset();  // free the records here, not on the parsing thread
    }
  }

  template <typename Strings>
  void WriteStrings(int64_t first, const Strings& values) {
    if (first != static_cast<int64_t>(strings.size())) throw SqlError("string ids out of order");
    for (const auto& v : values) {
      const std::string_view s = v;
      const int64_t id = static_cast<int64_t>(strings.size());
      strings.emplace_back(s);
      string.Int(1, id);
      string.Text(2, s);
      string.Run();
    }
  }

  void WriteRecords(std::span<const GpuActivity> gpu, std::span<const ApiCall> api_calls,
                    std::span<const Operator> operators, std::span<const Range> rs) {
    for (const GpuActivity& g : gpu) {
      switch (g.kind) {
        case GpuKind::kKernel:
          kernels.Add(g);
          break;
        case GpuKind::kMemcpy:
          memcpys.Add({g, String(g.copy_kind)});
          break;
        case GpuKind::kMemset:
          memsets.Add(g);
          break;
      }
    }
    gpu_rows += static_cast<int64_t>(gpu.size());
    for (const ApiCall& a : api_calls) apis.Add(a);
    api_rows += static_cast<int64_t>(api_calls.size());
    for (const Range& r : rs) ranges.Add(r);
    for (const Operator& o : operators) ops.Add(o);
    op_rows += static_cast<int64_t>(operators.size());
  }

  // Inserts the rows that wait for a full multi-row statement.
  void FlushRecords() {
    kernels.Flush();
    memcpys.Flush();
    memsets.Flush();
    apis.Flush();
    ranges.Flush();
    ops.Flush();
  }

  std::string_view String(StringId id) const {
    if (id >= strings.size()) throw SqlError("string id out of range");
    return strings[id];
  }

  // The small tables, after every record; `t`'s devices are ids 0, 1, ...
  void WriteRest(const Trace& t) {
    Exec(db, "PRAGMA ignore_check_constraints = OFF");  // re-prepares what runs next
    for (size_t i = 0; i < t.devices.size(); ++i) {
      const DeviceInfo& d = t.devices[i];
      device.Int(1, static_cast<int64_t>(i));
      device.Int(2, d.rank);
      device.Int(3, d.device);
      device.Text(4, d.name);
      device.Int(5, d.sm_count);
      device.Int(6, d.cc_major);
      device.Int(7, d.cc_minor);
      device.Int(8, d.memory_bytes);
      device.Int(9, d.clock_khz);
      device.Real(10, d.memory_bandwidth_gbps);
      device.Real(11, d.peak_tflops_fp32);
      device.Real(12, d.peak_tflops_bf16);
      device.Real(13, d.peak_tflops_fp8);
      device.Text(14, d.properties_json);
      device.Run();
    }
    for (const auto& [key, value] : t.metadata) {
      meta.Text(1, key);
      meta.Text(2, value);
      meta.Run();
    }
    for (const ProcessInfo& p : t.processes) {
      process.Int(1, p.rank);
      process.Int(2, p.pid);
      process.Text(3, p.name);
      process.Text(4, p.label);
      process.Run();
      for (const auto& [key, value] : p.metadata) {
        process_meta.Int(1, p.rank);
        process_meta.Int(2, p.pid);
        process_meta.Text(3, key);
        process_meta.Text(4, value);
        process_meta.Run();
      }
    }
    for (const auto& [rank, json] : t.distributed_info) {
      distributed_info.Int(1, rank);
      distributed_info.Text(2, json);
      distributed_info.Run();
    }
    for (const ThreadInfo& th : t.threads) {
      thread.Int(1, th.rank);
      thread.Int(2, th.pid);
      thread.Int(3, th.tid);
      thread.Text(4, th.name);
      thread.Run();
    }
    for (const ImportStat& s : t.stats.all()) {
      stat.Text(1, s.name);
      stat.Text(2, s.severity);
      stat.Int(3, s.count);
      stat.Text(4, s.description);
      stat.Run();
    }
  }

  // Runs before the remaining records are written: every row is a taken one.
  // Rows that the offset moves beyond +-kMaxAbsTimeNs are deleted, as
  // ShiftTimes (kineto_parser.h) removes them from the model.
  void ShiftTakenTimes(int64_t offset_ns) {
    for (const char* table :
         {"kernels", "memcpy", "memset", "api_calls", "operators", "ranges"}) {
      const std::string name(table);
      Stmt drop(db, ("DELETE FROM " + name +
                     " WHERE start_ns + ?1 NOT BETWEEN ?2 AND ?3"
                     " OR end_ns + ?1 NOT BETWEEN ?2 AND ?3").c_str());
      drop.Int(1, offset_ns);
      drop.Int(2, -kMaxAbsTimeNs);
      drop.Int(3, kMaxAbsTimeNs);
      drop.Run();
      Stmt update(db, ("UPDATE " + name + " SET start_ns = start_ns + ?1, end_ns = end_ns + ?1")
                          .c_str());
      update.Int(1, offset_ns);
      update.Run();
    }
  }

  void SetTakenRank(int32_t rank) {
    for (const char* table : {"api_calls", "operators", "ranges"}) {
      const std::string sql =
          "UPDATE " + std::string(table) + " SET rank = ?1 WHERE rank <> ?1";
      Stmt update(db, sql.c_str());
      update.Int(1, rank);
      update.Run();
    }
  }
};

TraceDbBulkWriter::TraceDbBulkWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TraceDbBulkWriter::~TraceDbBulkWriter() { Abort(); }

StatusOr<std::unique_ptr<TraceDbBulkWriter>> TraceDbBulkWriter::Start(const std::string& path,
                                                                      size_t queue_batches) {
  // Renaming over /dev/null or a FIFO would replace it with a file (as root).
  std::error_code probe;
  const auto status = std::filesystem::status(path, probe);
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    return Status::BadInput(path + ": not a regular file; a trace.db must be one");
  }
  // SQLite's memory statistics take a global mutex on every allocation; they
  // can only be turned off before SQLite initializes (later, this is a no-op).
  static std::once_flag no_memstatus;
  std::call_once(no_memstatus, [] { sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0); });
  auto impl = std::make_unique<Impl>(queue_batches);
  impl->path = path;
  impl->tmp = path + ".tmp-" + std::to_string(getpid());
  try {
    impl->Open();
  } catch (const std::exception& e) {
    impl->Close();
    RemoveStoreFiles(impl->tmp);
    return Status::Failure(path + ": cannot create trace store: " + e.what());
  }
  return std::unique_ptr<TraceDbBulkWriter>(new TraceDbBulkWriter(std::move(impl)));
}

void TraceDbBulkWriter::Take(Trace* part) {
  Impl& m = *impl_;
  if (m.finished || !m.worker.joinable()) return;
  auto batch = std::make_unique<Batch>();
  batch->first_string = m.taken_strings;
  for (auto id = static_cast<size_t>(m.taken_strings); id < part->strings.size(); ++id) {
    batch->strings.emplace_back(part->strings.Get(static_cast<StringId>(id)));
  }
  m.taken_strings = static_cast<int64_t>(part->strings.size());
  batch->gpu = std::move(part->gpu);
  batch->api = std::move(part->api);
  batch->ops = std::move(part->ops);
  batch->ranges = std::move(part->ranges);
  part->gpu.clear();
  part->api.clear();
  part->ops.clear();
  part->ranges.clear();
  m.taken_records = true;
  m.queue.Push(std::move(batch));
}

Status TraceDbBulkWriter::Finish(const Trace& trace, int32_t taken_rank,
                                 int64_t taken_offset_ns) {
  Impl& m = *impl_;
  if (m.finished) return Status::Failure(m.path + ": trace store already finished");
  m.finished = true;
  m.queue.Close();
  if (m.worker.joinable()) m.worker.join();  // this thread owns the connection from here
  std::string error = m.error;
  if (error.empty()) {
    try {
      std::vector<std::string_view> rest;
      for (auto id = static_cast<size_t>(m.taken_strings); id < trace.strings.size(); ++id) {
        rest.push_back(trace.strings.Get(static_cast<StringId>(id)));
      }
      if (m.taken_records && taken_offset_ns != 0) {
        m.FlushRecords();  // rows still waiting for a multi-row statement are taken ones
        m.ShiftTakenTimes(taken_offset_ns);
      }
      m.WriteStrings(m.taken_strings, rest);
      m.taken_strings = static_cast<int64_t>(trace.strings.size());
      m.WriteRecords(trace.gpu, trace.api, trace.ops, trace.ranges);
      m.FlushRecords();
      if (m.taken_records && taken_rank != 0) m.SetTakenRank(taken_rank);
      m.WriteRest(trace);
      Exec(m.db, "COMMIT");
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  m.Close();
  if (error.empty()) {
    std::error_code ec;
    std::filesystem::rename(m.tmp, m.path, ec);
    if (!ec) return Status::Ok();
    RemoveStoreFiles(m.tmp);
    return Status::Failure(m.path + ": cannot write: " + ec.message());
  }
  RemoveStoreFiles(m.tmp);
  return Status::Failure(m.path + ": cannot write trace store: " + error);
}

void TraceDbBulkWriter::Abort() {
  if (!impl_ || impl_->finished) return;
  impl_->finished = true;
  impl_->Close();
  RemoveStoreFiles(impl_->tmp);
}

int64_t TraceDbBulkWriter::gpu_rows() const { return impl_->gpu_rows; }
int64_t TraceDbBulkWriter::api_rows() const { return impl_->api_rows; }
int64_t TraceDbBulkWriter::op_rows() const { return impl_->op_rows; }

}  // namespace dynaflow
