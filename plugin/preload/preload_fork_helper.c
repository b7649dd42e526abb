/* A traced C program that forks, for preload_integration_test. The parent
 * and its first child record one operator each through the tracer's C ABI
 * when the tracer is loaded (found with dlsym, as the torch extension finds
 * it); the second child records nothing. The parent exits with 5 when its
 * children exited with 3 and 4, so the test sees exit statuses pass through.
 * The parent takes an operator id before it forks, so a child that continued
 * its parent's counter would record the parent's second id.
 */
#include <dlfcn.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

#include "plugin/preload/dynaflow_tracer.h"

typedef uint64_t (*NextIdFn)(void);

static uint64_t next_id(void) {
  NextIdFn next = (NextIdFn)dlsym(RTLD_DEFAULT, "dynaflow_next_operator_id");
  return next == NULL ? 0 : next();
}

static void record(const char* name) {
  typedef void (*RecordFn)(const DynaflowOperatorRecord*);
  typedef int64_t (*NowFn)(void);
  RecordFn record_operator = (RecordFn)dlsym(RTLD_DEFAULT, "dynaflow_record_operator");
  NowFn now = (NowFn)dlsym(RTLD_DEFAULT, "dynaflow_now_ns");
  if (record_operator == NULL || now == NULL) return;
  DynaflowOperatorRecord op = {0};
  op.id = next_id();
  op.start_ns = now();
  op.end_ns = op.start_ns + 1;
  op.sequence = -1;
  op.tid = (int32_t)getpid();
  op.name = name;
  record_operator(&op);
}

/* The exit status of `child`, or -1. */
static int exit_status(pid_t child) {
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

int main(void) {
  (void)next_id();
  pid_t recording = fork();
  if (recording < 0) return 1;
  if (recording == 0) {
    record("child_op");
    return 3;
  }
  pid_t idle = fork();
  if (idle < 0) return 1;
  if (idle == 0) return 4;
  record("parent_op");
  return exit_status(recording) == 3 && exit_status(idle) == 4 ? 5 : 1;
}
