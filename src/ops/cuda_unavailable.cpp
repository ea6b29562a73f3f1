// A build without the CUDA backend (no nvcc at configure time, or -DNIBBLE_CUDA=OFF).
#include "ops/backend.h"

namespace nibble::ops {

bool cuda_built() { return false; }

Backend& cuda() {
  throw UsageError("device=cuda: this nibble was built without the CUDA backend (CMake found no nvcc, or "
                   "-DNIBBLE_CUDA=OFF): install the CUDA toolkit, rebuild (make), or use device=cpu");
}

}  // namespace nibble::ops
