#include <iostream>
#include <memory>
#include <string>

#include "analysis/importers/reader.h"
#include "analysis/store/trace_db_bulk_writer.h"
#include "cli/commands.h"

namespace dynaflow {
namespace {

struct ImportArgs {
  std::vector<std::string> inputs;
  std::string output;
};

// Hands the records of a single input to the writer while it is parsed, so
// that parsing and writing overlap (the writer has its own thread).
class WriterSink : public RecordSink {
 public:
  explicit WriterSink(TraceDbBulkWriter* writer) : writer_(writer) {}
  void Take(Trace* part) override { writer_->Take(part); }
  void SetRank(int32_t rank) override { rank_ = rank; }
  void SetTakenTimeOffset(int64_t offset_ns) override { offset_ns_ = offset_ns; }
  int32_t rank() const { return rank_; }
  int64_t offset_ns() const { return offset_ns_; }

 private:
  TraceDbBulkWriter* writer_;
  int32_t rank_ = 0;
  int64_t offset_ns_ = 0;
};

// One line when the input lost records or values on the way in (statistics of
// severity data_loss, listed by `info`), so that an import never loses data
// without a word.
void WarnDataLoss(const ImportStats& stats) {
  std::string lost;
  for (const ImportStat& s : stats.all()) {
    if (s.severity != "data_loss") continue;
    lost += (lost.empty() ? "" : ", ") + s.name + " " + std::to_string(s.count);
  }
  if (!lost.empty()) std::cerr << "dynaflow: warning: data lost on import: " << lost << "\n";
}

int RunImport(const ImportArgs& args) {
  // Started first: a bad output path fails before the input is read. On any
  // failure the writer, destroyed unfinished, removes its temporary file.
  StatusOr<std::unique_ptr<TraceDbBulkWriter>> writer = TraceDbBulkWriter::Start(args.output);
  if (!writer.ok()) return Fail(writer.status());
  WriterSink sink(writer->get());
  Trace trace;
  Status st = LoadInputs(args.inputs, &trace, args.inputs.size() == 1 ? &sink : nullptr);
  if (!st.ok()) return Fail(st);
  st = (*writer)->Finish(trace, sink.rank(), sink.offset_ns());
  if (!st.ok()) return Fail(st);
  std::cerr << "dynaflow: wrote " << args.output << ": " << (*writer)->gpu_rows()
            << " GPU activities, " << (*writer)->op_rows() << " operators, "
            << (*writer)->api_rows() << " API calls\n";
  WarnDataLoss(trace.stats);
  return 0;
}

}  // namespace

void AddImportCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ImportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "import", "Import traces into one trace.db (SQLite; schema in schemas/trace.sql).");
  cmd->add_option("IN", args->inputs,
                  "Trace files; several Kineto rank files at once; - reads standard input")
      ->required();
  cmd->footer(
      "Example: two ranks' torch.profiler traces into one store, queried with SQL:\n"
      "  dynaflow import rank0.json.gz rank1.json.gz -o run.db\n"
      "  sqlite3 run.db 'SELECT rank, count(*) FROM gpu_activity GROUP BY rank'");
  cmd->add_option("-o,--output", args->output, "The trace.db to write (replaced if present)")
      ->required();
  cmd->final_callback([args, exit_code] { *exit_code = RunImport(*args); });
}

}  // namespace dynaflow
