#include "analysis/roofline/flops_bytes.h"

#include <gtest/gtest.h>

#include <string>

namespace dynaflow {
namespace {

constexpr const char* kBf16x2 = R"(["c10::BFloat16","c10::BFloat16"])";
constexpr const char* kBf16x3 = R"(["c10::BFloat16","c10::BFloat16","c10::BFloat16"])";

TEST(FlopsBytesTest, MatrixMultiplies) {
  OpCost mm = EstimateOpCost("aten::mm", "[[8,4096],[4096,4096]]", kBf16x2);
  EXPECT_EQ(mm.kind, OpKind::kMatmul);
  EXPECT_EQ(mm.precision, Precision::kHalf);
  EXPECT_DOUBLE_EQ(mm.flops, 2.0 * 8 * 4096 * 4096);
  EXPECT_DOUBLE_EQ(mm.bytes, 2.0 * (8 * 4096 + 4096 * 4096 + 8 * 4096));
  EXPECT_DOUBLE_EQ(mm.weight_bytes, 2.0 * 4096 * 4096);
  EXPECT_DOUBLE_EQ(mm.tokens, 8);

  // linear flattens the leading dimensions: M = 4 * 2048.
  OpCost lin = EstimateOpCost("aten::linear", "[[4,2048,4096],[3072,4096],[]]",
                              R"(["c10::BFloat16","c10::BFloat16",""])");
  EXPECT_DOUBLE_EQ(lin.flops, 2.0 * 8192 * 3072 * 4096);
  EXPECT_DOUBLE_EQ(lin.tokens, 8192);
  EXPECT_DOUBLE_EQ(lin.weight_bytes, 2.0 * 3072 * 4096);

  OpCost lin_bias = EstimateOpCost("aten::linear", "[[888,2880],[640,2880],[640]]", kBf16x3);
  EXPECT_DOUBLE_EQ(lin_bias.flops, 2.0 * 888 * 640 * 2880 + 888 * 640);
  EXPECT_DOUBLE_EQ(lin_bias.weight_bytes, 2.0 * (640 * 2880 + 640));

  OpCost addmm = EstimateOpCost("aten::addmm", "[[640],[888,2880],[2880,640],[],[]]",
                                R"(["c10::BFloat16","c10::BFloat16","c10::BFloat16","Scalar","Scalar"])");
  EXPECT_DOUBLE_EQ(addmm.flops, 2.0 * 888 * 640 * 2880 + 888 * 640);

  OpCost bmm = EstimateOpCost("aten::bmm", "[[16,128,64],[16,64,256]]", R"(["float","float"])");
  EXPECT_DOUBLE_EQ(bmm.flops, 2.0 * 16 * 128 * 256 * 64);
  EXPECT_EQ(bmm.precision, Precision::kFp32);
  EXPECT_DOUBLE_EQ(bmm.weight_bytes, 0);

  OpCost baddbmm = EstimateOpCost("aten::baddbmm", "[[16,128,256],[16,128,64],[16,64,256]]",
                                  R"(["float","float","float"])");
  EXPECT_DOUBLE_EQ(baddbmm.flops, 2.0 * 16 * 128 * 256 * 64 + 16 * 128 * 256);

  OpCost batched = EstimateOpCost("aten::matmul", "[[8,12,128,64],[8,12,64,128]]", kBf16x2);
  EXPECT_DOUBLE_EQ(batched.flops, 2.0 * 96 * 128 * 128 * 64);
}

TEST(FlopsBytesTest, AttentionPrefillIsCausalAndDecodeIsKvBound) {
  // [B, H, S, D] with equal query and key lengths: causal, half the square.
  OpCost prefill = EstimateOpCost("aten::_scaled_dot_product_flash_attention",
                                  "[[4,16,2048,128],[4,16,2048,128],[4,16,2048,128]]", kBf16x3);
  EXPECT_EQ(prefill.kind, OpKind::kAttention);
  EXPECT_DOUBLE_EQ(prefill.flops, 0.5 * 2.0 * 4 * 16 * 2048.0 * 2048 * 256);
  EXPECT_FALSE(prefill.decode);
  EXPECT_DOUBLE_EQ(prefill.tokens, 4 * 2048);

  // [B, S, H, D] for the flash entry point; one query token per sequence.
  OpCost decode = EstimateOpCost("aten::_flash_attention_forward",
                                 "[[64,1,16,128],[64,4096,4,128],[64,4096,4,128]]", kBf16x3);
  EXPECT_TRUE(decode.decode);
  EXPECT_DOUBLE_EQ(decode.flops, 2.0 * 64 * 16 * 1 * 4096 * 256);
  const double kv = 64.0 * 4 * 4096 * 256 * 2;
  const double qo = 64.0 * 16 * 1 * 256 * 2;
  EXPECT_DOUBLE_EQ(decode.bytes, kv + qo);
  // Intensity far below any GPU's ridge point: memory bound.
  EXPECT_LT(decode.flops / decode.bytes, 10);

  OpCost backward = EstimateOpCost("aten::_flash_attention_backward",
                                   "[[4,2048,16,128],[4,2048,16,128],[4,2048,16,128],[4,2048,16,128]]",
                                   R"(["c10::BFloat16","c10::BFloat16","c10::BFloat16","c10::BFloat16"])");
  EXPECT_DOUBLE_EQ(backward.flops, 2.5 * 0.5 * 2.0 * 4 * 16 * 2048.0 * 2048 * 256);

  // Paged / varlen layouts without the context: bytes only.
  OpCost paged = EstimateOpCost("vllm::unified_attention_with_output",
                                "[[888,8,64],[888,1,64],[888,1,64],[888,8,64],[],[],[]]",
                                R"(["c10::BFloat16","c10::BFloat16","c10::BFloat16","c10::BFloat16","","",""])");
  EXPECT_EQ(paged.kind, OpKind::kAttention);
  EXPECT_EQ(paged.flops, 0);
  EXPECT_GT(paged.bytes, 0);
}

TEST(FlopsBytesTest, Convolution) {
  OpCost c = EstimateOpCost("aten::conv2d", "[[32,64,56,56],[128,64,3,3],[128],[],[],[],[]]",
                            R"(["float","float","float","ScalarList","ScalarList","ScalarList","Int"])");
  EXPECT_EQ(c.kind, OpKind::kConvolution);
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 32 * 128 * 56 * 56 * 64 * 9);
  EXPECT_EQ(c.precision, Precision::kTf32);
  EXPECT_DOUBLE_EQ(c.tokens, 32);
  OpCost b = EstimateOpCost("aten::convolution_backward",
                            "[[32,128,56,56],[32,64,56,56],[128,64,3,3]]", R"(["float","float","float"])");
  EXPECT_DOUBLE_EQ(b.flops, 2.0 * c.flops);
}

TEST(FlopsBytesTest, MemoryBoundFamilies) {
  const double n = 4.0 * 2048 * 4096;
  OpCost add = EstimateOpCost("aten::add", "[[4,2048,4096],[4,2048,4096]]", kBf16x2);
  EXPECT_EQ(add.kind, OpKind::kElementwise);
  EXPECT_DOUBLE_EQ(add.bytes, 3 * n * 2);
  EXPECT_DOUBLE_EQ(add.flops, n);

  OpCost bcast = EstimateOpCost("aten::add", "[[4,2048,1]]", R"(["float"])");
  EXPECT_DOUBLE_EQ(bcast.bytes, 2 * 4.0 * 2048 * 4);

  OpCost copy = EstimateOpCost("aten::copy_", "[[4,2048],[4,2048],[]]", R"(["long int","c10::BFloat16","Scalar"])");
  EXPECT_DOUBLE_EQ(copy.bytes, 8192.0 * 8 + 8192.0 * 2);

  OpCost norm = EstimateOpCost("aten::rms_norm", "[[4,2048,4096],[],[4096],[]]",
                               R"(["c10::BFloat16","ScalarList","c10::BFloat16","Scalar"])");
  EXPECT_EQ(norm.kind, OpKind::kNormalization);
  EXPECT_DOUBLE_EQ(norm.bytes, 2 * n * 2 + 4096 * 2);
  OpCost fused = EstimateOpCost("_C::fused_add_rms_norm", "[[888,2880],[888,2880],[2880],[]]",
                                R"(["c10::BFloat16","c10::BFloat16","c10::BFloat16","Scalar"])");
  EXPECT_DOUBLE_EQ(fused.bytes, 4.0 * 888 * 2880 * 2 + 2880 * 2);

  OpCost softmax = EstimateOpCost("aten::_softmax", "[[8,16,512,512],[],[]]", R"(["float","Scalar","Scalar"])");
  EXPECT_EQ(softmax.kind, OpKind::kSoftmax);
  EXPECT_DOUBLE_EQ(softmax.bytes, 2.0 * 8 * 16 * 512 * 512 * 4);

  OpCost emb = EstimateOpCost("aten::embedding", "[[128256,4096],[4,2048],[],[],[]]",
                              R"(["c10::BFloat16","long int","Scalar","Scalar","Scalar"])");
  EXPECT_EQ(emb.kind, OpKind::kEmbedding);
  EXPECT_DOUBLE_EQ(emb.bytes, 2.0 * 8192 * 4096 * 2 + 8192 * 8);
  EXPECT_DOUBLE_EQ(emb.tokens, 8192);

  OpCost sum = EstimateOpCost("aten::sum", "[[4,2048,64128]]", R"(["float"])");
  EXPECT_EQ(sum.kind, OpKind::kReduction);
  EXPECT_DOUBLE_EQ(sum.bytes, 4.0 * 2048 * 64128 * 4);
}

TEST(FlopsBytesTest, CommunicationAndOptimizer) {
  OpCost ar = EstimateOpCost("c10d::allreduce_", "[[[33554432]],[],[],[],[]]",
                             R"(["TensorList","","","Scalar","Scalar"])");
  EXPECT_EQ(ar.kind, OpKind::kCommunication);
  EXPECT_DOUBLE_EQ(ar.bytes, 33554432.0 * 2);  // a tensor list: bf16 assumed
  OpCost rpc = EstimateOpCost("record_param_comms", "[[33554432]]", R"(["float"])");
  EXPECT_DOUBLE_EQ(rpc.bytes, 33554432.0 * 4);
  EXPECT_EQ(EstimateOpCost("nccl:all_reduce", "", "").kind, OpKind::kCommunication);
  EXPECT_EQ(EstimateOpCost("aten::_fused_adam_", "[[],[]]", R"(["TensorList","TensorList"])").kind,
            OpKind::kOptimizer);
  // broadcast_tensors is not a collective.
  EXPECT_NE(EstimateOpCost("aten::broadcast_tensors", "[[4,4]]", R"(["float"])").kind,
            OpKind::kCommunication);
}

TEST(FlopsBytesTest, UnknownAndMalformedInputsNeverFail) {
  EXPECT_FALSE(EstimateOpCost("aten::view", "[[4,4],[]]", R"(["float",""])").known());
  EXPECT_FALSE(EstimateOpCost("aten::mm", "", "").known());
  EXPECT_EQ(EstimateOpCost("aten::mm", "", "").kind, OpKind::kMatmul);
  for (const char* junk : {"[", "[[", "[[1,2", "[[a]]", "]]", "[[1,2],[3,", "[[-5,2],[2,3]]",
                           "[[99999999999999999999999,2],[2,3]]", "{}", "[[[[[[[1]]]]]]]"}) {
    OpCost c = EstimateOpCost("aten::mm", junk, R"(["float","float"])");
    EXPECT_GE(c.flops, 0) << junk;
    EXPECT_GE(c.bytes, 0) << junk;
  }
  EXPECT_EQ(ElementBytes("c10::BFloat16"), 2);
  EXPECT_EQ(ElementBytes("c10::Half"), 2);
  EXPECT_EQ(ElementBytes("float"), 4);
  EXPECT_EQ(ElementBytes("double"), 8);
  EXPECT_EQ(ElementBytes("long int"), 8);
  EXPECT_EQ(ElementBytes("int"), 4);
  EXPECT_EQ(ElementBytes("c10::Float8_e4m3fn"), 1);
  EXPECT_EQ(ElementBytes("bool"), 1);
  EXPECT_EQ(ElementBytes("Scalar"), 0);
  EXPECT_EQ(ElementBytes(""), 0);
}

}  // namespace
}  // namespace dynaflow

namespace dynaflow {
namespace {

constexpr const char* kFloatx2 = R"(["float","float"])";

// ResNet-50's first layer: 7x7, stride 2, padding 3 -> 112x112 outputs, not 224x224.
TEST(FlopsBytesTest, ConvolutionStridePaddingDilationGroups) {
  OpContext ctx;
  ctx.concrete_inputs = R"(["","","","[2, 2]","[3, 3]","[1, 1]","False","[0, 0]","1"])";
  OpCost c = EstimateOpCost("aten::convolution", "[[32,3,224,224],[64,3,7,7],[],[],[],[],[],[],[]]",
                            kFloatx2, ctx);
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 32 * 64 * 112 * 112 * 3 * 49);
  EXPECT_DOUBLE_EQ(c.bytes, 4.0 * (32.0 * 3 * 224 * 224 + 64 * 3 * 49 + 32.0 * 64 * 112 * 112));
  // cudnn_convolution takes (self, weight, padding, stride, dilation, groups).
  ctx.concrete_inputs = R"(["","","[3, 3]","[2, 2]","[1, 1]","1"])";
  EXPECT_DOUBLE_EQ(EstimateOpCost("aten::cudnn_convolution", "[[32,3,224,224],[64,3,7,7]]", kFloatx2, ctx).flops,
                   c.flops);
  // Dilation 2 with padding 2 keeps 56x56; groups = 64 (depthwise) shows in
  // the weight's C_in / groups = 1.
  ctx.concrete_inputs = R"(["","","","[1, 1]","[2, 2]","[2, 2]","False","[0, 0]","64"])";
  OpCost dw = EstimateOpCost("aten::convolution", "[[8,64,56,56],[64,1,3,3]]", kFloatx2, ctx);
  EXPECT_DOUBLE_EQ(dw.flops, 2.0 * 8 * 64 * 56 * 56 * 1 * 9);
  // Padding 0, dilation 2: 56 - 2*(3-1) = 52.
  ctx.concrete_inputs = R"(["","","","[1, 1]","[0, 0]","[2, 2]","False","[0, 0]","1"])";
  EXPECT_DOUBLE_EQ(EstimateOpCost("aten::convolution", "[[8,64,56,56],[64,64,3,3]]", kFloatx2, ctx).flops,
                   2.0 * 8 * 64 * 52 * 52 * 64 * 9);
  // conv2d(input, weight, bias, stride, padding="valid"): 56 - 2 = 54.
  ctx.concrete_inputs = R"(["","","","[1, 1]","valid","[1, 1]","1"])";
  EXPECT_DOUBLE_EQ(EstimateOpCost("aten::conv2d", "[[8,64,56,56],[64,64,3,3]]", kFloatx2, ctx).flops,
                   2.0 * 8 * 64 * 54 * 54 * 64 * 9);
}

// Legacy traces record no stride: the output size comes from the trace's
// backward of the same input and weight shapes.
TEST(FlopsBytesTest, ConvolutionOutputFromTheBackward) {
  std::string inputs, output;
  ASSERT_TRUE(ConvolutionOutputFromBackward("aten::cudnn_convolution_backward",
                                            "[[32,3,224,224],[32,64,112,112],[64,3,7,7],[],[]]", &inputs, &output));
  EXPECT_EQ(inputs, "[[32,3,224,224],[64,3,7,7]]");
  EXPECT_EQ(output, "[32,64,112,112]");
  std::string forward;
  ASSERT_TRUE(ConvolutionForwardInputs("aten::cudnn_convolution", "[[32,3,224,224],[64,3,7,7],[],[]]", &forward));
  EXPECT_EQ(forward, inputs);
  OpContext ctx;
  ctx.output_shape = output;
  EXPECT_DOUBLE_EQ(EstimateOpCost("aten::cudnn_convolution", "[[32,3,224,224],[64,3,7,7]]", kFloatx2, ctx).flops,
                   2.0 * 32 * 64 * 112 * 112 * 3 * 49);
  // A shape that does not fit (other channel count) is ignored: stride 1 assumed.
  ctx.output_shape = "[32,128,112,112]";
  EXPECT_DOUBLE_EQ(EstimateOpCost("aten::cudnn_convolution", "[[32,3,224,224],[64,3,7,7]]", kFloatx2, ctx).flops,
                   2.0 * 32 * 64 * 224 * 224 * 3 * 49);
}

// The backward schemas' own argument orders (kineto_legacy_v100_resnet50's
// shapes): the weight gradient was read as a forward, 2462% of peak.
TEST(FlopsBytesTest, ConvolutionBackwardArgumentOrders) {
  const char* types = R"(["GenericList","float","float"])";
  const double pass = 2.0 * 32 * 2048 * 7 * 7 * 512 * 1;
  OpContext parent;
  parent.parent_name = "aten::cudnn_convolution_backward";
  parent.parent_shapes = "[[32,512,7,7],[32,2048,7,7],[2048,512,1,1],[],[]]";
  OpCost w = EstimateOpCost("aten::cudnn_convolution_backward_weight", "[[],[32,2048,7,7],[32,512,7,7]]", types,
                            parent);
  EXPECT_EQ(w.kind, OpKind::kConvolution);
  EXPECT_DOUBLE_EQ(w.flops, pass);
  EXPECT_EQ(w.precision, Precision::kTf32);
  // Without the enclosing backward the kernel size is unknown: not costed.
  OpCost alone = EstimateOpCost("aten::cudnn_convolution_backward_weight", "[[],[32,2048,7,7],[32,512,7,7]]", types);
  EXPECT_EQ(alone.kind, OpKind::kConvolution);
  EXPECT_FALSE(alone.known());
  OpCost in = EstimateOpCost("aten::cudnn_convolution_backward_input", "[[],[32,2048,7,7],[2048,512,1,1]]", types);
  EXPECT_DOUBLE_EQ(in.flops, pass);
  EXPECT_DOUBLE_EQ(EstimateOpCost("aten::cudnn_convolution_backward",
                                  "[[32,512,7,7],[32,2048,7,7],[2048,512,1,1]]", R"(["float","float","float"])")
                       .flops,
                   2 * pass);
  // convolution_backward(grad_output, input, weight, ..., output_mask): the
  // first layer computes no input gradient.
  OpContext mask;
  mask.concrete_inputs = R"(["","","","","","","","","","","[False, True, True]"])";
  EXPECT_DOUBLE_EQ(EstimateOpCost("aten::convolution_backward", "[[32,2048,7,7],[32,512,7,7],[2048,512,1,1]]",
                                  R"(["float","float","float"])", mask)
                       .flops,
                   pass);
}

// flash_attn's varlen entry: q [total_q, H, D], k and v [total_k, H_kv, D],
// cu_seqlens [B + 1]; four causal sequences of 1024 tokens.
TEST(FlopsBytesTest, VarlenAttentionFromCuSeqlens) {
  OpCost c = EstimateOpCost("flash_attn::_flash_attn_varlen_forward",
                            "[[4096,32,128],[4096,8,128],[4096,8,128],[5],[5],[],[]]",
                            R"(["c10::BFloat16","c10::BFloat16","c10::BFloat16","int","int","Scalar","Scalar"])");
  EXPECT_EQ(c.kind, OpKind::kAttention);
  EXPECT_DOUBLE_EQ(c.flops, 0.5 * 2.0 * 32 * 4 * 1024.0 * 1024 * 256);
  EXPECT_DOUBLE_EQ(c.tokens, 4096);
  // Paged decode (vLLM's unified attention): the context is in a cache the
  // shapes do not describe; bytes of the listed tensors only.
  OpCost paged = EstimateOpCost("vllm::unified_attention_with_output",
                                "[[888,8,64],[888,1,64],[888,1,64],[888,8,64],[],[],[]]",
                                R"(["c10::BFloat16","c10::BFloat16","c10::BFloat16","c10::BFloat16","","",""])");
  EXPECT_EQ(paged.kind, OpKind::kAttention);
  EXPECT_DOUBLE_EQ(paged.flops, 0);
  EXPECT_GT(paged.bytes, 0);
}

// fbgemm's fused lookup + rowwise adagrad touches the rows its indices name,
// not whole tables (costed as a dense optimizer it read 205% of HBM).
TEST(FlopsBytesTest, SparseOptimizerInEmbeddingLookupIsNotCosted) {
  OpCost c = EstimateOpCost("fbgemm::split_embedding_codegen_lookup_rowwise_adagrad_function",
                            "[[1000000000],[4096]]", kFloatx2);
  EXPECT_FALSE(c.known());
  EXPECT_TRUE(EstimateOpCost("aten::_fused_adam_", "[[1024],[1024]]", kFloatx2).known());
}

}  // namespace
}  // namespace dynaflow
