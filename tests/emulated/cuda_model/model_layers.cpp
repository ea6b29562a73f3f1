// layers.cu's own source compiled for the CUDA model (this folder's cuda_runtime.h): its kernels and
// host drivers, unchanged. A mutant build puts its altered copy first on the include path.
#include "kernels/cuda/layers.cu"
