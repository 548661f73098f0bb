// Softmax cross-entropy over rows of float32 logits (rows, classes), integer (int64) targets,
// PyTorch's ignore_index and label smoothing. One block per row; blockDim.x a multiple of 32.
//   forward:  lse = max + log(sum exp(z - max))            (numerically stable)
//             loss = (1 - s) (lse - z[t]) + s (lse - mean(z)),  0 where t == ignore_index,
//             both formed from gaps to the max, which large logits do not round away
//   backward: dz = g * (softmax(z) - (1 - s) onehot(t) - s / classes),  0 where ignored
// The per-row loss and lse are written; the caller reduces (mean over non-ignored rows, sum).
#include "block_reduce.cuh"

extern "C" __global__ void softmax_cross_entropy_forward(const float* __restrict__ logits,
                                                         const long long* __restrict__ target,
                                                         float* __restrict__ loss,
                                                         float* __restrict__ lse_out, int rows,
                                                         int classes, long long ignore_index,
                                                         float smoothing) {
    __shared__ float scratch[32];
    const int row = blockIdx.x;
    if (row >= rows) return;  // uniform over the block, so no barrier is skipped by half of it
    const float* z = logits + (long long)row * classes;
    float row_max = NF_NEG_INF;
    for (int j = threadIdx.x; j < classes; j += blockDim.x) row_max = fmaxf(row_max, z[j]);
    row_max = nf_block_max(row_max, scratch);
    float exp_sum = 0.0f;
    float gap_sum = 0.0f;  // sum of (max - z): small terms, where a sum of z would round
    for (int j = threadIdx.x; j < classes; j += blockDim.x) {
        const float v = z[j];
        exp_sum += expf(v - row_max);
        gap_sum += row_max - v;
    }
    exp_sum = nf_block_sum(exp_sum, scratch);
    if (smoothing != 0.0f) gap_sum = nf_block_sum(gap_sum, scratch);
    if (threadIdx.x == 0) {
        // lse - z[t] as (max - z[t]) + log(sum): with large logits, lse itself rounds to the
        // float32 grid of its magnitude (1/512 near 3e4), which a small loss cannot afford
        const float log_sum = logf(exp_sum);
        const long long t = target[row];
        float value = 0.0f;
        if (t != ignore_index) {
            value = (1.0f - smoothing) * ((row_max - z[t]) + log_sum);
            if (smoothing != 0.0f) {
                value += smoothing * (gap_sum / (float)classes + log_sum);
            }
        }
        lse_out[row] = row_max + log_sum;
        loss[row] = value;
    }
}

// grad_loss holds dL/dloss[row] for every row (for a mean: upstream / number of counted rows).
extern "C" __global__ void softmax_cross_entropy_backward(const float* __restrict__ logits,
                                                          const long long* __restrict__ target,
                                                          const float* __restrict__ lse,
                                                          const float* __restrict__ grad_loss,
                                                          float* __restrict__ grad_logits,
                                                          int rows, int classes,
                                                          long long ignore_index,
                                                          float smoothing) {
    const int row = blockIdx.x;
    if (row >= rows) return;
    const long long offset = (long long)row * classes;
    const long long t = target[row];
    const float g = (t == ignore_index) ? 0.0f : grad_loss[row];
    const float row_lse = lse[row];
    const float uniform = smoothing / (float)classes;
    const float hit = 1.0f - smoothing;
    for (int j = threadIdx.x; j < classes; j += blockDim.x) {
        float d = expf(logits[offset + j] - row_lse) - uniform;
        if (j == t) d -= hit;
        grad_logits[offset + j] = g * d;
    }
}
