#include "analysis/store/store.h"

#include <SQLiteCpp/SQLiteCpp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "schemas/trace_sql.h"

namespace dynaflow {
namespace {

// Rows per transaction: large enough to amortise the commit, small enough to
// keep the journal-less write bounded if the process dies mid-way.
constexpr int kRowsPerTransaction = 200000;

const char* ApiKindName(ApiKind k) {
  switch (k) {
    case ApiKind::kRuntime: return "runtime";
    case ApiKind::kDriver: return "driver";
    case ApiKind::kSync: return "sync";
  }
  return "runtime";
}

ApiKind ApiKindFromName(std::string_view s) {
  if (s == "driver") return ApiKind::kDriver;
  if (s == "sync") return ApiKind::kSync;
  return ApiKind::kRuntime;
}

const char* DomainName(RangeDomain d) {
  switch (d) {
    case RangeDomain::kUser: return "user";
    case RangeDomain::kGpuUser: return "gpu_user";
    case RangeDomain::kNvtx: return "nvtx";
  }
  return "user";
}

RangeDomain DomainFromName(std::string_view s) {
  if (s == "gpu_user") return RangeDomain::kGpuUser;
  if (s == "nvtx") return RangeDomain::kNvtx;
  return RangeDomain::kUser;
}

const char* PassName(Pass p) {
  switch (p) {
    case Pass::kForward: return "forward";
    case Pass::kBackward: return "backward";
    case Pass::kUnknown: return "unknown";
  }
  return "unknown";
}

Pass PassFromName(std::string_view s) {
  if (s == "forward") return Pass::kForward;
  if (s == "backward") return Pass::kBackward;
  return Pass::kUnknown;
}

// Binds an optional id: negative values mean "absent" and are stored as NULL.
void BindOptional(SQLite::Statement& st, int index, int64_t value) {
  if (value < 0) {
    st.bind(index);
  } else {
    st.bind(index, value);
  }
}

int64_t OptionalColumn(const SQLite::Statement& st, int index) {
  return st.isColumnNull(index) ? -1 : st.getColumn(index).getInt64();
}

// Commits every kRowsPerTransaction rows.
class BatchedTransaction {
 public:
  explicit BatchedTransaction(SQLite::Database& db) : db_(db) { db_.exec("BEGIN"); }
  void Row() {
    if (++rows_ % kRowsPerTransaction == 0) {
      db_.exec("COMMIT");
      db_.exec("BEGIN");
    }
  }
  void Commit() { db_.exec("COMMIT"); }

 private:
  SQLite::Database& db_;
  int64_t rows_ = 0;
};

void Insert(SQLite::Statement& st, BatchedTransaction& tx) {
  st.exec();
  st.reset();
  tx.Row();
}

void WriteAll(const Trace& t, SQLite::Database& db) {
  db.exec("PRAGMA journal_mode = OFF");
  db.exec("PRAGMA synchronous = OFF");
  db.exec("PRAGMA locking_mode = EXCLUSIVE");
  db.exec(kTraceSql);
  BatchedTransaction tx(db);

  SQLite::Statement meta(db, "INSERT INTO meta VALUES (?, ?)");
  for (const auto& [k, v] : t.metadata) {
    meta.bind(1, k);
    meta.bind(2, v);
    Insert(meta, tx);
  }

  SQLite::Statement str(db, "INSERT INTO strings VALUES (?, ?)");
  for (size_t i = 0; i < t.strings.size(); ++i) {
    str.bind(1, static_cast<int64_t>(i));
    str.bind(2, std::string(t.strings.Get(static_cast<StringId>(i))));  // TEXT, not BLOB
    Insert(str, tx);
  }

  SQLite::Statement dev(db, "INSERT INTO devices VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)");
  for (size_t i = 0; i < t.devices.size(); ++i) {
    const DeviceInfo& d = t.devices[i];
    dev.bind(1, static_cast<int64_t>(i));
    dev.bind(2, d.rank);
    dev.bind(3, d.device);
    dev.bind(4, d.name);
    dev.bind(5, d.sm_count);
    dev.bind(6, d.cc_major);
    dev.bind(7, d.cc_minor);
    dev.bind(8, d.memory_bytes);
    dev.bind(9, d.clock_khz);
    dev.bind(10, d.memory_bandwidth_gbps);
    dev.bind(11, d.peak_tflops_fp32);
    dev.bind(12, d.peak_tflops_bf16);
    dev.bind(13, d.peak_tflops_fp8);
    Insert(dev, tx);
  }

  SQLite::Statement proc(db, "INSERT OR IGNORE INTO processes VALUES (?, ?, ?)");
  for (const ProcessInfo& p : t.processes) {
    proc.bind(1, p.rank);
    proc.bind(2, p.pid);
    proc.bind(3, p.name);
    Insert(proc, tx);
  }
  SQLite::Statement thr(db, "INSERT OR IGNORE INTO threads VALUES (?, ?, ?, ?)");
  for (const ThreadInfo& th : t.threads) {
    thr.bind(1, th.rank);
    thr.bind(2, th.pid);
    thr.bind(3, th.tid);
    thr.bind(4, th.name);
    Insert(thr, tx);
  }

  SQLite::Statement kern(db,
                         "INSERT INTO kernels VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
  SQLite::Statement copy(db, "INSERT INTO memcpy VALUES (?,?,?,?,?,?,?,?,?)");
  SQLite::Statement fill(db, "INSERT INTO memset VALUES (?,?,?,?,?,?,?,?)");
  for (const GpuActivity& g : t.gpu) {
    switch (g.kind) {
      case GpuKind::kKernel:
        kern.bind(1, g.device_index);
        kern.bind(2, g.stream);
        kern.bind(3, g.start);
        kern.bind(4, g.end);
        kern.bind(5, g.name);
        BindOptional(kern, 6, g.correlation);
        BindOptional(kern, 7, g.external_id);
        for (int i = 0; i < 3; ++i) kern.bind(8 + i, g.grid[i]);
        for (int i = 0; i < 3; ++i) kern.bind(11 + i, g.block[i]);
        kern.bind(14, g.registers);
        kern.bind(15, g.shared_memory);
        BindOptional(kern, 16, g.graph_id);
        BindOptional(kern, 17, g.graph_node);
        Insert(kern, tx);
        break;
      case GpuKind::kMemcpy: {
        copy.bind(1, g.device_index);
        copy.bind(2, g.stream);
        copy.bind(3, g.start);
        copy.bind(4, g.end);
        copy.bind(5, g.name);
        copy.bind(6, std::string(t.strings.Get(g.copy_kind)));
        copy.bind(7, g.bytes);
        BindOptional(copy, 8, g.correlation);
        BindOptional(copy, 9, g.external_id);
        Insert(copy, tx);
        break;
      }
      case GpuKind::kMemset:
        fill.bind(1, g.device_index);
        fill.bind(2, g.stream);
        fill.bind(3, g.start);
        fill.bind(4, g.end);
        fill.bind(5, g.name);
        fill.bind(6, g.bytes);
        BindOptional(fill, 7, g.correlation);
        BindOptional(fill, 8, g.external_id);
        Insert(fill, tx);
        break;
    }
  }

  SQLite::Statement api(db, "INSERT INTO api_calls VALUES (?,?,?,?,?,?,?,?,?)");
  for (const ApiCall& a : t.api) {
    api.bind(1, a.rank);
    api.bind(2, a.pid);
    api.bind(3, a.tid);
    api.bind(4, ApiKindName(a.kind));
    api.bind(5, a.start);
    api.bind(6, a.end);
    api.bind(7, a.name);
    BindOptional(api, 8, a.correlation);
    BindOptional(api, 9, a.external_id);
    Insert(api, tx);
  }

  SQLite::Statement rng(db, "INSERT INTO ranges VALUES (?,?,?,?,?,?,?,?)");
  for (const Range& r : t.ranges) {
    rng.bind(1, r.rank);
    rng.bind(2, r.pid);
    rng.bind(3, r.tid);
    BindOptional(rng, 4, r.device_index);
    rng.bind(5, DomainName(r.domain));
    rng.bind(6, r.start);
    rng.bind(7, r.end);
    rng.bind(8, r.name);
    Insert(rng, tx);
  }

  SQLite::Statement op(db, "INSERT INTO operators VALUES (?,?,?,?,?,?,?,?,?,?,?,?)");
  for (const Operator& o : t.ops) {
    op.bind(1, o.rank);
    op.bind(2, o.pid);
    op.bind(3, o.tid);
    op.bind(4, o.start);
    op.bind(5, o.end);
    op.bind(6, o.name);
    BindOptional(op, 7, o.sequence);
    op.bind(8, PassName(o.pass));
    op.bind(9, o.input_shapes);
    op.bind(10, o.input_types);
    op.bind(11, o.module_path);
    BindOptional(op, 12, o.external_id);
    Insert(op, tx);
  }

  SQLite::Statement stat(db, "INSERT INTO import_stats VALUES (?, ?, ?, ?)");
  for (const ImportStat& s : t.stats.all()) {
    stat.bind(1, s.name);
    stat.bind(2, s.severity);
    stat.bind(3, s.count);
    stat.bind(4, s.description);
    Insert(stat, tx);
  }
  tx.Commit();
}

void ReadAll(SQLite::Database& db, Trace* t) {
  std::vector<StringId> string_map;
  {
    SQLite::Statement q(db, "SELECT id, value FROM strings ORDER BY id");
    while (q.executeStep()) {
      auto id = static_cast<size_t>(q.getColumn(0).getInt64());
      if (id >= string_map.size()) string_map.resize(id + 1, 0);
      const SQLite::Column c = q.getColumn(1);
      string_map[id] = t->strings.Intern(
          std::string_view(static_cast<const char*>(c.getBlob()), c.getBytes()));
    }
  }
  auto S = [&](const SQLite::Statement& q, int col) -> StringId {
    auto id = static_cast<size_t>(q.getColumn(col).getInt64());
    return id < string_map.size() ? string_map[id] : 0;
  };

  {
    SQLite::Statement q(db, "SELECT key, value FROM meta");
    while (q.executeStep()) {
      std::string& v = t->metadata[q.getColumn(0).getString()];
      std::string add = q.getColumn(1).getString();
      v = v.empty() ? add : v + ";" + add;
    }
  }

  std::vector<uint32_t> device_map;
  {
    SQLite::Statement q(db, "SELECT * FROM devices ORDER BY id");
    while (q.executeStep()) {
      auto id = static_cast<size_t>(q.getColumn(0).getInt64());
      uint32_t index = t->DeviceIndex(q.getColumn(1).getInt(), q.getColumn(2).getInt());
      if (id >= device_map.size()) device_map.resize(id + 1, index);
      device_map[id] = index;
      DeviceInfo& d = t->devices[index];
      d.name = q.getColumn(3).getString();
      d.sm_count = q.getColumn(4).getInt();
      d.cc_major = q.getColumn(5).getInt();
      d.cc_minor = q.getColumn(6).getInt();
      d.memory_bytes = q.getColumn(7).getInt64();
      d.clock_khz = q.getColumn(8).getInt();
      d.memory_bandwidth_gbps = q.getColumn(9).getDouble();
      d.peak_tflops_fp32 = q.getColumn(10).getDouble();
      d.peak_tflops_bf16 = q.getColumn(11).getDouble();
      d.peak_tflops_fp8 = q.getColumn(12).getDouble();
    }
  }
  auto D = [&](const SQLite::Statement& q, int col) -> uint32_t {
    auto id = static_cast<size_t>(q.getColumn(col).getInt64());
    return id < device_map.size() ? device_map[id] : 0;
  };

  {
    SQLite::Statement q(db, "SELECT rank, pid, name FROM processes");
    while (q.executeStep()) {
      t->processes.push_back({q.getColumn(0).getInt(), q.getColumn(1).getInt(),
                              q.getColumn(2).getString()});
    }
    SQLite::Statement q2(db, "SELECT rank, pid, tid, name FROM threads");
    while (q2.executeStep()) {
      t->threads.push_back({q2.getColumn(0).getInt(), q2.getColumn(1).getInt(),
                            q2.getColumn(2).getInt(), q2.getColumn(3).getString()});
    }
  }

  {
    SQLite::Statement q(db, "SELECT * FROM kernels");
    while (q.executeStep()) {
      GpuActivity g;
      g.kind = GpuKind::kKernel;
      g.device_index = D(q, 0);
      g.stream = q.getColumn(1).getInt();
      g.start = q.getColumn(2).getInt64();
      g.end = q.getColumn(3).getInt64();
      g.name = S(q, 4);
      g.correlation = OptionalColumn(q, 5);
      g.external_id = OptionalColumn(q, 6);
      for (int i = 0; i < 3; ++i) g.grid[i] = q.getColumn(7 + i).getInt();
      for (int i = 0; i < 3; ++i) g.block[i] = q.getColumn(10 + i).getInt();
      g.registers = q.getColumn(13).getInt();
      g.shared_memory = q.getColumn(14).getInt();
      g.graph_id = OptionalColumn(q, 15);
      g.graph_node = OptionalColumn(q, 16);
      t->gpu.push_back(g);
    }
  }
  {
    SQLite::Statement q(db, "SELECT * FROM memcpy");
    while (q.executeStep()) {
      GpuActivity g;
      g.kind = GpuKind::kMemcpy;
      g.device_index = D(q, 0);
      g.stream = q.getColumn(1).getInt();
      g.start = q.getColumn(2).getInt64();
      g.end = q.getColumn(3).getInt64();
      g.name = S(q, 4);
      g.copy_kind = t->strings.Intern(q.getColumn(5).getString());
      g.bytes = q.getColumn(6).getInt64();
      g.correlation = OptionalColumn(q, 7);
      g.external_id = OptionalColumn(q, 8);
      t->gpu.push_back(g);
    }
  }
  {
    SQLite::Statement q(db, "SELECT * FROM memset");
    while (q.executeStep()) {
      GpuActivity g;
      g.kind = GpuKind::kMemset;
      g.device_index = D(q, 0);
      g.stream = q.getColumn(1).getInt();
      g.start = q.getColumn(2).getInt64();
      g.end = q.getColumn(3).getInt64();
      g.name = S(q, 4);
      g.bytes = q.getColumn(5).getInt64();
      g.correlation = OptionalColumn(q, 6);
      g.external_id = OptionalColumn(q, 7);
      t->gpu.push_back(g);
    }
  }
  {
    SQLite::Statement q(db, "SELECT * FROM api_calls");
    while (q.executeStep()) {
      ApiCall a;
      a.rank = q.getColumn(0).getInt();
      a.pid = q.getColumn(1).getInt();
      a.tid = q.getColumn(2).getInt();
      a.kind = ApiKindFromName(q.getColumn(3).getText());
      a.start = q.getColumn(4).getInt64();
      a.end = q.getColumn(5).getInt64();
      a.name = S(q, 6);
      a.correlation = OptionalColumn(q, 7);
      a.external_id = OptionalColumn(q, 8);
      t->api.push_back(a);
    }
  }
  {
    SQLite::Statement q(db, "SELECT * FROM ranges");
    while (q.executeStep()) {
      Range r;
      r.rank = q.getColumn(0).getInt();
      r.pid = q.getColumn(1).getInt();
      r.tid = q.getColumn(2).getInt();
      r.device_index = q.isColumnNull(3) ? -1 : static_cast<int32_t>(D(q, 3));
      r.domain = DomainFromName(q.getColumn(4).getText());
      r.start = q.getColumn(5).getInt64();
      r.end = q.getColumn(6).getInt64();
      r.name = S(q, 7);
      t->ranges.push_back(r);
    }
  }
  {
    SQLite::Statement q(db, "SELECT * FROM operators");
    while (q.executeStep()) {
      Operator o;
      o.rank = q.getColumn(0).getInt();
      o.pid = q.getColumn(1).getInt();
      o.tid = q.getColumn(2).getInt();
      o.start = q.getColumn(3).getInt64();
      o.end = q.getColumn(4).getInt64();
      o.name = S(q, 5);
      o.sequence = OptionalColumn(q, 6);
      o.pass = PassFromName(q.getColumn(7).getText());
      o.input_shapes = S(q, 8);
      o.input_types = S(q, 9);
      o.module_path = S(q, 10);
      o.external_id = OptionalColumn(q, 11);
      t->ops.push_back(o);
    }
  }
  {
    SQLite::Statement q(db, "SELECT name, severity, count, description FROM import_stats");
    while (q.executeStep()) {
      t->stats.Add(q.getColumn(0).getText(), q.getColumn(1).getText(), q.getColumn(3).getText(),
                   q.getColumn(2).getInt64());
    }
  }
}

}  // namespace

Status WriteTraceDb(const Trace& trace, const std::string& path) {
  const std::string tmp = path + ".tmp-" + std::to_string(getpid());
  std::remove(tmp.c_str());
  try {
    {
      SQLite::Database db(tmp, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
      WriteAll(trace, db);
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) {
      std::remove(tmp.c_str());
      return Status::Failure(path + ": cannot write: " + ec.message());
    }
  } catch (const std::exception& e) {
    std::remove(tmp.c_str());
    return Status::Failure(path + ": cannot write trace store: " + e.what());
  }
  return Status::Ok();
}

Status ReadTraceDb(const std::string& path, Trace* trace) {
  try {
    SQLite::Database db(path, SQLite::OPEN_READONLY);
    const int version = db.execAndGet("PRAGMA user_version").getInt();
    if (version != kTraceSchemaVersion) {
      return Status::BadInput(path + ": trace store schema version " + std::to_string(version) +
                              " is not supported (this build reads version " +
                              std::to_string(kTraceSchemaVersion) + ")");
    }
    ReadAll(db, trace);
  } catch (const std::exception& e) {
    return Status::BadInput(path + ": not a readable dynaflow trace store: " + e.what());
  }
  return Status::Ok();
}

bool LooksLikeTraceDb(const std::vector<std::string>& sql_tables) {
  auto has = [&](std::string_view name) {
    return std::find(sql_tables.begin(), sql_tables.end(), name) != sql_tables.end();
  };
  return has("meta") && has("strings") && has("kernels") && has("operators");
}

}  // namespace dynaflow
