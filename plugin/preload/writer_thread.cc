#include "plugin/preload/writer_thread.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <time.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "plugin/preload/log.h"

namespace dynaflow {
namespace {

// The queue wakes the writer once it holds this much (or a quarter of its
// bound, if smaller), so that a burst is converted before the queue fills.
constexpr size_t kWakeBytes = size_t{8} << 20;

constexpr uint64_t kAllFlushed = std::numeric_limits<uint64_t>::max();

timespec ToTimespec(std::chrono::steady_clock::time_point t) {
  // steady_clock is CLOCK_MONOTONIC on Linux, the clock given to sem_clockwait.
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch());
  return timespec{static_cast<time_t>(ns.count() / 1000000000),
                  static_cast<long>(ns.count() % 1000000000)};
}

// A deadline `timeout` from now, read with clock_gettime (async-signal-safe).
timespec MonotonicDeadline(std::chrono::milliseconds timeout) {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  const int64_t ms = std::min<int64_t>(timeout.count(), int64_t{1} << 40);
  now.tv_sec += static_cast<time_t>(ms / 1000);
  now.tv_nsec += static_cast<long>(ms % 1000) * 1000000;
  if (now.tv_nsec >= 1000000000) {
    now.tv_sec += 1;
    now.tv_nsec -= 1000000000;
  }
  return now;
}

}  // namespace

WriterThread::OperatorWork::OperatorWork(const DynaflowOperatorRecord& r, bool in_graph_capture)
    : numbers(r), in_graph_capture(in_graph_capture) {
  const char* fields[kTextFields] = {r.name, r.input_shapes, r.input_types, r.module_path,
                                     r.collective};
  size_t total = 0;
  for (const char* f : fields) total += (f != nullptr ? std::strlen(f) : 0) + 1;
  text.reserve(total);
  for (size_t i = 0; i < kTextFields; ++i) {
    offsets[i] = static_cast<uint32_t>(text.size());
    if (fields[i] != nullptr) text += fields[i];
    text += '\0';
  }
  numbers.name = numbers.input_shapes = numbers.input_types = numbers.module_path =
      numbers.collective = nullptr;
}

DynaflowOperatorRecord WriterThread::OperatorWork::View() const {
  DynaflowOperatorRecord r = numbers;
  r.name = text.data() + offsets[0];
  r.input_shapes = text.data() + offsets[1];
  r.input_types = text.data() + offsets[2];
  r.module_path = text.data() + offsets[3];
  r.collective = text.data() + offsets[4];
  return r;
}

WriterThread::WriterThread(WriterOptions options)
    : options_(std::move(options)),
      converter_(ConverterOptions{.rank = options_.rank,
                                  .pid = options_.pid,
                                  .graph_node_operator = options_.graph_node_operator}) {
  sem_init(&wake_, 0, 0);
  sem_init(&flushed_, 0, 0);
}

void WriterThread::Start() {
  // The thread starts with every signal blocked, so that the program's
  // signals (SIGINT, SIGTERM, SIGALRM...) reach the program's own threads,
  // but for the signals of a fault: a fault with its signal blocked kills the
  // process without running any handler (the tracer's, or Python's
  // faulthandler), and the trace would not say what killed it.
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  for (int fault : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) sigdelset(&all, fault);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  thread_ = std::thread([this] { Run(); });
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

WriterThread::~WriterThread() {
  (void)Stop();
  sem_destroy(&wake_);
  sem_destroy(&flushed_);
}

bool WriterThread::EnqueueOperator(const DynaflowOperatorRecord& record,
                                   bool in_graph_capture) noexcept {
  try {
    WorkItem item(std::in_place_type<OperatorWork>, record, in_graph_capture);
    const size_t bytes = sizeof(WorkItem) + std::get<OperatorWork>(item).text.size();
    if (Push(item, bytes)) {
      operators_queued_.fetch_add(1);
      return true;
    }
  } catch (...) {
    // Out of memory copying the record: it is dropped like any other.
  }
  dropped_.fetch_add(1);
  return false;
}

bool WriterThread::EnqueueBuffer(ActivityBuffer buffer) noexcept {
  const size_t bytes = sizeof(WorkItem) + buffer.size;
  WorkItem item(std::move(buffer));
  if (Push(item, bytes)) {
    buffers_queued_.fetch_add(1);
    return true;
  }
  const ActivityBuffer& refused = std::get<ActivityBuffer>(item);
  if (CuptiApi* cupti = cupti_.load()) {
    dropped_.fetch_add(CountActivityRecords(*cupti, refused.data.get(), refused.valid_size));
  }
  return false;
}

void WriterThread::AddCuptiDropped(size_t records) noexcept { cupti_dropped_.fetch_add(records); }

void WriterThread::SetMeta(std::string key, std::string value) noexcept {
  try {
    std::lock_guard<std::mutex> lock(queue_mu_);
    pending_meta_[std::move(key)] = std::move(value);
  } catch (...) {
    // Out of memory: the entry keeps its previous value.
  }
}

bool WriterThread::Push(WorkItem& item, size_t bytes) noexcept {
  bool wake = false;
  try {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (closed_ || queued_bytes_ + bytes > options_.max_queued_bytes) return false;
    queue_.push_back(std::move(item));  // moves only when it succeeds
    queued_bytes_ += bytes;
    peak_queued_bytes_ = std::max(peak_queued_bytes_, queued_bytes_);
    const size_t wake_bytes = std::min(kWakeBytes, options_.max_queued_bytes / 4);
    if (!wake_posted_ && queued_bytes_ >= wake_bytes) wake = wake_posted_ = true;
  } catch (...) {
    return false;
  }
  if (wake) sem_post(&wake_);
  return true;
}

bool WriterThread::Flush(std::chrono::milliseconds timeout) noexcept {
  return WaitFlushed(RequestFlush(/*finish=*/false), timeout);
}

bool WriterThread::Finish(std::chrono::milliseconds timeout) noexcept {
  return WaitFlushed(RequestFlush(/*finish=*/true), timeout);
}

Status WriterThread::Stop() noexcept {
  if (thread_.joinable()) {
    RequestFlush(/*finish=*/true);
    try {
      thread_.join();
    } catch (...) {
      // Only a join from the writer thread itself throws; nothing calls that.
    }
  }
  return status_;
}

void WriterThread::LockForFork() noexcept {
  io_mu_.lock();
  queue_mu_.lock();
}

void WriterThread::UnlockAfterFork() noexcept {
  queue_mu_.unlock();
  io_mu_.unlock();
}

WriterCounters WriterThread::counters() const {
  WriterCounters c;
  c.operators_queued = operators_queued_.load();
  c.buffers_queued = buffers_queued_.load();
  c.dropped_records = dropped_.load();
  c.cupti_dropped_records = cupti_dropped_.load();
  c.batches_written = batches_written_.load();
  std::lock_guard<std::mutex> lock(queue_mu_);
  c.peak_queued_bytes = peak_queued_bytes_;
  return c;
}

uint64_t WriterThread::RequestFlush(bool finish) noexcept {
  if (finish) finish_requested_.store(true);
  const uint64_t generation = flush_requested_.fetch_add(1) + 1;
  sem_post(&wake_);
  return generation;
}

bool WriterThread::WaitFlushed(uint64_t generation, std::chrono::milliseconds timeout) noexcept {
  // A signal taken on the writer thread itself (a fault in its own work):
  // nobody would answer.
  if (tid_.load() == static_cast<pid_t>(syscall(SYS_gettid))) return false;
  const timespec deadline = MonotonicDeadline(timeout);
  waiters_.fetch_add(1);
  while (flush_done_.load() < generation) {
    if (sem_clockwait(&flushed_, CLOCK_MONOTONIC, &deadline) != 0 && errno == ETIMEDOUT) break;
  }
  waiters_.fetch_sub(1);
  return flush_done_.load() >= generation;
}

void WriterThread::Completed(uint64_t generation) {
  flush_done_.store(std::max(flush_done_.load(), generation));
  // One post per waiter: each rechecks its own generation. A waiter that
  // timed out in between leaves a post behind, which only causes a recheck.
  for (int n = waiters_.load(); n > 0; --n) sem_post(&flushed_);
}

void WriterThread::Run() noexcept {
  tid_.store(static_cast<pid_t>(syscall(SYS_gettid)));
  Guarded([this] { OpenStore(); });
  auto next_flush = std::chrono::steady_clock::now() + options_.flush_interval;
  while (!finish_requested_.load()) {
    WaitForWork(next_flush);
    if (finish_requested_.load()) break;
    const uint64_t requested = flush_requested_.load();
    const bool asked = requested > flush_done_.load();
    Guarded([&] { Step(asked, &next_flush); });
    if (asked) Completed(requested);
  }
  Guarded([this] { FinalFlush(); });
  Completed(kAllFlushed);
}

template <typename Fn>
void WriterThread::Guarded(Fn&& work) noexcept {
  std::lock_guard<std::mutex> io(io_mu_);
  try {
    work();
  } catch (const std::exception& e) {
    Fail(Status::Failure(options_.path + ": tracer writer: " + e.what()));
  } catch (...) {
    Fail(Status::Failure(options_.path + ": tracer writer: unknown error"));
  }
}

void WriterThread::Step(bool asked, std::chrono::steady_clock::time_point* next_flush) {
  Drain();
  const auto now = std::chrono::steady_clock::now();
  if (!asked && now < *next_flush) return;
  const bool from_signal = asked && signal_flush_.exchange(false);
  if (options_.before_flush && !from_signal) options_.before_flush(/*forced=*/asked);
  Drain();
  WriteBatch(/*release_all=*/asked);
  *next_flush = now + options_.flush_interval;
}

void WriterThread::FinalFlush() {
  // Dying of a signal, the faulting thread may hold the tracer's CUPTI lock
  // or have faulted inside CUPTI: asking CUPTI for its buffers would wait
  // out the handler's timeout and lose everything queued (an H200 run under
  // --ops off died with nothing recorded). What reached the queue is written.
  if (options_.before_flush && exit_signal_.load() == 0) options_.before_flush(/*forced=*/true);
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    closed_ = true;  // what arrives from now on is dropped
  }
  Drain();
  converter_.EndOfTrace();
  WriteBatch(/*release_all=*/true);
  if (!store_) return;
  const Status closed = store_->Close();
  if (!closed.ok()) Fail(closed);
  store_.reset();
}

void WriterThread::OpenStore() {
  StatusOr<std::unique_ptr<TraceDbWriter>> created = TraceDbWriter::Create(options_.path);
  if (!created.ok()) {
    Fail(created.status());
    return;
  }
  store_ = std::move(*created);
  // The process and its metadata go in at once, so that even a process
  // killed before its first flush leaves a store that says what it was.
  Trace first;
  first.metadata = options_.meta;
  first.processes.push_back({options_.rank, options_.pid, options_.process_name, "", {}});
  const Status written = store_->Write(first);
  if (!written.ok()) Fail(written);
}

void WriterThread::WaitForWork(std::chrono::steady_clock::time_point deadline) {
  const timespec ts = ToTimespec(deadline);
  while (sem_clockwait(&wake_, CLOCK_MONOTONIC, &ts) != 0 && errno == EINTR) {
  }
}

void WriterThread::Drain() {
  std::map<std::string, std::string> meta;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    draining_.swap(queue_);
    queued_bytes_ = 0;
    wake_posted_ = false;
    meta.swap(pending_meta_);
  }
  for (auto& [key, value] : meta) meta_to_write_[key] = std::move(value);
  converter_.set_cupti(cupti_.load());
  for (const WorkItem& item : draining_) {
    if (const auto* op = std::get_if<OperatorWork>(&item)) {
      converter_.AddOperator(op->View(), op->in_graph_capture);
    } else {
      const ActivityBuffer& buffer = std::get<ActivityBuffer>(item);
      converter_.AddBuffer(buffer.data.get(), buffer.valid_size);
    }
    // Converted rows are bounded too: a full batch is written at once.
    if (converter_.batch_rows() >= options_.max_batch_rows) WriteBatch(/*release_all=*/false);
  }
  draining_.clear();  // frees the buffers; keeps the capacity for the next swap
}

void WriterThread::WriteBatch(bool release_all) {
  Trace batch = converter_.TakeBatch(release_all);
  const uint64_t dropped = dropped_.load();
  const uint64_t cupti_dropped = cupti_dropped_.load();
  AddDropCounts(&batch, dropped, cupti_dropped);
  for (auto& [key, value] : meta_to_write_) batch.metadata[key] = value;
  if (const int signal = exit_signal_.load(); signal != 0) {
    const char* abbrev = sigabbrev_np(signal);
    batch.metadata["exit_signal"] = abbrev != nullptr ? std::string("SIG") + abbrev
                                                      : std::to_string(signal);
  }
  if (!store_) return;
  const Status written = store_->Write(batch);
  if (!written.ok()) {
    Fail(written);
    return;
  }
  meta_to_write_.clear();
  dropped_written_ = dropped;
  cupti_dropped_written_ = cupti_dropped;
  batches_written_.fetch_add(1);
}

void WriterThread::AddDropCounts(Trace* batch, uint64_t dropped, uint64_t cupti_dropped) const {
  if (dropped > dropped_written_) {
    batch->stats.Add("tracer_queue_full", "data_loss",
                     "records the tracer dropped because its queue was full",
                     static_cast<int64_t>(dropped - dropped_written_));
  }
  if (cupti_dropped > cupti_dropped_written_) {
    batch->stats.Add("cupti_dropped_records", "data_loss",
                     "activity records CUPTI dropped for lack of buffer space",
                     static_cast<int64_t>(cupti_dropped - cupti_dropped_written_));
  }
  batch->metadata["dropped_records"] = std::to_string(dropped + cupti_dropped);
}

void WriterThread::Fail(const Status& status) {
  if (status_.ok()) status_ = status;
  LogOnce(failure_reported_, status.message());
}

}  // namespace dynaflow
