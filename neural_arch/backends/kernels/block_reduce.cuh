// Block-wide reductions shared by the row-wise kernels (one block per row).
// Header-free on purpose: the same text compiles under nvcc and under NVRTC (CuPy), which has
// no standard headers. blockDim.x must be a multiple of 32 and at most 1024.
#pragma once

#define NF_FULL_MASK 0xffffffffu
#define NF_NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float nf_warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(NF_FULL_MASK, v, offset);
    }
    return v;
}

__device__ __forceinline__ float nf_warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(NF_FULL_MASK, v, offset));
    }
    return v;
}

// Every thread gets the block's total. `scratch` holds 32 floats of shared memory; the leading
// barrier lets consecutive calls reuse it.
__device__ __forceinline__ float nf_block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    v = nf_warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = (lane < (int)(blockDim.x >> 5)) ? scratch[lane] : 0.0f;
        v = nf_warp_sum(v);
        if (lane == 0) scratch[0] = v;
    }
    __syncthreads();
    return scratch[0];
}

__device__ __forceinline__ float nf_block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    v = nf_warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = (lane < (int)(blockDim.x >> 5)) ? scratch[lane] : NF_NEG_INF;
        v = nf_warp_max(v);
        if (lane == 0) scratch[0] = v;
    }
    __syncthreads();
    return scratch[0];
}
