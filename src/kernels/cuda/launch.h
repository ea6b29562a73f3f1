// Kernel launches are written NIBBLE_LAUNCH(grid, block, shared_bytes, stream, kernel)(args...), the
// same as kernel<<<grid, block, shared_bytes, stream>>>(args...) under nvcc. The spelling lets the
// kernels' own source compile with a host compiler against tests/emulated/cuda_model/ (a software
// model of CUDA that runs every block's threads), so CI executes the kernels without a GPU.
#pragma once

#if defined(NIBBLE_CUDA_MODEL)
#define NIBBLE_LAUNCH(grid, block, shared_bytes, stream, ...) NIBBLE_MODEL_LAUNCH(grid, block, shared_bytes, stream, __VA_ARGS__)
#else
#define NIBBLE_LAUNCH(grid, block, shared_bytes, stream, ...) __VA_ARGS__<<<grid, block, shared_bytes, stream>>>
#endif

// The largest gridDim.y a launch uses (the hardware's limit is 65535); kernels with more row tiles
// than that loop over them with a gridDim.y stride. The CUDA model's build lowers it, so that those
// loops, which on a GPU only start past ~1M rows, turn several times on the tests' small shapes.
#if !defined(NIBBLE_CUDA_MAX_GRID_Y)
#define NIBBLE_CUDA_MAX_GRID_Y 65535
#endif
static_assert(NIBBLE_CUDA_MAX_GRID_Y >= 1 && NIBBLE_CUDA_MAX_GRID_Y <= 65535, "gridDim.y is at most 65535");
