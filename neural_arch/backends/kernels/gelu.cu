// Bias + GELU, float32, forward and backward, in PyTorch's two variants:
//   exact:  gelu(v) = v * Phi(v) = 0.5 v (1 + erf(v / sqrt 2))
//   tanh:   gelu(v) = 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))
// with v = x + bias. x is C-contiguous (rows, features) flattened to n elements; bias holds
// `features` values (pass zeros for a plain GELU). Grid-stride loops: any grid size is correct.
// The backward kernels write dL/dv; dL/dbias is its column sum, taken by the caller.
// Far in the negative tail 1 + erf and 1 + tanh cancel to a few float32 ulps, which ruins the
// relative accuracy of small outputs; erfc and logistic forms keep it.

#define NF_SQRT_HALF 0.70710678118654752f
#define NF_INV_SQRT_2PI 0.39894228040143268f
#define NF_TANH_SCALE 0.79788456080286536f
#define NF_TANH_CUBIC 0.044715f

// (1 + tanh(u)) / 2 and (1 - tanh(u)) / 2 as logistic functions, free of cancellation.
__device__ __forceinline__ void nf_tanh_halves(float u, float* plus, float* minus) {
    const float e = expf(-2.0f * fabsf(u));
    const float big = 1.0f / (1.0f + e), small = e / (1.0f + e);
    *plus = u >= 0.0f ? big : small;
    *minus = u >= 0.0f ? small : big;
}

__device__ __forceinline__ float nf_tanh_inner(float v) {
    return NF_TANH_SCALE * (v + NF_TANH_CUBIC * v * v * v);
}

// out[i] = f(x[i] + bias[i % features]), times grad[i] when grad is given, over this thread's
// elements of a grid-stride loop. The feature index advances by the stride's remainder instead
// of taking i % features: a 64-bit remainder is a long instruction sequence on the GPU and held
// these kernels far below the memory's speed. Where features % 4 == 0 and every array is
// 16-byte aligned, a thread moves float4s (four elements of one row); both paths apply the
// same f, so an element's result does not depend on the path.
template <typename F>
__device__ __forceinline__ void nf_map_biased(const float* __restrict__ x,
                                              const float* __restrict__ bias,
                                              const float* __restrict__ grad,
                                              float* __restrict__ out, long long n, int features,
                                              F f) {
    const long long stride = (long long)blockDim.x * gridDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long addresses = reinterpret_cast<unsigned long long>(x) |
        reinterpret_cast<unsigned long long>(bias) | reinterpret_cast<unsigned long long>(grad) |
        reinterpret_cast<unsigned long long>(out);
    if (features % 4 == 0 && (addresses & 15ULL) == 0) {
        const int feature_step = (int)((4 * stride) % features);
        int feature = (int)((4 * first) % features);
        for (long long j = first; j < n / 4; j += stride) {
            const float4 xv = reinterpret_cast<const float4*>(x)[j];
            const float4 bv = *reinterpret_cast<const float4*>(bias + feature);
            float4 r = {f(xv.x + bv.x), f(xv.y + bv.y), f(xv.z + bv.z), f(xv.w + bv.w)};
            if (grad != nullptr) {
                const float4 gv = reinterpret_cast<const float4*>(grad)[j];
                r.x *= gv.x;
                r.y *= gv.y;
                r.z *= gv.z;
                r.w *= gv.w;
            }
            reinterpret_cast<float4*>(out)[j] = r;
            feature += feature_step;
            if (feature >= features) feature -= features;
        }
        return;
    }
    const int feature_step = (int)(stride % features);
    int feature = (int)(first % features);
    for (long long i = first; i < n; i += stride) {
        const float value = f(x[i] + bias[feature]);
        out[i] = grad != nullptr ? grad[i] * value : value;
        feature += feature_step;
        if (feature >= features) feature -= features;
    }
}

__device__ __forceinline__ float nf_gelu_erf(float v) {
    return 0.5f * v * erfcf(-v * NF_SQRT_HALF);
}

__device__ __forceinline__ float nf_gelu_tanh(float v) {
    float plus, minus;
    nf_tanh_halves(nf_tanh_inner(v), &plus, &minus);
    return v * plus;
}

// d gelu / dv = Phi(v) + v * phi(v), phi the standard normal density.
__device__ __forceinline__ float nf_gelu_erf_slope(float v) {
    const float cdf = 0.5f * erfcf(-v * NF_SQRT_HALF);
    const float density = NF_INV_SQRT_2PI * expf(-0.5f * v * v);
    return cdf + v * density;
}

__device__ __forceinline__ float nf_gelu_tanh_slope(float v) {
    float plus, minus;
    nf_tanh_halves(nf_tanh_inner(v), &plus, &minus);
    const float d_inner = NF_TANH_SCALE * (1.0f + 3.0f * NF_TANH_CUBIC * v * v);
    return plus + 2.0f * v * plus * minus * d_inner;  // 1 - tanh^2 = 4 plus minus
}

extern "C" __global__ void bias_gelu_erf_forward(const float* __restrict__ x,
                                                 const float* __restrict__ bias,
                                                 float* __restrict__ out, long long n,
                                                 int features) {
    nf_map_biased(x, bias, nullptr, out, n, features, [](float v) { return nf_gelu_erf(v); });
}

extern "C" __global__ void bias_gelu_tanh_forward(const float* __restrict__ x,
                                                  const float* __restrict__ bias,
                                                  float* __restrict__ out, long long n,
                                                  int features) {
    nf_map_biased(x, bias, nullptr, out, n, features, [](float v) { return nf_gelu_tanh(v); });
}

extern "C" __global__ void bias_gelu_erf_backward(const float* __restrict__ grad_out,
                                                  const float* __restrict__ x,
                                                  const float* __restrict__ bias,
                                                  float* __restrict__ grad_in, long long n,
                                                  int features) {
    nf_map_biased(x, bias, grad_out, grad_in, n, features,
                  [](float v) { return nf_gelu_erf_slope(v); });
}

extern "C" __global__ void bias_gelu_tanh_backward(const float* __restrict__ grad_out,
                                                   const float* __restrict__ x,
                                                   const float* __restrict__ bias,
                                                   float* __restrict__ grad_in, long long n,
                                                   int features) {
    nf_map_biased(x, bias, grad_out, grad_in, n, features,
                  [](float v) { return nf_gelu_tanh_slope(v); });
}
