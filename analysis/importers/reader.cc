#include "analysis/importers/reader.h"

#include <SQLiteCpp/SQLiteCpp.h>

#include <filesystem>

#include "analysis/importers/dynaflow/dynaflow_reader.h"
#include "analysis/importers/io/byte_stream.h"
#include "analysis/importers/kineto/kineto_reader.h"
#include "analysis/importers/nsys/nsys_reader.h"

namespace dynaflow {
namespace {

constexpr size_t kProbeBytes = 4096;
constexpr std::string_view kSqliteMagic{"SQLite format 3\0", 16};

// The registry: adding a format adds one line here and one folder.
const std::vector<std::unique_ptr<TraceReader>>& Readers() {
  static const auto* readers = [] {
    auto* r = new std::vector<std::unique_ptr<TraceReader>>();
    r->push_back(MakeDynaflowReader());
    r->push_back(MakeNsysReader());
    r->push_back(MakeKinetoReader());
    return r;
  }();
  return *readers;
}

Status ListTables(FileProbe* probe) {
  try {
    SQLite::Database db(probe->path, SQLite::OPEN_READONLY);
    SQLite::Statement q(db, "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')");
    while (q.executeStep()) probe->sql_tables.push_back(q.getColumn(0).getString());
  } catch (const std::exception& e) {
    return Status::BadInput(probe->path + ": unreadable SQLite database: " + e.what());
  }
  return Status::Ok();
}

}  // namespace

StatusOr<FileProbe> ProbeFile(const std::string& path) {
  FileProbe probe;
  probe.path = path;
  auto head = ReadHead(path, kProbeBytes);
  if (!head.ok()) return head.status();
  if (head->empty()) return Status::BadInput(path + ": empty file, not a trace");
  probe.head = std::move(*head);
  if (probe.head.compare(0, kSqliteMagic.size(), kSqliteMagic) == 0) {
    probe.sqlite = true;
    DF_RETURN_IF_ERROR(ListTables(&probe));
  }
  return probe;
}

StatusOr<TraceReader*> FindReader(const FileProbe& probe) {
  for (const auto& reader : Readers()) {
    if (reader->Accepts(probe)) return reader.get();
  }
  if (probe.sqlite) {
    return Status::BadInput(probe.path +
                            ": SQLite database without Nsight Systems or dynaflow tables "
                            "(export with `nsys export --type sqlite`)");
  }
  return Status::BadInput(probe.path +
                          ": not a trace: expected Kineto/PyTorch-profiler JSON (.json, .json.gz), "
                          "an Nsight Systems SQLite export or a dynaflow trace.db");
}

Status ImportFiles(const std::vector<std::string>& paths, const ImportOptions& options,
                   Trace* trace) {
  for (size_t i = 0; i < paths.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      std::error_code ec;
      if (std::filesystem::equivalent(paths[j], paths[i], ec)) {
        return Status::BadInput(paths[i] + ": given twice (also as " + paths[j] + ")");
      }
    }
    auto probe = ProbeFile(paths[i]);
    if (!probe.ok()) return probe.status();
    auto reader = FindReader(*probe);
    if (!reader.ok()) return reader.status();
    if (options.on_file) options.on_file(paths[i]);
    DF_RETURN_IF_ERROR((*reader)->Read(*probe, static_cast<int>(i), options, trace));
  }
  return Status::Ok();
}

}  // namespace dynaflow
