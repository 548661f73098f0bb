// Softmax cross-entropy over rows of float32 logits (rows, classes), integer (int64) targets,
// PyTorch's ignore_index and label smoothing. One block per row; blockDim.x a multiple of 32.
//   forward:  lse = max + log(sum exp(z - max))            (numerically stable)
//             loss = (1 - s) (lse - z[t]) + s (lse - mean(z)),  0 where t == ignore_index,
//             both formed from gaps to the max, which large logits do not round away
//   backward: dz = g * (softmax(z) - (1 - s) onehot(t) - s / classes),  0 where ignored
// The per-row loss and lse are written; the caller reduces (mean over non-ignored rows, sum).
// The forward reads each row once: every thread keeps a running max and a sum of exp(z - max)
// rescaled whenever its max grows, and the block combines them. Rows whose length is a
// multiple of 4 and that start 16-byte aligned are read (and the gradient written) as float4s.
#include "block_reduce.cuh"

// Calls f(j, z[j]) for this thread's elements of a row of `width` floats.
template <typename F>
__device__ __forceinline__ void nf_row_each(const float* __restrict__ z, int width, F f) {
    if ((width & 3) == 0 && (reinterpret_cast<unsigned long long>(z) & 15ULL) == 0) {
        const float4* z4 = reinterpret_cast<const float4*>(z);
        for (int q = threadIdx.x; q < width / 4; q += blockDim.x) {
            const float4 v = z4[q];
            f(4 * q, v.x);
            f(4 * q + 1, v.y);
            f(4 * q + 2, v.z);
            f(4 * q + 3, v.w);
        }
        return;
    }
    for (int j = threadIdx.x; j < width; j += blockDim.x) f(j, z[j]);
}

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
    // sum(z - first) stays small where a sum of z would round; a masked (-inf) first logit
    // would make it inf - inf, so 0 stands in for it
    const float first = (fabsf(z[0]) < __int_as_float(0x7f800000)) ? z[0] : 0.0f;
    float own_max = NF_NEG_INF, own_sum = 0.0f, shifted_sum = 0.0f;
    nf_row_each(z, classes, [&](int, float v) {
        if (v > own_max) {
            own_sum = own_sum * expf(own_max - v) + 1.0f;
            own_max = v;
        } else if (own_max != NF_NEG_INF) {  // -inf after -inf adds nothing (and no NaN)
            own_sum += expf(v - own_max);
        }
        shifted_sum += v - first;
    });
    const float row_max = nf_block_max(own_max, scratch);
    const float rescaled = (own_max == NF_NEG_INF) ? 0.0f : own_sum * expf(own_max - row_max);
    const float exp_sum = nf_block_sum(rescaled, scratch);
    if (smoothing != 0.0f) shifted_sum = nf_block_sum(shifted_sum, scratch);
    if (threadIdx.x == 0) {
        // lse - z[t] as (max - z[t]) + log(sum): with large logits, lse itself rounds to the
        // float32 grid of its magnitude (1/512 near 3e4), which a small loss cannot afford
        const float log_sum = logf(exp_sum);
        const long long t = target[row];
        float value = 0.0f;
        if (t != ignore_index) {
            value = (1.0f - smoothing) * ((row_max - z[t]) + log_sum);
            if (smoothing != 0.0f) {  // lse - mean(z) = (max - first) - mean(z - first) + log
                const float mean_gap = (row_max - first) - shifted_sum / (float)classes;
                value += smoothing * (mean_gap + log_sum);
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
    const float* z = logits + offset;
    float* out = grad_logits + offset;
    const auto slope = [&](int j, float v) {
        const float d = expf(v - row_lse) - uniform;
        return g * (j == t ? d - hit : d);
    };
    if ((classes & 3) == 0 &&
        ((reinterpret_cast<unsigned long long>(z) | reinterpret_cast<unsigned long long>(out)) &
         15ULL) == 0) {
        const float4* z4 = reinterpret_cast<const float4*>(z);
        float4* out4 = reinterpret_cast<float4*>(out);
        for (int q = threadIdx.x; q < classes / 4; q += blockDim.x) {
            const float4 v = z4[q];
            const int j = 4 * q;
            out4[q] = float4{slope(j, v.x), slope(j + 1, v.y), slope(j + 2, v.z),
                             slope(j + 3, v.w)};
        }
        return;
    }
    for (int j = threadIdx.x; j < classes; j += blockDim.x) out[j] = slope(j, z[j]);
}
