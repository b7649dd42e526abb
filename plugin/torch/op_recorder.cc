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

void OnForkChild() { g_fork_generation.fetch_add(1, std::memory_order_relaxed); }

int32_t OsThreadId() { return static_cast<int32_t>(syscall(SYS_gettid)); }

struct ThreadState {
  uint32_t fork_generation = g_fork_generation.load(std::memory_order_relaxed);
  int32_t tid = OsThreadId();
  int64_t depth = 0;           // operators in flight on this thread
  int64_t backward_depth = 0;  // of which autograd nodes
  uint64_t top_level_seen = 0;
  bool sampled = true;  // the sampling decision of the current top-level operator
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

std::unique_ptr<at::ObserverContext> OnStart(const at::RecordFunction& fn) {
  if (fn.isAsync()) return nullptr;  // it may end on another thread
  ThreadState& t = State();
  if (t.depth++ == 0) t.sampled = t.top_level_seen++ % g_sample_every == 0;
  if (IsAutogradNode(fn)) ++t.backward_depth;
  if (!t.sampled || g_abi.active() == 0) return nullptr;
  try {
    return BeginOperator(fn, t);
  } catch (...) {
    return nullptr;  // an operator lost, never the user's program
  }
}

void OnEnd(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (fn.isAsync()) return;
  ThreadState& t = State();
  if (ctx != nullptr) EndOperator(fn, static_cast<const OpContext&>(*ctx), t);
  // Clamped: an operator already running when the callbacks were added ends
  // without having started here.
  if (IsAutogradNode(fn) && t.backward_depth > 0) --t.backward_depth;
  if (t.depth > 0) --t.depth;
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
      at::addGlobalCallback(
          at::RecordFunctionCallback(&OnStart, &OnEnd)
              .needsInputs(true)
              .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
      installed = true;
    } catch (...) {
      installed = false;
    }
  });
  return installed;
}

}  // namespace dynaflow
