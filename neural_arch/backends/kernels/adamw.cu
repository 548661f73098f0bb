// One launch updates many float32 parameter tensors with PyTorch's AdamW rule:
//   p  *= 1 - lr * weight_decay
//   m  += (g - m) * (1 - beta1)
//   v   = v * beta2 + (1 - beta2) * g * g
//   p  -= (lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// The host passes the step-dependent scalars already folded: decay = 1 - lr * weight_decay,
// step_size = lr / bias_correction1, bias_correction2_sqrt. Tensors are found through device
// tables of raw pointers; block b updates elements [block_start[b], block_start[b] + chunk) of
// tensor block_tensor[b], so every block streams one contiguous piece of one tensor.

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
    const int t = block_tensor[blockIdx.x];
    const long long start = block_start[blockIdx.x];
    const long long size = sizes[t];
    const long long end = (start + chunk < size) ? start + chunk : size;
    float* p = reinterpret_cast<float*>(params[t]);
    const float* g = reinterpret_cast<const float*>(grads[t]);
    float* m = reinterpret_cast<float*>(exp_avgs[t]);
    float* v = reinterpret_cast<float*>(exp_avg_sqs[t]);
    for (long long i = start + threadIdx.x; i < end; i += blockDim.x) {
        const float grad = maximize ? -g[i] : g[i];
        const float param = p[i] * decay;
        float avg = m[i];
        avg += (grad - avg) * one_minus_beta1;
        const float avg_sq = v[i] * beta2 + one_minus_beta2 * (grad * grad);
        const float denom = sqrtf(avg_sq) / bias_correction2_sqrt + eps;
        p[i] = param - step_size * (avg / denom);
        m[i] = avg;
        v[i] = avg_sq;
    }
}
