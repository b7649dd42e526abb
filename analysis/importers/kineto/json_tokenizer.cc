#include "analysis/importers/kineto/json_tokenizer.h"

#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "analysis/importers/io/byte_stream.h"

namespace dynaflow {
namespace {

// Top-level values other than the event array (deviceProperties,
// distributedInfo, ...) are small; anything larger is skipped, not buffered.
constexpr size_t kMaxTopLevelValue = 64 << 20;
// A top-level key longer than this is no trace's: the file is refused rather
// than the key buffered (a multi-gigabyte key once took 4 GB of memory).
constexpr size_t kMaxTopLevelKey = 64 << 10;

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

const char* SkipSpace(const char* p, const char* end) {
  while (p < end && IsSpace(*p)) ++p;
  return p;
}

// A UTF-8 byte order mark (EF BB BF) may precede the document.
bool IsByteOrderMark(char c) {
  auto u = static_cast<unsigned char>(c);
  return u == 0xEF || u == 0xBB || u == 0xBF;
}

// The first byte in [p, end) equal to one of Cs, or nullptr. Reads up to 15
// bytes past `end`, which Feed()'s padding (kChunkPadding) makes readable;
// matches there are ignored. Most strings and gaps between them are a few
// bytes long, so an inline 16-byte compare beats a memchr call.
template <char... Cs>
const char* FindAny(const char* p, const char* end) {
  static_assert(kChunkPadding >= 16, "FindAny reads up to 15 bytes past the end");
#if defined(__SSE2__)
  while (p < end) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    __m128i hit = _mm_setzero_si128();
    ((hit = _mm_or_si128(hit, _mm_cmpeq_epi8(v, _mm_set1_epi8(Cs)))), ...);
    const auto mask = static_cast<unsigned>(_mm_movemask_epi8(hit));
    if (mask != 0) {
      const char* found = p + __builtin_ctz(mask);
      return found < end ? found : nullptr;
    }
    p += 16;
  }
  return nullptr;
#else
  for (; p < end; ++p) {
    if (((*p == Cs) || ...)) return p;
  }
  return nullptr;
#endif
}

}  // namespace

void ChromeJsonTokenizer::BeginValue(char first) {
  depth_ = 0;
  in_string_ = false;
  escape_ = false;
  scalar_ = first != '{' && first != '[' && first != '"';
  keep_ = true;
  carry_.clear();
}

// String bodies are most of a trace's bytes, so they are skipped 16 bytes at
// a time rather than byte by byte: a quote ends the string unless an odd run of
// backslashes precedes it. Every byte before `p` in the string is already
// accounted for (an escape pending from the previous chunk is in escape_).
const char* ChromeJsonTokenizer::SkipStringBody(const char* p, const char* end) {
  if (escape_) {
    if (p == end) return p;
    escape_ = false;
    ++p;
  }
  while (p < end) {
    const char* quote = FindAny<'"'>(p, end);
    const char* stop = quote != nullptr ? quote : end;
    size_t backslashes = 0;
    for (const char* b = stop; b > p && b[-1] == '\\'; --b) ++backslashes;
    if (quote == nullptr) {
      escape_ = backslashes % 2 == 1;
      return end;
    }
    p = quote + 1;
    if (backslashes % 2 == 0) {
      in_string_ = false;
      return p;
    }
  }
  return p;
}

ChromeJsonTokenizer::Scan ChromeJsonTokenizer::ScanValue(const char** pp, const char* end) {
  const char* p = *pp;
  while (p < end) {
    if (in_string_) {
      p = SkipStringBody(p, end);
      if (!in_string_ && depth_ == 0) {
        *pp = p;
        return Scan::kComplete;
      }
      continue;
    }
    char c = *p;
    if (scalar_) {
      if (c == ',' || c == '}' || c == ']' || IsSpace(c)) {
        *pp = p;
        return Scan::kComplete;
      }
      ++p;
      continue;
    }
    // Outside strings only quotes and brackets matter.
    const char* next = FindAny<'"', '{', '[', '}', ']'>(p, end);
    if (next == nullptr) {
      p = end;
      break;
    }
    c = *next;
    p = next + 1;
    switch (c) {
      case '"':
        in_string_ = true;
        break;
      case '{':
      case '[':
        ++depth_;
        break;
      case '}':
      case ']':
        if (--depth_ == 0) {
          *pp = p;
          return Scan::kComplete;
        }
        break;
      default:
        break;
    }
  }
  *pp = p;
  return Scan::kNeedMore;
}

void ChromeJsonTokenizer::EmitEvent(const char* begin, const char* end, bool in_place) {
  std::string_view text = in_place ? std::string_view(begin, static_cast<size_t>(end - begin))
                                   : std::string_view(carry_);
  if (scalar_ || text.empty() || text[0] != '{') {
    sink_->OnNonObjectEvent();
    return;
  }
  ++events_;
  if (!in_place) {
    // Pad the reassembled copy the way chunks are padded.
    const size_t size = carry_.size();
    carry_.append(kChunkPadding, ' ');
    text = std::string_view(carry_.data(), size);
  }
  sink_->OnEvent(text);
}

Status ChromeJsonTokenizer::Feed(std::string_view chunk) {
  const char* p = chunk.data();
  const char* end = p + chunk.size();
  while (p < end) {
    switch (state_) {
      case State::kStart:
        while (p < end && (IsSpace(*p) || IsByteOrderMark(*p))) ++p;
        if (p == end) break;
        if (*p == '{') {
          state_ = State::kKey;
        } else if (*p == '[') {
          top_is_array_ = true;
          saw_events_ = true;
          state_ = State::kEvents;
        } else {
          return Status::BadInput("not a JSON trace: it does not start with '{' or '['");
        }
        ++p;
        break;

      case State::kKey:
        if (!key_in_string_) {
          while (p < end && (IsSpace(*p) || *p == ',')) ++p;
          if (p == end) break;
          if (*p == '}') {
            state_ = State::kDone;
            ++p;
            break;
          }
          if (*p != '"') return Status::BadInput("not a JSON trace: expected a key at top level");
          key_.clear();
          key_in_string_ = true;
          ++p;
        }
        while (p < end) {
          char c = *p++;
          if (key_escape_) {
            key_escape_ = false;
          } else if (c == '\\') {
            key_escape_ = true;
            continue;
          } else if (c == '"') {
            key_in_string_ = false;
            state_ = State::kColon;
            break;
          }
          key_.push_back(c);
          if (key_.size() > kMaxTopLevelKey) {
            std::string().swap(key_);
            return Status::BadInput("a top-level key is longer than 64 KiB: not a trace, refused "
                                    "to bound memory");
          }
        }
        break;

      case State::kColon:
        p = SkipSpace(p, end);
        if (p == end) break;
        if (*p != ':') return Status::BadInput("not a JSON trace: expected ':' after a key");
        ++p;
        state_ = State::kValue;
        break;

      case State::kValue:
        p = SkipSpace(p, end);
        if (p == end) break;
        if (key_ == "traceEvents" && *p == '[') {
          saw_events_ = true;
          state_ = State::kEvents;
          ++p;
        } else if (*p == '}' || *p == ']' || *p == ',') {
          return Status::BadInput("malformed JSON: a top-level key without a value");
        } else {
          BeginValue(*p);
          state_ = State::kOther;
        }
        break;

      case State::kOther: {
        const char* begin = p;
        if (ScanValue(&p, end) == Scan::kComplete) {
          if (keep_ && carry_.size() + static_cast<size_t>(p - begin) > kMaxTopLevelValue) {
            keep_ = false;  // over the bound in its last chunk
            std::string().swap(carry_);
          }
          if (keep_) {
            carry_.append(begin, p);
            sink_->OnTopLevel(key_, carry_);
          } else {
            ++dropped_values_;
          }
          carry_.clear();
          state_ = State::kKey;
        } else if (keep_) {
          carry_.append(begin, p);
          if (carry_.size() > kMaxTopLevelValue) {
            keep_ = false;
            std::string().swap(carry_);
          }
        }
        break;
      }

      case State::kEvents:
        while (p < end && (IsSpace(*p) || *p == ',')) ++p;
        if (p == end) break;
        if (*p == ']') {
          ++p;
          state_ = top_is_array_ ? State::kDone : State::kKey;
          break;
        }
        // A value never starts with '}'; scanning one as a scalar would
        // consume nothing and never advance.
        if (*p == '}') return Status::BadInput("malformed JSON: unexpected '}' in traceEvents");
        BeginValue(*p);
        state_ = State::kEvent;
        break;

      case State::kEvent: {
        const char* begin = p;
        const Scan scan = ScanValue(&p, end);
        if (carry_.size() + static_cast<size_t>(p - begin) > max_event_bytes_) {
          const int64_t at = offset_ + (begin - chunk.data()) - static_cast<int64_t>(carry_.size());
          std::string().swap(carry_);
          const std::string limit = max_event_bytes_ % (size_t{1} << 20) == 0
                                        ? std::to_string(max_event_bytes_ >> 20) + " MiB"
                                        : std::to_string(max_event_bytes_) + " bytes";
          return Status::BadInput("the trace event at byte " + std::to_string(at) + " is longer than " +
                                  limit + ": refused, to bound memory");
        }
        if (scan == Scan::kComplete) {
          if (carry_.empty()) {
            EmitEvent(begin, p, /*in_place=*/true);
          } else {
            carry_.append(begin, p);
            EmitEvent(nullptr, nullptr, /*in_place=*/false);
          }
          carry_.clear();
          state_ = State::kEvents;
        } else {
          carry_.append(begin, p);
        }
        break;
      }

      case State::kDone:
        p = end;  // trailing bytes after the document are ignored
        break;
    }
  }
  offset_ += static_cast<int64_t>(chunk.size());
  return Status::Ok();
}

Status ChromeJsonTokenizer::Finish() {
  switch (state_) {
    case State::kDone:
      if (!saw_events_) {
        return Status::BadInput("JSON without a \"traceEvents\" array: not a Kineto/Chrome trace");
      }
      if (top_is_array_ && events_ == 0) {
        return Status::BadInput("JSON array without trace events: not a Kineto/Chrome trace");
      }
      return Status::Ok();
    case State::kStart:
      return Status::BadInput("empty input: no JSON trace");
    case State::kEvents:
    case State::kEvent:
      return Status::BadInput("truncated trace: the input ends inside \"traceEvents\" after " +
                              std::to_string(events_) + " events");
    default:
      return Status::BadInput("truncated trace: the JSON document ends early (after " +
                              std::to_string(offset_) + " bytes)");
  }
}

}  // namespace dynaflow
