#include "analysis/store/store.h"

#include <SQLiteCpp/SQLiteCpp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <utility>

#include "analysis/store/store_enums.h"
#include "analysis/store/trace_db_bulk_writer.h"
#include "schemas/trace_sql.h"

namespace dynaflow {
namespace {

int64_t OptionalColumn(const SQLite::Statement& st, int index) {
  return st.isColumnNull(index) ? -1 : st.getColumn(index).getInt64();
}

// A column of a table and the store version that added it.
struct Column {
  const char* name;
  int since = 1;
  const char* absent = "NULL";  // what a store older than `since` reads instead
};

// "SELECT <columns> FROM <table>" for a store of `version`: the columns it
// lacks read as their `absent` value, so ReadAll reads every version alike.
std::string Select(int version, const char* table, std::initializer_list<Column> columns) {
  std::string sql = "SELECT ";
  for (const Column& c : columns) {
    if (sql.size() > 7) sql += ", ";
    sql += version >= c.since ? c.name : c.absent;
  }
  return sql + " FROM " + table;
}

std::string KernelsQuery(int version) {
  return Select(version, "kernels",
                {{"device_id"}, {"stream"}, {"start_ns"}, {"end_ns"}, {"name_id"}, {"correlation"},
                 {"external_id"}, {"grid_x"}, {"grid_y"}, {"grid_z"}, {"block_x"}, {"block_y"},
                 {"block_z"}, {"registers"}, {"shared_memory"}, {"graph_id"}, {"graph_node"},
                 {"pid", 3}, {"collective_id", 3, "0"}});
}

std::string MemcpyQuery(int version) {
  return Select(version, "memcpy",
                {{"device_id"}, {"stream"}, {"start_ns"}, {"end_ns"}, {"name_id"}, {"copy_kind"},
                 {"bytes"}, {"correlation"}, {"external_id"}, {"graph_id", 2}, {"graph_node", 2},
                 {"pid", 3}});
}

std::string MemsetQuery(int version) {
  return Select(version, "memset",
                {{"device_id"}, {"stream"}, {"start_ns"}, {"end_ns"}, {"name_id"}, {"bytes"},
                 {"correlation"}, {"external_id"}, {"graph_id", 2}, {"graph_node", 2},
                 {"pid", 3}});
}

std::string ApiCallsQuery(int version) {
  return Select(version, "api_calls",
                {{"rank"}, {"pid"}, {"tid"}, {"kind"}, {"start_ns"}, {"end_ns"}, {"name_id"},
                 {"correlation"}, {"external_id"}, {"sync_device", 2}, {"sync_stream", 2},
                 {"wait_on_stream", 2}, {"wait_event_id", 2}, {"wait_event_correlation", 2}});
}

std::string OperatorsQuery(int version) {
  return Select(version, "operators",
                {{"rank"}, {"pid"}, {"tid"}, {"start_ns"}, {"end_ns"}, {"name_id"}, {"sequence"},
                 {"pass"}, {"input_shapes_id"}, {"input_types_id"}, {"module_path_id"},
                 {"external_id"}, {"collective_id", 2, "0"}, {"concrete_inputs_id", 3, "0"},
                 {"input_strides_id", 3, "0"}, {"in_graph_capture", 4, "0"}});
}

std::string DevicesQuery(int version) {
  return Select(version, "devices",
                {{"id"}, {"rank"}, {"device"}, {"name"}, {"sm_count"}, {"cc_major"},
                 {"cc_minor"}, {"memory_bytes"}, {"clock_khz"}, {"memory_bandwidth_gbps"},
                 {"peak_tflops_fp32"}, {"peak_tflops_bf16"}, {"peak_tflops_fp8"},
                 {"properties_json", 3, "''"}}) +
         " ORDER BY id";
}

std::string ProcessesQuery(int version) {
  return Select(version, "processes", {{"rank"}, {"pid"}, {"name"}, {"label", 3, "''"}});
}

// Each process's metadata (process_meta, version 3) into its ProcessInfo.
void ReadProcessMeta(SQLite::Database& db, int version, Trace* t) {
  if (version < 3) return;
  std::map<std::pair<int32_t, int32_t>, ProcessInfo*> by_pid;
  for (ProcessInfo& p : t->processes) by_pid.emplace(std::pair(p.rank, p.pid), &p);
  SQLite::Statement q(db, "SELECT rank, pid, key, value FROM process_meta");
  while (q.executeStep()) {
    auto it = by_pid.find({q.getColumn(0).getInt(), q.getColumn(1).getInt()});
    if (it == by_pid.end()) continue;  // a process row is written with its metadata
    it->second->metadata[q.getColumn(2).getString()] = q.getColumn(3).getString();
  }
}

void ReadDistributedInfo(SQLite::Database& db, int version, Trace* t) {
  if (version < 3) return;
  SQLite::Statement q(db, "SELECT rank, json FROM distributed_info");
  while (q.executeStep()) t->distributed_info[q.getColumn(0).getInt()] = q.getColumn(1).getString();
}

void ReadAll(SQLite::Database& db, int version, Trace* t) {
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
    SQLite::Statement q(db, DevicesQuery(version));
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
      d.properties_json = q.getColumn(13).getString();
    }
  }
  auto D = [&](const SQLite::Statement& q, int col) -> uint32_t {
    auto id = static_cast<size_t>(q.getColumn(col).getInt64());
    return id < device_map.size() ? device_map[id] : 0;
  };

  {
    SQLite::Statement q(db, ProcessesQuery(version));
    while (q.executeStep()) {
      t->processes.push_back({q.getColumn(0).getInt(), q.getColumn(1).getInt(),
                              q.getColumn(2).getString(), q.getColumn(3).getString(), {}});
    }
    SQLite::Statement q2(db, "SELECT rank, pid, tid, name FROM threads ORDER BY rowid");
    while (q2.executeStep()) {
      t->threads.push_back({q2.getColumn(0).getInt(), q2.getColumn(1).getInt(),
                            q2.getColumn(2).getInt(), q2.getColumn(3).getString()});
    }
  }

  {
    SQLite::Statement q(db, KernelsQuery(version));
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
      g.pid = static_cast<int32_t>(OptionalColumn(q, 17));
      g.collective = S(q, 18);
      t->gpu.push_back(g);
    }
  }
  {
    SQLite::Statement q(db, MemcpyQuery(version));
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
      g.graph_id = OptionalColumn(q, 9);
      g.graph_node = OptionalColumn(q, 10);
      g.pid = static_cast<int32_t>(OptionalColumn(q, 11));
      t->gpu.push_back(g);
    }
  }
  {
    SQLite::Statement q(db, MemsetQuery(version));
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
      g.graph_id = OptionalColumn(q, 8);
      g.graph_node = OptionalColumn(q, 9);
      g.pid = static_cast<int32_t>(OptionalColumn(q, 10));
      t->gpu.push_back(g);
    }
  }
  {
    SQLite::Statement q(db, ApiCallsQuery(version));
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
      a.sync_device = static_cast<int32_t>(OptionalColumn(q, 9));
      a.sync_stream = static_cast<int32_t>(OptionalColumn(q, 10));
      a.wait_on_stream = static_cast<int32_t>(OptionalColumn(q, 11));
      a.wait_event_id = OptionalColumn(q, 12);
      a.wait_event_correlation = OptionalColumn(q, 13);
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
    SQLite::Statement q(db, OperatorsQuery(version));
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
      o.collective = S(q, 12);
      o.concrete_inputs = S(q, 13);
      o.input_strides = S(q, 14);
      o.in_graph_capture = q.getColumn(15).getInt() != 0;
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
  ReadProcessMeta(db, version, t);
  ReadDistributedInfo(db, version, t);
}

}  // namespace

Status WriteTraceDb(const Trace& trace, const std::string& path) {
  StatusOr<std::unique_ptr<TraceDbBulkWriter>> writer = TraceDbBulkWriter::Start(path);
  if (!writer.ok()) return writer.status();
  return (*writer)->Finish(trace);
}

Status ReadTraceDb(const std::string& path, Trace* trace) {
  try {
    SQLite::Database db(path, SQLite::OPEN_READONLY);
    const int version = db.execAndGet("PRAGMA user_version").getInt();
    if (version < kOldestReadableTraceSchemaVersion || version > kTraceSchemaVersion) {
      return Status::BadInput(path + ": trace store schema version " + std::to_string(version) +
                              " is not supported (this build reads versions " +
                              std::to_string(kOldestReadableTraceSchemaVersion) + " to " +
                              std::to_string(kTraceSchemaVersion) + ")");
    }
    SQLite::Statement ranks(db, "SELECT rank FROM devices UNION SELECT rank FROM processes");
    while (ranks.executeStep()) {
      DF_RETURN_IF_ERROR(trace->CheckNewRank(ranks.getColumn(0).getInt(), path));
    }
    ReadAll(db, version, trace);
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
