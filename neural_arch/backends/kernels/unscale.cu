// Mixed-precision gradient unscaling, as PyTorch's _amp_foreach_non_finite_check_and_unscale_:
// every gradient element is multiplied by inv_scale in place (computed in float32, rounded back
// to the storage type), and *found_inf is set to 1 when any element was inf or NaN before
// scaling. found_inf is only ever written with 1.0f, so racing writers agree; the caller zeroes
// it once before a batch of launches. Half values travel as raw 16-bit patterns and convert with
// the PTX cvt instructions, so no header is needed.

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

extern "C" __global__ void unscale_check_inf_f32(float* __restrict__ grad, long long n,
                                                 float inv_scale, float* __restrict__ found_inf) {
    const long long stride = (long long)blockDim.x * gridDim.x;
    bool bad = false;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float value = grad[i];
        bad |= !nf_is_finite(value);
        grad[i] = value * inv_scale;
    }
    if (bad) *found_inf = 1.0f;
}

extern "C" __global__ void unscale_check_inf_f16(unsigned short* __restrict__ grad, long long n,
                                                 float inv_scale, float* __restrict__ found_inf) {
    const long long stride = (long long)blockDim.x * gridDim.x;
    bool bad = false;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float value = nf_half_to_float(grad[i]);
        bad |= !nf_is_finite(value);
        grad[i] = nf_float_to_half(value * inv_scale);
    }
    if (bad) *found_inf = 1.0f;
}
