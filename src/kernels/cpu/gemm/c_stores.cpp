// How GEMMs write a large overwritten C (gemm.h: c_stores): through the caches or streamed. Both
// give the same bits: streamed from AVX2 up (measured faster on Intel and AMD), or $NIBBLE_C_STORES.

#include "kernels/cpu/common/cpu_features.h"
#include "kernels/cpu/common/forced_choice.h"
#include "kernels/cpu/gemm/gemm.h"

namespace nibble::cpu {
namespace {

std::atomic<int>& forced_slot() {
  return forced_choice<CStores>("NIBBLE_C_STORES", &parse_c_stores, "cached or streaming");
}

}  // namespace

CStores c_stores() {
  if (active_isa() < Isa::avx2) return CStores::cached;  // streaming is by whole AVX2/AVX-512 vectors
  const int forced = forced_slot().load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<CStores>(forced);
  return CStores::streaming;
}

void set_c_stores(std::optional<CStores> stores) {
  forced_slot().store(stores ? static_cast<int>(*stores) : -1, std::memory_order_relaxed);
}

std::string_view to_string(CStores stores) { return stores == CStores::streaming ? "streaming" : "cached"; }

std::optional<CStores> parse_c_stores(std::string_view name) {
  if (name == "cached") return CStores::cached;
  if (name == "streaming") return CStores::streaming;
  return std::nullopt;
}

}  // namespace nibble::cpu
