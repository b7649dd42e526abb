// The tracer's only background thread: it receives operator records and raw
// CUPTI buffers through a bounded queue, converts them off the application's
// threads and writes them to a trace.db in batches.
#pragma once

#include <semaphore.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "analysis/base/status.h"
#include "analysis/store/trace_db_writer.h"
#include "plugin/preload/activity_buffer.h"
#include "plugin/preload/activity_converter.h"
#include "plugin/preload/cupti_api.h"
#include "plugin/preload/dynaflow_tracer.h"

namespace dynaflow {

struct WriterOptions {
  std::string path;  // the trace.db to create
  int32_t rank = 0;
  int32_t pid = 0;
  std::string process_name;
  std::map<std::string, std::string> meta;  // written as soon as the store exists
  // Converted records are written at least this often.
  std::chrono::milliseconds flush_interval{1000};
  // Bound of the queue: records' structs, their strings and CUPTI buffers.
  // What does not fit is dropped and counted. The writer converts one queue's
  // worth at a time, so the tracer holds at most twice this, plus a batch.
  size_t max_queued_bytes = size_t{256} << 20;
  // Converted rows held in memory: a batch this large is written at once,
  // before the flush interval ends.
  size_t max_batch_rows = 100000;
  // Runs on the writer thread before each flush; `forced` for a requested or
  // final flush. The tracer makes CUPTI complete its buffers here.
  std::function<void(bool forced)> before_flush;
  // ConverterOptions::graph_node_operator; called on the writer thread.
  std::function<int64_t(uint64_t graph_node)> graph_node_operator;
};

// Totals since the writer started.
struct WriterCounters {
  uint64_t operators_queued = 0;  // accepted into the queue
  uint64_t buffers_queued = 0;
  uint64_t dropped_records = 0;  // refused by a full (or closed) queue
  uint64_t cupti_dropped_records = 0;
  size_t peak_queued_bytes = 0;  // never more than max_queued_bytes
  uint64_t batches_written = 0;
};

class WriterThread {
 public:
  // Nothing runs before Start(); records may already be queued.
  explicit WriterThread(WriterOptions options);
  WriterThread(const WriterThread&) = delete;
  WriterThread& operator=(const WriterThread&) = delete;
  ~WriterThread();  // Stop()

  // Starts the thread, which creates the store (a failure is reported once on
  // stderr; records are then dropped). Once only. Separate from construction
  // so that the owner can publish the writer first: a signal handler that
  // sees no writer must find no store half-created either.
  void Start();

  // The CUPTI that reads activity buffers; it must outlive the writer. Set
  // before the first buffer is queued (CUPTI may load long after the writer
  // starts, or never).
  void AttachCupti(CuptiApi* cupti) noexcept { cupti_.store(cupti); }

  // Producers, on any thread: never block on I/O, never throw. A record that
  // does not fit in the queue is dropped and counted; false then.
  // `in_graph_capture`: the operator began while its thread captured a CUDA
  // graph (Operator::in_graph_capture).
  bool EnqueueOperator(const DynaflowOperatorRecord& record,
                       bool in_graph_capture = false) noexcept;
  bool EnqueueBuffer(ActivityBuffer buffer) noexcept;
  void AddCuptiDropped(size_t records) noexcept;
  // Written with the next flush.
  void SetMeta(std::string key, std::string value) noexcept;
  // The fatal signal the process is dying of, written by the writer thread
  // with the next flush as metadata "exit_signal" (e.g. "SIGSEGV").
  // Async-signal-safe (an atomic).
  void NoteExitSignal(int signal) noexcept { exit_signal_.store(signal); }
  // The next flush is asked for by a signal handler: it writes what reached
  // the queue without asking CUPTI for its buffers (before_flush), as the
  // thread that took the signal may hold the tracer's CUPTI lock or have
  // faulted inside CUPTI. The final flush of a process dying of a signal
  // (NoteExitSignal) does not ask CUPTI either. Async-signal-safe (an atomic).
  void NoteSignalFlush() noexcept { signal_flush_.store(true); }

  // Ask for everything queued so far to be committed (Flush) or, in
  // addition, for the store to be closed and the thread to end (Finish), and
  // wait up to `timeout` for it. True when done in time. Async-signal-safe
  // (atomics and semaphores only), so signal handlers may call them.
  bool Flush(std::chrono::milliseconds timeout) noexcept;
  bool Finish(std::chrono::milliseconds timeout) noexcept;
  // Finish() without a time limit, then joins the thread. The status of the
  // store: the first failure to create, write or close it. Idempotent.
  Status Stop() noexcept;

  // Around fork(): hold the locks so that the child never inherits one taken
  // mid-operation (or SQLite mid-write). The child abandons this writer.
  void LockForFork() noexcept;
  void UnlockAfterFork() noexcept;

  WriterCounters counters() const;

 private:
  // An operator record with its strings copied (at offsets into `text`).
  struct OperatorWork {
    OperatorWork(const DynaflowOperatorRecord& r, bool in_graph_capture);
    DynaflowOperatorRecord View() const;
    // name, input_shapes, input_types, module_path, collective
    static constexpr size_t kTextFields = 5;
    DynaflowOperatorRecord numbers;  // string fields unset
    bool in_graph_capture;
    uint32_t offsets[kTextFields];
    std::string text;
  };
  using WorkItem = std::variant<OperatorWork, ActivityBuffer>;

  bool Push(WorkItem& item, size_t bytes) noexcept;
  uint64_t RequestFlush(bool finish) noexcept;
  bool WaitFlushed(uint64_t generation, std::chrono::milliseconds timeout) noexcept;

  void Run() noexcept;
  // Runs `work` holding io_mu_; a failure is recorded and reported, never thrown.
  template <typename Fn>
  void Guarded(Fn&& work) noexcept;
  void OpenStore();
  // Waits until `deadline` or until something wakes the thread.
  void WaitForWork(std::chrono::steady_clock::time_point deadline);
  // Converts what is queued; writes a batch when the flush interval is over
  // or a flush was asked for.
  void Step(bool asked, std::chrono::steady_clock::time_point* next_flush);
  void FinalFlush();
  // Converts what is queued (writing full batches on the way).
  void Drain();
  void WriteBatch(bool release_all);
  void AddDropCounts(Trace* batch, uint64_t dropped, uint64_t cupti_dropped) const;
  void Fail(const Status& status);
  void Completed(uint64_t generation);

  WriterOptions options_;
  std::atomic<CuptiApi*> cupti_{nullptr};
  ActivityConverter converter_;
  std::unique_ptr<TraceDbWriter> store_;
  Status status_;
  std::atomic<bool> failure_reported_{false};
  std::map<std::string, std::string> meta_to_write_;  // the writer's, until written
  std::vector<WorkItem> draining_;                     // the writer's, swapped with queue_

  // Producers and the writer.
  mutable std::mutex queue_mu_;
  std::vector<WorkItem> queue_;
  size_t queued_bytes_ = 0;
  size_t peak_queued_bytes_ = 0;
  bool wake_posted_ = false;
  bool closed_ = false;
  std::map<std::string, std::string> pending_meta_;

  // Held by the writer while it converts or writes (see LockForFork).
  std::mutex io_mu_;

  std::atomic<uint64_t> operators_queued_{0};
  std::atomic<uint64_t> buffers_queued_{0};
  std::atomic<int> exit_signal_{0};
  std::atomic<bool> signal_flush_{false};
  std::atomic<pid_t> tid_{0};  // the writer thread's, once it runs
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint64_t> cupti_dropped_{0};
  std::atomic<uint64_t> batches_written_{0};
  uint64_t dropped_written_ = 0;  // the writer's: totals already in the store
  uint64_t cupti_dropped_written_ = 0;

  // Wake-ups and flush requests (async-signal-safe).
  sem_t wake_;
  sem_t flushed_;
  std::atomic<uint64_t> flush_requested_{0};
  std::atomic<uint64_t> flush_done_{0};
  std::atomic<bool> finish_requested_{false};
  std::atomic<int> waiters_{0};

  std::thread thread_;
};

}  // namespace dynaflow
