// The tracer of one process: its writer, its CUPTI session and the
// recording window. preload.cc owns one (and the process glue: constructor,
// exit, signals, fork, the C ABI); tests build their own with a fake CUPTI.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "plugin/preload/cupti_api.h"
#include "plugin/preload/cupti_session.h"
#include "plugin/preload/dynaflow_tracer.h"
#include "plugin/preload/graph_attribution.h"
#include "plugin/preload/realtime_clock.h"
#include "plugin/preload/tracer_config.h"
#include "plugin/preload/writer_thread.h"

namespace dynaflow {

// Loads CUPTI, or returns nullptr and says why.
using CuptiLoader = std::function<std::unique_ptr<CuptiApi>(std::string* error)>;

// When CUPTI is started (loaded, callbacks registered).
enum class CuptiStart {
  // When CUDA initialises (InitializeInjection, called by the driver), so
  // that no kernel runs before CUPTI; processes that never use CUDA never
  // load CUPTI.
  kAtCudaInit,
  // When the writer first sees the recording window open: for processes
  // whose CUDA_INJECTION64_PATH belongs to another tool.
  kAtWindowOpen,
};

// The first operator id of process `pid` (dynaflow_next_operator_id): ids are
// unique across the processes of a trace, and below 2^53 for any Linux pid
// (pid_max is at most 2^22), so JSON readers keep them exact.
constexpr uint64_t FirstOperatorId(int32_t pid) { return (static_cast<uint64_t>(pid) << 31) + 1; }

class Tracer {
 public:
  // Precondition: config.output_dir is set. Nothing starts until StartWriter().
  Tracer(TracerConfig config, CuptiLoader load_cupti, CuptiStart cupti_start);
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;
  // Shuts down and frees everything; the library never destroys its tracer.
  ~Tracer();

  // Starts this process's writer of <output_dir>/<pid>.db unless it runs
  // already (in a forked child it starts lazily, at the first record).
  void StartWriter();

  // Whether now is inside the recording window (DYNAFLOW_DELAY_S,
  // DYNAFLOW_DURATION_S), and whether operators are recorded (DYNAFLOW_OPS).
  bool Active() const;
  bool RecordOps() const { return config_.record_ops; }

  // The C ABI (dynaflow_tracer.h): any thread, never blocks on I/O.
  // An operator whose thread was capturing a CUDA stream into a graph when it
  // was pushed (graph_capture.h) is a capture-time operator
  // (Operator::in_graph_capture) when its record follows its pop on the same
  // thread, before that thread's next pop: the torch extension's order. A
  // record without such a push is never marked.
  void RecordOperator(const DynaflowOperatorRecord& record);
  void PushOperator(uint64_t id);
  void PopOperator();
  // The innermost operator pushed and not popped on the calling thread; 0
  // when none. What CUDA graph nodes created now are attributed to.
  static uint64_t CurrentOperator();
  // Metadata "rank": the torch.distributed rank, which replaces the
  // environment's (TracerConfig::rank) for the whole process at the merge.
  void RecordProcessGroupRank(int32_t rank);
  // Metadata "module_fingerprint.<root_class>" (a later value replaces it;
  // the Python side records each class once).
  void RecordModuleFingerprint(const std::string& root_class, const std::string& fingerprint);

  // The driver's CUDA_INJECTION64_PATH entry point: starts CUPTI once per
  // process, and enables it when the window is open.
  void OnCudaInit();
  // The NVTX loader's NVTX_INJECTION64_PATH entry point, forwarded to CUPTI's.
  int OnNvtxInit(NvtxGetExportTable get_export_table);

  // torch.profiler in the same process (dynaflow_tracer_lend_cupti and
  // dynaflow_tracer_reclaim_cupti, called by the Python side around the
  // profiler's start and stop). Its Kineto registers its own buffer
  // callbacks and clock when it starts and disables its kinds, which are
  // ours too, when it stops; CUPTI has one set of callbacks per process.
  // LendCupti flushes what CUPTI holds for the tracer (the caller has
  // synchronised the device), then leaves CUPTI's callbacks, clock and kinds
  // alone and pushes no operator ids (Kineto warns about each foreign one)
  // until ReclaimCupti, which registers and enables them again
  // (CuptiSession::Reclaim) and records the window in the metadata:
  // "torch_profiler_windows" counts every window; where CUPTI was enabled,
  // its GPU records went to torch.profiler: "cupti_kineto_window_count",
  // "cupti_kineto_windows" (start-end in dynaflow_now_ns, the first
  // kMaxListedWindows; an open window ends in '-') and
  // "cupti_kineto_operators" (operators launched meanwhile). A second lend
  // and a reclaim without lend do nothing.
  void LendCupti();
  void ReclaimCupti();
  static constexpr int kMaxListedWindows = 64;

  // Whether this tracer belongs to the calling process: false in the child
  // of vfork(), which shares the parent's memory but runs no fork handlers
  // and must not touch the parent's writer. Async-signal-safe.
  bool OwnsProcess() const { return pid_.load() == getpid(); }

  // Commits what was recorded so far (Flush) or also closes the store
  // (Finish), waiting up to `timeout`; false when not done in time or not
  // OwnsProcess(). Async-signal-safe.
  bool Flush(std::chrono::milliseconds timeout) noexcept;
  bool Finish(std::chrono::milliseconds timeout) noexcept;
  // Finish() for a process dying of `signal`, which the store then names
  // (metadata "exit_signal"). Async-signal-safe.
  bool FinishOnSignal(int signal, std::chrono::milliseconds timeout) noexcept;
  // Flush() from a signal handler whose program handles the signal itself:
  // the flush does not ask CUPTI (WriterThread::NoteSignalFlush).
  // Async-signal-safe.
  bool FlushOnSignal(std::chrono::milliseconds timeout) noexcept;
  // At exit: disables CUPTI, writes what remains and closes the store. Every
  // process that started a tracer leaves its <pid>.db, even if it recorded
  // nothing. Later records are ignored. `by` names the caller in the store
  // (metadata "final_flush"): Python's exit handler runs it before torch,
  // libcuda and libcupti tear down, the C exit handler after them.
  void Shutdown(const char* by = "c_exit");

  // pthread_atfork handlers. The child abandons the parent's writer and
  // CUPTI session state; its own start lazily under its own pid.
  void PrepareFork();
  void ParentAfterFork();
  void ChildAfterFork();

 private:
  WriterThread* EnsureWriter();
  std::map<std::string, std::string> ProcessMeta(int32_t pid);
  // Runs on the writer thread before each flush.
  void BeforeFlush(bool forced);
  // Loads the CUPTI library, once per process. Caller holds cupti_mu_.
  void LoadCuptiLocked();
  // Loads CUPTI and starts the session, once per process (and again in a
  // forked child). Caller holds cupti_mu_.
  void StartCuptiLocked();
  // Enables or disables CUPTI to match the window. Caller holds cupti_mu_.
  void SyncCuptiLocked();
  void SetCuptiUnavailableLocked(const std::string& reason);
  // Hands the current CUPTI status to the writer as metadata.
  void PublishCuptiStatus();
  // Hands the torch.profiler windows (LendCupti) to the writer as metadata.
  void PublishProfilerWindows();
  // "cupti_graph_nodes_forgotten": graph nodes beyond GraphAttribution's
  // bound, whose replayed kernels link to their launch. Writer thread only.
  void PublishForgottenGraphNodes();
  // Ends the lent window that began at lent_since_ns_. Caller holds cupti_mu_.
  void CloseLentWindowLocked();
  // Subscribes to CUDA graph node callbacks (graph_attribution.h) and says
  // the outcome in "cupti_graph_attribution". Caller holds cupti_mu_.
  void StartGraphAttributionLocked(const char* when);

  const TracerConfig config_;
  const CuptiLoader load_cupti_;
  const CuptiStart cupti_start_;
  std::chrono::steady_clock::time_point window_open_;
  std::chrono::steady_clock::time_point window_close_;
  int64_t start_time_ns_;
  std::atomic<int32_t> pid_;  // getpid(), updated in a forked child

  // Lock order, also taken in this order by PrepareFork: writer_mu_, the
  // writer's own locks, cupti_mu_.
  std::mutex writer_mu_;  // creating the writer
  std::atomic<WriterThread*> writer_{nullptr};
  std::unique_ptr<WriterThread> own_writer_;
  // Writers inherited from a parent: their threads did not survive fork()
  // and their locks may be held, so they are never touched again, nor freed.
  std::vector<WriterThread*> abandoned_;
  std::atomic<bool> shut_down_{false};

  std::mutex cupti_mu_;  // every change of CUPTI's state
  bool cupti_load_attempted_ = false;
  bool cupti_start_attempted_ = false;
  bool cupti_started_ = false;
  bool enable_attempted_ = false;
  std::unique_ptr<CuptiApi> cupti_;
  std::unique_ptr<CuptiSession> session_;
  std::string cupti_status_;  // the "cupti" metadata
  std::string cupti_version_;  // cuptiGetVersion once started: "cupti_api_version"
  std::string driver_version_;  // cuDriverGetVersion once started: "cuda_driver_version"
  std::string skipped_apis_;    // hot APIs whose records are off, once enabled: "cupti_skipped_apis"
  bool cupti_status_dirty_ = false;
  std::atomic<bool> cupti_problem_reported_{false};
  // The started session, for the C ABI's lock-free push and pop.
  std::atomic<CuptiSession*> session_for_abi_{nullptr};

  // torch.profiler's windows (LendCupti), under cupti_mu_ but the atomics.
  bool cupti_lent_ = false;
  bool lent_enabled_ = false;   // the session was enabled when lent: its records were lost
  bool start_deferred_ = false;  // CUDA initialised while lent: CUPTI starts at the reclaim
  int profiler_windows_ = 0;     // every window
  int lent_windows_ = 0;         // closed windows that lost records
  std::string lent_window_times_;
  int64_t lent_since_ns_ = 0;
  bool windows_dirty_ = false;
  std::atomic<bool> lent_for_abi_{false};
  std::atomic<uint64_t> lent_operators_{0};  // pushed while lent with CUPTI enabled

  // Replayed CUDA graph nodes' operators, once CUPTI is started. A forked
  // child abandons its parent's (its lock may be held) and makes its own.
  std::unique_ptr<GraphAttribution> graph_;
  // graph_ for the writer thread and the C ABI's push, without cupti_mu_.
  std::atomic<GraphAttribution*> graph_for_threads_{nullptr};
  std::string graph_status_;  // "cupti_graph_attribution"
  size_t graph_nodes_forgotten_ = 0;  // last published; writer thread only
};

}  // namespace dynaflow
