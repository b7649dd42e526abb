#!/usr/bin/env python3
"""Generates realistic PyTorch-profiler (Kineto) Chrome-trace JSON, deterministically.

The traces model a Llama-style decoder (Megatron-style tensor parallelism over the
ranks) profiled with torch.profiler on NVIDIA H200 GPUs, one file per rank, written the
way libkineto's ChromeTraceLogger writes them (same layout, spelling, argument names and
"µs with three decimals" timestamps):

  * top level: schemaVersion, deviceProperties, distributedInfo, cupti/cuda versions,
    displayTimeUnit, traceEvents, traceName;
  * per step: a `ProfilerStep#N` user_annotation on the CPU and gpu_user_annotation
    ranges on each GPU stream the step used;
  * cpu_op events (aten::linear/mm, aten::_scaled_dot_product_flash_attention,
    aten::rms_norm and its pieces, aten::silu, aten::embedding, c10d::allreduce_ /
    record_param_comms, autograd::engine::evaluate_function: ... in backward) with
    External id, Input Dims/Strides/type, Concrete Inputs, Fwd thread id, Sequence
    number, Record function id;
  * cuda_runtime events (cudaLaunchKernel, cudaLaunchKernelExC, cudaMemcpyAsync,
    cudaMemsetAsync, cudaEventRecord, cudaStreamWaitEvent, cudaStreamSynchronize) with
    cbid, correlation and External id, and cuda_sync events on the device;
  * kernel / gpu_memcpy / gpu_memset events on the device (pid = device, tid = stream):
    compute stream 7, NCCL stream 20 (all-reduces that are exposed in forward and
    overlap the weight-gradient GEMMs in backward), copy stream 24 (input prefetch);
  * ac2g flow events (ph s on the launch, ph f on the GPU activity, id = correlation);
  * process/thread metadata events.

Modes: `train` (forward, vocab-parallel cross entropy, backward, fused Adam, grad-buffer
memset, loss.item() sync) and `infer` (KV-cache decode steps, CPU-launch bound).

The document is written as it is generated (one step at a time); gzip output when the
file name ends in .gz. Ranks are generated in parallel processes. `--target-mb` sizes
the run: the number of steps is chosen so that the uncompressed total over all ranks is
about that many megabytes. A sidecar PREFIX_rankN.meta.json records the exact event
counts and byte sizes (unless --no-meta).

Example:
  scripts/gen_kineto_trace.py --ranks 2 --layers 4 --steps 3 -o examples/traces/llama_tp2
  scripts/gen_kineto_trace.py --ranks 2 --target-mb 2200 --level 1 -o bench/out/llama_big
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import queue
import random
import sys
import threading
import time
import zlib

# --------------------------------------------------------------------------------------
# Hardware and model constants.

NUM_SMS = 132
H200_MEM = 150754820096  # 140 GiB as CUDA reports it
PEAK_BF16 = 989e12  # dense FLOP/s
HBM_BW = 4.8e12  # bytes/s
GEMM_EFF = 0.68
MEM_EFF = 0.82
NVLINK_BUSBW = 360e9  # achieved all-reduce bus bandwidth, bytes/s
PCIE_BW = 48e9  # pinned host <-> device, bytes/s

MODELS = {
    "8b": dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256, layers=32),
    "70b": dict(hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672, vocab=128256, layers=80),
}

COMPUTE, COMM, COPY = 7, 20, 24

CBID = {
    "cudaLaunchKernel": 211,
    "cudaLaunchKernelExC": 430,
    "cudaMemcpyAsync": 41,
    "cudaMemsetAsync": 51,
    "cudaEventRecord": 135,
    "cudaStreamWaitEvent": 147,
    "cudaStreamSynchronize": 131,
}

# --------------------------------------------------------------------------------------
# Event templates, byte for byte what libkineto's ChromeTraceLogger prints.
# Times are integer nanoseconds, printed as "{us}.{ns:03}".

CPU_EV = (
    '\n  {\n    "ph": "X", "cat": "%s", "name": "%s", "pid": %d, "tid": %d,\n'
    '    "ts": %d.%03d, "dur": %d.%03d,\n    "args": {\n      "External id": %d,%s\n    }\n  },'
)
RT_EV = (
    '\n  {\n    "ph": "X", "cat": "cuda_runtime", "name": "%s", "pid": %d, "tid": %d,\n'
    '    "ts": %d.%03d, "dur": %d.%03d,\n    "args": {\n      %s\n      "cbid": %d, "correlation": %d\n    }\n  },'
)
FLOW_S = (
    '\n  {\n    "ph": "s", "id": %d, "pid": %d, "tid": %d, "ts": %d.%03d,\n'
    '    "cat": "ac2g", "name": "ac2g"\n  },'
)
FLOW_F = (
    '\n  {\n    "ph": "f", "id": %d, "pid": %d, "tid": %d, "ts": %d.%03d,\n'
    '    "cat": "ac2g", "name": "ac2g", "bp": "e"\n  },'
)
KERNEL_EV = (
    '\n  {\n    "ph": "X", "cat": "kernel", "name": "%s", "pid": %d, "tid": %d,\n'
    '    "ts": %d.%03d, "dur": %d.%03d,\n    "args": {\n      %s\n'
    '      "queued": 0, "device": %d, "context": 1,\n      "stream": %d, "correlation": %d,\n'
    '%s%s\n    }\n  },'
)
MEM_EV = (
    '\n  {\n    "ph": "X", "cat": "%s", "name": "%s", "pid": %d, "tid": %d,\n'
    '    "ts": %d.%03d, "dur": %d.%03d,\n    "args": {\n      %s\n'
    '      "device": %d, "context": 1,\n      "stream": %d, "correlation": %d,\n'
    '      "bytes": %d, "memory bandwidth (GB/s)": %s\n    }\n  },'
)
SYNC_EV = (
    '\n  {\n    "ph": "X", "cat": "cuda_sync", "name": "%s", "pid": %d, "tid": %d,\n'
    '    "ts": %d.%03d, "dur": %d.%03d,\n    "args": {\n      %s\n'
    '      "cuda_sync_kind": "%s",%s\n      "stream": %d, "correlation": %d,\n'
    '      "device": %d, "context": 1\n    }\n  },'
)
GPU_ANN_EV = (
    '\n  {\n    "ph": "X", "cat": "gpu_user_annotation", "name": "%s", "pid": %d, "tid": %d,\n'
    '    "ts": %d.%03d, "dur": %d.%03d,\n    "args": {\n      "External id": %d,\n'
    '      "device": %d\n    }\n  },'
)


def fmt_float(x: float) -> str:
    """fmt's "{}" for a double: shortest round-trip form, integers without ".0"."""
    if x == int(x):
        return str(int(x))
    return repr(x)


def dims_str(dims) -> str:
    return "[" + ", ".join("[" + ", ".join(str(d) for d in shape) + "]" for shape in dims) + "]"


def contiguous_strides(shape):
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return list(reversed(strides))


def op_meta(dims, types, strides=None, concrete=None) -> str:
    """Static part of a cpu_op's args as torch's AddGenericMetadata prints it."""
    if strides is None:
        strides = [contiguous_strides(d) if d else [] for d in dims]
    if concrete is None:
        concrete = ['""'] * len(dims)
    return '"Input Dims": %s, "Input Strides": %s, "Input type": [%s], "Concrete Inputs": [%s]' % (
        dims_str(dims),
        dims_str(strides),
        ", ".join('"%s"' % t for t in types),
        ", ".join(concrete),
    )


_KSPEC_CACHE: dict = {}


def kspec(grid, block, regs, smem) -> str:
    """Static kernel args (registers ... occupancy), cached by launch geometry."""
    key = (grid, block, regs, smem)
    s = _KSPEC_CACHE.get(key)
    if s is None:
        blocks = grid[0] * grid[1] * grid[2]
        threads = block[0] * block[1] * block[2]
        bps = blocks / NUM_SMS
        wps = bps * ((threads + 31) // 32)
        by_regs = 65536 // max(1, regs * threads)
        by_smem = 233472 // smem if smem else 32
        by_threads = 2048 // threads
        resident = max(1, min(by_regs, by_smem, by_threads, 32))
        occ = min(1.0, min(bps, resident) * threads / 2048.0)
        s = (
            '      "registers per thread": %d,\n      "shared memory": %d,\n'
            '      "blocks per SM": %s,\n      "warps per SM": %s,\n'
            '      "grid": [%d, %d, %d],\n      "block": [%d, %d, %d],\n'
            '      "est. achieved occupancy %%": %d'
            % (regs, smem, fmt_float(bps), fmt_float(wps), grid[0], grid[1], grid[2],
               block[0], block[1], block[2], int(0.5 + occ * 100.0))
        )
        _KSPEC_CACHE[key] = s
    return s


# --------------------------------------------------------------------------------------
# Kernel names (as CUPTI demangles them on sm_90 with torch 2.x).

K_GEMM_TN = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"
K_GEMM_TN_SMALL = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
K_GEMM_NN = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"
K_GEMM_NT = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
K_GEMM_DECODE = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_on_kernel__5x_cublas"
K_SPLITK = "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, false>(cublasLt::cublasSplitKParams<float>, float const*, __nv_bfloat16 const*, __nv_bfloat16*, float const*, float const*, __nv_bfloat16 const*, float const*, __nv_bfloat16*, void*, long, float*, int*)"
K_FLASH_FWD = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)"
K_FLASH_SPLITKV = "void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 4, cutlass::bfloat16_t> >, true, false, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)"
K_FLASH_COMBINE = "void pytorch_flash::flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 4, cutlass::bfloat16_t> >, 4, 4, false>(pytorch_flash::Flash_fwd_params)"
K_FLASH_BWD_DOT = "void pytorch_flash::flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> > >(pytorch_flash::Flash_bwd_params)"
K_FLASH_BWD = "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> >, false, true, false, false, false, true, true, false>(pytorch_flash::Flash_bwd_params)"
K_FLASH_BWD_CVT = "void pytorch_flash::flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> > >(pytorch_flash::Flash_bwd_params, int)"
K_COPY = "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >(int, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1>)"
K_POW = "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::pow_tensor_scalar_kernel_impl<float, float>(at::TensorIteratorBase&, float)::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, at::native::(anonymous namespace)::pow_tensor_scalar_kernel_impl<float, float>(at::TensorIteratorBase&, float)::{lambda(float)#1}, at::detail::Array<char*, 2>)"
K_MEAN = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4>)"
K_ADD_SCALAR = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctorOnSelf_add<float>, at::detail::Array<char*, 2> >(int, at::native::CUDAFunctorOnSelf_add<float>, at::detail::Array<char*, 2>)"
K_RSQRT = "void at::native::vectorized_elementwise_kernel<4, at::native::rsqrt_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, at::native::rsqrt_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>)"
K_MUL_F = "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1})"
K_MUL = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3> >(int, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3>)"
K_ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)"
K_NEG = "void at::native::vectorized_elementwise_kernel<4, at::native::neg_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#9}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, at::native::neg_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#9}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2>)"
K_CAT = "void at::native::(anonymous namespace)::CatArrayBatchedCopy_aligned16_contig<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int, 4, 128, 1>(at::native::(anonymous namespace)::OpaqueType<2u>*, at::native::(anonymous namespace)::CatArrInputTensorMetadata<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int, 128, 1>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>, int, unsigned int)"
K_SILU = "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, at::native::(anonymous namespace)::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2>)"
K_SILU_BWD = "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::silu_backward_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}, at::detail::Array<char*, 3> >(int, at::native::(anonymous namespace)::silu_backward_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}, at::detail::Array<char*, 3>)"
K_SUM = "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4>)"
K_MAX = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MaxOps<float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MaxOps<float>, unsigned int, float, 4>)"
K_EXP = "void at::native::vectorized_elementwise_kernel<4, at::native::exp_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, at::native::exp_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>)"
K_LOG = "void at::native::vectorized_elementwise_kernel<4, at::native::log_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, at::native::log_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>)"
K_SUB = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"
K_INDEX_SELECT = "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo<c10::BFloat16 const, unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, unsigned int, long)"
K_EMB_BWD = "void at::native::(anonymous namespace)::embedding_backward_feature_kernel<c10::BFloat16, float, long>(long const*, c10::BFloat16 const*, c10::BFloat16*, int, long, int, int)"
K_ADAM = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<c10::BFloat16, 4, (at::native::ADAM_MODE)1, false>, double*, double, double, double, double, double, bool, double*, double*>(at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<c10::BFloat16, 4, (at::native::ADAM_MODE)1, false>, double*, double, double, double, double, double, bool, double*, double*)"
K_ARGMAX = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, at::native::ArgMaxOps<float>, unsigned int, long, 4> >(at::native::ReduceOp<c10::BFloat16, at::native::ArgMaxOps<float>, unsigned int, long, 4>)"
K_KV_COPY = "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::index_put_kernel_impl<at::native::OpaqueType<2> >(at::TensorIterator&, c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char const*, long)#1}>(at::TensorIteratorBase&, c10::ArrayRef<long>, c10::ArrayRef<long>, at::native::index_put_kernel_impl<at::native::OpaqueType<2> >(at::TensorIterator&, c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char const*, long)#1} const&, bool)::{lambda(int)#1}>(long, at::native::gpu_index_kernel<at::native::index_put_kernel_impl<at::native::OpaqueType<2> >(at::TensorIterator&, c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char const*, long)#1}>(at::TensorIteratorBase&, c10::ArrayRef<long>, c10::ArrayRef<long>, at::native::index_put_kernel_impl<at::native::OpaqueType<2> >(at::TensorIterator&, c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char const*, long)#1} const&, bool)::{lambda(int)#1})"
K_NCCL_AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
K_NCCL_AR_F32 = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
K_NCCL_AR_MAX = "ncclDevKernel_AllReduce_Max_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
K_NCCL_AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"

BF16 = "c10::BFloat16"
F32 = "float"
I64 = "long int"

# --------------------------------------------------------------------------------------
# Output: a compressing writer thread (zlib releases the GIL, so compression overlaps
# generation), large writes.


class Sink:
    FLUSH_AT = 8 << 20

    def __init__(self, path: str | None, level: int):
        self.path = path
        self.raw_bytes = 0
        self.parts: list = []
        self.pending = 0
        self.error = None
        if path is None:  # dry run: count only
            self.q = None
            return
        self.gzip = path.endswith(".gz")
        self.comp = zlib.compressobj(level, zlib.DEFLATED, 31, 9) if self.gzip else None
        self.tmp = path + ".tmp-gen"
        self.f = open(self.tmp, "wb")
        self.q = queue.Queue(maxsize=6)
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        try:
            while True:
                b = self.q.get()
                if b is None:
                    break
                if self.comp is not None:
                    b = self.comp.compress(b)
                self.f.write(b)
            if self.comp is not None:
                self.f.write(self.comp.flush())
            self.f.close()
        except BaseException as e:  # reported by close()
            self.error = e

    def write(self, s: str):
        self.parts.append(s)
        self.pending += len(s)
        if self.pending >= self.FLUSH_AT:
            self.flush()

    def flush(self):
        if not self.parts:
            return
        b = "".join(self.parts).encode("utf-8")
        self.parts = []
        self.pending = 0
        self.raw_bytes += len(b)
        if self.q is not None:
            if self.error is not None:
                raise RuntimeError("%s: write failed: %s" % (self.path, self.error))
            self.q.put(b)

    def close(self):
        self.flush()
        if self.q is None:
            return
        self.q.put(None)
        self.t.join()
        if self.error is not None:
            raise RuntimeError("%s: write failed: %s" % (self.path, self.error))
        os.replace(self.tmp, self.path)


# --------------------------------------------------------------------------------------
# The generator for one rank.


class RankGen:
    def __init__(self, rank: int, cfg: dict, sink: Sink):
        self.rank = rank
        self.cfg = cfg
        self.sink = sink
        self.world = cfg["ranks"]
        self.tp = self.world
        self.train = cfg["mode"] == "train"
        self.rng = random.Random(cfg["seed"] * 1000003 + rank * 7919 + 17)
        self.rand = self.rng.random
        m = MODELS[cfg["model"]]
        self.m = m
        self.layers = cfg["layers"] if cfg["layers"] else m["layers"]
        self.device = 0  # one GPU per rank process, cuda:0 after CUDA_VISIBLE_DEVICES
        self.pid = 2400000 + 1000 * rank + int(self.rand() * 900)
        self.tid = self.pid  # main thread
        self.bwd_tid = self.pid + 211  # autograd engine device thread
        self.ts_base = 0
        if cfg["relative_ts"]:
            self.ts_base = 1_700_000_000_000_000 - 5_000_000_000  # program start, ns
        # Clocks (ns): CPU thread cursor, per-stream "free at" times.
        self.cpu = 1_700_000_000_000_000 + 123_456 + 47_131 * rank + int(self.rand() * 20000)
        self.ready = {COMPUTE: self.cpu, COMM: self.cpu, COPY: self.cpu}
        self.next_ext = 1
        self.next_corr = 1
        self.seq = 0
        self.counts: dict = {}
        # Per-step buffers.
        self.cpu_recs: list = []
        self.act_recs: list = []
        self.stack: list = []
        self.spans: dict = {}
        self.copy_done = self.cpu
        self.ctx = cfg["seq"]  # decode: current context length
        self._build_shapes()

    # ---- small helpers -----------------------------------------------------------------

    def _count(self, key, n=1):
        self.counts[key] = self.counts.get(key, 0) + n

    def jit(self, lo_us: float, hi_us: float) -> int:
        return int((lo_us + (hi_us - lo_us) * self.rand()) * 1000)

    def _span(self, stream, start, end):
        s = self.spans.get(stream)
        if s is None:
            self.spans[stream] = [start, end]
        else:
            if start < s[0]:
                s[0] = start
            if end > s[1]:
                s[1] = end

    # ---- CPU operators -------------------------------------------------------------------

    def begin(self, name, meta="", cat="cpu_op", seq=True, pre=(0.6, 2.5), tid=None):
        """Opens an operator; `meta` is the static args text after External id."""
        self.cpu += self.jit(*pre)
        ext = self.next_ext
        self.next_ext += 1
        if tid is None:
            tid = self.stack[-1][6] if self.stack else self.tid
        if seq and self.train and cat == "cpu_op" and tid == self.tid:
            # Forward ops in grad mode; backward nodes pass their own numbers in `meta`.
            meta = (meta + ", " if meta else "") + '"Fwd thread id": 0, "Sequence number": %d' % self.seq
        if cat == "cpu_op":
            meta = (meta + ", " if meta else "") + '"Record function id": 0'
        else:
            meta = '"Record function id": 0'
        idx = len(self.cpu_recs)
        self.cpu_recs.append(None)
        self.stack.append((idx, ext, self.cpu, name, meta, cat, tid))
        self.cpu += self.jit(0.8, 2.2)  # dispatcher + profiler callback
        return ext

    def end(self, post=(0.3, 1.5)):
        idx, ext, start, name, meta, cat, tid = self.stack.pop()
        self.cpu += self.jit(*post)
        dur = self.cpu - start
        ts = start - self.ts_base
        self.cpu_recs[idx] = CPU_EV % (cat, name, self.pid, tid, ts // 1000, ts % 1000,
                                       dur // 1000, dur % 1000, ext, meta)
        self._count(cat)

    def leaf(self, name, meta="", work=(1.0, 4.0), **kw):
        self.begin(name, meta, **kw)
        self.cpu += self.jit(*work)
        self.end()

    def cur_tid(self):
        return self.stack[-1][6] if self.stack else self.tid

    # ---- CUDA runtime + GPU activities -------------------------------------------------------

    def _ext_arg(self):
        # Runtime calls outside any operator have no External id (Kineto omits it).
        if self.stack:
            return '"External id": %d,' % self.stack[-1][1]
        return ""

    def _runtime(self, api, cost, flow=True):
        corr = self.next_corr
        self.next_corr += 1
        start = self.cpu
        dur = cost
        if self.rand() < 0.004:
            dur += self.jit(15, 80)  # occasional driver hiccup
        self.cpu = start + dur
        tid = self.cur_tid()
        ts = start - self.ts_base
        ext_arg = self._ext_arg()
        rec = RT_EV % (api, self.pid, tid, ts // 1000, ts % 1000, dur // 1000, dur % 1000,
                       ext_arg, CBID[api], corr)
        if flow:
            rec += FLOW_S % (corr, self.pid, tid, ts // 1000, ts % 1000)
            self._count("ac2g")
        self.act_recs.append((start, rec))
        self._count("cuda_runtime")
        return corr, start, dur, ext_arg

    def launch(self, name, geom, dur_ns, stream=COMPUTE, coll="", api="cudaLaunchKernel"):
        corr, rt_start, rt_dur, ext_arg = self._runtime(api, self.jit(3.2, 6.5))
        start = rt_start + self.jit(2.5, 6.0)
        if self.ready[stream] > start:
            start = self.ready[stream]
        dur = max(1000, int(dur_ns * (0.965 + 0.07 * self.rand())))
        end = start + dur
        self.ready[stream] = end + self.jit(0.6, 1.6)
        self._span(stream, start, end)
        ts = start - self.ts_base
        rec = KERNEL_EV % (name, self.device, stream, ts // 1000, ts % 1000, dur // 1000, dur % 1000,
                           ext_arg, self.device, stream, corr, geom, coll)
        rec += FLOW_F % (corr, self.device, stream, ts // 1000, ts % 1000)
        self.act_recs.append((start, rec))
        self._count("kernel")
        self._count("ac2g")
        return start, end

    def memcpy(self, kind, nbytes, stream, pinned=True):
        corr, rt_start, rt_dur, ext_arg = self._runtime("cudaMemcpyAsync", self.jit(4.0, 9.0))
        host = "Pinned" if pinned else "Pageable"
        name = "Memcpy %s (%s -> %s)" % (kind, host if kind == "HtoD" else "Device",
                                         "Device" if kind == "HtoD" else host)
        start = max(self.ready[stream], rt_start + self.jit(2.0, 5.0))
        dur = max(1000, int(1300 + nbytes / PCIE_BW * 1e9 * (0.95 + 0.1 * self.rand())))
        end = start + dur
        self.ready[stream] = end + self.jit(0.5, 1.2)
        self._span(stream, start, end)
        ts = start - self.ts_base
        rec = MEM_EV % ("gpu_memcpy", name, self.device, stream, ts // 1000, ts % 1000,
                        dur // 1000, dur % 1000, ext_arg, self.device, stream, corr, nbytes,
                        fmt_float(nbytes / dur))
        rec += FLOW_F % (corr, self.device, stream, ts // 1000, ts % 1000)
        self.act_recs.append((start, rec))
        self._count("gpu_memcpy")
        self._count("ac2g")
        if not pinned:  # a pageable copy returns only once the data has moved
            self.cpu = max(self.cpu, end + self.jit(1.0, 3.0))
        return start, end

    def memset(self, nbytes, stream=COMPUTE):
        corr, rt_start, rt_dur, ext_arg = self._runtime("cudaMemsetAsync", self.jit(3.0, 6.0))
        start = max(self.ready[stream], rt_start + self.jit(2.0, 5.0))
        dur = max(1000, int(1200 + nbytes / (HBM_BW * 0.7) * 1e9))
        end = start + dur
        self.ready[stream] = end + self.jit(0.5, 1.2)
        self._span(stream, start, end)
        ts = start - self.ts_base
        rec = MEM_EV % ("gpu_memset", "Memset (Device)", self.device, stream, ts // 1000, ts % 1000,
                        dur // 1000, dur % 1000, ext_arg, self.device, stream, corr, nbytes,
                        fmt_float(nbytes / dur))
        rec += FLOW_F % (corr, self.device, stream, ts // 1000, ts % 1000)
        self.act_recs.append((start, rec))
        self._count("gpu_memset")
        self._count("ac2g")

    def event_record(self, stream):
        self._runtime("cudaEventRecord", self.jit(1.5, 3.5), flow=False)
        return self.ready[stream]

    def wait_event(self, waiter, event_time, src):
        corr, rt_start, rt_dur, ext_arg = self._runtime("cudaStreamWaitEvent", self.jit(1.5, 3.5))
        start = max(rt_start + self.jit(2.0, 4.0), self.ready[waiter])
        end = max(start + 1000, event_time)
        if event_time > self.ready[waiter]:
            self.ready[waiter] = event_time
        ts = start - self.ts_base
        dur = end - start
        extra = '\n      "wait_on_stream": %d,\n      "wait_on_cuda_event_id": %d,' % (src, 1 + corr % 64)
        rec = SYNC_EV % ("Stream Wait Event", self.device, waiter, ts // 1000, ts % 1000,
                         dur // 1000, dur % 1000, ext_arg, "Stream Wait Event", extra, waiter, corr,
                         self.device)
        rec += FLOW_F % (corr, self.device, waiter, ts // 1000, ts % 1000)
        self.act_recs.append((start, rec))
        self._count("cuda_sync")
        self._count("ac2g")

    def stream_sync(self, stream):
        corr, rt_start, rt_dur, ext_arg = self._runtime("cudaStreamSynchronize", self.jit(1.5, 3.0))
        # The call blocks until the stream drains: stretch the runtime event.
        done = max(self.ready[stream], rt_start) + self.jit(1.5, 4.0)
        rec_start, rec = self.act_recs[-1]
        new_dur = done - rt_start
        old = ", \"dur\": %d.%03d," % (rt_dur // 1000, rt_dur % 1000)
        new = ", \"dur\": %d.%03d," % (new_dur // 1000, new_dur % 1000)
        self.act_recs[-1] = (rec_start, rec.replace(old, new, 1))
        self.cpu = done
        start = rt_start + self.jit(1.0, 2.0)
        end = max(start + 1000, self.ready[stream])
        ts = start - self.ts_base
        dur = end - start
        rec = SYNC_EV % ("Stream Sync", self.device, stream, ts // 1000, ts % 1000, dur // 1000,
                         dur % 1000, ext_arg, "Stream Sync", "", stream, corr, self.device)
        rec += FLOW_F % (corr, self.device, stream, ts // 1000, ts % 1000)
        self.act_recs.append((start, rec))
        self._count("cuda_sync")
        self._count("ac2g")

    # ---- shapes and durations ------------------------------------------------------------

    def _build_shapes(self):
        m, tp, cfg = self.m, self.tp, self.cfg
        self.B = cfg["batch"]
        self.S = cfg["seq"] if self.train else 1
        self.H = m["hidden"]
        self.hq = m["heads"] // tp
        self.hkv = max(1, m["kv_heads"] // tp)
        self.d = m["head_dim"]
        self.qkv_out = (self.hq + 2 * self.hkv) * self.d
        self.attn_out = self.hq * self.d
        self.ffn = m["ffn"] // tp
        self.vocab = m["vocab"] // tp
        self.metas: dict = {}

    def T(self):
        return self.B * self.S

    def gemm_ns(self, M, N, K, eff=GEMM_EFF):
        flops = 2.0 * M * N * K
        nbytes = 2.0 * (M * K + K * N + M * N)
        t = max(flops / (PEAK_BF16 * eff), nbytes / (HBM_BW * MEM_EFF))
        return int(t * 1e9) + 2500

    def ew_ns(self, nbytes):
        return int(nbytes / (HBM_BW * MEM_EFF) * 1e9) + 1800

    def gemm_geom(self, M, N, big=True):
        if big and M >= 256:
            grid = (min(NUM_SMS, max(1, math.ceil(M / 128) * math.ceil(N / 256))), 1, 1)
            return kspec(grid, (384, 1, 1), 168, 213248)
        grid = (max(1, math.ceil(N / 64)), max(1, math.ceil(M / 64)), 1)
        return kspec(grid, (128, 1, 1), 90, 82944)

    def ew_geom(self, numel, vec=4):
        blocks = max(1, min(2 ** 31 - 1, math.ceil(numel / (128 * vec))))
        return kspec((blocks, 1, 1), (128, 1, 1), 24, 0)

    def meta(self, key, fn):
        s = self.metas.get(key)
        if s is None:
            s = fn()
            self.metas[key] = s
        return s

    # ---- model building blocks ------------------------------------------------------------

    def linear(self, N, K, tag, fwd_seq=True):
        """aten::linear -> aten::t, aten::matmul -> aten::view, aten::mm, aten::_unsafe_view."""
        B, S, T = self.B, self.S, self.T()
        mlin = self.meta(("lin", N, K, B, S), lambda: op_meta([[B, S, K], [N, K], []], [BF16, BF16, ""]))
        self.begin("aten::linear", mlin)
        self.leaf("aten::t", self.meta(("t", N, K), lambda: op_meta([[N, K]], [BF16])), work=(0.8, 2.0))
        self.begin("aten::matmul", self.meta(("mat", N, K, B, S), lambda: op_meta(
            [[B, S, K], [K, N]], [BF16, BF16], strides=[[S * K, K, 1], [1, K]])))
        self.leaf("aten::view", self.meta(("view", B, S, K), lambda: op_meta(
            [[B, S, K], []], [BF16, ""], concrete=['""', '"[%d, %d]"' % (T, K)])), work=(0.8, 1.8))
        self.begin("aten::mm", self.meta(("mm", T, N, K), lambda: op_meta(
            [[T, K], [K, N]], [BF16, BF16], strides=[[K, 1], [1, K]])))
        self.cpu += self.jit(2.0, 5.0)  # cuBLAS heuristics + workspace
        if self.train:
            self.launch(K_GEMM_TN if N >= 2048 else K_GEMM_TN_SMALL, self.gemm_geom(T, N),
                        self.gemm_ns(T, N, K))
        else:
            g = self.gemm_geom(T, N, big=False)
            self.launch(K_GEMM_DECODE, g, self.gemm_ns(T, N, K))
            if K >= 4096:
                self.launch(K_SPLITK, self.ew_geom(T * N, 1), self.ew_ns(T * N * 8))
        self.end()
        self.leaf("aten::_unsafe_view", self.meta(("uv", T, N), lambda: op_meta(
            [[T, N], []], [BF16, ""], concrete=['""', '"[%d, %d, %d]"' % (B, S, N)])), work=(0.6, 1.5))
        self.end()
        self.end()
        if self.train:
            self.seq += 1

    def ew(self, name, kname, numel, elem_bytes, nin=2, dtype=BF16, shape=None):
        shape = shape or [self.B, self.S, numel // (self.B * self.S)]
        m = self.meta(("ew", name, tuple(shape), dtype, nin), lambda: op_meta(
            [shape] * nin if nin else [shape], [dtype] * max(1, nin)))
        self.begin(name, m)
        self.cpu += self.jit(1.5, 4.0)
        self.launch(kname, self.ew_geom(numel), self.ew_ns(numel * elem_bytes * (nin + 1)))
        self.end()
        if self.train:
            self.seq += 1

    def rms_norm(self):
        B, S, H = self.B, self.S, self.H
        n = B * S * H
        self.begin("aten::rms_norm", self.meta(("rms", B, S, H), lambda: op_meta(
            [[B, S, H], [], [H], []], [BF16, "ScalarList", BF16, "Scalar"],
            concrete=['""', '"[%d]"' % H, '""', '"1e-05"'])))
        self.begin("aten::to", self.meta(("to", B, S, H), lambda: op_meta(
            [[B, S, H], [], [], [], []], [BF16, "Scalar", "Scalar", "Scalar", ""],
            concrete=['""', '"6"', '"False"', '"False"', '""'])))
        self.begin("aten::_to_copy", self.meta(("tc", B, S, H), lambda: op_meta(
            [[B, S, H], [], [], [], [], [], []], [BF16, "Scalar", "", "", "", "Scalar", ""])))
        self.leaf("aten::empty_strided", self.meta(("es", B, S, H), lambda: op_meta(
            [[], [], [], [], [], []], ["", "", "Scalar", "", "", ""])), work=(1.0, 2.5))
        self.ew("aten::copy_", K_COPY, n, 3, nin=2)
        self.end()
        self.end()
        self.ew("aten::pow", K_POW, n, 4, nin=1, dtype=F32)
        self.ew("aten::mean", K_MEAN, n, 2, nin=1, dtype=F32)
        self.ew("aten::add", K_ADD_SCALAR, B * S, 4, nin=1, dtype=F32, shape=[B, S, 1])
        self.ew("aten::rsqrt", K_RSQRT, B * S, 4, nin=1, dtype=F32, shape=[B, S, 1])
        self.ew("aten::mul", K_MUL_F, n, 4, nin=2, dtype=F32)
        self.ew("aten::mul", K_MUL, n, 2, nin=2)
        self.end()

    def rope(self, heads):
        B, S, d = self.B, self.S, self.d
        n = B * S * heads * d
        shape = [B, heads, S, d]
        self.ew("aten::mul", K_MUL, n, 2, shape=shape)
        self.leaf("aten::slice", self.meta(("sl", tuple(shape)), lambda: op_meta(
            [shape, [], [], [], []], [BF16, "Scalar", "Scalar", "Scalar", "Scalar"],
            concrete=['""', '"3"', '"0"', '"%d"' % (d // 2), '"1"'])), work=(0.8, 2.0))
        self.leaf("aten::slice", self.meta(("sl2", tuple(shape)), lambda: op_meta(
            [shape, [], [], [], []], [BF16, "Scalar", "Scalar", "Scalar", "Scalar"],
            concrete=['""', '"3"', '"%d"' % (d // 2), '"9223372036854775807"', '"1"'])), work=(0.8, 2.0))
        self.ew("aten::neg", K_NEG, n // 2, 2, nin=1, shape=[B, heads, S, d // 2])
        self.ew("aten::cat", K_CAT, n, 2, nin=1, shape=shape)
        self.ew("aten::mul", K_MUL, n, 2, shape=shape)
        self.ew("aten::add", K_ADD, n, 2, shape=shape)

    def attention_fwd(self):
        B, S, d, hq, hkv = self.B, self.S, self.d, self.hq, self.hkv
        ctx = S if self.train else self.ctx
        dims = [[B, hq, S, d], [B, hkv, ctx, d], [B, hkv, ctx, d]]
        self.begin("aten::scaled_dot_product_attention", self.meta(("sdpa", B, S, ctx), lambda: op_meta(
            dims + [[], [], [], [], []], [BF16, BF16, BF16, "", "Scalar", "Scalar", "", "Scalar"])))
        self.begin("aten::_scaled_dot_product_flash_attention", self.meta(("sdpf", B, S, ctx), lambda: op_meta(
            dims + [[], [], [], []], [BF16, BF16, BF16, "Scalar", "Scalar", "Scalar", ""])))
        for _ in range(3):
            self.leaf("aten::transpose", self.meta(("tr", B, S, ctx), lambda: op_meta(
                [[B, hq, S, d], [], []], [BF16, "Scalar", "Scalar"], concrete=['""', '"1"', '"2"'])),
                work=(0.6, 1.5))
        self.begin("aten::_flash_attention_forward", self.meta(("faf", B, S, ctx), lambda: op_meta(
            [[B, S, hq, d], [B, ctx, hkv, d], [B, ctx, hkv, d], [], [], [], [], [], []],
            [BF16, BF16, BF16, "", "", "Scalar", "Scalar", "Scalar", "Scalar"])))
        self.leaf("aten::empty_like", self.meta(("el", B, S), lambda: op_meta(
            [[B, S, hq, d], [], [], [], [], []], [BF16, "", "", "", "", ""])), work=(1.0, 2.5))
        self.leaf("aten::empty", self.meta(("em",), lambda: op_meta(
            [[], [], [], [], [], []], ["", "Scalar", "", "", "", ""])), work=(0.8, 2.0))
        if self.train:
            flops = 4.0 * B * hq * S * S * d / 2  # causal
            dur = int(flops / (PEAK_BF16 * 0.55) * 1e9) + 4000
            self.launch(K_FLASH_FWD, kspec((math.ceil(S / 128), B * hq, 1), (128, 1, 1), 255, 49152), dur)
        else:
            kv_bytes = 2.0 * B * hkv * ctx * d * 2
            dur = int(kv_bytes / (HBM_BW * 0.75) * 1e9) + 5000
            splits = 8
            self.launch(K_FLASH_SPLITKV, kspec((splits, B * hq, 1), (128, 1, 1), 222, 73728), dur)
            self.launch(K_FLASH_COMBINE, kspec((math.ceil(B * hq / 16), 1, 1), (128, 1, 1), 56, 16896),
                        self.ew_ns(B * hq * splits * d * 4))
        self.end()
        self.end()
        self.end()
        if self.train:
            self.seq += 1

    def allreduce(self, numel, dtype=BF16, kname=K_NCCL_AR, wait=True, overlap_fn=None, name="allreduce"):
        """c10d::allreduce_ -> record_param_comms: NCCL stream waits on compute, the kernel
        runs on stream 20, then compute waits on NCCL (exposed) unless `overlap_fn`
        launches independent work first (hidden)."""
        esize = 2 if dtype == BF16 else 4
        shape = [numel]
        nbytes = numel * esize
        tname = "BFloat16" if dtype == BF16 else "Float"
        ranks = "[" + ", ".join(str(r) for r in range(self.world)) + "]"
        self.begin("c10d::allreduce_", self.meta(("ar", numel, dtype), lambda: op_meta(
            [[shape], [], [], [], []], ["TensorList", "", "", "Scalar", "Scalar"])), seq=False)
        rpc_meta = self.meta(("rpc", numel, dtype), lambda: (
            op_meta([shape], [dtype]) + ', "Collective name": "%s", "dtype": "%s", "In msg nelems": %d, '
            '"Out msg nelems": %d, "In split size": "[]", "Out split size": "[]", "Global rank start": 0, '
            '"Global rank stride": 1, "Group size": %d, "Process Group Name": "0", '
            '"Process Group Description": "default_pg", "Process Group Ranks": "%s", "Rank": %d'
            % (name, tname, numel, numel, self.world, ranks, self.rank)))
        self.begin("record_param_comms", rpc_meta, seq=False)
        ev = self.event_record(COMPUTE)
        self.wait_event(COMM, ev, COMPUTE)
        algo = nbytes * 2.0 * (self.world - 1) / self.world / NVLINK_BUSBW * 1e9
        skew = self.jit(2.0, 45.0)  # waiting for the slower peer
        coll = (', "Collective name": "%s", "In msg nelems": %d, "Out msg nelems": %d, "Group size": %d, '
                '"dtype": "%s", "Process Group Name": "0", "Process Group Description": "default_pg", '
                '"Process Group Ranks": %s' % (name, numel, numel, self.world, tname, ranks))
        chans = 16 if nbytes < (1 << 20) else 32
        geom = kspec((chans, 1, 1), (640 if nbytes >= (1 << 20) else 512, 1, 1), 94, 0)
        self.launch(kname, geom, int(algo) + 9000 + skew, stream=COMM, coll=coll, api="cudaLaunchKernelExC")
        done = self.event_record(COMM)
        self.end()
        self.end()
        if overlap_fn is not None:
            overlap_fn()
        if wait:
            self.wait_event(COMPUTE, done, COMM)
        return done

    # ---- forward / backward of one decoder layer -------------------------------------------------

    def layer_fwd(self, i):
        B, S, H = self.B, self.S, self.H
        T = B * S
        self.rms_norm()
        self.linear(self.qkv_out, H, "qkv")
        for _ in range(3):
            self.leaf("aten::view", self.meta(("v4", B, S), lambda: op_meta(
                [[B, S, self.qkv_out], []], [BF16, ""])), work=(0.8, 1.8))
            self.leaf("aten::transpose", self.meta(("tq", B, S), lambda: op_meta(
                [[B, S, self.hq, self.d], [], []], [BF16, "Scalar", "Scalar"],
                concrete=['""', '"1"', '"2"'])), work=(0.6, 1.5))
        self.rope(self.hq)
        self.rope(self.hkv)
        if not self.train:
            shape = [self.B, self.hkv, 1, self.d]
            for _ in range(2):  # k and v into the cache
                self.begin("aten::index_copy_", self.meta(("kv",), lambda: op_meta(
                    [[self.B, self.hkv, self.ctx + 1, self.d], [], [1], shape], [BF16, "Scalar", I64, BF16])))
                self.launch(K_KV_COPY, self.ew_geom(self.B * self.hkv * self.d, 1),
                            self.ew_ns(self.B * self.hkv * self.d * 4))
                self.end()
        self.attention_fwd()
        self.leaf("aten::transpose", self.meta(("to2", B, S), lambda: op_meta(
            [[B, self.hq, S, self.d], [], []], [BF16, "Scalar", "Scalar"],
            concrete=['""', '"1"', '"2"'])), work=(0.6, 1.5))
        self.leaf("aten::reshape", self.meta(("rs", B, S), lambda: op_meta(
            [[B, S, self.hq, self.d], []], [BF16, ""])), work=(0.8, 2.0))
        self.linear(H, self.attn_out, "o")
        if self.tp > 1:
            self.allreduce(T * H)
        self.ew("aten::add", K_ADD, T * H, 2)
        self.rms_norm()
        self.linear(2 * self.ffn, H, "gate_up")
        self.leaf("aten::chunk", self.meta(("ch", B, S), lambda: op_meta(
            [[B, S, 2 * self.ffn], [], []], [BF16, "Scalar", "Scalar"], concrete=['""', '"2"', '"-1"'])),
            work=(1.5, 3.5))
        self.ew("aten::silu", K_SILU, T * self.ffn, 2, nin=1)
        self.ew("aten::mul", K_MUL, T * self.ffn, 2)
        self.linear(H, self.ffn, "down")
        if self.tp > 1:
            self.allreduce(T * H)
        self.ew("aten::add", K_ADD, T * H, 2)

    def bwd_node(self, node, seq, body, meta=""):
        """autograd::engine::evaluate_function: NODE -> NODE -> body, on the autograd thread."""
        m = '"Fwd thread id": %d, "Sequence number": %d' % (self.tid, seq)
        self.begin("autograd::engine::evaluate_function: " + node, m, tid=self.bwd_tid, seq=False,
                   pre=(1.0, 3.0))
        self.begin(node, (meta + ", " if meta else "") + m, tid=self.bwd_tid, seq=False)
        body()
        self.end()
        self.end()

    def mm_bwd(self, M, N, K, nn=True):
        self.begin("aten::mm", self.meta(("bmm", M, N, K), lambda: op_meta(
            [[M, K], [K, N]], [BF16, BF16])), seq=False, tid=self.bwd_tid)
        self.cpu += self.jit(2.0, 5.0)
        self.launch(K_GEMM_NN if nn else K_GEMM_NT, self.gemm_geom(M, N), self.gemm_ns(M, N, K))
        self.end()

    def linear_bwd(self, N, K, seq, comm):
        """Megatron LinearWithGradAccumulationAndAsyncCommunication backward: dX GEMM, async
        all-reduce of dX (column-parallel layers), dW GEMM overlapping it, then wait."""
        T = self.T()

        def body():
            self.leaf("aten::t", self.meta(("bt", N, K), lambda: op_meta([[N, K]], [BF16])),
                      seq=False, tid=self.bwd_tid, work=(0.8, 2.0))
            self.mm_bwd(T, K, N, nn=True)  # dX = dY @ W
            dw = lambda: self.mm_bwd(K, N, T, nn=False)  # noqa: E731  dW = dY^T @ X
            if comm and self.tp > 1:
                self.allreduce(T * K, overlap_fn=dw)
            else:
                dw()
        self.bwd_node("LinearWithGradAccumulationAndAsyncCommunicationBackward", seq, body)

    def ew_bwd(self, node, seq, kernels):
        def body():
            for name, kname, numel, eb in kernels:
                self.begin(name, self.meta(("ewb", name, numel), lambda: op_meta(
                    [[numel], [numel]], [BF16, BF16])), seq=False, tid=self.bwd_tid)
                self.cpu += self.jit(1.5, 4.0)
                self.launch(kname, self.ew_geom(numel), self.ew_ns(numel * eb * 3))
                self.end()
        self.bwd_node(node, seq, body)

    def rms_norm_bwd(self, seq):
        n = self.T() * self.H
        self.ew_bwd("MulBackward0", seq, [("aten::mul", K_MUL, n, 2), ("aten::mul", K_MUL, n, 2)])
        self.ew_bwd("RsqrtBackward0", seq, [("aten::mul", K_MUL_F, self.T(), 4)])
        self.ew_bwd("MeanBackward1", seq, [("aten::div", K_MUL_F, n, 4)])
        self.ew_bwd("PowBackward0", seq, [("aten::mul", K_MUL_F, n, 4), ("aten::mul", K_MUL_F, n, 4)])
        self.ew_bwd("ToCopyBackward0", seq, [("aten::copy_", K_COPY, n, 3), ("aten::add", K_ADD, n, 2)])

    def layer_bwd(self, i, seqs):
        T, H = self.T(), self.H
        self.bwd_node("AddBackward0", seqs + 12, lambda: None)
        self.linear_bwd(H, self.ffn, seqs + 11, comm=False)
        self.ew_bwd("MulBackward0", seqs + 10, [("aten::mul", K_MUL, T * self.ffn, 2),
                                                ("aten::mul", K_MUL, T * self.ffn, 2)])
        self.ew_bwd("SiluBackward0", seqs + 9, [("aten::silu_backward", K_SILU_BWD, T * self.ffn, 2)])
        self.linear_bwd(2 * self.ffn, H, seqs + 8, comm=True)
        self.rms_norm_bwd(seqs + 7)
        self.bwd_node("AddBackward0", seqs + 6, lambda: None)
        self.linear_bwd(H, self.attn_out, seqs + 5, comm=False)

        def flash_bwd():
            B, S, hq, d = self.B, self.S, self.hq, self.d
            self.begin("aten::_flash_attention_backward", self.meta(("fab", B, S), lambda: op_meta(
                [[B, S, hq, d]] * 6 + [[], [], [], [], []], [BF16] * 6 + ["", "", "Scalar", "Scalar", "Scalar"])),
                seq=False, tid=self.bwd_tid)
            self.cpu += self.jit(3.0, 6.0)
            self.launch(K_FLASH_BWD_DOT, kspec((math.ceil(S / 128), B, hq), (256, 1, 1), 40, 0),
                        self.ew_ns(B * S * hq * d * 4))
            self.launch(K_FLASH_BWD_CVT, kspec((math.ceil(S / 128), B, hq), (256, 1, 1), 40, 0),
                        self.ew_ns(B * S * hq * d * 6))
            flops = 2.5 * 4.0 * B * hq * S * S * d / 2
            self.launch(K_FLASH_BWD, kspec((math.ceil(S / 128), B, hq), (256, 1, 1), 255, 98304),
                        int(flops / (PEAK_BF16 * 0.45) * 1e9) + 6000)
            self.end()
        self.bwd_node("ScaledDotProductFlashAttentionBackward0", seqs + 4, flash_bwd)
        n_q = T * self.hq * self.d
        rope_k = [("aten::mul", K_MUL, n_q, 2), ("aten::neg", K_NEG, n_q // 2, 2), ("aten::add", K_ADD, n_q, 2)]
        self.ew_bwd("MulBackward0", seqs + 3, rope_k)
        self.ew_bwd("CatBackward0", seqs + 2, [("aten::slice_backward", K_CAT, n_q, 2)])
        self.linear_bwd(self.qkv_out, H, seqs + 1, comm=True)
        self.rms_norm_bwd(seqs)

    # ---- one training / decode step ----------------------------------------------------------

    def prefetch_batch(self):
        """Next batch: pinned HtoD copies of input ids and labels on the copy stream."""
        n = self.B * self.S
        self.begin("aten::to", self.meta(("pf",), lambda: op_meta(
            [[self.B, self.S], [], [], [], []], [I64, "", "", "Scalar", ""],
            concrete=['""', '""', '""', '"True"', '""'])), seq=False)
        self.begin("aten::_to_copy", self.meta(("pf2",), lambda: op_meta(
            [[self.B, self.S], [], [], [], [], [], []], [I64, "Scalar", "", "", "", "Scalar", ""])),
            seq=False)
        self.leaf("aten::empty_strided", self.meta(("pf3",), lambda: op_meta(
            [[], [], [], [], [], []], ["", "", "Scalar", "", "", ""])), seq=False)
        self.begin("aten::copy_", self.meta(("pf4",), lambda: op_meta(
            [[self.B, self.S], [self.B, self.S], []], [I64, I64, "Scalar"])), seq=False)
        for _ in range(2 if self.train else 1):
            self.memcpy("HtoD", n * 8, COPY, pinned=True)
        self.end()
        self.end()
        self.end()
        self.copy_done = self.event_record(COPY)

    def step(self, n):
        self.spans = {}
        step_start = self.cpu
        step_ext = self.begin("ProfilerStep#%d" % n, cat="user_annotation", pre=(0.0, 0.0))
        # Data loading on the CPU: the GPU idles meanwhile.
        self.begin("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", cat="user_annotation")
        self.cpu += self.jit(180.0, 700.0) if self.train else self.jit(30.0, 90.0)
        self.end()
        self.prefetch_batch()  # this step's batch
        self.wait_event(COMPUTE, self.copy_done, COPY)
        T, H = self.T(), self.H
        first_seq = self.seq
        # Embedding.
        self.begin("aten::embedding", self.meta(("emb",), lambda: op_meta(
            [[self.vocab, H], [self.B, self.S], [], [], []], [BF16, I64, "Scalar", "Scalar", "Scalar"])))
        self.begin("aten::index_select", self.meta(("is",), lambda: op_meta(
            [[self.vocab, H], [], [T]], [BF16, "Scalar", I64])))
        self.launch(K_INDEX_SELECT, self.ew_geom(T * H, 1), self.ew_ns(T * H * 4))
        self.end()
        self.end()
        self.seq += 1
        layer_seq = []
        for i in range(self.layers):
            layer_seq.append(self.seq)
            self.layer_fwd(i)
        self.rms_norm()
        self.linear(self.vocab, H, "lm_head")
        if self.train:
            # Vocab-parallel cross entropy: max, all-reduce(max), exp-sum, all-reduce(sum), log.
            V = self.vocab
            self.ew("aten::max", K_MAX, T * V, 2, nin=1, shape=[self.B, self.S, V])
            if self.tp > 1:
                self.allreduce(T, dtype=F32, kname=K_NCCL_AR_MAX)
            self.ew("aten::sub", K_SUB, T * V, 4, shape=[self.B, self.S, V])
            self.ew("aten::exp", K_EXP, T * V, 4, nin=1, shape=[self.B, self.S, V])
            self.ew("aten::sum", K_SUM, T * V, 4, nin=1, shape=[self.B, self.S, V])
            if self.tp > 1:
                self.allreduce(T, dtype=F32, kname=K_NCCL_AR_F32)
            self.ew("aten::log", K_LOG, T, 4, nin=1, shape=[self.B, self.S, 1])
            self.ew("aten::mean", K_MEAN, T, 4, nin=1, shape=[self.B, self.S, 1])
            # Backward (autograd engine thread; the main thread waits in backward()).
            loss_seq = self.seq
            self.ew_bwd("MeanBackward0", loss_seq, [("aten::div", K_MUL_F, T, 4)])
            self.ew_bwd("_VocabParallelCrossEntropyBackward", loss_seq - 1,
                        [("aten::exp", K_EXP, T * V, 4), ("aten::sub", K_SUB, T * V, 4),
                         ("aten::mul", K_MUL, T * V, 2)])
            self.linear_bwd(V, H, loss_seq - 2, comm=True)
            self.rms_norm_bwd(loss_seq - 3)
            half = self.layers // 2
            for i in reversed(range(self.layers)):
                self.layer_bwd(i, layer_seq[i])
                if i == half:
                    self.prefetch_batch()  # next batch, overlapping backward
            self.ew_bwd("EmbeddingBackward0", first_seq,
                        [("aten::embedding_dense_backward", K_EMB_BWD, T * H, 2)])
            # Optimizer: fused Adam over the local shard, chunked as multi_tensor_apply does.
            params = (self.layers * (self.qkv_out * H + H * self.attn_out + 3 * self.ffn * H + 2 * H)
                      + 2 * self.vocab * H)
            self.begin("Optimizer.step#FusedAdam.step", cat="user_annotation")
            self.begin("aten::_fused_adam_", self.meta(("adam",), lambda: op_meta(
                [[], [], [], [], [], [], [], [], [], [], [], [], []],
                ["TensorList"] * 6 + ["Scalar"] * 5 + ["", ""])), seq=False)
            chunks = max(1, (self.layers * 9 + 3) // 48)
            per = params // chunks
            for _ in range(chunks):
                self.cpu += self.jit(8.0, 20.0)
                self.launch(K_ADAM, kspec((320, 1, 1), (512, 1, 1), 64, 0), self.ew_ns(per * 16))
            self.end()
            self.end()
            # Zero the gradient buffer (one contiguous bf16 buffer).
            self.begin("Optimizer.zero_grad#FusedAdam.zero_grad", cat="user_annotation")
            self.begin("aten::zero_", self.meta(("z",), lambda: op_meta([[params]], [BF16])), seq=False)
            self.begin("aten::fill_", self.meta(("f",), lambda: op_meta([[params], []], [BF16, "Scalar"])),
                       seq=False)
            self.memset(params * 2)
            self.end()
            self.end()
            self.end()
            # loss.item(): DtoH + stream synchronize.
            self.begin("aten::item", self.meta(("item",), lambda: op_meta([[]], [F32])), seq=False)
            self.begin("aten::_local_scalar_dense", self.meta(("lsd",), lambda: op_meta([[]], [F32])),
                       seq=False)
            self.memcpy("DtoH", 4, COMPUTE, pinned=False)
            self.stream_sync(COMPUTE)
            self.end()
            self.end()
        else:
            if self.tp > 1:
                self.allreduce(self.B * self.vocab * self.tp, kname=K_NCCL_AG, name="allgather_into_tensor_coalesced")
            self.ew("aten::argmax", K_ARGMAX, self.B * self.vocab * self.tp, 2, nin=1,
                    shape=[self.B, 1, self.vocab * self.tp])
            self.begin("aten::item", self.meta(("item",), lambda: op_meta([[self.B]], [I64])), seq=False)
            self.begin("aten::_local_scalar_dense", self.meta(("lsd",), lambda: op_meta([[self.B]], [I64])),
                       seq=False)
            self.memcpy("DtoH", self.B * 8, COMPUTE, pinned=False)
            self.stream_sync(COMPUTE)
            self.end()
            self.end()
            self.ctx += 1
        self.cpu += self.jit(20.0, 60.0)  # python: logging, scheduler
        self.end()  # ProfilerStep#n
        self._flush_step(n, step_ext)
        return step_start

    def _flush_step(self, n, step_ext):
        out = self.cpu_recs
        # GPU user annotations: one per stream the step used, as Kineto emits them.
        for stream in sorted(self.spans):
            s, e = self.spans[stream]
            ts = s - 1 - self.ts_base
            dur = e - s + 2
            self.act_recs.append((s, GPU_ANN_EV % ("ProfilerStep#%d" % n, self.device, stream,
                                                   ts // 1000, ts % 1000, dur // 1000, dur % 1000,
                                                   step_ext, self.device)))
            self._count("gpu_user_annotation")
        self.act_recs.sort(key=lambda r: r[0])
        out.extend(r[1] for r in self.act_recs)
        self.sink.write("".join(out))
        self.cpu_recs = []
        self.act_recs = []

    # ---- document ---------------------------------------------------------------------------------

    def header(self):
        dist = {
            "backend": "nccl", "rank": self.rank, "world_size": self.world, "pg_count": 1,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                           "pg_size": self.world, "ranks": list(range(self.world))}],
            "nccl_version": "2.21.5",
        }
        props = (
            '\n      {\n      "id": %d, "name": "NVIDIA H200", "totalGlobalMem": %d,\n'
            '      "computeMajor": 9, "computeMinor": 0,\n'
            '      "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,\n'
            '      "regsPerBlock": 65536, "warpSize": 32,\n'
            '      "sharedMemPerBlock": 49152, "numSms": %d\n'
            '    , "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 232448, '
            '"sharedMemPerMultiprocessor": 233472\n    }' % (self.device, H200_MEM, NUM_SMS)
        )
        s = '\n  {\n    "schemaVersion": 1,\n    "deviceProperties": [%s\n    ],' % props
        meta = [
            ("distributedInfo", json.dumps(dist)),
            ("cupti_version", "24"),
            ("cuda_runtime_version", "12040"),
            ("cuda_driver_version", "12040"),
            ("with_flops", "0"),
            ("record_shapes", "1"),
            ("with_stack", "0"),
            ("with_modules", "0"),
            ("profile_memory", "0"),
            ("trace_id", '"%016X"' % self.rng.getrandbits(64)),
        ]
        for k, v in meta:
            s += '\n      "%s": %s,' % (k, v)
        if self.ts_base:
            s += '\n  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": %d,\n  "traceEvents": [' % self.ts_base
        else:
            s += '\n  "displayTimeUnit": "ms",\n  "traceEvents": ['
        # Process and thread metadata (Kineto writes them first).
        t0 = self.cpu - self.ts_base - 1000
        us, ns = t0 // 1000, t0 % 1000
        pm = (
            '\n  {\n    "name": "process_name", "ph": "M", "ts": %d.%03d, "pid": %s, "tid": 0,\n'
            '    "args": {\n      "name": "%s"\n    }\n  },\n'
            '  {\n    "name": "process_labels", "ph": "M", "ts": %d.%03d, "pid": %s, "tid": 0,\n'
            '    "args": {\n      "labels": "%s"\n    }\n  },\n'
            '  {\n    "name": "process_sort_index", "ph": "M", "ts": %d.%03d, "pid": %s, "tid": 0,\n'
            '    "args": {\n      "sort_index": %d\n    }\n  },'
        )
        tm = (
            '\n  {\n    "name": "thread_name", "ph": "M", "ts": %d.%03d, "pid": %d, "tid": %d,\n'
            '    "args": {\n      "name": "%s"\n    }\n  },\n'
            '  {\n    "name": "thread_sort_index", "ph": "M", "ts": %d.%03d, "pid": %d, "tid": %d,\n'
            '    "args": {\n      "sort_index": %d\n    }\n  },'
        )
        s += pm % (us, ns, self.device, "python", us, ns, self.device, "GPU %d" % self.device,
                   us, ns, self.device, 5000000 + self.device)
        s += pm % (us, ns, self.pid, "python", us, ns, self.pid, "", us, ns, self.pid, self.pid)
        for stream in (COMPUTE, COMM, COPY):
            s += tm % (us, ns, self.device, stream, "stream %d " % stream, us, ns, self.device, stream, stream)
        s += tm % (us, ns, self.pid, self.tid, "thread %d (python)" % self.tid, us, ns, self.pid, self.tid, self.tid)
        s += tm % (us, ns, self.pid, self.bwd_tid, "thread %d (pt_autograd_0)" % self.bwd_tid,
                   us, ns, self.pid, self.bwd_tid, self.bwd_tid)
        self._count("M", 16)  # 2 processes x 3 records + 5 threads x 2 records
        self.sink.write(s)

    def footer(self, path):
        t = max(self.cpu, max(self.ready.values())) - self.ts_base + 1000
        s = ('\n  {\n    "name": "Record Window End", "ph": "i", "s": "g",\n'
             '    "pid": "", "tid": "", "ts": %d.%03d\n  }\n  ],' % (t // 1000, t % 1000))
        s += '\n  "traceName": "%s"\n}' % path
        self._count("i")
        self.sink.write(s)


def _events_total(counts):
    return sum(counts.values())


def generate_rank(rank: int, cfg: dict, steps: int, path: str | None) -> dict:
    t0 = time.time()
    sink = Sink(path, cfg["level"])
    g = RankGen(rank, cfg, sink)
    g.header()
    for n in range(steps):
        g.step(cfg["first_step"] + n)
    g.footer(os.path.basename(path) if path else "dry-run")
    sink.close()
    meta = {
        "file": os.path.basename(path) if path else None,
        "generator": "scripts/gen_kineto_trace.py",
        "rank": rank,
        "world_size": cfg["ranks"],
        "mode": cfg["mode"],
        "model": cfg["model"],
        "layers": g.layers,
        "steps": steps,
        "seed": cfg["seed"],
        "events": _events_total(g.counts),
        "events_by_category": dict(sorted(g.counts.items())),
        "uncompressed_bytes": sink.raw_bytes,
        "compressed_bytes": os.path.getsize(path) if path else None,
        "gzip_level": cfg["level"] if path and path.endswith(".gz") else None,
        "seconds": round(time.time() - t0, 3),
    }
    return meta


def _worker(a):
    rank, cfg, steps, path = a
    meta = generate_rank(rank, cfg, steps, path)
    if not cfg["no_meta"]:
        mpath = cfg["prefix"] + "_rank%d.meta.json" % rank
        with open(mpath, "w") as f:
            json.dump(meta, f, indent=2)
            f.write("\n")
    return meta


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description="Generate deterministic Kineto/PyTorch-profiler Chrome traces of a "
                    "tensor-parallel Llama-style decoder on H200s (one file per rank).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("-o", "--output", required=True, metavar="PREFIX",
                   help="output prefix: writes PREFIX_rank<N>.json.gz (and PREFIX_rank<N>.meta.json)")
    p.add_argument("--ranks", type=int, default=2, help="ranks = tensor-parallel world size")
    p.add_argument("--steps", type=int, default=3, help="profiler steps per rank (ignored with --target-mb)")
    p.add_argument("--target-mb", type=float, default=None,
                   help="choose the step count so the uncompressed total over all ranks is about this many MB")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's)")
    p.add_argument("--model", choices=sorted(MODELS), default="8b")
    p.add_argument("--mode", choices=["train", "infer"], default="train")
    p.add_argument("--batch", type=int, default=None, help="batch size (default 4 train, 64 infer)")
    p.add_argument("--seq", type=int, default=None,
                   help="sequence length (train) or initial KV context (infer); default 2048")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--first-step", type=int, default=5, help="number of the first ProfilerStep")
    p.add_argument("--ext", default=".json.gz", help="file suffix; gzip when it ends in .gz")
    p.add_argument("--level", type=int, default=None,
                   help="gzip level (default 1 when --target-mb >= 64, else 6)")
    p.add_argument("--relative-ts", action="store_true",
                   help="write baseTimeNanoseconds and timestamps relative to it (libkineto >= 2024)")
    p.add_argument("--jobs", type=int, default=None, help="parallel processes (default: min(ranks, CPUs))")
    p.add_argument("--no-meta", action="store_true", help="do not write the .meta.json sidecars")
    a = p.parse_args(argv)

    if a.ranks < 1 or a.ranks > 64:
        p.error("--ranks must be 1..64")
    model = MODELS[a.model]
    if a.ranks > 1 and (model["heads"] % a.ranks or model["ffn"] % a.ranks or model["vocab"] % a.ranks):
        p.error("--ranks must divide the model's heads, FFN width and vocabulary")
    if a.steps < 1:
        p.error("--steps must be >= 1")
    if a.layers is not None and a.layers < 1:
        p.error("--layers must be >= 1")
    level = a.level if a.level is not None else (1 if (a.target_mb or 0) >= 64 else 6)
    if not 0 <= level <= 9:
        p.error("--level must be 0..9")
    cfg = {
        "ranks": a.ranks, "mode": a.mode, "model": a.model, "layers": a.layers,
        "batch": a.batch or (4 if a.mode == "train" else 64), "seq": a.seq or 2048,
        "seed": a.seed, "level": level, "relative_ts": a.relative_ts, "first_step": a.first_step,
        "no_meta": a.no_meta, "prefix": a.output,
    }
    out_dir = os.path.dirname(os.path.abspath(a.output))
    if not os.path.isdir(out_dir):
        p.error("output directory does not exist: %s" % out_dir)

    steps = a.steps
    if a.target_mb:
        # Dry run of rank 0 (nothing written) to measure the header and a step.
        g_sink = Sink(None, level)
        g = RankGen(0, cfg, g_sink)
        g.header()
        g_sink.flush()
        head = g_sink.raw_bytes
        g.step(0)
        g_sink.flush()
        first = g_sink.raw_bytes - head
        g.step(1)
        g_sink.flush()
        per_step = g_sink.raw_bytes - head - first
        per_rank = a.target_mb * 1e6 / a.ranks
        steps = max(1, int(math.ceil((per_rank - head - first) / per_step)) + 1)
        print("gen_kineto_trace: %.2f MB per step per rank -> %d steps per rank" % (per_step / 1e6, steps),
              file=sys.stderr)

    jobs = a.jobs or min(a.ranks, os.cpu_count() or 1)
    work = [(r, cfg, steps, a.output + "_rank%d%s" % (r, a.ext)) for r in range(a.ranks)]
    t0 = time.time()
    if jobs > 1 and a.ranks > 1:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            metas = pool.map(_worker, work, chunksize=1)
    else:
        metas = [_worker(w) for w in work]
    wall = time.time() - t0
    total = sum(m["uncompressed_bytes"] for m in metas)
    for m in metas:
        print("gen_kineto_trace: %s: %d steps, %d events, %.1f MB JSON, %.1f MB on disk, %.1f s" % (
            m["file"], m["steps"], m["events"], m["uncompressed_bytes"] / 1e6,
            m["compressed_bytes"] / 1e6, m["seconds"]), file=sys.stderr)
    print("gen_kineto_trace: %.1f MB JSON in %.1f s (%.1f MB/s)" % (total / 1e6, wall, total / 1e6 / max(wall, 1e-9)),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
