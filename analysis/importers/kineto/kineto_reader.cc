#include "analysis/importers/kineto/kineto_reader.h"

#include <simdjson.h>

#include "analysis/importers/io/byte_stream.h"
#include "analysis/importers/kineto/json_tokenizer.h"
#include "analysis/importers/kineto/kineto_parser.h"

namespace dynaflow {
namespace {

static_assert(kChunkPadding >= simdjson::SIMDJSON_PADDING, "chunks must be padded for simdjson");

class KinetoReader : public TraceReader {
 public:
  std::string_view format() const override { return "kineto"; }

  // A JSON document: the first non-space byte opens an object or an array.
  bool Accepts(const FileProbe& probe) const override {
    if (probe.sqlite) return false;
    for (char c : probe.head) {
      if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
      auto u = static_cast<unsigned char>(c);
      if (u == 0xEF || u == 0xBB || u == 0xBF) continue;  // byte order mark
      return c == '{' || c == '[';
    }
    return false;
  }

  Status Read(const FileProbe& probe, int ordinal, const ImportOptions& options,
              Trace* trace) override {
    auto stream = ByteStream::Open(probe.path);
    if (!stream.ok()) return stream.status();
    Trace part;
    KinetoParser parser(&part);
    ChromeJsonTokenizer tokenizer(&parser);
    for (;;) {
      auto chunk = (*stream)->Next();
      if (!chunk.ok()) return chunk.status();
      if (chunk->empty()) break;
      Status st = tokenizer.Feed(*chunk);
      if (!st.ok()) return Status::BadInput(probe.path + ": " + st.message());
      if (options.sink) options.sink->Take(&part);
      if (options.progress) options.progress((*stream)->file_bytes_read(), (*stream)->file_size());
    }
    Status st = tokenizer.Finish();
    if (!st.ok()) return Status::BadInput(probe.path + ": " + st.message());
    parser.Finish();
    if (tokenizer.dropped_top_level_values() > 0) {
      part.stats.Add("kineto_oversized_top_level_value", "data_loss",
                     "top-level values other than traceEvents too large to keep",
                     tokenizer.dropped_top_level_values());
    }
    part.metadata["source"] = probe.path;
    const int32_t rank = parser.rank() >= 0 ? parser.rank() : ordinal;
    DF_RETURN_IF_ERROR(trace->CheckNewRank(rank, probe.path));
    if (options.sink) {
      options.sink->SetRank(rank);
      options.sink->SetTakenTimeOffset(parser.base_time_ns());
    }
    trace->Append(std::move(part), rank);
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<TraceReader> MakeKinetoReader() { return std::make_unique<KinetoReader>(); }

}  // namespace dynaflow
