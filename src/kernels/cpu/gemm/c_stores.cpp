// How GEMMs write a large overwritten C (gemm.h: c_stores): through the caches or streamed. Both
// give the same bits, so the choice is the CPU vendor's default, or $NIBBLE_C_STORES.
#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "kernels/cpu/common/cpu_features.h"
#include "kernels/cpu/gemm/gemm.h"

namespace nibble::cpu {
namespace {

// -1: not forced; else a CStores.
std::atomic<int>& forced_slot() {
  static std::atomic<int> slot{[] {
    const char* e = std::getenv("NIBBLE_C_STORES");
    if (!e) return -1;
    const std::optional<CStores> s = parse_c_stores(e);
    // Read before any command can report errors, so this warns rather than fails (as NIBBLE_ISA).
    if (!s) std::fprintf(stderr, "nibble: NIBBLE_C_STORES=%s is not cached or streaming; ignoring it\n", e);
    return s ? static_cast<int>(*s) : -1;
  }()};
  return slot;
}

}  // namespace

CStores c_stores() {
  const int forced = forced_slot().load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<CStores>(forced);
  return genuine_intel() ? CStores::streaming : CStores::cached;
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
