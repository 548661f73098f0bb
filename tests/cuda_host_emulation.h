// Runs CUDA kernels on the CPU, for tests on machines without a GPU.
//
// Blocks run one after another; the threads of a block are real std::threads, so
// __syncthreads is a barrier over the block and __shfl_xor_sync a barrier-exchanged value
// within a warp. Shared memory (`__shared__`) becomes a function-static array: one instance,
// which is correct because only one block runs at a time. This checks a kernel's indexing,
// reductions and barrier placement, not the GPU memory model or its float rounding.
#pragma once

#include <barrier>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

struct alignas(16) float4 {
    float x, y, z, w;
};

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static

static dim3 blockIdx, blockDim, gridDim;
static thread_local dim3 threadIdx;
static std::unique_ptr<std::barrier<>> emu_block_barrier;
static std::vector<std::unique_ptr<std::barrier<>>> emu_warp_barriers;
static float emu_exchange[1024];

inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }

inline unsigned emu_linear_thread() { return threadIdx.y * blockDim.x + threadIdx.x; }

inline float __shfl_xor_sync(unsigned, float value, int lane_mask) {
    const unsigned me = emu_linear_thread();
    std::barrier<>& warp = *emu_warp_barriers[me / 32];
    emu_exchange[me] = value;
    warp.arrive_and_wait();
    const float other = emu_exchange[me ^ static_cast<unsigned>(lane_mask)];
    warp.arrive_and_wait();
    return other;
}

inline float __int_as_float(unsigned bits) {
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

template <typename... Args, std::size_t... I>
void emu_call(void (*kernel)(Args...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_reference_t<Args>*>(args[I])...);
}

// Launch `kernel` over a (gx, gy) grid of (bx, by) blocks; args[i] points at argument i.
template <typename... Args>
void emu_launch(void (*kernel)(Args...), unsigned gx, unsigned gy, unsigned bx, unsigned by,
                void** args) {
    gridDim = dim3{gx, gy, 1};
    blockDim = dim3{bx, by, 1};
    const unsigned threads = bx * by;
    for (unsigned y = 0; y < gy; ++y) {
        for (unsigned x = 0; x < gx; ++x) {
            blockIdx = dim3{x, y, 1};
            emu_block_barrier = std::make_unique<std::barrier<>>(threads);
            emu_warp_barriers.clear();
            for (unsigned w = 0; w < (threads + 31) / 32; ++w) {
                emu_warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
            }
            std::vector<std::thread> pool;
            for (unsigned t = 0; t < threads; ++t) {
                pool.emplace_back([=] {
                    threadIdx = dim3{t % bx, t / bx, 1};
                    emu_call(kernel, args, std::index_sequence_for<Args...>{});
                });
            }
            for (auto& thread : pool) thread.join();
        }
    }
}
