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
