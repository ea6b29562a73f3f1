// A build without the CUDA backend (no nvcc at configure time, or -DNIBBLE_CUDA=OFF).
#include "ops/backend.h"

namespace nibble::ops {

bool cuda_built() { return false; }

namespace {
[[noreturn]] void no_cuda_backend() {
  throw UsageError("device=cuda: this nibble was built without the CUDA backend (CMake found no nvcc, or "
                   "-DNIBBLE_CUDA=OFF): install the CUDA toolkit, rebuild (make), or use device=cpu");
}
}  // namespace

Backend& cuda() { no_cuda_backend(); }
int cuda_device_count() { return 0; }
void select_cuda_device(int) { no_cuda_backend(); }
uint64_t cuda_device_fingerprint() { no_cuda_backend(); }
bool nccl_built() { return false; }
CollectiveId new_cuda_collective_id() { no_cuda_backend(); }
std::unique_ptr<Collective> connect_cuda_ranks(const CollectiveId&, int, int) { no_cuda_backend(); }

}  // namespace nibble::ops
