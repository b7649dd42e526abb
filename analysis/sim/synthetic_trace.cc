#include "analysis/sim/synthetic_trace.h"

#include <algorithm>

namespace dynaflow::testing {

double GemmUs(double m, double n, double k) {
  const double flops = 2 * m * n * k;
  const double bytes = 2 * (m * k + k * n + m * n);
  return std::max(flops / (989.4e12 * 0.70), bytes / (4.8e12 * 0.90)) * 1e6 + 2;
}

double MemoryUs(double bytes) { return bytes / (4.8e12 * 0.90) * 1e6 + 2; }

SyntheticTrace::SyntheticTrace(std::string device_name, int32_t rank) {
  device_ = trace_.DeviceIndex(rank, 0);
  trace_.devices[device_].name = std::move(device_name);
}

void SyntheticTrace::Open(const std::string& name) {
  Operator o;
  o.start = cpu_;
  o.end = cpu_;
  o.rank = trace_.devices[device_].rank;
  o.pid = 100;
  o.tid = 100;
  o.name = trace_.strings.Intern(name);
  o.external_id = next_ext_++;
  cpu_ += 1000;
  open_.push_back(trace_.ops.size());
  trace_.ops.push_back(o);
}

void SyntheticTrace::Close() {
  cpu_ += 1000;
  trace_.ops[open_.back()].end = cpu_;
  open_.pop_back();
}

TimeNs SyntheticTrace::Launch(const Kernel& k) {
  if (!k.op.empty()) Open(k.op);
  if (!k.op.empty()) {
    Operator& o = trace_.ops[open_.back()];
    o.input_shapes = trace_.strings.Intern(k.shapes);
    o.input_types = trace_.strings.Intern(k.types);
  }
  cpu_ += static_cast<TimeNs>(k.host_us * 1000);
  ApiCall call;
  call.start = cpu_;
  call.end = cpu_ + static_cast<TimeNs>(launch_call_us * 1000);
  call.correlation = next_corr_++;
  call.rank = trace_.devices[device_].rank;
  call.pid = 100;
  call.tid = 100;
  call.name = trace_.strings.Intern("cudaLaunchKernel");
  call.external_id = open_.empty() ? -1 : trace_.ops[open_.back()].external_id;
  trace_.api.push_back(call);

  TimeNs start = call.start + static_cast<TimeNs>(launch_latency_us * 1000);
  auto it = stream_free_.find(k.stream);
  if (it != stream_free_.end()) start = std::max(start, it->second);
  start = std::max(start, k.after);
  GpuActivity g;
  g.start = start;
  g.end = start + static_cast<TimeNs>(k.dur_us * 1000);
  g.correlation = call.correlation;
  g.external_id = call.external_id;
  g.device_index = device_;
  g.stream = k.stream;
  g.name = trace_.strings.Intern(k.kernel);
  trace_.gpu.push_back(g);
  stream_free_[k.stream] = g.end + 1000;  // ~1 us between back-to-back kernels
  cpu_ = call.end;
  if (!k.op.empty()) Close();
  if (!range_name_.empty()) {
    if (step_gpu_start_ < 0 || g.start < step_gpu_start_) step_gpu_start_ = g.start;
    step_gpu_end_ = std::max(step_gpu_end_, g.end);
  }
  return g.end;
}

void SyntheticTrace::StepBegin(int64_t number) { RangeBegin("ProfilerStep#" + std::to_string(number)); }

void SyntheticTrace::StepEnd() { RangeEnd(); }

void SyntheticTrace::RangeBegin(const std::string& name) {
  range_name_ = name;
  step_cpu_start_ = cpu_;
  step_gpu_start_ = -1;
  step_gpu_end_ = -1;
}

void SyntheticTrace::RangeEnd() {
  const StringId name = trace_.strings.Intern(range_name_);
  Range host;
  host.start = step_cpu_start_;
  host.end = cpu_;
  host.rank = trace_.devices[device_].rank;
  host.pid = 100;
  host.tid = 100;
  host.name = name;
  trace_.ranges.push_back(host);
  if (step_gpu_start_ >= 0) {
    Range gpu = host;
    gpu.start = step_gpu_start_;
    gpu.end = step_gpu_end_;
    gpu.domain = RangeDomain::kGpuUser;
    gpu.device_index = static_cast<int32_t>(device_);
    trace_.ranges.push_back(gpu);
  }
  range_name_.clear();
}

namespace {

std::string Dims(std::initializer_list<std::vector<long>> shapes) {
  std::string s = "[";
  bool first = true;
  for (const auto& shape : shapes) {
    if (!first) s += ",";
    first = false;
    s += "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
    s += "]";
  }
  return s + "]";
}

constexpr const char* kGemmKernel =
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas";

}  // namespace

Trace DdpSerializedAllReduce(int layers, double allreduce_us, int steps) {
  SyntheticTrace t;
  TimeNs last = -1;
  for (int s = 0; s < steps; ++s) {
    t.StepBegin(10 + s);
    for (int l = 0; l < layers; ++l) {
      SyntheticTrace::Kernel gemm;
      gemm.op = "aten::mm";
      gemm.shapes = Dims({{4096, 8192}, {8192, 4096}});
      gemm.types = R"(["c10::BFloat16","c10::BFloat16"])";
      gemm.kernel = kGemmKernel;
      gemm.dur_us = GemmUs(4096, 4096, 8192);
      gemm.after = last;
      t.Open("autograd::engine::evaluate_function: MmBackward0");
      const TimeNs gemm_end = t.Launch(gemm);
      t.Close();
      SyntheticTrace::Kernel ar;
      ar.op = "c10d::allreduce_";
      ar.shapes = "[[[16777216]],[],[],[],[]]";
      ar.types = R"(["TensorList","","","Scalar","Scalar"])";
      ar.kernel = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)";
      ar.stream = 20;
      ar.dur_us = allreduce_us;
      ar.after = gemm_end + 2000;  // the NCCL stream waits on the gradient
      t.Open("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad");
      last = t.Launch(ar) + 3000;  // the compute stream waits on the all-reduce
      t.Close();
    }
    t.StepEnd();
    t.HostIdle(100);
  }
  return std::move(t.trace());
}

namespace {

// One Llama-3-8B-shaped decode layer (LlamaDecode) of `batch` sequences with
// `context` tokens of KV cache each; with `prefill`, the layer of one prompt
// of `b` tokens instead (causal flash attention over the prompt).
void LlamaDecodeLayer(SyntheticTrace& t, long b, int context, int l, bool prefill = false) {
  const char* bf16 = R"("c10::BFloat16")";
  auto types = [bf16](int n) {
    std::string s = "[";
    for (int i = 0; i < n; ++i) s += std::string(i ? "," : "") + bf16;
    return s + "]";
  };
  auto gemm = [&](long n, long k, const char* module) {
    t.Open(module);
    SyntheticTrace::Kernel g;
    g.op = "aten::mm";
    g.shapes = Dims({{b, k}, {k, n}});
    g.types = types(2);
    g.kernel = kGemmKernel;
    g.dur_us = GemmUs(static_cast<double>(b), static_cast<double>(n), static_cast<double>(k));
    t.Launch(g);
    t.Close();
  };
  auto elementwise = [&](const char* op, long width, int inputs, const char* kernel) {
    SyntheticTrace::Kernel e;
    e.op = op;
    e.shapes = inputs == 1 ? Dims({{b, 1, width}}) : Dims({{b, 1, width}, {b, 1, width}});
    e.types = types(inputs);
    e.kernel = kernel;
    e.dur_us = MemoryUs(2.0 * b * width * (inputs + 1));
    t.Launch(e);
  };
  auto norm = [&]() {
    SyntheticTrace::Kernel e;
    e.op = "aten::rms_norm";
    e.shapes = Dims({{b, 1, 4096}, {}, {4096}, {}});
    e.types = R"(["c10::BFloat16","ScalarList","c10::BFloat16","Scalar"])";
    e.kernel = "void at::native::rms_norm_kernel<c10::BFloat16>(...)";
    e.dur_us = MemoryUs(2.0 * b * 4096 * 2);
    t.Launch(e);
  };
  const std::string layer = "model.layers." + std::to_string(l);
  t.Open(layer + ".self_attn");
  norm();
  gemm(6144, 4096, "qkv_proj");
  elementwise("aten::mul", 4096, 2, "void at::native::vectorized_elementwise_kernel<4, rope>(...)");
  SyntheticTrace::Kernel a;
  a.op = "aten::_scaled_dot_product_flash_attention";
  a.shapes = Dims({{b, 32, 1, 128}, {b, 8, context, 128}, {b, 8, context, 128}});
  a.types = types(3);
  a.kernel = "void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4> >(Flash_fwd_params)";
  a.dur_us = MemoryUs(2.0 * b * 8 * context * 256 + 4.0 * b * 4096);
  if (prefill) {
    a.shapes = Dims({{1, 32, b, 128}, {1, 8, b, 128}, {1, 8, b, 128}});
    a.kernel = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4> >(Flash_fwd_params)";
    a.dur_us = 2.0 * 32 * static_cast<double>(b) * b * 256 * 0.5 / (989.4e12 * 0.55) * 1e6 + 4;
  }
  t.Launch(a);
  gemm(4096, 4096, "o_proj");
  t.Close();
  elementwise("aten::add", 4096, 2, "void at::native::vectorized_elementwise_kernel<4, add>(...)");
  t.Open(layer + ".mlp");
  norm();
  gemm(28672, 4096, "gate_up_proj");
  elementwise("aten::silu", 14336, 1, "void at::native::vectorized_elementwise_kernel<4, silu>(...)");
  elementwise("aten::mul", 14336, 2, "void at::native::vectorized_elementwise_kernel<4, mul>(...)");
  gemm(4096, 14336, "down_proj");
  t.Close();
  elementwise("aten::add", 4096, 2, "void at::native::vectorized_elementwise_kernel<4, add>(...)");
}

// A kernel that runs once per forward (embedding, head, sampling).
void OncePerForward(SyntheticTrace& t, const char* op, const std::string& shapes, const char* kernel,
                    double dur_us) {
  SyntheticTrace::Kernel k;
  k.op = op;
  k.shapes = shapes;
  k.types = R"(["c10::BFloat16","c10::BFloat16"])";
  k.kernel = kernel;
  k.dur_us = dur_us;
  t.Launch(k);
}

}  // namespace

Trace LlamaDecode(int batch, int context, int layers, int steps) {
  SyntheticTrace t;
  for (int s = 0; s < steps; ++s) {
    t.StepBegin(100 + s);
    for (int l = 0; l < layers; ++l) LlamaDecodeLayer(t, batch, context, l);
    t.StepEnd();
    t.HostIdle(60);
  }
  return std::move(t.trace());
}

Trace ServingDecodeForward(int batch, int context, int layers, bool annotated) {
  SyntheticTrace t;
  const long b = batch;
  const std::string name =
      "execute_context_0(0)_generation_" + std::to_string(batch) + "(" + std::to_string(batch) + ")";
  if (annotated) t.RangeBegin(name);
  OncePerForward(t, "aten::embedding", Dims({{128256, 4096}, {b}}),
                 "void at::native::indexSelectLargeIndex<c10::BFloat16>(...)", MemoryUs(2.0 * b * 4096));
  for (int l = 0; l < layers; ++l) LlamaDecodeLayer(t, b, context, l);
  OncePerForward(t, "aten::mm", Dims({{b, 4096}, {4096, 128256}}), "nvjet_tst_192x8_64x8_4x1_v_bz_TNT",
                 GemmUs(static_cast<double>(b), 128256, 4096));
  OncePerForward(t, "aten::argmax", Dims({{b, 128256}}),
                 "void at::native::reduce_kernel<512, 1, ArgMaxOps>(...)", MemoryUs(2.0 * b * 128256));
  if (annotated) t.RangeEnd();
  return std::move(t.trace());
}

Trace ServingSession(int prompt_tokens, int batch, int context, int layers, int decode_steps) {
  SyntheticTrace t;
  auto forward = [&t, layers](const std::string& annotation, long rows, int context, bool prefill) {
    t.RangeBegin(annotation);
    OncePerForward(t, "aten::embedding", Dims({{128256, 4096}, {rows}}),
                   "void at::native::indexSelectLargeIndex<c10::BFloat16>(...)", MemoryUs(2.0 * rows * 4096));
    for (int l = 0; l < layers; ++l) LlamaDecodeLayer(t, rows, context, l, prefill);
    OncePerForward(t, "aten::mm", Dims({{rows, 4096}, {4096, 128256}}), "nvjet_tst_192x8_64x8_4x1_v_bz_TNT",
                   GemmUs(static_cast<double>(rows), 128256, 4096));
    t.RangeEnd();
    t.HostIdle(50);
  };
  const std::string p = std::to_string(prompt_tokens), b = std::to_string(batch);
  forward("execute_context_1(" + p + ")_generation_0(0)", prompt_tokens, prompt_tokens, true);
  for (int s = 0; s < decode_steps; ++s) {
    forward("execute_context_0(0)_generation_" + b + "(" + b + ")", batch, context + s, false);
  }
  return std::move(t.trace());
}

Trace TensorParallelForward(int tokens, double allreduce_us, int layers, int steps) {
  SyntheticTrace t;
  const long m = tokens;
  const std::string bf16x2 = R"(["c10::BFloat16","c10::BFloat16"])";
  auto gemm = [&](long n, long k, TimeNs after = -1) {
    SyntheticTrace::Kernel g;
    g.op = "aten::mm";
    g.shapes = Dims({{m, k}, {k, n}});
    g.types = bf16x2;
    g.kernel = kGemmKernel;
    g.dur_us = GemmUs(static_cast<double>(m), static_cast<double>(n), static_cast<double>(k));
    g.after = after;
    return t.Launch(g);
  };
  auto memory = [&](const char* op, int passes, TimeNs after = -1) {
    SyntheticTrace::Kernel e;
    e.op = op;
    e.shapes = Dims({{m, 4096}, {m, 4096}});
    e.types = bf16x2;
    e.kernel = "void at::native::vectorized_elementwise_kernel<4, op>(...)";
    e.dur_us = MemoryUs(2.0 * m * 4096 * passes);
    e.after = after;
    return t.Launch(e);
  };
  auto allreduce = [&](TimeNs producer_end) {
    SyntheticTrace::Kernel ar;
    ar.op = "c10d::allreduce_";
    ar.shapes = "[[[" + std::to_string(m * 4096) + "]],[],[],[],[]]";
    ar.types = R"(["TensorList","","","Scalar","Scalar"])";
    ar.kernel = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)";
    ar.stream = 20;
    ar.dur_us = allreduce_us;
    ar.after = producer_end + 2000;
    return t.Launch(ar) + 3000;  // the compute stream waits on it
  };
  for (int s = 0; s < steps; ++s) {
    t.StepBegin(s);
    TimeNs wait = -1;
    for (int l = 0; l < layers; ++l) {
      t.Open("model.layers." + std::to_string(l));
      memory("aten::rms_norm", 2, wait);
      gemm(3072, 4096);
      SyntheticTrace::Kernel a;
      a.op = "aten::_scaled_dot_product_flash_attention";
      a.shapes = Dims({{1, 16, m, 128}, {1, 4, m, 128}, {1, 4, m, 128}});
      a.types = R"(["c10::BFloat16","c10::BFloat16","c10::BFloat16"])";
      a.kernel = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4> >(Flash_fwd_params)";
      a.dur_us = 2.0 * 16 * static_cast<double>(m) * m * 256 * 0.5 / (989.4e12 * 0.55) * 1e6 + 4;
      t.Launch(a);
      wait = allreduce(gemm(4096, 2048));
      memory("aten::add", 3, wait);
      memory("aten::rms_norm", 2);
      gemm(14336, 4096);
      memory("aten::silu", 2);
      memory("aten::mul", 3);
      wait = allreduce(gemm(4096, 7168));
      memory("aten::add", 3, wait);
      wait = -1;
      t.Close();
    }
    t.StepEnd();
    t.HostIdle(80);
  }
  return std::move(t.trace());
}

Trace MemoryDominatedForward(int rows, int layers, int steps) {
  SyntheticTrace t;
  const long m = rows;
  for (int s = 0; s < steps; ++s) {
    t.StepBegin(s);
    for (int l = 0; l < layers; ++l) {
      t.Open("model.blocks." + std::to_string(l));
      SyntheticTrace::Kernel g;
      g.op = "aten::mm";
      g.shapes = Dims({{m, 1024}, {1024, 1024}});
      g.types = R"(["c10::BFloat16","c10::BFloat16"])";
      g.kernel = kGemmKernel;
      g.dur_us = GemmUs(static_cast<double>(m), 1024, 1024);
      t.Launch(g);
      for (int k = 0; k < 2; ++k) {
        SyntheticTrace::Kernel e;
        e.op = "aten::_softmax";
        e.shapes = Dims({{m, 32, 1024}, {}, {}});
        e.types = R"(["c10::BFloat16","Scalar","Scalar"])";
        e.kernel = "void at::native::cunn_SoftMaxForward<8, c10::BFloat16, float, c10::BFloat16>(...)";
        e.dur_us = MemoryUs(2.0 * 2 * m * 32 * 1024);
        t.Launch(e);
      }
      t.Close();
    }
    t.StepEnd();
    t.HostIdle(60);
  }
  return std::move(t.trace());
}

}  // namespace dynaflow::testing
