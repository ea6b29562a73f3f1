#include "ops/backend.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "ops/host_quantized.h"

namespace nibble::ops {

Backend& backend(Device d) { return d == Device::cuda ? cuda() : cpu(); }

std::string_view to_string(Device d) { return d == Device::cuda ? "cuda" : "cpu"; }

Device parse_device(std::string_view s) {
  if (s == "cpu") return Device::cpu;
  if (s == "cuda") return Device::cuda;
  throw UsageError("device '" + std::string(s) + "' is unknown: use cpu or cuda");
}


namespace {
template <typename Q>
Q& checked_host(Q& q, std::string_view user) {
  auto* h = dynamic_cast<std::conditional_t<std::is_const_v<Q>, const HostQuantized, HostQuantized>*>(&q);
  if (!h) {
    std::fprintf(stderr, "nibble: internal error: %.*s was handed a quantized tensor of the %.*s backend\n",
                 static_cast<int>(user.size()), user.data(), static_cast<int>(to_string(q.device()).size()),
                 to_string(q.device()).data());
    std::abort();
  }
  return q;
}
}  // namespace

// Backends without the pieces of distributed.shard=full's NVFP4 weight gather (which runs on CPUs:
// TrainConfig::validate refuses the mode elsewhere before any of these is reached).
float TensorOps::max_abs(const float*, int64_t) {
  throw UsageError("max_abs: not available on the " + std::string(to_string(device())) + " backend");
}
void TensorOps::quantize_rows_of(const float*, int64_t, int64_t, const QuantOptions&, float, Quantized&) {
  throw UsageError("quantizing rows of a sharded tensor is not available on the " + std::string(to_string(device())) +
                   " backend: distributed.shard=full runs on CPUs");
}
void TensorOps::load_quantized(QuantizedTensor, Quantized&) {
  throw UsageError("loading a gathered quantized tensor is not available on the " +
                   std::string(to_string(device())) + " backend: distributed.shard=full runs on CPUs");
}

QuantizedTensor& host_tensor(Quantized& q, std::string_view user) {
  return static_cast<HostQuantized&>(checked_host(q, user)).tensor;
}
const QuantizedTensor& host_tensor(const Quantized& q, std::string_view user) {
  return static_cast<const HostQuantized&>(checked_host(q, user)).tensor;
}

}  // namespace nibble::ops
