// nccl_collective.cu's own source compiled for the CUDA model and its NCCL model (this folder's
// cuda_runtime.h and nccl.h), unchanged. A mutant build puts its altered copy first on the include path.
#include "kernels/cuda/nccl_collective.cu"
