// libdynaflow_preload.so: the tracer inside a traced process, loaded with
// LD_PRELOAD (or by the CUDA driver as CUDA_INJECTION64_PATH).
//
// With DYNAFLOW_OUTPUT_DIR unset it does nothing at all. Otherwise it writes
// <DYNAFLOW_OUTPUT_DIR>/<pid>.db for this process and for every forked child,
// flushed periodically, on SIGINT/SIGTERM and at exit, through exit() or
// _exit() (which it interposes: see FinishAndExit), and on a crash, a stack
// overflow included (it interposes pthread_create to give every thread an
// alternate signal stack: see AlternateSignalStack). It claims the CUDA and
// NVTX injection hooks when nobody else has, so that CUPTI starts inside
// cuInit, before any kernel runs, and NVTX ranges reach CUPTI.
//
// Nothing is thrown out of this library and nothing aborts the host process:
// every entry point catches everything, and a tracer that fails leaves the
// program running untraced.
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <new>
#include <optional>
#include <string>

#include "plugin/preload/cupti_api_dl.h"
#include "plugin/preload/dynaflow_tracer.h"
#include "plugin/preload/log.h"
#include "plugin/preload/tracer.h"

// The C ABI and the injection entry points are the library's only exports;
// everything else is built with -fvisibility=hidden.
#define DYNAFLOW_EXPORT __attribute__((visibility("default")))

namespace dynaflow {
namespace {

// Set by the constructor, before main, and never freed: exit handlers, other
// libraries' destructors and late threads may still call in.
Tracer* g_tracer = nullptr;

// Operator ids (also the CUPTI external correlation ids) are unique per trace,
// not only per process: a process's ids start at FirstOperatorId(its pid), so
// the operators of DataLoader workers, spawned ranks and forked children never
// share an id with another process's, and a forked child starts afresh.
std::atomic<uint64_t> g_next_operator_id{1};

void SeedOperatorIds() { g_next_operator_id.store(FirstOperatorId(getpid())); }

// The C library's _exit, resolved by the constructor before anything could
// call ours (dlsym is no call to make from a vfork child or signal handler).
using ExitFunction = void (*)(int);
ExitFunction g_libc_exit = nullptr;

// How long a signal handler waits for the writer before letting the signal
// take its course.
constexpr std::chrono::milliseconds kSignalFlushTimeout{5000};

struct HookedSignal {
  int signal;
  struct sigaction previous;
};
// SIGINT and SIGTERM, and the signals of a crash: a program that dies of one
// keeps what it recorded since the last timed flush (a sub-second program
// kept nothing). A crash handler runs in a damaged process, but only signals
// the writer thread and waits at most kSignalFlushTimeout; the writer then
// writes what it holds without calling CUPTI (the faulting thread may hold
// the tracer's CUPTI lock). A fault on the writer thread itself is noted, not
// waited for. The handler runs on an alternate signal stack where the thread
// has one (see AlternateSignalStack), so that a stack overflow is
// flushed too.
std::array<HookedSignal, 7> g_hooked_signals = {{{SIGINT, {}},
                                                {SIGTERM, {}},
                                                {SIGSEGV, {}},
                                                {SIGBUS, {}},
                                                {SIGFPE, {}},
                                                {SIGILL, {}},
                                                {SIGABRT, {}}}};

bool TerminatesProcess(const struct sigaction& action) {
  return !(action.sa_flags & SA_SIGINFO) && action.sa_handler == SIG_DFL;
}

// Commits the trace, then restores the program's disposition and raises the
// signal again, so that the program's own handler runs, or the process dies
// of the signal with the exit status it would have had.
void OnSignal(int signal) {
  const int saved_errno = errno;
  for (const HookedSignal& hooked : g_hooked_signals) {
    if (hooked.signal != signal) continue;
    if (g_tracer != nullptr) {
      // A signal that kills the process gets the store closed (no -wal left).
      if (TerminatesProcess(hooked.previous)) {
        (void)g_tracer->FinishOnSignal(signal, kSignalFlushTimeout);
      } else {
        (void)g_tracer->FlushOnSignal(kSignalFlushTimeout);
      }
    }
    sigaction(signal, &hooked.previous, nullptr);
    raise(signal);  // blocked until this handler returns
  }
  errno = saved_errno;
}

// Hooks g_hooked_signals unless the program ignores them.
void HookSignals() {
  for (HookedSignal& hooked : g_hooked_signals) {
    struct sigaction current;
    if (sigaction(hooked.signal, nullptr, &current) != 0) continue;
    if (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_IGN) continue;
    hooked.previous = current;
    struct sigaction ours = {};
    ours.sa_handler = OnSignal;
    sigemptyset(&ours.sa_mask);
    ours.sa_flags = SA_RESTART | SA_ONSTACK;
    sigaction(hooked.signal, &ours, nullptr);
  }
}

// The size of the alternate signal stacks: the handler signals the writer
// and waits for it, a few KiB of stack. (SIGSTKSZ is a sysconf call in glibc
// 2.34 and later.)
size_t AlternateStackSize() { return std::max<size_t>(SIGSTKSZ, 64 * 1024); }

// Alternate stacks of ended threads, kept for the threads started next: a
// thread start then costs two sigaltstack calls, not also a mmap and a munmap
// (which, in a multi-threaded process, interrupts the other cores to flush
// their TLBs; docs/performance.md, bench/thread_start_overhead.sh). Lock-free
// slots, so that a fork never leaves one locked.
std::array<std::atomic<void*>, 16> g_spare_stacks{};

void* TakeSpareStack() {
  for (std::atomic<void*>& slot : g_spare_stacks) {
    if (slot.load(std::memory_order_relaxed) == nullptr) continue;
    if (void* memory = slot.exchange(nullptr, std::memory_order_acquire)) return memory;
  }
  return nullptr;
}

void KeepOrUnmapStack(void* memory) {
  for (std::atomic<void*>& slot : g_spare_stacks) {
    void* empty = nullptr;
    if (slot.compare_exchange_strong(empty, memory, std::memory_order_release)) return;
  }
  munmap(memory, AlternateStackSize());
}

// A stack overflow leaves no stack for a handler to run on, so the thread
// that loads the library (the main thread, under LD_PRELOAD), every thread
// started after it (see pthread_create below) and every other thread that
// records an operator (see t_late_stack) get an alternate signal stack,
// unless the program or a sanitizer runtime gave them one already.
class AlternateSignalStack {
 public:
  AlternateSignalStack() {
    stack_t current;
    if (sigaltstack(nullptr, &current) != 0 || !(current.ss_flags & SS_DISABLE)) return;
    void* memory = TakeSpareStack();
    if (memory == nullptr) {
      memory = mmap(nullptr, AlternateStackSize(), PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (memory == MAP_FAILED) return;
    }
    stack_t ours = {};
    ours.ss_sp = memory;
    ours.ss_size = AlternateStackSize();
    if (sigaltstack(&ours, nullptr) != 0) {
      KeepOrUnmapStack(memory);
      return;
    }
    memory_ = memory;
  }
  // At the thread's end: disabled and kept for the next thread (or unmapped)
  // while it is still the thread's stack. One the thread's code replaced is
  // left alone: whoever replaced it may have unmapped it already (a sanitizer
  // runtime unmaps the stack it finds at a thread's end), and its pages may
  // hold other memory by now.
  ~AlternateSignalStack() {
    if (memory_ == nullptr) return;
    stack_t current;
    if (sigaltstack(nullptr, &current) != 0 || current.ss_sp != memory_) return;
    stack_t disabled = {};
    disabled.ss_flags = SS_DISABLE;
    if (sigaltstack(&disabled, nullptr) != 0) return;  // in use: a handler is on it
    KeepOrUnmapStack(memory_);
  }
  AlternateSignalStack(const AlternateSignalStack&) = delete;
  AlternateSignalStack& operator=(const AlternateSignalStack&) = delete;

 private:
  void* memory_ = nullptr;
};

// A thread started while tracing: its routine runs with an alternate signal
// stack, freed when the routine returns or the thread exits (pthread_exit and
// cancellation unwind through this frame).
struct ThreadStart {
  void* (*routine)(void*);
  void* arg;
};

void* StartWithAlternateStack(void* boxed) {
  const ThreadStart start = *static_cast<ThreadStart*>(boxed);
  delete static_cast<ThreadStart*>(boxed);
  const AlternateSignalStack stack;
  return start.routine(start.arg);
}

// The loading thread's, kept for the life of the process (a static object's
// destructor would unmap it during exit, while exit handlers still run).
AlternateSignalStack* g_loading_thread_stack = nullptr;

// A thread the library did not start gets one at its first operator: a
// thread started before the library was loaded (the CUDA driver loads it in
// cuInit, when a program has threads already) or by a raw clone. Freed (kept
// for the next thread) when the thread ends; a thread that has one already
// keeps its own (the constructor leaves it alone). The main thread's is kept
// for the life of the process, as the loading thread's: exit() runs
// thread_local destructors before its exit handlers.
thread_local bool t_stack_given = false;
thread_local std::optional<AlternateSignalStack> t_late_stack;
AlternateSignalStack* g_main_thread_stack = nullptr;  // written by the main thread only

void GiveThreadAnAlternateStack() {
  if (t_stack_given) return;
  t_stack_given = true;
  if (syscall(SYS_gettid) == getpid()) {
    g_main_thread_stack = new (std::nothrow) AlternateSignalStack();
  } else {
    t_late_stack.emplace();
  }
}

using PthreadCreateFunction = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
// The C library's pthread_create, resolved by the constructor.
PthreadCreateFunction g_libc_pthread_create = nullptr;

// The absolute path of this library, for the injection variables.
std::string OwnPath() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&OwnPath), &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  char resolved[PATH_MAX];
  return realpath(info.dli_fname, resolved) != nullptr ? resolved : info.dli_fname;
}

bool SameFile(const char* a, const std::string& b) {
  struct stat sa;
  struct stat sb;
  return stat(a, &sa) == 0 && stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

// Points `variable` at this library unless it names another one. True when
// it names this library (now or already).
bool ClaimInjection(const char* variable, const std::string& own_path) {
  const char* current = getenv(variable);
  if (current == nullptr || *current == '\0') {
    return !own_path.empty() && setenv(variable, own_path.c_str(), /*overwrite=*/1) == 0;
  }
  return SameFile(current, own_path);
}

// Programs that leave through _exit() skip atexit handlers: dash does, and so
// do Python's os._exit and the workers of multiprocessing's fork start method.
// The store is finished here, through the async-signal-safe path since
// _exit() is often called from signal handlers, then the C library's _exit()
// runs. A forked child that recorded nothing has no writer and leaves no store
// this way.
[[noreturn]] void FinishAndExit(int status) {
  if (g_tracer != nullptr) (void)g_tracer->Finish(kSignalFlushTimeout);
  if (g_libc_exit != nullptr) g_libc_exit(status);
  syscall(SYS_exit_group, status);
  __builtin_unreachable();
}

CuptiLoader RealCuptiLoader(const std::string& env_path) {
  return [candidates = CuptiLibraryCandidates(env_path.c_str())](std::string* error) {
    return LoadCuptiLibrary(candidates, error);
  };
}

void OnExit(const char* by) {
  try {
    g_tracer->Shutdown(by);
  } catch (...) {
    // The process is exiting; the store keeps its last flush.
  }
}

void OnCExit() { OnExit("c_exit"); }
void OnCExitAfterCudaInit() { OnExit("c_exit_after_cuda_init"); }

void PrepareFork() { g_tracer->PrepareFork(); }
void ParentAfterFork() { g_tracer->ParentAfterFork(); }
void ChildAfterFork() {
  SeedOperatorIds();
  try {
    g_tracer->ChildAfterFork();
  } catch (...) {
    // The child runs on; it starts its own writer at its first record.
  }
}

__attribute__((constructor)) void LoadTracer() {
  g_libc_exit = reinterpret_cast<ExitFunction>(dlsym(RTLD_NEXT, "_exit"));
  g_libc_pthread_create =
      reinterpret_cast<PthreadCreateFunction>(dlsym(RTLD_NEXT, "pthread_create"));
  SeedOperatorIds();
  try {
    std::vector<std::string> problems;
    TracerConfig config = ReadTracerConfig(getenv, &problems);
    if (config.output_dir.empty()) return;
    for (const std::string& problem : problems) Log(problem);
    const std::string own_path = OwnPath();
    const CuptiStart start = ClaimInjection("CUDA_INJECTION64_PATH", own_path)
                                 ? CuptiStart::kAtCudaInit
                                 : CuptiStart::kAtWindowOpen;
    (void)ClaimInjection("NVTX_INJECTION64_PATH", own_path);
    const std::string cupti_path = config.cupti_path;
    g_tracer = new Tracer(std::move(config), RealCuptiLoader(cupti_path), start);
    g_loading_thread_stack = new AlternateSignalStack();
    HookSignals();
    atexit(OnCExit);
    pthread_atfork(PrepareFork, ParentAfterFork, ChildAfterFork);
    g_tracer->StartWriter();
  } catch (const std::exception& e) {
    Log(std::string("tracer not started: ") + e.what());
  } catch (...) {
    // The program runs untraced.
  }
}

}  // namespace
}  // namespace dynaflow

using dynaflow::g_next_operator_id;
using dynaflow::g_tracer;

extern "C" {

DYNAFLOW_EXPORT int dynaflow_tracer_abi_version(void) { return DYNAFLOW_TRACER_ABI_VERSION; }

DYNAFLOW_EXPORT int dynaflow_tracer_active(void) {
  return g_tracer != nullptr && g_tracer->Active();
}

DYNAFLOW_EXPORT int dynaflow_tracer_record_ops(void) {
  return g_tracer != nullptr && g_tracer->RecordOps();
}

DYNAFLOW_EXPORT int64_t dynaflow_now_ns(void) { return dynaflow::RealtimeNs(); }

DYNAFLOW_EXPORT uint64_t dynaflow_next_operator_id(void) {
  return g_next_operator_id.fetch_add(1);
}

DYNAFLOW_EXPORT void dynaflow_push_operator(uint64_t id) {
  try {
    if (g_tracer == nullptr) return;
    dynaflow::GiveThreadAnAlternateStack();
    g_tracer->PushOperator(id);
  } catch (...) {
    // Out of memory: the operator's GPU work stays unlinked.
  }
}

DYNAFLOW_EXPORT void dynaflow_pop_operator(void) {
  try {
    if (g_tracer != nullptr) g_tracer->PopOperator();
  } catch (...) {
    // Nothing to undo.
  }
}

DYNAFLOW_EXPORT void dynaflow_record_operator(const DynaflowOperatorRecord* record) {
  try {
    if (g_tracer != nullptr && record != nullptr) g_tracer->RecordOperator(*record);
  } catch (...) {
    // Counted as dropped by the writer where it could be; never thrown.
  }
}

DYNAFLOW_EXPORT void dynaflow_tracer_shutdown(void) {
  if (g_tracer != nullptr && g_tracer->OwnsProcess()) dynaflow::OnExit("program_exit");
}

DYNAFLOW_EXPORT void dynaflow_record_process_group_rank(int32_t rank) {
  try {
    if (g_tracer != nullptr && rank >= 0) g_tracer->RecordProcessGroupRank(rank);
  } catch (...) {
    // Out of memory: the process keeps the rank of its environment.
  }
}

DYNAFLOW_EXPORT void dynaflow_record_module_fingerprint(const char* root_class,
                                                        const char* fingerprint) {
  try {
    if (g_tracer != nullptr && root_class != nullptr && fingerprint != nullptr) {
      g_tracer->RecordModuleFingerprint(root_class, fingerprint);
    }
  } catch (...) {
    // Out of memory: the trace has no fingerprint and plans from it none.
  }
}

DYNAFLOW_EXPORT void dynaflow_tracer_lend_cupti(void) {
  try {
    if (g_tracer != nullptr && g_tracer->OwnsProcess()) g_tracer->LendCupti();
  } catch (...) {
    // Out of memory: the window goes unrecorded; the profiler runs regardless.
  }
}

DYNAFLOW_EXPORT void dynaflow_tracer_reclaim_cupti(void) {
  try {
    if (g_tracer != nullptr && g_tracer->OwnsProcess()) g_tracer->ReclaimCupti();
  } catch (...) {
    // Out of memory: CUPTI stays with the profiler; the trace says "-" for the window's end.
  }
}

// Threads started while tracing get an alternate signal stack, so that their
// stack overflows are flushed too. Untraced, or out of memory, a thread starts
// as it would without the library.
DYNAFLOW_EXPORT int pthread_create(pthread_t* thread, const pthread_attr_t* attr,
                                   void* (*routine)(void*), void* arg) {
  using dynaflow::g_libc_pthread_create;
  if (g_libc_pthread_create == nullptr) {  // called before our constructor ran
    g_libc_pthread_create = reinterpret_cast<dynaflow::PthreadCreateFunction>(
        dlsym(RTLD_NEXT, "pthread_create"));
    if (g_libc_pthread_create == nullptr) return EAGAIN;
  }
  auto* start = g_tracer != nullptr ? new (std::nothrow) dynaflow::ThreadStart{routine, arg}
                                    : nullptr;
  if (start == nullptr) return g_libc_pthread_create(thread, attr, routine, arg);
  const int result =
      g_libc_pthread_create(thread, attr, dynaflow::StartWithAlternateStack, start);
  if (result != 0) delete start;
  return result;
}

DYNAFLOW_EXPORT void _exit(int status) noexcept { dynaflow::FinishAndExit(status); }
DYNAFLOW_EXPORT void _Exit(int status) noexcept { dynaflow::FinishAndExit(status); }

// Called by the CUDA driver inside cuInit when CUDA_INJECTION64_PATH names
// this library. Returns 1: a tracer that cannot start must not fail CUDA.
DYNAFLOW_EXPORT int InitializeInjection(void) {
  try {
    if (g_tracer != nullptr) {
      g_tracer->OnCudaInit();
      // exit() runs its handlers in reverse order of registration, C++ static
      // destructors included: registered now, after libcuda and libcupti
      // loaded, the final flush runs before their teardown (the handler the
      // constructor registered runs after it). Programs without Python's
      // exit flush (plugin/python) get theirs from here.
      static std::once_flag registered;
      std::call_once(registered, [] { atexit(dynaflow::OnCExitAfterCudaInit); });
    }
  } catch (...) {
    // CUDA goes on untraced.
  }
  return 1;
}

// Called by the NVTX loader when NVTX_INJECTION64_PATH names this library:
// hands NVTX to CUPTI. 0 makes NVTX a no-op, as without injection.
DYNAFLOW_EXPORT int InitializeInjectionNvtx2(dynaflow::NvtxGetExportTable get_export_table) {
  try {
    return g_tracer != nullptr ? g_tracer->OnNvtxInit(get_export_table) : 0;
  } catch (...) {
    return 0;
  }
}

}  // extern "C"
