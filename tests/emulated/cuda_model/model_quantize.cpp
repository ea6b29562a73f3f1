// quantize.cu's own source (with nvfp4_kernels.cuh) compiled for the CUDA model (this folder's
// cuda_runtime.h): its kernels and host drivers, unchanged. A mutant build puts its altered copy
// first on the include path.
#include "kernels/cuda/quantize.cu"
