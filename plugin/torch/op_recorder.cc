#include "plugin/torch/op_recorder.h"

#include <ATen/record_function.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string_view>

#include "plugin/torch/collective_metadata.h"
#include "plugin/torch/input_encoding.h"
#include "plugin/torch/module_stack.h"

namespace dynaflow {
namespace {

// Written once by InstallOpRecorder before the callbacks are registered and
// only read afterwards.
TracerAbi g_abi{};
int64_t g_sample_every = 1;

// Bumped in a forked child, whose thread keeps its parent's thread_local state
// but not its parent's thread id.
std::atomic<uint32_t> g_fork_generation{0};

// In a forked child only the forking thread lives on.
void OnForkChild();

int32_t OsThreadId() { return static_cast<int32_t>(syscall(SYS_gettid)); }

// Sampling (sample_every = N > 1) is decided before an operator starts, so
// that a skipped operator boxes no inputs: torch fixes an operator's
// callbacks, and whether it boxes inputs for them, when it creates its
// RecordFunction, before any start callback runs. So a thread announces at
// the end of a top-level operator that its next one is sampled (after N - 1
// skipped ones), and the recording callback is on while the tracer is active
// and some thread has announced. A thread's first top-level operator is
// skipped: nothing announced it. Where another thread's sampled operator runs
// at the same time, a skipped one boxes its inputs all the same, and
// OnRecordingStart ignores it.
std::atomic<int64_t> g_announced{0};  // threads whose next or current top-level op is sampled

struct ThreadState {
  uint32_t fork_generation = g_fork_generation.load(std::memory_order_relaxed);
  int32_t tid = OsThreadId();
  int64_t depth = 0;           // operators in flight on this thread
  int64_t backward_depth = 0;  // of which autograd nodes
  bool sampled = true;  // the sampling decision of the current top-level operator
  bool announced = false;  // counted in g_announced
  int64_t skips_left = 0;  // top-level operators to skip before announcing

  ThreadState() = default;
  ThreadState(const ThreadState&) = delete;
  ThreadState& operator=(const ThreadState&) = delete;
  ~ThreadState() {
    if (announced) g_announced.fetch_sub(1);
  }
};

ThreadState& State() {
  thread_local ThreadState state;
  const uint32_t generation = g_fork_generation.load(std::memory_order_relaxed);
  if (state.fork_generation != generation) {
    state.fork_generation = generation;
    state.tid = OsThreadId();
  }
  return state;
}

// One recorded operator, from its start callback to its end callback.
struct OpContext : at::ObserverContext {
  uint64_t id = 0;
  int64_t start_ns = 0;
  DynaflowPass pass = DYNAFLOW_PASS_UNKNOWN;
  const char* module_path = nullptr;
  EncodedInputs inputs;
  std::string collective;  // record_param_comms only
};

// The autograd engine's evaluation of a node: the node itself
// (BACKWARD_FUNCTION scope, forward thread id set) and the engine's
// FUNCTION-scope range around it.
bool IsAutogradNode(const at::RecordFunction& fn) {
  static constexpr std::string_view kEngine = "autograd::engine::evaluate_function";
  return fn.scope() == at::RecordScope::BACKWARD_FUNCTION || fn.forwardThreadId() != 0 ||
         std::strncmp(fn.name(), kEngine.data(), kEngine.size()) == 0;
}

DynaflowPass PassOf(const at::RecordFunction& fn, const ThreadState& t) {
  if (t.backward_depth > 0) return DYNAFLOW_PASS_BACKWARD;
  if (fn.seqNr() >= 0 || ModuleDepth() > 0) return DYNAFLOW_PASS_FORWARD;
  return DYNAFLOW_PASS_UNKNOWN;
}

// Everything that may throw (allocation) happens before the push, so a
// context that exists always has its correlation id pushed.
std::unique_ptr<at::ObserverContext> BeginOperator(const at::RecordFunction& fn,
                                                   const ThreadState& t) {
  auto ctx = std::make_unique<OpContext>();
  ctx->inputs = EncodeInputs(fn.inputs());
  ctx->collective = CollectiveOf(fn);
  ctx->pass = PassOf(fn, t);
  ctx->module_path = CurrentModulePath();
  ctx->id = g_abi.next_operator_id();
  ctx->start_ns = g_abi.now_ns();
  g_abi.push_operator(ctx->id);
  return ctx;
}

void EndOperator(const at::RecordFunction& fn, const OpContext& ctx, const ThreadState& t) {
  DynaflowOperatorRecord record{};
  record.end_ns = g_abi.now_ns();
  g_abi.pop_operator();
  record.id = ctx.id;
  record.start_ns = ctx.start_ns;
  record.sequence = fn.seqNr();
  record.tid = t.tid;
  record.pass = ctx.pass;
  record.name = fn.name();
  record.input_shapes = ctx.inputs.shapes.c_str();
  record.input_types = ctx.inputs.types.c_str();
  record.module_path = ctx.module_path;
  record.collective = ctx.collective.c_str();
  g_abi.record_operator(&record);
}

// Two global callbacks, registered in this order, so that torch runs the
// first's start and end before the second's:
//   nesting    (no inputs) keeps each thread's depth, autograd depth and
//              sampling decision, always on; at the end of each top-level
//              operator it switches `recording` on or off with the tracer's
//              active state and the threads' sampling announcements;
//   recording  (inputs) records the operator. Off while the tracer is
//              inactive and while no thread's next operator is sampled, so
//              torch then boxes no inputs for it: an operator costs the
//              tracer only the nesting callback. It follows the tracer's
//              state within one top-level operator of any thread.
// torch runs an operator's end callbacks from the set its start saw, so a
// switch never splits an operator's start from its end.
at::CallbackHandle g_recording = 0;
std::atomic<bool> g_recording_on{true};

std::mutex g_switch_mu;  // switching `recording` and g_recording_on

bool WantRecording() {
  return g_abi.active() != 0 && (g_sample_every == 1 || g_announced.load() > 0);
}

// Switches `recording` to what WantRecording says. Re-read under the lock
// after each switch: a thread that announced after the re-read sees the new
// g_recording_on and comes here itself (both sequentially consistent).
void FollowTracerState() {
  if (WantRecording() == g_recording_on.load()) return;
  std::lock_guard<std::mutex> lock(g_switch_mu);
  for (bool want = WantRecording(); want != g_recording_on.load(); want = WantRecording()) {
    if (want) {
      at::reenableCallback(g_recording);
    } else {
      at::disableCallback(g_recording);
    }
    g_recording_on.store(want);
  }
}

// At the end of a top-level operator under sampling: announces the thread's
// next top-level operator as sampled after N - 1 skipped ones.
void PlanNextTopLevel(ThreadState& t) {
  if (t.announced) {  // the sampled operator ended
    t.announced = false;
    g_announced.fetch_sub(1);
    t.skips_left = g_sample_every - 1;
  } else if (t.skips_left > 0) {
    --t.skips_left;
  }
  if (t.skips_left == 0 && !t.announced) {
    t.announced = true;
    g_announced.fetch_add(1);
  }
}

std::unique_ptr<at::ObserverContext> OnNestingStart(const at::RecordFunction& fn) {
  if (fn.isAsync()) return nullptr;  // it may end on another thread
  ThreadState& t = State();
  if (t.depth++ == 0) t.sampled = g_sample_every == 1 || t.announced;
  if (IsAutogradNode(fn)) ++t.backward_depth;
  return nullptr;
}

void OnNestingEnd(const at::RecordFunction& fn, at::ObserverContext*) {
  if (fn.isAsync()) return;
  ThreadState& t = State();
  // Clamped: an operator already running when the callbacks were added ends
  // without having started here.
  if (IsAutogradNode(fn) && t.backward_depth > 0) --t.backward_depth;
  if (t.depth > 0 && --t.depth == 0) {
    if (g_sample_every > 1) PlanNextTopLevel(t);
    try {
      FollowTracerState();
    } catch (...) {  // torch refused the switch: the callback stays as it was
    }
  }
}

std::unique_ptr<at::ObserverContext> OnRecordingStart(const at::RecordFunction& fn) {
  if (fn.isAsync()) return nullptr;
  const ThreadState& t = State();
  if (!t.sampled || g_abi.active() == 0) return nullptr;
  try {
    return BeginOperator(fn, t);
  } catch (...) {
    return nullptr;  // an operator lost, never the user's program
  }
}

void OnRecordingEnd(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (ctx != nullptr) EndOperator(fn, static_cast<const OpContext&>(*ctx), State());
}

void OnForkChild() {
  g_fork_generation.fetch_add(1, std::memory_order_relaxed);
  g_announced.store(State().announced ? 1 : 0);
}

}  // namespace

bool InstallOpRecorder(const TracerAbi& abi, const OpRecorderOptions& options) {
  static std::once_flag once;
  static bool installed = false;
  std::call_once(once, [&] {
    g_abi = abi;
    g_sample_every = std::max<int64_t>(1, options.sample_every);
    pthread_atfork(nullptr, nullptr, &OnForkChild);
    try {
      const auto scopes = {at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION};
      at::addGlobalCallback(at::RecordFunctionCallback(&OnNestingStart, &OnNestingEnd)
                                .needsInputs(false)
                                .scopes(scopes));
      g_recording = at::addGlobalCallback(
          at::RecordFunctionCallback(&OnRecordingStart, &OnRecordingEnd)
              .needsInputs(true)
              .scopes(scopes));
      if (!WantRecording()) {
        g_recording_on.store(false);
        at::disableCallback(g_recording);
      }
      installed = true;
    } catch (...) {
      installed = false;
    }
  });
  return installed;
}

}  // namespace dynaflow
