// A burst of operators through the C ABI from several threads, as the torch
// extension records them, for preload_integration_test. Linked to
// libdynaflow_preload.so (not LD_PRELOADed), so that it also runs in
// sanitizer builds. Usage:
//   preload_burst_helper THREADS OPS_PER_THREAD [overflow|thread_overflow|raw_thread_overflow]
// With `overflow`, the main thread then overflows its stack (SIGSEGV); with
// `thread_overflow`, a thread started after the burst does; with
// `raw_thread_overflow`, a thread started by the C library's pthread_create
// itself (as a thread started before the library was loaded, with no
// alternate signal stack from it) records one operator and then does.
#include <dlfcn.h>
#include <pthread.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "plugin/preload/dynaflow_tracer.h"

// Recurses until the stack runs out: the frame is used after the call, so
// the call cannot become a jump. `depth` never reaches the limit.
__attribute__((noinline)) int64_t OverflowTheStack(volatile char* caller, int64_t depth) {
  volatile char frame[4096];
  frame[0] = static_cast<char>(caller[0] + 1);
  if (depth == INT64_MAX) return frame[0];
  return OverflowTheStack(frame, depth + 1) + frame[0];
}

void RecordOne(int sequence) {
  DynaflowOperatorRecord op = {};
  op.id = dynaflow_next_operator_id();
  dynaflow_push_operator(op.id);
  op.start_ns = dynaflow_now_ns();
  op.end_ns = dynaflow_now_ns();
  op.sequence = sequence;
  op.tid = 1;
  op.pass = DYNAFLOW_PASS_FORWARD;
  op.name = "aten::add";
  op.input_shapes = "[[8,4096],[8,4096]]";
  op.module_path = "model.layers.0";
  dynaflow_pop_operator();
  dynaflow_record_operator(&op);
}

void* RecordOneAndOverflow(void*) {
  RecordOne(0);
  volatile char start = 0;
  return reinterpret_cast<void*>(OverflowTheStack(&start, 0));
}

// The C library's pthread_create, past the one the tracer library exports.
int StartRawThread() {
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  using Create = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  auto create = libc == nullptr ? nullptr : reinterpret_cast<Create>(dlsym(libc, "pthread_create"));
  pthread_t thread;
  if (create == nullptr || create(&thread, nullptr, RecordOneAndOverflow, nullptr) != 0) return 4;
  return pthread_join(thread, nullptr) == 0 ? 0 : 4;
}

int main(int argc, char** argv) {
  const bool overflow = argc == 4 && std::strcmp(argv[3], "overflow") == 0;
  const bool thread_overflow = argc == 4 && std::strcmp(argv[3], "thread_overflow") == 0;
  const bool raw_thread_overflow = argc == 4 && std::strcmp(argv[3], "raw_thread_overflow") == 0;
  if ((argc != 3 && !overflow && !thread_overflow && !raw_thread_overflow) ||
      dynaflow_tracer_abi_version() != DYNAFLOW_TRACER_ABI_VERSION) {
    return 2;
  }
  const int threads = std::atoi(argv[1]);
  const int per_thread = std::atoi(argv[2]);
  std::vector<std::thread> producers;
  for (int t = 0; t < threads; ++t) {
    producers.emplace_back([per_thread] {
      for (int i = 0; i < per_thread; ++i) RecordOne(i);
    });
  }
  for (std::thread& p : producers) p.join();
  if (overflow) {
    volatile char start = 0;
    return static_cast<int>(OverflowTheStack(&start, 0));
  }
  if (thread_overflow) {
    std::thread([] {
      volatile char start = 0;
      (void)OverflowTheStack(&start, 0);
    }).join();
  }
  if (raw_thread_overflow) return StartRawThread();
  return dynaflow_tracer_active() && dynaflow_tracer_record_ops() ? 0 : 3;
}
