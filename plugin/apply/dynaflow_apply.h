/* The C entry points of libdynaflow_apply.so: the overlap runtime (runtime/)
 * for `dynaflow apply`'s Python side (plugin/python/dynaflow/_apply.py), which
 * loads it with ctypes. Python describes a schedule as arrays, the runtime
 * runs it on its CPU or CUDA backend and calls back into Python once per task.
 *
 * Errors: functions that can fail take `err`, a buffer of `err_len` bytes that
 * receives one line saying why (always NUL-terminated when err_len > 0), and
 * return NULL or a nonzero code. No function throws or aborts. */
#ifndef DYNAFLOW_PLUGIN_APPLY_DYNAFLOW_APPLY_H_
#define DYNAFLOW_PLUGIN_APPLY_DYNAFLOW_APPLY_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(DYNAFLOW_APPLY_EXPORT)
#define DYNAFLOW_APPLY_API __attribute__((visibility("default")))
#else
#define DYNAFLOW_APPLY_API
#endif

/* Backends of dynaflow_apply_executor_new. */
enum DynaflowApplyBackend { DYNAFLOW_APPLY_CPU = 0, DYNAFLOW_APPLY_CUDA = 1 };

/* Return codes of dynaflow_apply_run. */
enum DynaflowApplyCode { DYNAFLOW_APPLY_OK = 0, DYNAFLOW_APPLY_FAILED = 1, DYNAFLOW_APPLY_BAD_INPUT = 2 };

/* The work of one task: `task` is its index in the schedule, `micro_batch`
 * the part of the batch it processes, `stream` the native stream to issue on
 * (a cudaStream_t on the CUDA backend, 0 on the CPU backend). Returns 0 on
 * success; anything else stops the call (tasks not yet started are skipped).
 * The CPU backend calls it from one worker thread per stream. */
typedef int (*dynaflow_apply_task_fn)(void* user, int task, int micro_batch, uintptr_t stream);

/* The most streams an executor or a schedule may have: the CPU backend runs
 * one thread per stream, and a plan splits a batch 16 ways at most
 * (schemas/plan.schema.json). More is refused with an error, not started. */
#define DYNAFLOW_APPLY_MAX_STREAMS 64

/* An executor with `num_streams` streams (1..DYNAFLOW_APPLY_MAX_STREAMS).
 * NULL with err set when the system refuses a thread or a stream.
 * CUDA: streams and events are
 * created at the first run, on the device current then; NULL when this
 * library was built without CUDA. */
DYNAFLOW_APPLY_API void* dynaflow_apply_executor_new(int backend, int num_streams, char* err,
                                                     size_t err_len);
DYNAFLOW_APPLY_API void dynaflow_apply_executor_free(void* executor);

/* A schedule of `num_tasks` tasks: task i runs on streams[i], processes
 * micro_batches[i], is named "<name>/mb<micro_batch>", and depends on
 * deps[dep_begin[i] .. dep_begin[i + 1]) (dep_begin has num_tasks + 1
 * entries). Every task calls fn(user, ...). NULL when the tasks do not form a
 * valid DAG over num_streams streams (err names the task). */
DYNAFLOW_APPLY_API void* dynaflow_apply_schedule_new(const char* name, int num_streams, int num_tasks,
                                                     const int* streams, const int* micro_batches,
                                                     const int* dep_begin, const int* deps,
                                                     dynaflow_apply_task_fn fn, void* user,
                                                     char* err, size_t err_len);
DYNAFLOW_APPLY_API void dynaflow_apply_schedule_free(void* schedule);

/* Runs one call of `schedule` ordered after `caller_stream` (CUDA; ignored on
 * the CPU) and, when `wait` is nonzero, blocks until it has finished (CPU: the
 * call's results are then complete). On CUDA pass wait = 0 inside a stream
 * capture: the caller's stream is ordered after the call either way. */
DYNAFLOW_APPLY_API int dynaflow_apply_run(void* executor, void* schedule, uintptr_t caller_stream,
                                          int wait, char* err, size_t err_len);

/* The bucket policy of a plan: bucket i covers steps of up to max_tokens[i]
 * tokens (strictly increasing; INT64_MAX for no bound) and runs schedule
 * schedules[i] (-1: the original path). NULL and err on a malformed list. */
DYNAFLOW_APPLY_API void* dynaflow_apply_policy_new(int num_buckets, const int64_t* max_tokens,
                                                   const int* schedules, int num_schedules,
                                                   char* err, size_t err_len);
/* The schedule index for a step of `tokens` tokens, or -1 for the original path. */
DYNAFLOW_APPLY_API int dynaflow_apply_policy_pick(const void* policy, int64_t tokens);
DYNAFLOW_APPLY_API void dynaflow_apply_policy_free(void* policy);

#ifdef __cplusplus
}
#endif

#endif /* DYNAFLOW_PLUGIN_APPLY_DYNAFLOW_APPLY_H_ */
