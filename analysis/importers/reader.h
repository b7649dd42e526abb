// One reader interface for every trace format, and the registry that picks a
// reader by looking at a file's content (never its name).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/base/status.h"
#include "analysis/model/trace.h"

namespace dynaflow {

// Takes records while a file is still being read, so that they can be
// written out meanwhile (dynaflow import of a single file).
class RecordSink {
 public:
  virtual ~RecordSink() = default;
  // Moves out the GPU activities, API calls, operators and ranges that the
  // file's own trace `part` holds so far; their rank is not set yet. `part`
  // keeps its strings and devices and is appended to the output trace at the
  // end as usual.
  virtual void Take(Trace* part) = 0;
  // The rank that every record of the file, taken or not, gets.
  virtual void SetRank(int32_t rank) = 0;
  // Nanoseconds to add to the times of the records taken so far (a file's
  // time base, e.g. Kineto's baseTimeNanoseconds, known only at its end); the
  // records the trace still holds have it already.
  virtual void SetTakenTimeOffset(int64_t offset_ns) = 0;
};

struct ImportOptions {
  // Called now and then with the bytes consumed so far and the total (0 when
  // unknown). Must be cheap; may be empty.
  std::function<void(int64_t done, int64_t total)> progress;
  // Called with each path just before it is read (progress then counts that
  // file). May be empty.
  std::function<void(const std::string& path)> on_file;
  // Readers that can hand records over while reading do so here; the others
  // ignore it. Only for a single input file read into an empty trace, whose
  // StringIds and device indices then stay those of the file's own trace.
  RecordSink* sink = nullptr;
};

// What the registry learned about a file before choosing a reader.
struct FileProbe {
  std::string path;
  bool gzip = false;
  bool sqlite = false;
  std::string head;                     // first bytes, decompressed when gzip
  std::vector<std::string> sql_tables;  // table names when sqlite
};

class TraceReader {
 public:
  virtual ~TraceReader() = default;
  virtual std::string_view format() const = 0;
  virtual bool Accepts(const FileProbe& probe) const = 0;
  // Appends the file's events to `trace`. `ordinal` is the file's position on
  // the command line, used as its rank when the file names none. On failure
  // the trace may hold part of the file; callers discard it.
  virtual Status Read(const FileProbe& probe, int ordinal, const ImportOptions& options,
                      Trace* trace) = 0;
};

// Probes `path`: BadInput when it is missing, unreadable or empty.
StatusOr<FileProbe> ProbeFile(const std::string& path);

// The reader for a probed file; BadInput naming what the file looks like when
// no reader accepts it.
StatusOr<TraceReader*> FindReader(const FileProbe& probe);

// Reads every input into one trace (several Kineto rank files, say).
Status ImportFiles(const std::vector<std::string>& paths, const ImportOptions& options,
                   Trace* trace);

}  // namespace dynaflow
