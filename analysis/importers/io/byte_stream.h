// Streams a file's bytes in chunks, read (and inflated when gzip) on a
// background thread so that reading and parsing overlap on two cores.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "analysis/base/status.h"

namespace dynaflow {

// Every chunk handed out has at least this many readable bytes past its end,
// so parsers that read ahead (simdjson) may run on it in place.
inline constexpr size_t kChunkPadding = 64;

class ByteStream {
 public:
  virtual ~ByteStream() = default;

  // Opens `path`, detecting gzip by its magic bytes. BadInput when the file is
  // missing or unreadable.
  static StatusOr<std::unique_ptr<ByteStream>> Open(const std::string& path);

  // The next chunk of decompressed bytes, or an empty view at the end. The
  // view stays valid until the next call. BadInput for a truncated or corrupt
  // gzip stream.
  virtual StatusOr<std::string_view> Next() = 0;

  // Bytes of the file consumed so far, and its size, for progress reports.
  virtual int64_t file_bytes_read() const = 0;
  virtual int64_t file_size() const = 0;
  virtual bool gzip() const = 0;
};

// Reads up to `limit` decompressed bytes from the start of `path`.
StatusOr<std::string> ReadHead(const std::string& path, size_t limit);

}  // namespace dynaflow
