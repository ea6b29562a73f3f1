// The quantized tensor of the backends that keep it in host memory (the CPU's): a QuantizedTensor
// behind the seam's Quantized interface.
#pragma once
#include <string_view>

#include "ops/backend.h"

namespace nibble::ops {

class HostQuantized final : public Quantized {
 public:
  HostQuantized() = default;
  explicit HostQuantized(QuantizedTensor t) : tensor(std::move(t)) {}
  Device device() const override { return Device::cpu; }
  const QuantizedLayout& layout() const override { return tensor.layout(); }
  float amax() const override { return tensor.amax; }
  int64_t stored_bytes() const override { return static_cast<int64_t>(tensor.codes.size() + tensor.scales.size()); }
  QuantizedTensor to_host() const override { return tensor; }

  QuantizedTensor tensor;
};

// The host tensor of q; an internal error when q belongs to another backend (`user` names the caller).
QuantizedTensor& host_tensor(Quantized& q, std::string_view user);
const QuantizedTensor& host_tensor(const Quantized& q, std::string_view user);

}  // namespace nibble::ops
