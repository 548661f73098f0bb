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

// Calls body(i, x[i] + bias[i % features]) for this thread's elements of a grid-stride loop.
// The feature index advances by the stride's remainder instead of taking i % features: a 64-bit
// remainder is a long instruction sequence on the GPU and held these kernels far below the
// memory's speed.
template <typename Body>
__device__ __forceinline__ void nf_for_each_biased(const float* __restrict__ x,
                                                   const float* __restrict__ bias, long long n,
                                                   int features, Body body) {
    const long long stride = (long long)blockDim.x * gridDim.x;
    const int feature_step = (int)(stride % features);
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int feature = (int)(i % features);
    for (; i < n; i += stride) {
        body(i, x[i] + bias[feature]);
        feature += feature_step;
        if (feature >= features) feature -= features;
    }
}

extern "C" __global__ void bias_gelu_erf_forward(const float* __restrict__ x,
                                                 const float* __restrict__ bias,
                                                 float* __restrict__ out, long long n,
                                                 int features) {
    nf_for_each_biased(x, bias, n, features, [&](long long i, float v) {
        out[i] = 0.5f * v * erfcf(-v * NF_SQRT_HALF);
    });
}

extern "C" __global__ void bias_gelu_tanh_forward(const float* __restrict__ x,
                                                  const float* __restrict__ bias,
                                                  float* __restrict__ out, long long n,
                                                  int features) {
    nf_for_each_biased(x, bias, n, features, [&](long long i, float v) {
        float plus, minus;
        nf_tanh_halves(nf_tanh_inner(v), &plus, &minus);
        out[i] = v * plus;
    });
}

// d gelu / dv = Phi(v) + v * phi(v), phi the standard normal density.
extern "C" __global__ void bias_gelu_erf_backward(const float* __restrict__ grad_out,
                                                  const float* __restrict__ x,
                                                  const float* __restrict__ bias,
                                                  float* __restrict__ grad_in, long long n,
                                                  int features) {
    nf_for_each_biased(x, bias, n, features, [&](long long i, float v) {
        const float cdf = 0.5f * erfcf(-v * NF_SQRT_HALF);
        const float density = NF_INV_SQRT_2PI * expf(-0.5f * v * v);
        grad_in[i] = grad_out[i] * (cdf + v * density);
    });
}

extern "C" __global__ void bias_gelu_tanh_backward(const float* __restrict__ grad_out,
                                                   const float* __restrict__ x,
                                                   const float* __restrict__ bias,
                                                   float* __restrict__ grad_in, long long n,
                                                   int features) {
    nf_for_each_biased(x, bias, n, features, [&](long long i, float v) {
        float plus, minus;
        nf_tanh_halves(nf_tanh_inner(v), &plus, &minus);
        const float d_inner = NF_TANH_SCALE * (1.0f + 3.0f * NF_TANH_CUBIC * v * v);
        // 1 - tanh^2 = (1 + tanh)(1 - tanh) = 4 plus minus
        grad_in[i] = grad_out[i] * (plus + 2.0f * v * plus * minus * d_inner);
    });
}
