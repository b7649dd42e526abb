#include "plugin/preload/tracer.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <utility>

#include "plugin/preload/log.h"

namespace dynaflow {
namespace {

// A CUDA version number as CUDA names it: 13020 is "13.2".
std::string CudaVersionName(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

constexpr char kCuptiNotStarted[] =
    "unavailable: CUPTI was not started (the process did not initialise CUDA)";

std::string ReadProcFile(const char* path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// argv joined with spaces.
std::string CommandLine() {
  std::string args = ReadProcFile("/proc/self/cmdline");
  while (!args.empty() && args.back() == '\0') args.pop_back();
  std::replace(args.begin(), args.end(), '\0', ' ');
  return args;
}

std::string ProcessName() {
  std::string comm = ReadProcFile("/proc/self/comm");
  if (!comm.empty() && comm.back() == '\n') comm.pop_back();
  return comm;
}

// This thread's open operators and which of their pushes reached CUPTI:
// CUPTI may be enabled (or disabled) between a push and its pop, and a pop
// must match a push.
// `in_graph_capture`: the thread was capturing a stream when it was pushed.
struct OpenOperator {
  uint64_t id;
  bool to_cupti;
  bool in_graph_capture;
};
thread_local std::vector<OpenOperator> t_open_operators;
// The last operator this thread popped if it began during a stream capture,
// 0 otherwise: its record, which follows the pop, is marked.
thread_local uint64_t t_popped_in_graph_capture = 0;

}  // namespace

Tracer::Tracer(TracerConfig config, CuptiLoader load_cupti, CuptiStart cupti_start)
    : config_(std::move(config)),
      load_cupti_(std::move(load_cupti)),
      cupti_start_(cupti_start),
      start_time_ns_(RealtimeNs()),
      pid_(static_cast<int32_t>(getpid())),
      cupti_status_(kCuptiNotStarted) {
  using Clock = std::chrono::steady_clock;
  window_open_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(config_.delay);
  window_close_ = config_.duration.count() > 0
                      ? window_open_ + std::chrono::duration_cast<Clock::duration>(config_.duration)
                      : Clock::time_point::max();
}

Tracer::~Tracer() {
  Shutdown();
  own_writer_.reset();
  std::lock_guard<std::mutex> lock(cupti_mu_);
  session_for_abi_.store(nullptr);
  session_.reset();
}

void Tracer::StartWriter() { (void)EnsureWriter(); }

bool Tracer::Active() const {
  const auto now = std::chrono::steady_clock::now();
  return now >= window_open_ && now < window_close_ && !shut_down_.load();
}

void Tracer::RecordOperator(const DynaflowOperatorRecord& record) {
  const bool in_graph_capture = record.id != 0 && record.id == t_popped_in_graph_capture;
  t_popped_in_graph_capture = 0;
  if (!config_.record_ops || !Active()) return;
  if (WriterThread* writer = EnsureWriter()) writer->EnqueueOperator(record, in_graph_capture);
}

void Tracer::RecordProcessGroupRank(int32_t rank) {
  if (WriterThread* writer = EnsureWriter()) writer->SetMeta("rank", std::to_string(rank));
}

void Tracer::RecordModuleFingerprint(const std::string& root_class,
                                     const std::string& fingerprint) {
  if (WriterThread* writer = EnsureWriter()) {
    writer->SetMeta("module_fingerprint." + root_class, fingerprint);
  }
}

void Tracer::PushOperator(uint64_t id) {
  CuptiSession* session = session_for_abi_.load();
  const bool enabled = session != nullptr && session->enabled();
  const bool lent = lent_for_abi_.load(std::memory_order_relaxed);
  if (enabled && lent) lent_operators_.fetch_add(1, std::memory_order_relaxed);
  const bool to_cupti = enabled && !lent;
  GraphAttribution* graph = graph_for_threads_.load();
  const bool in_graph_capture = graph != nullptr && graph->CallingThreadCapturing();
  t_open_operators.push_back({id, to_cupti, in_graph_capture});
  if (to_cupti) session->PushExternalId(id);
}

void Tracer::PopOperator() {
  if (t_open_operators.empty()) return;  // unbalanced pop: nothing to undo
  const OpenOperator popped = t_open_operators.back();
  t_open_operators.pop_back();
  t_popped_in_graph_capture = popped.in_graph_capture ? popped.id : 0;
  const bool to_cupti = popped.to_cupti;
  CuptiSession* session = session_for_abi_.load();
  if (to_cupti && session != nullptr) session->PopExternalId();
}

uint64_t Tracer::CurrentOperator() {
  return t_open_operators.empty() ? 0 : t_open_operators.back().id;
}

void Tracer::OnCudaInit() {
  if (shut_down_.load()) return;
  // CUPTI hands buffers to the writer from under cupti_mu_ (when disabled);
  // a writer that already exists is never created from there.
  (void)EnsureWriter();
  {
    std::lock_guard<std::mutex> lock(cupti_mu_);
    if (cupti_lent_) {
      start_deferred_ = true;  // registering now would take torch.profiler's callbacks
    } else {
      StartCuptiLocked();
      SyncCuptiLocked();
    }
  }
  PublishCuptiStatus();
}

void Tracer::LendCupti() {
  {
    std::lock_guard<std::mutex> lock(cupti_mu_);
    if (cupti_lent_ || shut_down_.load()) return;
    cupti_lent_ = true;
    lent_for_abi_.store(true);
    ++profiler_windows_;
    lent_enabled_ = cupti_started_ && session_->enabled();
    lent_since_ns_ = RealtimeNs();
    // While the callbacks are still ours: what CUPTI holds comes back here,
    // not to the profiler, which would drop our buffers as unknown.
    if (lent_enabled_) session_->Flush(/*forced=*/true);
    // Kineto subscribes once, when it first prepares a trace: torch.profiler
    // gets CUPTI's one subscription (graph_attribution.h).
    if (graph_ != nullptr) graph_->Unsubscribe();
    windows_dirty_ = true;
  }
  PublishProfilerWindows();
}

void Tracer::ReclaimCupti() {
  {
    std::lock_guard<std::mutex> lock(cupti_mu_);
    if (!cupti_lent_) return;
    cupti_lent_ = false;
    lent_for_abi_.store(false);
    if (lent_enabled_) CloseLentWindowLocked();
    if (cupti_started_ && !shut_down_.load()) {
      const Status reclaimed = session_->Reclaim();
      if (!reclaimed.ok()) {
        SetCuptiUnavailableLocked("after torch.profiler: " + reclaimed.message());
      }
      if (graph_ != nullptr && !graph_->subscribed()) {
        StartGraphAttributionLocked("after torch.profiler: ");
      }
    }
    if (start_deferred_) {
      start_deferred_ = false;
      StartCuptiLocked();
    }
    SyncCuptiLocked();
    windows_dirty_ = true;
  }
  PublishCuptiStatus();
  PublishProfilerWindows();
}

void Tracer::CloseLentWindowLocked() {
  ++lent_windows_;
  if (lent_windows_ > kMaxListedWindows) return;
  if (!lent_window_times_.empty()) lent_window_times_ += ',';
  lent_window_times_ += std::to_string(lent_since_ns_) + "-" + std::to_string(RealtimeNs());
}

void Tracer::PublishForgottenGraphNodes() {
  GraphAttribution* graph = graph_for_threads_.load();
  const size_t forgotten = graph != nullptr ? graph->forgotten_nodes() : 0;
  if (forgotten == 0 || forgotten == graph_nodes_forgotten_) return;
  graph_nodes_forgotten_ = forgotten;
  if (WriterThread* writer = writer_.load()) {
    writer->SetMeta("cupti_graph_nodes_forgotten", std::to_string(forgotten));
  }
}

void Tracer::PublishProfilerWindows() {
  int windows;
  int lost_windows;
  std::string times;
  {
    std::lock_guard<std::mutex> lock(cupti_mu_);
    if (!windows_dirty_ || profiler_windows_ == 0) return;
    windows_dirty_ = false;
    windows = profiler_windows_;
    lost_windows = lent_windows_;
    times = lent_window_times_;
    if (cupti_lent_ && lent_enabled_ && ++lost_windows <= kMaxListedWindows) {
      if (!times.empty()) times += ',';
      times += std::to_string(lent_since_ns_);
      times += '-';  // still open
    }
  }
  WriterThread* writer = EnsureWriter();
  if (writer == nullptr) return;
  writer->SetMeta("torch_profiler_windows", std::to_string(windows));
  if (lost_windows == 0) return;
  writer->SetMeta("cupti_kineto_window_count", std::to_string(lost_windows));
  writer->SetMeta("cupti_kineto_windows", std::move(times));
  writer->SetMeta("cupti_kineto_operators", std::to_string(lent_operators_.load()));
}

int Tracer::OnNvtxInit(NvtxGetExportTable get_export_table) {
  CuptiApi* cupti;
  {
    std::lock_guard<std::mutex> lock(cupti_mu_);
    LoadCuptiLocked();
    cupti = cupti_.get();
  }
  PublishCuptiStatus();
  return cupti != nullptr ? cupti->InitializeInjectionNvtx2(get_export_table) : 0;
}

bool Tracer::Flush(std::chrono::milliseconds timeout) noexcept {
  if (!OwnsProcess()) return false;
  WriterThread* writer = writer_.load();
  return writer == nullptr || writer->Flush(timeout);
}

bool Tracer::Finish(std::chrono::milliseconds timeout) noexcept {
  if (!OwnsProcess()) return false;
  WriterThread* writer = writer_.load();
  return writer == nullptr || writer->Finish(timeout);
}

bool Tracer::FinishOnSignal(int signal, std::chrono::milliseconds timeout) noexcept {
  if (!OwnsProcess()) return false;
  WriterThread* writer = writer_.load();
  if (writer == nullptr) return true;
  writer->NoteExitSignal(signal);
  return writer->Finish(timeout);
}

bool Tracer::FlushOnSignal(std::chrono::milliseconds timeout) noexcept {
  if (WriterThread* writer = OwnsProcess() ? writer_.load() : nullptr) writer->NoteSignalFlush();
  return Flush(timeout);
}

void Tracer::Shutdown(const char* by) {
  if (shut_down_.load()) return;
  WriterThread* writer = EnsureWriter();
  if (writer != nullptr) writer->SetMeta("final_flush", by);
  {
    // Disabling flushes CUPTI, whose buffers still reach the writer; lent to
    // torch.profiler, CUPTI is the profiler's to disable.
    std::lock_guard<std::mutex> lock(cupti_mu_);
    if (session_ != nullptr && !cupti_lent_) session_->Disable();
    windows_dirty_ = true;  // the operators of a window still open
  }
  PublishProfilerWindows();
  shut_down_.store(true);
  if (writer != nullptr) (void)writer->Stop();
}

void Tracer::PrepareFork() {
  writer_mu_.lock();
  if (WriterThread* writer = writer_.load()) writer->LockForFork();
  cupti_mu_.lock();
}

void Tracer::ParentAfterFork() {
  cupti_mu_.unlock();
  if (WriterThread* writer = writer_.load()) writer->UnlockAfterFork();
  writer_mu_.unlock();
}

void Tracer::ChildAfterFork() {
  // Released however this ends; the abandoned writer's locks stay held.
  std::lock_guard<std::mutex> writer_lock(writer_mu_, std::adopt_lock);
  std::lock_guard<std::mutex> cupti_lock(cupti_mu_, std::adopt_lock);
  if (WriterThread* writer = writer_.exchange(nullptr)) {
    (void)own_writer_.release();
    abandoned_.push_back(writer);  // last: should it throw, the child is already free of it
  }
  cupti_start_attempted_ = false;
  cupti_started_ = false;
  enable_attempted_ = false;
  if (graph_ != nullptr) {  // its lock may be held: never touched again
    graph_for_threads_.store(nullptr);
    (void)graph_.release();
  }
  graph_nodes_forgotten_ = 0;
  // The child's CUPTI is its own: the parent's profiler windows are not its.
  cupti_lent_ = lent_enabled_ = start_deferred_ = windows_dirty_ = false;
  profiler_windows_ = lent_windows_ = 0;
  lent_window_times_.clear();
  lent_for_abi_.store(false);
  lent_operators_.store(0);
  if (session_ != nullptr) session_->ForgetAfterFork();
  if (cupti_ != nullptr) {  // loaded, so the child may start it again
    cupti_status_ = kCuptiNotStarted;
    cupti_status_dirty_ = true;
  }
  start_time_ns_ = RealtimeNs();
  pid_.store(static_cast<int32_t>(getpid()));
}

WriterThread* Tracer::EnsureWriter() {
  WriterThread* writer = writer_.load();
  if (writer != nullptr || shut_down_.load()) return writer;
  std::lock_guard<std::mutex> lock(writer_mu_);
  writer = writer_.load();
  if (writer != nullptr || shut_down_.load()) return writer;
  const int32_t pid = static_cast<int32_t>(getpid());
  WriterOptions options;
  options.path = config_.output_dir + "/" + std::to_string(pid) + ".db";
  options.rank = config_.rank;
  options.pid = pid;
  options.process_name = ProcessName();
  options.meta = ProcessMeta(pid);
  options.flush_interval = config_.flush_interval;
  options.before_flush = [this](bool forced) { BeforeFlush(forced); };
  options.graph_node_operator = [this](uint64_t node) -> int64_t {
    GraphAttribution* graph = graph_for_threads_.load();
    return graph != nullptr ? graph->OperatorOf(node) : -1;
  };
  own_writer_ = std::make_unique<WriterThread>(std::move(options));
  writer = own_writer_.get();
  writer_.store(writer);
  {
    // After the store above, so that a CUPTI loading concurrently either is
    // seen here or sees this writer (StartCuptiLocked attaches it too).
    std::lock_guard<std::mutex> cupti_lock(cupti_mu_);
    if (cupti_ != nullptr) writer->AttachCupti(cupti_.get());
  }
  writer->Start();  // published first: signal handlers find what they wait for
  return writer;
}

std::map<std::string, std::string> Tracer::ProcessMeta(int32_t pid) {
  std::map<std::string, std::string> meta = {
      {"format", "dynaflow"},
      {"pid", std::to_string(pid)},
      {"rank", std::to_string(config_.rank)},
      {"command_line", CommandLine()},
      {"start_time_ns", std::to_string(start_time_ns_)},
      {"ops", config_.record_ops ? "on" : "off"},
      {"dropped_records", "0"},
  };
  std::lock_guard<std::mutex> lock(cupti_mu_);
  meta["cupti"] = cupti_status_;
  return meta;
}

void Tracer::BeforeFlush(bool forced) {
  CuptiSession* session = nullptr;
  {
    std::lock_guard<std::mutex> lock(cupti_mu_);
    // Lent to torch.profiler, CUPTI's callbacks and kinds are left alone.
    if (!cupti_lent_) {
      if (cupti_start_ == CuptiStart::kAtWindowOpen && Active()) StartCuptiLocked();
      SyncCuptiLocked();
      if (cupti_started_) session = session_.get();
    } else {
      windows_dirty_ = true;  // the operator count of the open window
    }
  }
  PublishCuptiStatus();
  PublishProfilerWindows();
  PublishForgottenGraphNodes();
  if (session != nullptr) session->Flush(forced);
}

void Tracer::LoadCuptiLocked() {
  if (cupti_load_attempted_) return;
  cupti_load_attempted_ = true;
  std::string error;
  cupti_ = load_cupti_(&error);
  if (cupti_ == nullptr) {
    SetCuptiUnavailableLocked(error);
    return;
  }
  session_ = std::make_unique<CuptiSession>(
      *cupti_, CuptiSink{.buffer =
                             [this](ActivityBuffer buffer) {
                               if (WriterThread* w = EnsureWriter()) {
                                 w->EnqueueBuffer(std::move(buffer));
                               }
                             },
                         .dropped =
                             [this](size_t records) {
                               if (WriterThread* w = EnsureWriter()) w->AddCuptiDropped(records);
                             }});
  if (WriterThread* writer = writer_.load()) writer->AttachCupti(cupti_.get());
}

void Tracer::StartCuptiLocked() {
  if (cupti_start_attempted_ || shut_down_.load()) return;
  cupti_start_attempted_ = true;
  LoadCuptiLocked();
  if (cupti_ == nullptr) return;
  const Status started = session_->Start();
  if (!started.ok()) {
    SetCuptiUnavailableLocked(started.message());
    return;
  }
  cupti_started_ = true;
  session_for_abi_.store(session_.get());
  if (graph_ == nullptr) {
    graph_ = std::make_unique<GraphAttribution>(*cupti_, &Tracer::CurrentOperator);
    graph_for_threads_.store(graph_.get());
  }
  StartGraphAttributionLocked("");
  uint32_t version = 0;
  if (cupti_->GetVersion(&version) == CUPTI_SUCCESS) {
    cupti_version_ = std::to_string(version);
    cupti_status_dirty_ = true;
  }
  int driver = 0;
  if (cupti_->DriverGetVersion(&driver) == CUDA_SUCCESS) {
    driver_version_ = CudaVersionName(driver);
    cupti_status_dirty_ = true;
  }
}

void Tracer::SyncCuptiLocked() {
  if (!cupti_started_) return;
  const bool want = Active();
  if (want && !session_->enabled() && !enable_attempted_) {
    enable_attempted_ = true;  // the window opens once: so does CUPTI
    const Status enabled = session_->Enable();
    if (!enabled.ok()) {
      SetCuptiUnavailableLocked(enabled.message());
      return;
    }
    const std::string& missing = session_->unavailable_kinds();
    cupti_status_ = missing.empty() ? "enabled" : "enabled (unavailable kinds: " + missing + ")";
    skipped_apis_ = std::to_string(session_->skipped_apis());
    cupti_status_dirty_ = true;
  } else if (!want && session_->enabled()) {
    session_->Disable();
  }
}

void Tracer::StartGraphAttributionLocked(const char* when) {
  const Status subscribed = graph_->Subscribe();
  graph_status_ = subscribed.ok() ? "enabled" : "unavailable: " + std::string(when) +
                                                    subscribed.message();
  cupti_status_dirty_ = true;
}

void Tracer::SetCuptiUnavailableLocked(const std::string& reason) {
  cupti_status_ = "unavailable: " + reason;
  cupti_status_dirty_ = true;
  LogOnce(cupti_problem_reported_,
          "CUPTI unavailable (" + reason + "); recording framework operators only");
}

void Tracer::PublishCuptiStatus() {
  std::string status;
  std::string version;
  std::string driver;
  std::string skipped;
  std::string graph;
  {
    std::lock_guard<std::mutex> lock(cupti_mu_);
    if (!cupti_status_dirty_) return;
    graph = graph_status_;
    cupti_status_dirty_ = false;
    status = cupti_status_;
    version = cupti_version_;
    skipped = skipped_apis_;
    driver = driver_version_;
  }
  WriterThread* writer = writer_.load();
  if (writer == nullptr) return;
  writer->SetMeta("cupti", std::move(status));
  if (!version.empty()) {
    writer->SetMeta("cupti_api_version", std::move(version));
    // The CUDA headers the tracer was built with (CUDA_VERSION: 13000 is 13.0).
    writer->SetMeta("cuda_toolkit_built", CudaVersionName(CUDA_VERSION));
  }
  // The CUDA version the installed driver supports, beside the toolkit's.
  if (!driver.empty()) writer->SetMeta("cuda_driver_version", std::move(driver));
  // Driver and runtime APIs whose records are switched off (cupti_session.cc).
  if (!skipped.empty()) writer->SetMeta("cupti_skipped_apis", std::move(skipped));
  // Whether replayed CUDA graph kernels link to their capturing operators.
  if (!graph.empty()) writer->SetMeta("cupti_graph_attribution", std::move(graph));
}

}  // namespace dynaflow
