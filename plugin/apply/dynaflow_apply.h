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

/* Kinds of region (runtime/schedule.h): DYNAFLOW_APPLY_STAGGERED is
 * BuildStaggeredRegion(n, micro_batches), n segments; DYNAFLOW_APPLY_DUAL_BATCH
 * is BuildDualBatchRegion(n), n collectives, micro_batches must be 2. */
enum DynaflowApplyRegionKind { DYNAFLOW_APPLY_STAGGERED = 0, DYNAFLOW_APPLY_DUAL_BATCH = 1 };

/* A region's schedule, with the sequencer that turns the micro-batches' host
 * threads through its issue order (runtime/sequencer.h). NULL and err when a
 * count is out of range (n >= 1, 1 <= micro_batches <=
 * DYNAFLOW_APPLY_MAX_STREAMS) or the kind is unknown. */
DYNAFLOW_APPLY_API void* dynaflow_apply_region_new(int kind, int n, int micro_batches, char* err,
                                                   size_t err_len);
DYNAFLOW_APPLY_API void dynaflow_apply_region_free(void* region);
/* The region's schedule as arrays: for task i (0 <= i < num_tasks) its
 * stream, segment (a dual-batch region's part: compute 2j, collective 2j+1)
 * and micro-batch, and its issue order. Returns num_tasks;
 * writes nothing when `capacity` is smaller. Any array may be NULL. */
DYNAFLOW_APPLY_API int dynaflow_apply_region_tasks(const void* region, int* streams, int* segments,
                                                   int* micro_batches, int* issue_order,
                                                   int capacity);
/* Starts a call (no thread of the previous one may still run). */
DYNAFLOW_APPLY_API void dynaflow_apply_region_reset(void* region);
/* Begin (first = 1) or Next (first = 0) of micro-batch `mb`: blocks until its
 * next task has its turn, then writes the task (-1: past its last segment),
 * whether an event must be recorded at its end (*signal), and up to
 * `max_waits` tasks whose events its stream must wait for (*num_waits).
 * Returns DYNAFLOW_APPLY_OK, or FAILED/BAD_INPUT with err (aborted, or a
 * micro-batch outside the call). */
DYNAFLOW_APPLY_API int dynaflow_apply_region_turn(void* region, int mb, int first, int* task,
                                                  int* signal, int* waits, int max_waits,
                                                  int* num_waits, char* err, size_t err_len);
/* Task `task`'s edges in the region's schedule, for a caller that issues
 * the tasks itself, on one host thread, in an order of its own that the
 * dependencies allow (a staggered region on CUDA: micro-batch after
 * micro-batch): whether an event must be recorded at its end (*signal), and
 * up to `max_waits` tasks on other streams whose events its stream must wait
 * for (*num_waits; runtime::Schedule::cross_stream_waits). Returns
 * DYNAFLOW_APPLY_OK, or BAD_INPUT with err for a task outside the schedule. */
DYNAFLOW_APPLY_API int dynaflow_apply_region_edges(const void* region, int task, int* signal,
                                                   int* waits, int max_waits, int* num_waits,
                                                   char* err, size_t err_len);
/* Micro-batch `mb` returned or failed: its remaining tasks are skipped. */
DYNAFLOW_APPLY_API void dynaflow_apply_region_finish(void* region, int mb);
/* Wakes every waiting thread with a failure naming `why`. */
DYNAFLOW_APPLY_API void dynaflow_apply_region_abort(void* region, const char* why);
/* This call's tasks in the order their turns came (returns the count; writes
 * up to `capacity`), and how many were skipped and how many boundaries fell
 * past a micro-batch's last segment. */
DYNAFLOW_APPLY_API int dynaflow_apply_region_executed(const void* region, int* tasks, int capacity,
                                                      int* skipped, int* extra_boundaries);

/* The communication-overlap schedule one comm_overlap call executed
 * (runtime::BuildCommOverlapRegion, the schedule the simulator predicts): its
 * n collectives in launch order and, for collective j, the compute part that
 * first read its result (parts are cut at the launches: j + 1 .. n; n + 1:
 * nothing read it before the call returned). Returns how many compute parts
 * that schedule runs beside a collective, summed over the collectives
 * (runtime::RunsBeside), or -1 with err when `consumers` form no such
 * schedule. */
DYNAFLOW_APPLY_API int dynaflow_apply_comm_overlap_beside(const int* consumers, int n, char* err,
                                                          size_t err_len);

#ifdef __cplusplus
}
#endif

#endif /* DYNAFLOW_PLUGIN_APPLY_DYNAFLOW_APPLY_H_ */
