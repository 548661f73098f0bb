// Mixed-precision gradient unscaling, as PyTorch's _amp_foreach_non_finite_check_and_unscale_:
// every gradient element is multiplied by inv_scale in place (computed in float32, rounded back
// to the storage type), and *found_inf is set to 1 when any element was inf or NaN before
// scaling. found_inf is only ever written with 1.0f, so racing writers agree; the caller zeroes
// it once before a batch of launches. Half values travel as raw 16-bit patterns and convert with
// the PTX cvt instructions, so no header is needed. Where the array is 16-byte aligned, threads
// move 16 bytes at a time (4 floats or 8 halves): one 2-byte access per thread left the memory
// half idle. The last n % width elements take the scalar loop.

__device__ __forceinline__ float nf_half_to_float(unsigned short bits) {
    float value;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(value) : "h"(bits));
    return value;
}

__device__ __forceinline__ unsigned short nf_float_to_half(float value) {
    unsigned short bits;
    asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(bits) : "f"(value));
    return bits;
}

// False for +-inf and NaN (every comparison with NaN is false).
__device__ __forceinline__ bool nf_is_finite(float value) {
    return fabsf(value) < __int_as_float(0x7f800000);
}

__device__ __forceinline__ float nf_unscaled(float value, float inv_scale, bool* bad) {
    *bad |= !nf_is_finite(value);
    return value * inv_scale;
}

extern "C" __global__ void unscale_check_inf_f32(float* __restrict__ grad, long long n,
                                                 float inv_scale, float* __restrict__ found_inf) {
    const long long stride = (long long)blockDim.x * gridDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    bool bad = false;
    long long scalar_from = 0;
    if ((reinterpret_cast<unsigned long long>(grad) & 15ULL) == 0) {
        float4* vectors = reinterpret_cast<float4*>(grad);
        for (long long j = first; j < n / 4; j += stride) {
            float4 v = vectors[j];
            v.x = nf_unscaled(v.x, inv_scale, &bad);
            v.y = nf_unscaled(v.y, inv_scale, &bad);
            v.z = nf_unscaled(v.z, inv_scale, &bad);
            v.w = nf_unscaled(v.w, inv_scale, &bad);
            vectors[j] = v;
        }
        scalar_from = n / 4 * 4;
    }
    for (long long i = scalar_from + first; i < n; i += stride) {
        grad[i] = nf_unscaled(grad[i], inv_scale, &bad);
    }
    if (bad) *found_inf = 1.0f;
}

__device__ __forceinline__ unsigned int nf_unscaled_pair(unsigned int pair, float inv_scale,
                                                         bool* bad) {
    const unsigned short low = nf_float_to_half(
        nf_unscaled(nf_half_to_float((unsigned short)(pair & 0xffffu)), inv_scale, bad));
    const unsigned short high = nf_float_to_half(
        nf_unscaled(nf_half_to_float((unsigned short)(pair >> 16)), inv_scale, bad));
    return (unsigned int)low | ((unsigned int)high << 16);
}

extern "C" __global__ void unscale_check_inf_f16(unsigned short* __restrict__ grad, long long n,
                                                 float inv_scale, float* __restrict__ found_inf) {
    const long long stride = (long long)blockDim.x * gridDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    bool bad = false;
    long long scalar_from = 0;
    if ((reinterpret_cast<unsigned long long>(grad) & 15ULL) == 0) {
        uint4* vectors = reinterpret_cast<uint4*>(grad);  // 8 halves, little-endian pairs
        for (long long j = first; j < n / 8; j += stride) {
            uint4 v = vectors[j];
            v.x = nf_unscaled_pair(v.x, inv_scale, &bad);
            v.y = nf_unscaled_pair(v.y, inv_scale, &bad);
            v.z = nf_unscaled_pair(v.z, inv_scale, &bad);
            v.w = nf_unscaled_pair(v.w, inv_scale, &bad);
            vectors[j] = v;
        }
        scalar_from = n / 8 * 8;
    }
    for (long long i = scalar_from + first; i < n; i += stride) {
        grad[i] = nf_float_to_half(nf_unscaled(nf_half_to_float(grad[i]), inv_scale, &bad));
    }
    if (bad) *found_inf = 1.0f;
}
