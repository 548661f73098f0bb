// One launch updates many float32 parameter tensors with PyTorch's AdamW rule:
//   p  *= 1 - lr * weight_decay
//   m  += (g - m) * (1 - beta1)
//   v   = v * beta2 + (1 - beta2) * g * g
//   p  -= (lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// The host passes the step-dependent scalars already folded: decay = 1 - lr * weight_decay,
// step_size = lr / bias_correction1, bias_correction2_sqrt. Tensors are found through device
// tables of raw pointers; block b updates elements [block_start[b], block_start[b] + chunk) of
// tensor block_tensor[b], so every block streams one contiguous piece of one tensor.
// Where all four arrays are 16-byte aligned (CuPy's allocations are; views may not be) a block
// moves float4s: fewer, wider memory transactions. Both paths share one update, so an element's
// result does not depend on which path it took.

struct NfAdamW {
    float decay, beta2, one_minus_beta1, one_minus_beta2, step_size, bias_correction2_sqrt, eps;
    int maximize;

    __device__ __forceinline__ void update(float& p, float g, float& m, float& v) const {
        const float grad = maximize ? -g : g;
        const float param = p * decay;
        float avg = m;
        avg += (grad - avg) * one_minus_beta1;
        const float avg_sq = v * beta2 + one_minus_beta2 * (grad * grad);
        const float denom = sqrtf(avg_sq) / bias_correction2_sqrt + eps;
        p = param - step_size * (avg / denom);
        m = avg;
        v = avg_sq;
    }
};

extern "C" __global__ void adamw_multi_tensor(const unsigned long long* __restrict__ params,
                                              const unsigned long long* __restrict__ grads,
                                              const unsigned long long* __restrict__ exp_avgs,
                                              const unsigned long long* __restrict__ exp_avg_sqs,
                                              const long long* __restrict__ sizes,
                                              const int* __restrict__ block_tensor,
                                              const long long* __restrict__ block_start,
                                              int chunk, float decay, float beta2,
                                              float one_minus_beta1, float one_minus_beta2,
                                              float step_size, float bias_correction2_sqrt,
                                              float eps, int maximize) {
    const NfAdamW rule{decay, beta2, one_minus_beta1, one_minus_beta2, step_size,
                       bias_correction2_sqrt, eps, maximize};
    const int t = block_tensor[blockIdx.x];
    const long long start = block_start[blockIdx.x];
    const long long size = sizes[t];
    const long long end = (start + chunk < size) ? start + chunk : size;
    float* p = reinterpret_cast<float*>(params[t]);
    const float* g = reinterpret_cast<const float*>(grads[t]);
    float* m = reinterpret_cast<float*>(exp_avgs[t]);
    float* v = reinterpret_cast<float*>(exp_avg_sqs[t]);
    long long scalar_from = start;
    // start is a multiple of chunk, itself a multiple of 4, so aligned bases keep i aligned
    if (((params[t] | grads[t] | exp_avgs[t] | exp_avg_sqs[t]) & 15ULL) == 0 && chunk % 4 == 0) {
        const long long vector_end = start + ((end - start) & ~3LL);
        for (long long i = start + 4LL * threadIdx.x; i < vector_end; i += 4LL * blockDim.x) {
            float4 p4 = *reinterpret_cast<const float4*>(p + i);
            const float4 g4 = *reinterpret_cast<const float4*>(g + i);
            float4 m4 = *reinterpret_cast<const float4*>(m + i);
            float4 v4 = *reinterpret_cast<const float4*>(v + i);
            rule.update(p4.x, g4.x, m4.x, v4.x);
            rule.update(p4.y, g4.y, m4.y, v4.y);
            rule.update(p4.z, g4.z, m4.z, v4.z);
            rule.update(p4.w, g4.w, m4.w, v4.w);
            *reinterpret_cast<float4*>(p + i) = p4;
            *reinterpret_cast<float4*>(m + i) = m4;
            *reinterpret_cast<float4*>(v + i) = v4;
        }
        scalar_from = vector_end;
    }
    for (long long i = scalar_from + threadIdx.x; i < end; i += blockDim.x) {
        float param = p[i], avg = m[i], avg_sq = v[i];
        rule.update(param, g[i], avg, avg_sq);
        p[i] = param;
        m[i] = avg;
        v[i] = avg_sq;
    }
}
