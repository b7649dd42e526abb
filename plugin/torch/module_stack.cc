#include "plugin/torch/module_stack.h"

#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

namespace dynaflow {
namespace {

std::vector<const char*>& ThreadStack() {
  thread_local std::vector<const char*> stack;
  return stack;
}

}  // namespace

const char* InternModulePath(std::string_view path) {
  // Node-based: element addresses, and so the returned pointers, are stable.
  static std::mutex mutex;
  static auto* table = new std::unordered_set<std::string>();  // never destroyed: see header
  std::lock_guard<std::mutex> lock(mutex);
  return table->emplace(path).first->c_str();
}

void PushModule(const char* interned) { ThreadStack().push_back(interned); }

void PopModule() {
  std::vector<const char*>& stack = ThreadStack();
  if (!stack.empty()) stack.pop_back();
}

const char* CurrentModulePath() {
  const std::vector<const char*>& stack = ThreadStack();
  return stack.empty() ? nullptr : stack.back();
}

size_t ModuleDepth() { return ThreadStack().size(); }

}  // namespace dynaflow
