// Bias + GELU, float32, forward and backward, in PyTorch's two variants:
//   exact:  gelu(v) = v * Phi(v) = 0.5 v (1 + erf(v / sqrt 2))
//   tanh:   gelu(v) = 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))
// with v = x + bias. x is C-contiguous (rows, features) flattened to n elements; bias holds
// `features` values (pass zeros for a plain GELU). Grid-stride loops: any grid size is correct.
// The backward kernels write dL/dv; dL/dbias is its column sum, taken by the caller.

#define NF_SQRT_HALF 0.70710678118654752f
#define NF_INV_SQRT_2PI 0.39894228040143268f
#define NF_TANH_SCALE 0.79788456080286536f
#define NF_TANH_CUBIC 0.044715f

__device__ __forceinline__ float nf_biased(const float* x, const float* bias, long long i,
                                           int features) {
    return x[i] + bias[(int)(i % features)];
}

extern "C" __global__ void bias_gelu_erf_forward(const float* __restrict__ x,
                                                 const float* __restrict__ bias,
                                                 float* __restrict__ out, long long n,
                                                 int features) {
    const long long stride = (long long)blockDim.x * gridDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = nf_biased(x, bias, i, features);
        out[i] = 0.5f * v * (1.0f + erff(v * NF_SQRT_HALF));
    }
}

extern "C" __global__ void bias_gelu_tanh_forward(const float* __restrict__ x,
                                                  const float* __restrict__ bias,
                                                  float* __restrict__ out, long long n,
                                                  int features) {
    const long long stride = (long long)blockDim.x * gridDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = nf_biased(x, bias, i, features);
        const float t = tanhf(NF_TANH_SCALE * (v + NF_TANH_CUBIC * v * v * v));
        out[i] = 0.5f * v * (1.0f + t);
    }
}

// d gelu / dv = Phi(v) + v * phi(v), phi the standard normal density.
extern "C" __global__ void bias_gelu_erf_backward(const float* __restrict__ grad_out,
                                                  const float* __restrict__ x,
                                                  const float* __restrict__ bias,
                                                  float* __restrict__ grad_in, long long n,
                                                  int features) {
    const long long stride = (long long)blockDim.x * gridDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = nf_biased(x, bias, i, features);
        const float cdf = 0.5f * (1.0f + erff(v * NF_SQRT_HALF));
        const float density = NF_INV_SQRT_2PI * expf(-0.5f * v * v);
        grad_in[i] = grad_out[i] * (cdf + v * density);
    }
}

extern "C" __global__ void bias_gelu_tanh_backward(const float* __restrict__ grad_out,
                                                   const float* __restrict__ x,
                                                   const float* __restrict__ bias,
                                                   float* __restrict__ grad_in, long long n,
                                                   int features) {
    const long long stride = (long long)blockDim.x * gridDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = nf_biased(x, bias, i, features);
        const float t = tanhf(NF_TANH_SCALE * (v + NF_TANH_CUBIC * v * v * v));
        const float d_inner = NF_TANH_SCALE * (1.0f + 3.0f * NF_TANH_CUBIC * v * v);
        grad_in[i] = grad_out[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * d_inner);
    }
}
