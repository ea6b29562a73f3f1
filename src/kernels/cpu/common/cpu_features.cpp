#include "kernels/cpu/common/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace nibble::cpu {
namespace {
// AMX needs three things: the CPU's AMX-TILE and AMX-INT8 bits (cpuid leaf 7), the OS saving the
// tile state (XCR0 bits 17 and 18), and, on Linux, this process asking for the 8 KB tile-data
// state before its first tile instruction (without it the first one raises SIGILL).
bool amx_usable() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool amx_tile = (edx >> 24) & 1, amx_int8 = (edx >> 25) & 1;
  if (!amx_tile || !amx_int8) return false;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !((ecx >> 27) & 1)) return false;  // OSXSAVE
  uint32_t xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const uint64_t xcr0 = (static_cast<uint64_t>(xcr0_hi) << 32) | xcr0_lo;
  if ((xcr0 & (3ull << 17)) != (3ull << 17)) return false;
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
#endif
  return true;
}

// AVX512-BF16: cpuid leaf 7 subleaf 1, EAX bit 5 (the OS state is AVX-512's, already checked).
bool avx512_bf16_supported() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && ((eax >> 5) & 1);
}

Isa detect() {
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                __builtin_cpu_supports("avx512vnni");
  if (avx512 && avx2) {
    if (!avx512_bf16_supported()) return Isa::avx512;  // (no CPU has AMX without AVX512-BF16)
    return amx_usable() ? Isa::amx : Isa::avx512bf16;
  }
  return avx2 ? Isa::avx2 : Isa::scalar;
}

Isa env_limit(Isa detected) {
  const char* e = std::getenv("NIBBLE_ISA");
  if (!e) return detected;
  std::optional<Isa> parsed = parse_isa(e);
  // Read once at start-up, before any command can report errors, so this warns rather than fails.
  if (!parsed)
    std::fprintf(stderr, "nibble: NIBBLE_ISA=%s is not one of scalar, avx2, avx512, avx512bf16, amx; ignoring it\n", e);
  const Isa want = parsed.value_or(Isa::amx);
  return want < detected ? want : detected;
}

std::atomic<int>& limit_slot() {
  static std::atomic<int> slot{static_cast<int>(env_limit(detected_isa()))};
  return slot;
}
}  // namespace

bool amx_bf16_active() {
  // AMX-BF16 (leaf 7.0 EDX bit 22) for the tile products and AVX512-BF16 (leaf 7.1 EAX bit 5) for
  // the FP32 -> BF16 conversions while packing; every CPU with AMX so far has both.
  static const bool bf16 = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || !((edx >> 22) & 1)) return false;
    return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && ((eax >> 5) & 1);
  }();
  return bf16 && active_isa() >= Isa::amx;
}

Isa detected_isa() {
  static const Isa isa = detect();
  return isa;
}

Isa active_isa() { return static_cast<Isa>(limit_slot().load(std::memory_order_relaxed)); }

void set_isa_limit(Isa limit) {
  Isa d = detected_isa();
  limit_slot().store(static_cast<int>(limit < d ? limit : d), std::memory_order_relaxed);
}

std::optional<Isa> parse_isa(std::string_view name) {
  if (name == "scalar") return Isa::scalar;
  if (name == "avx2") return Isa::avx2;
  if (name == "avx512") return Isa::avx512;
  if (name == "avx512bf16") return Isa::avx512bf16;
  if (name == "amx" || name.empty()) return Isa::amx;
  return std::nullopt;
}

std::string_view to_string(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512-vnni";
    case Isa::avx512bf16: return "avx512-bf16";
    case Isa::amx: return "amx-int8";
  }
  return "?";
}

bool genuine_intel() {
  static const bool intel = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return false;
    char vendor[13] = {};
    std::memcpy(vendor, &ebx, 4);
    std::memcpy(vendor + 4, &edx, 4);
    std::memcpy(vendor + 8, &ecx, 4);
    return std::strcmp(vendor, "GenuineIntel") == 0;
  }();
  return intel;
}

}  // namespace nibble::cpu
