// Splits a Chrome-trace JSON document, fed in chunks of any size, into its
// events (the elements of "traceEvents", or of a top-level array) and its other
// top-level values. There is no requirement for chunk boundaries to match
// event boundaries: an event that straddles chunks is reassembled.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "analysis/base/status.h"

namespace dynaflow {

class ChromeJsonTokenizer {
 public:
  class Sink {
   public:
    virtual ~Sink() = default;
    // One element of the event array: an object's JSON text, with at least
    // kChunkPadding readable bytes after it.
    virtual void OnEvent(std::string_view json) = 0;
    // A top-level key other than "traceEvents" and its raw JSON value (values
    // over a size limit are dropped and counted by the tokenizer instead).
    virtual void OnTopLevel(std::string_view key, std::string_view json) = 0;
    // An element of the event array that is not an object.
    virtual void OnNonObjectEvent() = 0;
  };

  // The longest event the tokenizer buffers: a longer one (a 3 GB string in
  // an event's args) is BadInput, so memory stays bounded whatever the input.
  // Real events are at most a few hundred kilobytes.
  static constexpr size_t kMaxEventBytes = size_t{64} << 20;

  explicit ChromeJsonTokenizer(Sink* sink, size_t max_event_bytes = kMaxEventBytes)
      : sink_(sink), max_event_bytes_(max_event_bytes) {}

  // Feeds the next chunk, which must have kChunkPadding readable bytes past its
  // end. BadInput when the bytes cannot be a Chrome trace.
  Status Feed(std::string_view chunk);

  // Declares the end of input. BadInput when the document is incomplete
  // (truncated) or never contained an event array.
  Status Finish();

  int64_t events() const { return events_; }
  int64_t dropped_top_level_values() const { return dropped_values_; }

 private:
  enum class State { kStart, kKey, kColon, kValue, kEvents, kEvent, kOther, kDone };
  enum class Scan { kComplete, kNeedMore };

  // Scans a JSON value from `*p` with string and nesting awareness, advancing
  // `*p`; kComplete when the value ended (at *p).
  Scan ScanValue(const char** p, const char* end);
  // Advances past string content from `p`; clears in_string_ at the closing quote.
  const char* SkipStringBody(const char* p, const char* end);
  void BeginValue(char first);
  void EmitEvent(const char* begin, const char* end, bool in_place);

  Sink* sink_;
  size_t max_event_bytes_;
  State state_ = State::kStart;
  bool top_is_array_ = false;
  bool saw_events_ = false;
  int64_t events_ = 0;
  int64_t dropped_values_ = 0;
  int64_t offset_ = 0;  // bytes consumed before the current chunk

  // Value scanning state (kEvent, kOther).
  int depth_ = 0;
  bool in_string_ = false;
  bool escape_ = false;
  bool scalar_ = false;   // a top-level scalar value: ends at , } ] or space
  bool keep_ = true;      // false once a top-level value exceeded the limit
  std::string carry_;     // the part of the current value seen in earlier chunks
  std::string key_;       // current top-level key
  bool key_in_string_ = false;
  bool key_escape_ = false;
};

}  // namespace dynaflow
