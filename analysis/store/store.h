// trace.db: the SQLite trace store described by schemas/trace.sql.
#pragma once

#include <string>
#include <vector>

#include "analysis/base/status.h"
#include "analysis/model/trace.h"

namespace dynaflow {

// Writes `trace` to a new trace.db at `path`, replacing any file there.
// Rows go through TraceDbBulkWriter (one transaction, no journal) into a
// temporary file beside `path` that is renamed into place only when complete,
// so a failure never leaves a partial output file. Tracers that write while
// the traced program runs use TraceDbWriter directly (trace_db_writer.h).
Status WriteTraceDb(const Trace& trace, const std::string& path);

// Appends the contents of the trace.db at `path` to `trace`. BadInput when the
// file is not a dynaflow store, has a schema version this build does not know,
// or holds a rank that `trace` already has (two runs would merge into one).
// Older schema versions (trace.sql) read with their missing columns unknown.
Status ReadTraceDb(const std::string& path, Trace* trace);

// True when the named tables look like a dynaflow store.
bool LooksLikeTraceDb(const std::vector<std::string>& sql_tables);

}  // namespace dynaflow
