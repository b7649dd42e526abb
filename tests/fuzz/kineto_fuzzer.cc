// libFuzzer target for the Kineto JSON path: ChromeJsonTokenizer, KinetoParser
// and ParseKinetoJson, then the GPU timeline analysis of what they produced.
//
// The input is the JSON document itself, so real traces and hand-written
// documents serve as seeds unchanged. Each input is parsed three ways: whole
// (ParseKinetoJson), in 2 or 3 chunks cut at positions derived from a hash of
// the input, and, when small, one byte at a time. The tokenizer promises that
// chunk boundaries do not matter, so the three results must agree; a
// disagreement aborts like a crash would.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/importers/io/byte_stream.h"
#include "analysis/importers/kineto/json_tokenizer.h"
#include "analysis/importers/kineto/kineto_parser.h"
#include "analysis/model/trace.h"
#include "analysis/timeline/timeline.h"

namespace dynaflow {
namespace {

// Inputs up to this size are also fed one byte per chunk: every boundary at
// once, for a cost linear in the size.
constexpr size_t kByteWiseLimit = 4096;

// FNV-1a over the whole input. Deriving the cuts from every byte (not only
// the first ones, which are almost always `{"traceEvents": [`) spreads the
// corpus over many cut positions while keeping each input reproducible.
uint64_t Hash(const uint8_t* data, size_t size) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < size; ++i) {
    h ^= data[i];
    h *= 1099511628211ull;
  }
  return h;
}

// What a parse produced, compared across the ways of feeding the same input.
struct Outcome {
  bool ok = false;
  size_t gpu = 0, api = 0, ops = 0, ranges = 0, processes = 0, threads = 0, devices = 0;
  std::vector<std::pair<std::string, int64_t>> stats;

  static Outcome Of(bool ok, const Trace& t) {
    Outcome o;
    o.ok = ok;
    if (!ok) return o;  // a failed parse leaves a partial trace: not compared
    o.gpu = t.gpu.size();
    o.api = t.api.size();
    o.ops = t.ops.size();
    o.ranges = t.ranges.size();
    o.processes = t.processes.size();
    o.threads = t.threads.size();
    o.devices = t.devices.size();
    for (const ImportStat& s : t.stats.all()) o.stats.emplace_back(s.name, s.count);
    std::sort(o.stats.begin(), o.stats.end());
    return o;
  }

  bool SameAs(const Outcome& other) const {
    return ok == other.ok && gpu == other.gpu && api == other.api && ops == other.ops &&
           ranges == other.ranges && processes == other.processes &&
           threads == other.threads && devices == other.devices && stats == other.stats;
  }

  std::string Describe() const {
    std::string s = ok ? "ok" : "error";
    s += " gpu=" + std::to_string(gpu) +
         " api=" + std::to_string(api) + " ops=" + std::to_string(ops) +
         " ranges=" + std::to_string(ranges) + " devices=" + std::to_string(devices);
    for (const auto& [name, count] : stats) s += " " + name + "=" + std::to_string(count);
    return s;
  }
};

// Feeds `input` cut at `cuts` (ascending, inside [0, size]), each chunk copied
// into its own heap block of exactly size + kChunkPadding bytes (zero padding,
// as ByteStream pads), so ASan sees any read past the promised padding.
Outcome FeedChunks(std::string_view input, const std::vector<size_t>& cuts) {
  Trace part;
  KinetoParser parser(&part);
  ChromeJsonTokenizer tokenizer(&parser);
  size_t begin = 0;
  bool ok = true;
  std::vector<size_t> ends = cuts;
  ends.push_back(input.size());
  for (size_t end : ends) {
    const size_t n = end - begin;
    auto block = std::make_unique<char[]>(n + kChunkPadding);
    std::memcpy(block.get(), input.data() + begin, n);
    std::memset(block.get() + n, 0, kChunkPadding);
    if (!tokenizer.Feed(std::string_view(block.get(), n)).ok()) {
      ok = false;
      break;
    }
    begin = end;
  }
  if (ok) ok = tokenizer.Finish().ok();
  if (ok) parser.Finish();
  return Outcome::Of(ok, part);
}

// Fails the run, printing both outcomes, when two ways of feeding disagree.
void ExpectSame(const char* what, const Outcome& whole, const Outcome& other) {
  if (whole.SameAs(other)) return;
  std::fprintf(stderr,
               "kineto_fuzzer: chunked parse (%s) disagrees with the whole-input parse\n"
               "  whole:   %s\n  chunked: %s\n",
               what, whole.Describe().c_str(), other.Describe().c_str());
  std::abort();
}

// Every StringId a record holds must name a string of the trace.
void CheckStringIds(const Trace& t) {
  const size_t n = t.strings.size();
  auto check = [n](StringId id, const char* field) {
    if (id >= n) {
      std::fprintf(stderr, "kineto_fuzzer: %s StringId %u out of range (%zu strings)\n", field,
                   id, n);
      std::abort();
    }
  };
  for (const GpuActivity& g : t.gpu) {
    check(g.name, "gpu.name");
    check(g.copy_kind, "gpu.copy_kind");
    if (g.device_index >= t.devices.size()) {
      std::fprintf(stderr, "kineto_fuzzer: gpu.device_index %u out of range\n", g.device_index);
      std::abort();
    }
  }
  for (const ApiCall& a : t.api) check(a.name, "api.name");
  for (const Operator& o : t.ops) {
    check(o.name, "op.name");
    check(o.input_shapes, "op.input_shapes");
    check(o.input_types, "op.input_types");
    check(o.module_path, "op.module_path");
  }
  for (const Range& r : t.ranges) check(r.name, "range.name");
}

}  // namespace
}  // namespace dynaflow

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dynaflow;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const uint64_t h = Hash(data, size);

  // 1. The whole input through the public entry point.
  Trace trace;
  const bool whole_ok = ParseKinetoJson(input, /*default_rank=*/static_cast<int32_t>(h & 3),
                                        &trace)
                            .ok();
  const Outcome whole = Outcome::Of(whole_ok, trace);
  if (whole_ok) CheckStringIds(trace);

  // 2. Two or three chunks at hash-derived cuts (empty chunks included).
  std::vector<size_t> cuts = {static_cast<size_t>((h >> 8) % (size + 1))};
  if (h & 0x10) cuts.push_back(static_cast<size_t>((h >> 32) % (size + 1)));
  std::sort(cuts.begin(), cuts.end());
  ExpectSame("2-3 chunks", whole, FeedChunks(input, cuts));

  // 3. One byte per chunk.
  if (size <= kByteWiseLimit) {
    std::vector<size_t> every;
    for (size_t i = 1; i < size; ++i) every.push_back(i);
    ExpectSame("1-byte chunks", whole, FeedChunks(input, every));
  }

  // 4. The analysis over what was imported.
  if (whole_ok) {
    TimelineOptions options;
    options.kernel_wait_threshold_ns = static_cast<TimeNs>((h >> 40) & 0xFFFFF);
    options.top_kernels = static_cast<size_t>((h >> 60) & 0xF);
    const std::vector<DeviceTimeline> timelines = AnalyzeTimelines(trace, options);
    for (const DeviceTimeline& d : timelines) {
      if (d.device_index >= trace.devices.size() || d.top_kernels.size() > options.top_kernels) {
        std::fprintf(stderr, "kineto_fuzzer: AnalyzeTimelines broke its contract\n");
        std::abort();
      }
    }
  }
  return 0;
}
