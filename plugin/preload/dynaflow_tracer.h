/* The C ABI of libdynaflow_preload.so that the torch extension (and any other
 * framework glue) calls to record framework operators. The torch extension
 * finds these symbols with dlsym(RTLD_DEFAULT, ...) when the preload library
 * is loaded (LD_PRELOAD); when they are absent it records nothing.
 *
 * Every function is safe to call from any thread, never blocks on I/O, never
 * throws and never aborts: on overload a record is dropped and counted.
 */
#ifndef DYNAFLOW_PLUGIN_PRELOAD_DYNAFLOW_TRACER_H_
#define DYNAFLOW_PLUGIN_PRELOAD_DYNAFLOW_TRACER_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version 2 added DynaflowOperatorRecord.collective: the record's layout
 * changed, so an extension built for another version records nothing. */
#define DYNAFLOW_TRACER_ABI_VERSION 2

/* Pass of an operator, as in the trace store's operators.pass column. */
enum DynaflowPass { DYNAFLOW_PASS_UNKNOWN = 0, DYNAFLOW_PASS_FORWARD = 1, DYNAFLOW_PASS_BACKWARD = 2 };

/* One finished framework operator. Strings are copied before the call returns. */
typedef struct DynaflowOperatorRecord {
  uint64_t id;            /* unique per process; also the CUPTI external correlation id */
  int64_t start_ns;       /* dynaflow_now_ns() clock */
  int64_t end_ns;
  int64_t sequence;       /* autograd sequence number, -1 when none */
  int32_t tid;            /* OS thread id */
  int32_t pass;           /* enum DynaflowPass */
  const char* name;       /* e.g. "aten::mm" */
  const char* input_shapes; /* compact JSON, e.g. "[[8,4096],[4096,4096]]"; may be NULL */
  const char* input_types;  /* compact JSON, e.g. "[\"c10::BFloat16\"]"; may be NULL */
  const char* module_path;  /* e.g. "model.layers.0.mlp"; may be NULL */
  /* c10d/NCCL metadata of record_param_comms as the members of a compact JSON
   * object without braces, in Kineto's names, e.g.
   * "\"Collective name\":\"allreduce\",\"Group size\":2"; NULL or "" for
   * other operators (the trace store's operators.collective_id). */
  const char* collective;
} DynaflowOperatorRecord;

/* DYNAFLOW_TRACER_ABI_VERSION of the loaded library. */
int dynaflow_tracer_abi_version(void);

/* Nonzero while the tracer records (after --delay, before --duration ends). */
int dynaflow_tracer_active(void);

/* Nonzero when framework operators should be recorded (--ops on). */
int dynaflow_tracer_record_ops(void);

/* Timestamp on the clock of GPU activity records (CUPTI's when available,
 * CLOCK_REALTIME otherwise), in nanoseconds. */
int64_t dynaflow_now_ns(void);

/* An operator id unique within the trace, to pass to push/record: a process's
 * ids count up from (pid << 31) + 1 (below 2^53 for any Linux pid, so JSON
 * readers keep them exact), and a forked child starts at its own. */
uint64_t dynaflow_next_operator_id(void);

/* Marks GPU work launched by this thread until the matching pop as caused by
 * operator `id` (a CUPTI external correlation id). No-op without CUPTI. */
void dynaflow_push_operator(uint64_t id);
void dynaflow_pop_operator(void);

/* Queues a finished operator for the writer thread. */
void dynaflow_record_operator(const DynaflowOperatorRecord* record);

/* Finishes this process's trace now: disables CUPTI, which completes its
 * buffers, writes what remains and closes the store; later records are
 * ignored. The Python side calls it at interpreter exit, after a device
 * synchronize, so the last kernels are recorded before torch, libcuda and
 * libcupti tear down (the tracer's own exit handler runs after their static
 * destructors). Idempotent. Added within ABI version 1, as below. */
void dynaflow_tracer_shutdown(void);

/* The process's rank in torch.distributed's default process group, recorded by
 * the Python side when the program calls init_process_group: it replaces the
 * rank of the environment (RANK) as the process metadata "rank", which the
 * merge gives every record of the process (ranks started by
 * torch.multiprocessing carry no RANK). Added within ABI version 1, as below. */
void dynaflow_record_process_group_rank(int32_t rank);

/* Records the structure fingerprint of a root module of class `root_class`
 * (dynaflow._module_paths.module_fingerprint) as the process metadata
 * "module_fingerprint.<root_class>", which `dynaflow advise` copies into the
 * plan and `dynaflow apply` compares with the program's model. The Python
 * side records each class once per process. Added within ABI version 1: the Python side looks
 * it up by name and does without it. */
void dynaflow_record_module_fingerprint(const char* root_class, const char* fingerprint);

/* torch.profiler (Kineto) in the same process takes CUPTI's buffer
 * callbacks, clock and activity kinds: the Python side calls lend right
 * before the profiler prepares or starts (after a device synchronize) and
 * reclaim right after it stops. Lend flushes the tracer's buffers and leaves
 * CUPTI alone; reclaim registers the tracer's callbacks and clock and enables
 * its kinds again. GPU records in between go to torch.profiler; the trace's
 * metadata says when (cupti_kineto_windows) and for how many operators.
 * Idempotent. Added within ABI version 2: the Python side looks them up by
 * name and does without them. */
void dynaflow_tracer_lend_cupti(void);
void dynaflow_tracer_reclaim_cupti(void);

#ifdef __cplusplus
}
#endif

#endif  /* DYNAFLOW_PLUGIN_PRELOAD_DYNAFLOW_TRACER_H_ */
