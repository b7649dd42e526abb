// FLOPs and bytes of a framework operator from its input shapes and dtypes, as
// the PyTorch profiler records them (Operator::input_shapes / input_types,
// compact JSON such as [[8,4096],[4096,4096]] and ["c10::BFloat16","float"]).
//
// The numbers are the ideal work of the operator: every input read once, every
// output written once, no recomputation. They are what a roofline needs, not
// what a profiler counter would show. Unknown operators, or known ones whose
// shapes are missing or malformed, yield an OpCost with kind kUnknown or with
// zero flops and bytes; this function never fails and never allocates on the
// heap (ConvolutionOutputFromBackward and ConvolutionForwardInputs, which
// build keys, excepted).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace dynaflow {

enum class OpKind : uint8_t {
  kUnknown = 0,
  kMatmul,         // mm, addmm, linear, matmul, bmm, baddbmm
  kConvolution,    // convolution and its backward
  kAttention,      // scaled-dot-product / flash / efficient attention, forward and backward
  kElementwise,    // pointwise math, copies, fills, concatenation
  kNormalization,  // layer, RMS, batch and group norm
  kSoftmax,
  kEmbedding,
  kReduction,      // sum, mean, max, argmax, norms, losses
  kCommunication,  // collectives (c10d, record_param_comms, nccl annotations)
  kOptimizer,      // fused / foreach optimizer steps (token-independent)
};

const char* OpKindName(OpKind kind);

// Which peak bounds the operator's math.
enum class Precision : uint8_t { kUnknown = 0, kFp8, kHalf, kTf32, kFp32, kFp64, kInteger };

struct OpCost {
  OpKind kind = OpKind::kUnknown;
  Precision precision = Precision::kUnknown;
  double flops = 0;
  double bytes = 0;         // ideal DRAM traffic: inputs read once, outputs written once
  double weight_bytes = 0;  // the part of `bytes` independent of the token count (weights, bias)
  double tokens = 0;        // the token (row) dimension: GEMM M, conv batch, attention B*Sq; 0 unknown
  bool decode = false;      // attention with few query tokens per sequence (KV-bound)
  bool known() const { return flops > 0 || bytes > 0; }
};

// What the trace recorded around an operator's shapes, all optional.
struct OpContext {
  // Kineto's "Concrete Inputs" (["","","[2, 2]","1"]): a convolution's stride,
  // padding, dilation and groups, a backward's output_mask, weight sizes.
  std::string_view concrete_inputs;
  // The innermost enclosing operator: cudnn_convolution_backward_weight takes
  // the weight's size as an int list the profiler does not record; the
  // enclosing (cudnn_)convolution_backward holds the weight tensor itself.
  std::string_view parent_name;
  std::string_view parent_shapes;
  // A forward convolution's output shape ("[32,64,112,112]") when the trace
  // shows it elsewhere: the grad_output of the backward of the same input and
  // weight shapes (ConvolutionOutputFromBackward). Stride and padding are not
  // recorded by older profilers; this is how the output size is still exact.
  std::string_view output_shape;
};

// For a convolution backward (convolution_backward, cudnn_ or
// miopen_convolution_backward): `forward_inputs` = "[x,w]", the shapes of its
// forward's input and weight as a forward convolution lists them first, and
// `output` = the grad_output's shape, i.e. the forward's output. False for
// other operators or incomplete shapes.
bool ConvolutionOutputFromBackward(std::string_view name, std::string_view input_shapes,
                                   std::string* forward_inputs, std::string* output);

// The "[x,w]" key of a forward convolution's first two shapes, as above; false
// for other operators.
bool ConvolutionForwardInputs(std::string_view name, std::string_view input_shapes,
                              std::string* forward_inputs);

// The cost of operator `name` (e.g. "aten::mm") given its recorded inputs.
OpCost EstimateOpCost(std::string_view name, std::string_view input_shapes,
                      std::string_view input_types, const OpContext& context = {});

// Bytes of one element of a profiler dtype name ("c10::BFloat16" -> 2, "float"
// -> 4, "long int" -> 8); 0 for non-tensors ("Scalar", "", "TensorList").
int ElementBytes(std::string_view dtype);

// Whether `s` contains `needle`, ignoring ASCII case; `needle` is lowercase.
// Kernel- and operator-name rules use it.
bool ContainsIgnoringCase(std::string_view s, std::string_view needle);
// Whether `s` contains any of `needles` (lowercase), ignoring ASCII case.
bool ContainsAny(std::string_view s, std::initializer_list<std::string_view> needles);

}  // namespace dynaflow
