// The c10d/NCCL metadata of a record_param_comms operator, which torch keeps
// beside the operator (ThreadLocalDebugInfo PARAM_COMMS_INFO) rather than in
// its inputs, encoded as the members of a compact JSON object without braces
// in the names torch.profiler (Kineto) gives them, the trace store's
// operators.collective_id:
//   "Collective name":"allreduce","Process Group Name":"0",
//   "Process Group Description":"default_pg","In msg nelems":1024,
//   "Out msg nelems":1024,"dtype":"Float","Group size":2,
//   "In split size":[],"Out split size":[],"Global rank start":0,
//   "Global rank stride":1
#pragma once

#include <ATen/record_function.h>

#include <string>

namespace torch {
class ParamCommsDebugInfo;
}

namespace dynaflow {

// Strings are escaped for JSON; never throws except std::bad_alloc.
std::string EncodeCollective(const torch::ParamCommsDebugInfo& info);

// The metadata of `fn` when it is record_param_comms with its debug info in
// scope on this thread, else "".
std::string CollectiveOf(const at::RecordFunction& fn);

}  // namespace dynaflow
