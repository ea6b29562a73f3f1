// Blackwell (sm_100a / sm_103a) instantiations of the NVFP4 quantize kernel: the E2M1 conversion
// becomes cvt.rn.satfinite.e2m1x2.f32 (bit-identical to the reference's comparisons for the finite
// inputs the chain produces) and, on request, cvt.rs stochastic rounding. Built only for those
// architectures (a separate object library), so the portable library carries no Blackwell PTX.
#include <cuda_bf16.h>

#include "kernels/cuda/nvfp4_kernels.cuh"

namespace nibble::cuda::detail {

void launch_nvfp4_tile_kernel_sm100(const Nvfp4TileParams& p, bool input_is_bf16, bool hardware_sr,
                                    cudaStream_t stream) {
  if (hardware_sr) {
    if (input_is_bf16)
      launch_nvfp4_tile_kernel<__nv_bfloat16, EncoderSet::hardware_rn_and_sr>(p, stream);
    else
      launch_nvfp4_tile_kernel<float, EncoderSet::hardware_rn_and_sr>(p, stream);
  } else {
    if (input_is_bf16)
      launch_nvfp4_tile_kernel<__nv_bfloat16, EncoderSet::hardware_rn>(p, stream);
    else
      launch_nvfp4_tile_kernel<float, EncoderSet::hardware_rn>(p, stream);
  }
}

}  // namespace nibble::cuda::detail
