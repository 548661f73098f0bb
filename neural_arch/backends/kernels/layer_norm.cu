// LayerNorm over the last `cols` values of float32 rows, with affine weight and bias
// (pass ones and zeros for none). One block per row for the row kernels; blockDim.x a
// multiple of 32.
//   forward:  mean, rstd = 1 / sqrt(var + eps) (biased variance, two passes for accuracy),
//             y = (x - mean) * rstd * weight + bias; mean and rstd are saved per row.
//   backward: xhat = (x - mean) * rstd, gh = dy * weight,
//             dx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)),
//             dweight = sum over rows of dy * xhat, dbias = sum over rows of dy.
// Rows of a multiple of 4 floats, 16-byte aligned and at most NF_LN_QUADS float4s per thread,
// are read once into registers as float4s (unrolled, so the cache stays in registers); other
// rows are read from memory at each pass.
#include "block_reduce.cuh"

#define NF_LN_QUADS 2

__device__ __forceinline__ bool nf_ln_cached(int cols, unsigned long long addresses) {
    return (cols & 3) == 0 && (addresses & 15ULL) == 0 &&
           cols / 4 <= NF_LN_QUADS * (int)blockDim.x;
}

__device__ __forceinline__ float nf_sum4(float4 v) { return (v.x + v.y) + (v.z + v.w); }

extern "C" __global__ void layer_norm_forward(const float* __restrict__ x,
                                              const float* __restrict__ weight,
                                              const float* __restrict__ bias,
                                              float* __restrict__ y, float* __restrict__ mean_out,
                                              float* __restrict__ rstd_out, int rows, int cols,
                                              float eps) {
    __shared__ float scratch[32];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const long long offset = (long long)row * cols;
    const float* xr = x + offset;
    float* yr = y + offset;
    const unsigned long long addresses = reinterpret_cast<unsigned long long>(xr) |
        reinterpret_cast<unsigned long long>(yr) | reinterpret_cast<unsigned long long>(weight) |
        reinterpret_cast<unsigned long long>(bias);
    if (nf_ln_cached(cols, addresses)) {
        const int quads = cols / 4;
        float4 cache[NF_LN_QUADS];
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < NF_LN_QUADS; ++k) {
            const int q = threadIdx.x + k * blockDim.x;
            if (q < quads) {
                cache[k] = reinterpret_cast<const float4*>(xr)[q];
                sum += nf_sum4(cache[k]);
            }
        }
        const float mean = nf_block_sum(sum, scratch) / (float)cols;
        float squares = 0.0f;
#pragma unroll
        for (int k = 0; k < NF_LN_QUADS; ++k) {
            if (threadIdx.x + k * blockDim.x < quads) {
                const float4 d = {cache[k].x - mean, cache[k].y - mean, cache[k].z - mean,
                                  cache[k].w - mean};
                squares += (d.x * d.x + d.y * d.y) + (d.z * d.z + d.w * d.w);
            }
        }
        const float rstd = 1.0f / sqrtf(nf_block_sum(squares, scratch) / (float)cols + eps);
        if (threadIdx.x == 0) {
            mean_out[row] = mean;
            rstd_out[row] = rstd;
        }
#pragma unroll
        for (int k = 0; k < NF_LN_QUADS; ++k) {
            const int q = threadIdx.x + k * blockDim.x;
            if (q < quads) {
                const float4 w = reinterpret_cast<const float4*>(weight)[q];
                const float4 b = reinterpret_cast<const float4*>(bias)[q];
                reinterpret_cast<float4*>(yr)[q] = float4{
                    (cache[k].x - mean) * rstd * w.x + b.x, (cache[k].y - mean) * rstd * w.y + b.y,
                    (cache[k].z - mean) * rstd * w.z + b.z, (cache[k].w - mean) * rstd * w.w + b.w};
            }
        }
        return;
    }
    float sum = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) sum += xr[j];
    const float mean = nf_block_sum(sum, scratch) / (float)cols;
    float squares = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const float d = xr[j] - mean;
        squares += d * d;
    }
    const float var = nf_block_sum(squares, scratch) / (float)cols;
    const float rstd = 1.0f / sqrtf(var + eps);
    if (threadIdx.x == 0) {
        mean_out[row] = mean;
        rstd_out[row] = rstd;
    }
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        yr[j] = (xr[j] - mean) * rstd * weight[j] + bias[j];
    }
}

extern "C" __global__ void layer_norm_backward_input(const float* __restrict__ grad_out,
                                                     const float* __restrict__ x,
                                                     const float* __restrict__ weight,
                                                     const float* __restrict__ mean,
                                                     const float* __restrict__ rstd,
                                                     float* __restrict__ grad_in, int rows,
                                                     int cols) {
    __shared__ float scratch[32];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const long long offset = (long long)row * cols;
    const float* xr = x + offset;
    const float* gr = grad_out + offset;
    const float mu = mean[row];
    const float rs = rstd[row];
    float* dr = grad_in + offset;
    const unsigned long long addresses = reinterpret_cast<unsigned long long>(xr) |
        reinterpret_cast<unsigned long long>(gr) | reinterpret_cast<unsigned long long>(dr) |
        reinterpret_cast<unsigned long long>(weight);
    if (nf_ln_cached(cols, addresses)) {
        const int quads = cols / 4;
        float4 gh[NF_LN_QUADS], xhat[NF_LN_QUADS];
        float gh_sum = 0.0f, gh_xhat_sum = 0.0f;
#pragma unroll
        for (int k = 0; k < NF_LN_QUADS; ++k) {
            const int q = threadIdx.x + k * blockDim.x;
            if (q < quads) {
                const float4 g = reinterpret_cast<const float4*>(gr)[q];
                const float4 w = reinterpret_cast<const float4*>(weight)[q];
                const float4 v = reinterpret_cast<const float4*>(xr)[q];
                gh[k] = float4{g.x * w.x, g.y * w.y, g.z * w.z, g.w * w.w};
                xhat[k] = float4{(v.x - mu) * rs, (v.y - mu) * rs, (v.z - mu) * rs,
                                 (v.w - mu) * rs};
                gh_sum += nf_sum4(gh[k]);
                gh_xhat_sum += (gh[k].x * xhat[k].x + gh[k].y * xhat[k].y) +
                               (gh[k].z * xhat[k].z + gh[k].w * xhat[k].w);
            }
        }
        const float gh_mean = nf_block_sum(gh_sum, scratch) / (float)cols;
        const float gh_xhat_mean = nf_block_sum(gh_xhat_sum, scratch) / (float)cols;
#pragma unroll
        for (int k = 0; k < NF_LN_QUADS; ++k) {
            const int q = threadIdx.x + k * blockDim.x;
            if (q < quads) {
                reinterpret_cast<float4*>(dr)[q] = float4{
                    rs * (gh[k].x - gh_mean - xhat[k].x * gh_xhat_mean),
                    rs * (gh[k].y - gh_mean - xhat[k].y * gh_xhat_mean),
                    rs * (gh[k].z - gh_mean - xhat[k].z * gh_xhat_mean),
                    rs * (gh[k].w - gh_mean - xhat[k].w * gh_xhat_mean)};
            }
        }
        return;
    }
    float gh_sum = 0.0f;
    float gh_xhat_sum = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const float gh = gr[j] * weight[j];
        gh_sum += gh;
        gh_xhat_sum += gh * (xr[j] - mu) * rs;
    }
    const float gh_mean = nf_block_sum(gh_sum, scratch) / (float)cols;
    const float gh_xhat_mean = nf_block_sum(gh_xhat_sum, scratch) / (float)cols;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const float xhat = (xr[j] - mu) * rs;
        dr[j] = rs * (gr[j] * weight[j] - gh_mean - xhat * gh_xhat_mean);
    }
}

// Partial column sums for dweight and dbias. Block (32, 8): threadIdx.x picks the column,
// threadIdx.y strides over the block's `rows_per_block` rows. Block (bx, by) writes row `by`
// of the (gridDim.y, cols) partial arrays; the caller sums those over axis 0.
extern "C" __global__ void layer_norm_backward_params(const float* __restrict__ grad_out,
                                                      const float* __restrict__ x,
                                                      const float* __restrict__ mean,
                                                      const float* __restrict__ rstd,
                                                      float* __restrict__ dweight_partial,
                                                      float* __restrict__ dbias_partial,
                                                      int rows, int cols, int rows_per_block) {
    __shared__ float weight_acc[8][33];
    __shared__ float bias_acc[8][33];
    const int col = blockIdx.x * 32 + threadIdx.x;
    const int first = blockIdx.y * rows_per_block;
    const int last = (first + rows_per_block < rows) ? first + rows_per_block : rows;
    float dw = 0.0f;
    float db = 0.0f;
    if (col < cols) {
        for (int r = first + threadIdx.y; r < last; r += blockDim.y) {
            const long long at = (long long)r * cols + col;
            const float g = grad_out[at];
            dw += g * (x[at] - mean[r]) * rstd[r];
            db += g;
        }
    }
    weight_acc[threadIdx.y][threadIdx.x] = dw;
    bias_acc[threadIdx.y][threadIdx.x] = db;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        for (int k = 1; k < (int)blockDim.y; ++k) {
            dw += weight_acc[k][threadIdx.x];
            db += bias_acc[k][threadIdx.x];
        }
        dweight_partial[(long long)blockIdx.y * cols + col] = dw;
        dbias_partial[(long long)blockIdx.y * cols + col] = db;
    }
}
