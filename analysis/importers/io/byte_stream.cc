#include "analysis/importers/io/byte_stream.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace dynaflow {
namespace {

constexpr size_t kInflateChunk = 4 << 20;
constexpr size_t kCompressedBlock = 1 << 20;
constexpr int kInflateBuffers = 4;

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// read() that retries on EINTR and fills `n` bytes unless the file ends.
ssize_t ReadFull(int fd, char* buf, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = read(fd, buf + done, n - done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return static_cast<ssize_t>(done);
}

// Reads, and inflates when gzip, on a producer thread into a small ring of
// buffers; the consumer holds at most one buffer at a time, so memory stays at
// a few megabytes. Plain files are read there too, so that the parsing thread
// spends no time copying them out of the page cache.
class BackgroundStream : public ByteStream {
 public:
  BackgroundStream(std::string path, int fd, int64_t size, bool gzip)
      : path_(std::move(path)), fd_(fd), size_(size), gzip_(gzip) {
    for (int i = 0; i < kInflateBuffers; ++i) {
      buffers_.emplace_back(kInflateChunk + kChunkPadding, 0);
      free_.push_back(i);
    }
    producer_ = std::thread([this] { Produce(); });
  }

  ~BackgroundStream() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    producer_.join();
  }

  StatusOr<std::string_view> Next() override {
    std::unique_lock<std::mutex> lock(mu_);
    if (held_ >= 0) {
      free_.push_back(held_);
      held_ = -1;
      cv_.notify_all();
    }
    cv_.wait(lock, [this] { return !ready_.empty() || done_; });
    if (ready_.empty()) {
      if (!error_.ok()) return error_;
      return std::string_view();
    }
    auto [index, length] = ready_.front();
    ready_.pop_front();
    held_ = index;
    return std::string_view(buffers_[index].data(), length);
  }
  int64_t file_bytes_read() const override { return read_.load(); }
  int64_t file_size() const override { return size_; }
  bool gzip() const override { return gzip_; }

 private:
  int AcquireBuffer() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !free_.empty() || stop_; });
    if (stop_) return -1;
    int index = free_.front();
    free_.pop_front();
    return index;
  }

  void Publish(int index, size_t length) {
    std::memset(buffers_[index].data() + length, 0, kChunkPadding);
    std::lock_guard<std::mutex> lock(mu_);
    ready_.emplace_back(index, length);
    cv_.notify_all();
  }

  void Finish(Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::move(status);
    done_ = true;
    cv_.notify_all();
  }

  void Produce() {
    if (gzip_) {
      ProduceInflated();
    } else {
      ProducePlain();
    }
  }

  void ProducePlain() {
    Status status;
    for (;;) {
      const int out = AcquireBuffer();
      if (out < 0) break;
      ssize_t n = ReadFull(fd_.get(), buffers_[out].data(), kInflateChunk);
      if (n < 0) {
        status = Status::BadInput(path_ + ": read failed: " + std::strerror(errno));
        break;
      }
      if (n == 0) break;
      read_ += n;
      Publish(out, static_cast<size_t>(n));
    }
    Finish(std::move(status));
  }

  void ProduceInflated() {
    z_stream zs{};
    // 15 + 32: accept gzip or zlib headers.
    if (inflateInit2(&zs, 15 + 32) != Z_OK) {
      Finish(Status::Failure(path_ + ": cannot initialise zlib"));
      return;
    }
    std::vector<unsigned char> in(kCompressedBlock);
    bool input_done = false;
    bool stream_end = false;  // the last gzip member ended cleanly
    int out = AcquireBuffer();
    size_t out_len = 0;
    Status status;
    while (out >= 0) {
      if (zs.avail_in == 0 && !input_done) {
        ssize_t n = ReadFull(fd_.get(), reinterpret_cast<char*>(in.data()), in.size());
        if (n < 0) {
          status = Status::BadInput(path_ + ": read failed: " + std::strerror(errno));
          break;
        }
        read_ += n;
        input_done = n == 0;
        zs.next_in = in.data();
        zs.avail_in = static_cast<uInt>(n);
      }
      if (zs.avail_in == 0 && input_done) {
        if (!stream_end) {
          status = Status::BadInput(path_ + ": truncated gzip stream (the file ends before "
                                            "the compressed data does)");
        }
        break;
      }
      zs.next_out = reinterpret_cast<unsigned char*>(buffers_[out].data()) + out_len;
      zs.avail_out = static_cast<uInt>(kInflateChunk - out_len);
      int rc = inflate(&zs, Z_NO_FLUSH);
      out_len = kInflateChunk - zs.avail_out;
      stream_end = false;
      if (rc == Z_STREAM_END) {
        stream_end = true;
        inflateReset(&zs);  // another gzip member may follow
      } else if (rc == Z_NEED_DICT || rc == Z_DATA_ERROR || rc == Z_MEM_ERROR) {
        status = Status::BadInput(path_ + ": corrupt gzip data: " +
                                  (zs.msg != nullptr ? zs.msg : "inflate failed"));
        break;
      }
      if (out_len == kInflateChunk) {
        Publish(out, out_len);
        out = AcquireBuffer();
        out_len = 0;
      }
    }
    if (out >= 0 && out_len > 0 && status.ok()) Publish(out, out_len);
    inflateEnd(&zs);
    Finish(std::move(status));
  }

  std::string path_;
  Fd fd_;
  int64_t size_;
  bool gzip_;
  std::atomic<int64_t> read_{0};
  std::vector<std::vector<char>> buffers_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> free_;
  std::deque<std::pair<int, size_t>> ready_;
  int held_ = -1;
  bool done_ = false;
  bool stop_ = false;
  Status error_;
  std::thread producer_;
};

}  // namespace

StatusOr<std::unique_ptr<ByteStream>> ByteStream::Open(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::BadInput(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    close(fd);
    return Status::BadInput(path + ": not a regular file");
  }
  unsigned char magic[2] = {0, 0};
  ssize_t n = pread(fd, magic, 2, 0);
  if (n == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
    return std::unique_ptr<ByteStream>(new BackgroundStream(path, fd, st.st_size, true));
  }
  return std::unique_ptr<ByteStream>(new BackgroundStream(path, fd, st.st_size, false));
}

StatusOr<std::string> ReadHead(const std::string& path, size_t limit) {
  // Reads synchronously: the probe needs a few kilobytes, not a pipeline.
  // gzread passes plain files through unchanged.
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::BadInput(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    close(fd);
    return Status::BadInput(path + ": not a regular file");
  }
  gzFile gz = gzdopen(fd, "rb");
  if (gz == nullptr) {
    close(fd);
    return Status::BadInput(path + ": cannot read");
  }
  std::string head(limit, '\0');
  int n = gzread(gz, head.data(), static_cast<unsigned>(limit));
  gzclose(gz);
  // A truncated gzip still has a readable head; its reader reports the truncation.
  head.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return head;
}

}  // namespace dynaflow
