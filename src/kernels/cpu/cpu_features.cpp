#include "kernels/cpu/cpu_features.h"

#include <atomic>
#include <cstdlib>
#include <string>

namespace nibble::cpu {
namespace {
Isa detect() {
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                __builtin_cpu_supports("avx512vnni");
  return avx512 && avx2 ? Isa::avx512 : avx2 ? Isa::avx2 : Isa::scalar;
}

Isa env_limit(Isa detected) {
  const char* e = std::getenv("NIBBLE_ISA");
  if (!e) return detected;
  std::string s(e);
  Isa want = s == "scalar" ? Isa::scalar : s == "avx2" ? Isa::avx2 : Isa::avx512;
  return want < detected ? want : detected;
}

std::atomic<int>& limit_slot() {
  static std::atomic<int> slot{static_cast<int>(env_limit(detected_isa()))};
  return slot;
}
}  // namespace

Isa detected_isa() {
  static const Isa isa = detect();
  return isa;
}

Isa active_isa() { return static_cast<Isa>(limit_slot().load(std::memory_order_relaxed)); }

void set_isa_limit(Isa limit) {
  Isa d = detected_isa();
  limit_slot().store(static_cast<int>(limit < d ? limit : d), std::memory_order_relaxed);
}

std::string_view to_string(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512-vnni";
  }
  return "?";
}

}  // namespace nibble::cpu
