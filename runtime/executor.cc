#include "runtime/executor.h"

#include <exception>
#include <string>

namespace dynaflow::runtime {

Status InvokeTask(const Task& task, TaskContext& context) noexcept {
  try {
    return task.fn(context);
  } catch (const std::exception& e) {
    return Status::Failure("task " + std::to_string(task.id) + " '" + task.name +
                           "' threw: " + e.what());
  } catch (...) {
    return Status::Failure("task " + std::to_string(task.id) + " '" + task.name +
                           "' threw a non-standard exception");
  }
}

}  // namespace dynaflow::runtime
