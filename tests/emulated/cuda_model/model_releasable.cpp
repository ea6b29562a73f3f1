// releasable_memory.cpp's own source compiled for the CUDA model and its virtual memory API (this
// folder's cuda_runtime.h and cuda.h), unchanged. A mutant build puts its altered copy first on the include path.
#include "kernels/cuda/releasable_memory.cpp"
