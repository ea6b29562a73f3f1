// gemm.cu's own source compiled for the CUDA model: its cuBLASLt plumbing (plans, descriptors,
// fallbacks) runs against the model's recording cuBLASLt (cublasLt.h), its kernels on the model.
#include "kernels/cuda/gemm.cu"
