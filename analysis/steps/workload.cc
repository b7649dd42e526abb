#include "analysis/steps/workload.h"

#include <unordered_map>
#include <vector>

#include "analysis/roofline/flops_bytes.h"

namespace dynaflow {
namespace {

// What one step's activities showed.
struct Evidence {
  bool backward = false;
  int64_t decode_shapes = 0, prefill_shapes = 0;  // attention operators
  int64_t decode_kernels = 0, prefill_kernels = 0;
  std::unordered_map<int64_t, int64_t> tokens;  // attention query rows -> operator instances
  std::vector<int32_t> seen_ops;                // attention operators counted once
};

bool BackwardName(std::string_view n) {
  return ContainsAny(n, {"backward", "_bwd", "autograd::engine"});
}

void AddActivity(const Trace& trace, const OperatorLinks& links, CostCache* costs, uint32_t i,
                 Evidence* e) {
  const GpuActivity& g = trace.gpu[i];
  const std::string_view kernel = trace.strings.Get(g.name);
  if (BackwardName(kernel)) e->backward = true;
  const StepPhase by_name = AttentionKernelPhase(kernel);
  e->decode_kernels += by_name == StepPhase::kDecode;
  e->prefill_kernels += by_name == StepPhase::kPrefill;
  const int32_t op = links.activity_op[i];
  if (op < 0) return;
  const Operator& o = trace.ops[static_cast<size_t>(op)];
  const int32_t top = links.op_top[static_cast<size_t>(op)];
  if (o.pass == Pass::kBackward || BackwardName(trace.strings.Get(o.name)) ||
      BackwardName(trace.strings.Get(trace.ops[static_cast<size_t>(top)].name))) {
    e->backward = true;
  }
  const OpCost& c = costs->Get(o);
  if (c.kind != OpKind::kAttention || c.tokens <= 0) return;
  for (int32_t s : e->seen_ops) {
    if (s == op) return;
  }
  e->seen_ops.push_back(op);
  ++e->tokens[static_cast<int64_t>(c.tokens)];
  // Shapes tell decode apart only where the cost model saw the context
  // length (FLOPs known); a variable-length call without sequence offsets
  // says nothing about the phase.
  if (c.decode) {
    ++e->decode_shapes;
  } else if (c.flops > 0) {
    ++e->prefill_shapes;
  }
}

StepPhase PhaseOf(const Evidence& e) {
  if (e.backward) return StepPhase::kTraining;
  const bool by_shape = e.decode_shapes + e.prefill_shapes > 0;
  const int64_t decode = by_shape ? e.decode_shapes : e.decode_kernels;
  const int64_t prefill = by_shape ? e.prefill_shapes : e.prefill_kernels;
  if (decode > 0 && prefill > 0) return StepPhase::kMixed;
  if (decode > 0) return StepPhase::kDecode;
  return prefill > 0 ? StepPhase::kPrefill : StepPhase::kUnknown;
}

// The most common attention row count (ties: the larger), 0 when none.
int64_t TokensOf(const Evidence& e) {
  int64_t best = 0, best_count = 0;
  for (const auto& [rows, count] : e.tokens) {
    if (count > best_count || (count == best_count && rows > best)) {
      best = rows;
      best_count = count;
    }
  }
  return best;
}

}  // namespace

StepPhase AttentionKernelPhase(std::string_view n) {
  // flash-attn runs decode through its split-KV kernel (flash_fwd_splitkv_*);
  // vLLM's paged_attention_v1/v2 and FlashInfer's BatchDecodeWithPagedKVCache*
  // serve decode; TensorRT-LLM's masked multi-head attention is its decode
  // kernel. "decode" alone counts only in an attention kernel's name.
  const bool attention = ContainsAny(n, {"attention", "attn", "fmha", "kvcache", "kv_cache"});
  if (ContainsAny(n, {"splitkv", "paged_attention", "single_query", "masked_multihead_attention"}) ||
      (attention && ContainsIgnoringCase(n, "decode"))) {
    return StepPhase::kDecode;
  }
  // FlashInfer's BatchPrefill*, TensorRT-LLM's (and vLLM's TRT-LLM gen) fmha
  // context kernels (fmhaSm100aKernel_...Context).
  if (attention && ContainsAny(n, {"prefill", "context"})) {
    return StepPhase::kPrefill;
  }
  return StepPhase::kUnknown;
}

void InferWorkloads(const Trace& trace, const OperatorLinks& links, const DeviceResources& dev,
                    CostCache* costs, DeviceSteps* steps) {
  std::vector<Evidence> ev(steps->steps.size());
  for (size_t k = 0; k < dev.order.size() && k < steps->step_of.size(); ++k) {
    const int32_t s = steps->step_of[k];
    if (s < 0 || static_cast<size_t>(s) >= ev.size()) continue;
    AddActivity(trace, links, costs, dev.order[k], &ev[static_cast<size_t>(s)]);
  }
  for (size_t s = 0; s < ev.size(); ++s) {
    Step& step = steps->steps[s];
    if (step.phase == StepPhase::kUnknown) step.phase = PhaseOf(ev[s]);
    if (step.tokens > 0) continue;
    step.tokens = TokensOf(ev[s]);
    if (step.tokens > 0) step.tokens_source = TokenSource::kAttentionShapes;
  }
}

}  // namespace dynaflow
