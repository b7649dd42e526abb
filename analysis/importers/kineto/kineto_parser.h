// Meaning of Kineto / PyTorch-profiler Chrome-trace events: turns each event
// the tokenizer hands over into Trace records. Current spellings (`kernel`,
// `gpu_memcpy`, `cuda_runtime`, `cpu_op`, `External id`) and the 2021 legacy
// ones (`Kernel`, `Memcpy`, `Runtime`, `Operator`, `external id`,
// `"tid": "stream 7"`) are both understood.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "analysis/base/status.h"
#include "analysis/importers/kineto/json_tokenizer.h"
#include "analysis/model/trace.h"

namespace dynaflow {

// Parses a JSON number token holding microseconds into integer nanoseconds.
// Decimal tokens are converted exactly (rounding half up beyond the third
// fractional digit), so "1623142623529248.123" keeps every nanosecond.
bool MicrosToNs(std::string_view token, int64_t* ns);

class KinetoParser : public ChromeJsonTokenizer::Sink {
 public:
  // Records go into `part` with rank 0; the caller assigns the file's rank
  // (Trace::Append) once the whole file, and so distributedInfo, was seen.
  explicit KinetoParser(Trace* part);
  ~KinetoParser() override;

  void OnEvent(std::string_view json) override;
  void OnTopLevel(std::string_view key, std::string_view json) override;
  void OnNonObjectEvent() override;

  // Applies what needs the whole file (deviceProperties to the devices seen).
  void Finish();
  // The rank named by distributedInfo.rank, or -1.
  int32_t rank() const { return rank_; }
  // baseTimeNanoseconds (recent Kineto: every ts is relative to it), 0 when
  // absent or out of range. Finish() adds it to the records `part` still
  // holds; records a RecordSink took before need it added by the sink.
  int64_t base_time_ns() const { return base_time_ns_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Trace* part_;
  int32_t rank_ = -1;
  int64_t base_time_ns_ = 0;
};

// baseTimeNanoseconds beyond +-kMaxAbsTimeNs are refused (counted, ignored).
inline constexpr int64_t kMaxBaseTimeNs = kMaxAbsTimeNs;

// Adds `offset_ns` (|offset_ns| <= kMaxAbsTimeNs) to every time of the
// records `trace` holds. Records whose times then fall beyond
// +-kMaxAbsTimeNs are removed (trace.h's bound keeps differences in int64);
// returns how many.
int64_t ShiftTimes(Trace* trace, int64_t offset_ns);

// Parses a whole Kineto JSON document held in memory (tests, fuzzers) into
// `trace` as rank `default_rank` unless the document names its rank.
Status ParseKinetoJson(std::string_view json, int32_t default_rank, Trace* trace);

}  // namespace dynaflow
