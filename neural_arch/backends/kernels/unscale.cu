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

// A thread's 16-byte vector for each storage type, and how many elements it holds.
template <typename T> struct nf_vector;
template <> struct nf_vector<float> {
    typedef float4 type;
    static const int width = 4;
};
template <> struct nf_vector<unsigned short> {  // raw half bits
    typedef uint4 type;
    static const int width = 8;
};

__device__ __forceinline__ void nf_unscale(float* value, float inv_scale, bool* bad) {
    *value = nf_unscaled(*value, inv_scale, bad);
}

__device__ __forceinline__ void nf_unscale(unsigned short* bits, float inv_scale, bool* bad) {
    *bits = nf_float_to_half(nf_unscaled(nf_half_to_float(*bits), inv_scale, bad));
}

template <typename T>
__device__ __forceinline__ void nf_unscale_check_inf(T* __restrict__ grad, long long n,
                                                     float inv_scale,
                                                     float* __restrict__ found_inf) {
    typedef typename nf_vector<T>::type Vector;
    const int width = nf_vector<T>::width;
    const long long stride = (long long)blockDim.x * gridDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    bool bad = false;
    long long scalar_from = 0;
    if ((reinterpret_cast<unsigned long long>(grad) & 15ULL) == 0) {
        Vector* vectors = reinterpret_cast<Vector*>(grad);
        for (long long j = first; j < n / width; j += stride) {
            union {
                Vector whole;
                T lanes[width];
            } v;
            v.whole = vectors[j];
#pragma unroll
            for (int k = 0; k < width; ++k) nf_unscale(&v.lanes[k], inv_scale, &bad);
            vectors[j] = v.whole;
        }
        scalar_from = n / width * width;
    }
    for (long long i = scalar_from + first; i < n; i += stride) {
        nf_unscale(&grad[i], inv_scale, &bad);
    }
    if (bad) *found_inf = 1.0f;
}

extern "C" __global__ void unscale_check_inf_f32(float* __restrict__ grad, long long n,
                                                 float inv_scale, float* __restrict__ found_inf) {
    nf_unscale_check_inf(grad, n, inv_scale, found_inf);
}

extern "C" __global__ void unscale_check_inf_f16(unsigned short* __restrict__ grad, long long n,
                                                 float inv_scale, float* __restrict__ found_inf) {
    nf_unscale_check_inf(grad, n, inv_scale, found_inf);
}
