// LayerNorm over the last `cols` values of float32 rows, with affine weight and bias
// (pass ones and zeros for none). One block per row for the row kernels; blockDim.x a
// multiple of 32.
//   forward:  mean, rstd = 1 / sqrt(var + eps) (biased variance, two passes for accuracy),
//             y = (x - mean) * rstd * weight + bias; mean and rstd are saved per row.
//   backward: xhat = (x - mean) * rstd, gh = dy * weight,
//             dx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)),
//             dweight = sum over rows of dy * xhat, dbias = sum over rows of dy.
#include "block_reduce.cuh"

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
    float* yr = y + offset;
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
    float gh_sum = 0.0f;
    float gh_xhat_sum = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const float gh = gr[j] * weight[j];
        gh_sum += gh;
        gh_xhat_sum += gh * (xr[j] - mu) * rs;
    }
    const float gh_mean = nf_block_sum(gh_sum, scratch) / (float)cols;
    const float gh_xhat_mean = nf_block_sum(gh_xhat_sum, scratch) / (float)cols;
    float* dr = grad_in + offset;
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
