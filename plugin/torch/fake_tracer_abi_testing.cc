#include "plugin/torch/fake_tracer_abi_testing.h"

#include "plugin/preload/dynaflow_tracer.h"

namespace dynaflow::testing_abi {
namespace {

thread_local std::vector<uint64_t> t_pushed;
thread_local uint64_t t_last_popped = 0;

std::string Str(const char* s) { return s == nullptr ? std::string() : std::string(s); }

}  // namespace

FakeTracer g_tracer;

size_t PushedOnThisThread() { return t_pushed.size(); }

}  // namespace dynaflow::testing_abi

using dynaflow::testing_abi::g_tracer;
using dynaflow::testing_abi::t_last_popped;
using dynaflow::testing_abi::t_pushed;

extern "C" {
__attribute__((visibility("default"))) int dynaflow_tracer_abi_version(void) {
  return DYNAFLOW_TRACER_ABI_VERSION;
}
__attribute__((visibility("default"))) int dynaflow_tracer_active(void) {
  ++g_tracer.active_queries;
  return g_tracer.active.load();
}
__attribute__((visibility("default"))) int dynaflow_tracer_record_ops(void) { return 1; }
__attribute__((visibility("default"))) int64_t dynaflow_now_ns(void) {
  return g_tracer.clock.fetch_add(10) + 10;
}
__attribute__((visibility("default"))) uint64_t dynaflow_next_operator_id(void) {
  return g_tracer.next_id.fetch_add(1);
}
__attribute__((visibility("default"))) void dynaflow_push_operator(uint64_t id) {
  t_pushed.push_back(id);
}
__attribute__((visibility("default"))) void dynaflow_pop_operator(void) {
  if (t_pushed.empty()) {
    ++g_tracer.unbalanced;
    return;
  }
  t_last_popped = t_pushed.back();
  t_pushed.pop_back();
}
__attribute__((visibility("default"))) void dynaflow_record_operator(
    const DynaflowOperatorRecord* r) {
  if (r->id != t_last_popped) ++g_tracer.unbalanced;
  std::lock_guard<std::mutex> lock(g_tracer.mutex);
  g_tracer.records.push_back({r->id, r->start_ns, r->end_ns, r->sequence, r->tid, r->pass,
                              dynaflow::testing_abi::Str(r->name),
                              dynaflow::testing_abi::Str(r->input_shapes),
                              dynaflow::testing_abi::Str(r->input_types),
                              dynaflow::testing_abi::Str(r->module_path),
                              dynaflow::testing_abi::Str(r->collective)});
}
}  // extern "C"
