#include "analysis/importers/dynaflow/dynaflow_reader.h"

#include "analysis/store/store.h"

namespace dynaflow {
namespace {

class DynaflowReader : public TraceReader {
 public:
  std::string_view format() const override { return "dynaflow"; }
  bool Accepts(const FileProbe& probe) const override {
    return probe.sqlite && LooksLikeTraceDb(probe.sql_tables);
  }
  // A store already carries its ranks; `ordinal` is not needed.
  Status Read(const FileProbe& probe, int /*ordinal*/, const ImportOptions& /*options*/,
              Trace* trace) override {
    return ReadTraceDb(probe.path, trace);
  }
};

}  // namespace

std::unique_ptr<TraceReader> MakeDynaflowReader() { return std::make_unique<DynaflowReader>(); }

}  // namespace dynaflow
