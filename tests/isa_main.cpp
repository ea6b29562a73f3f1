// main() of every test binary. Plain GoogleTest, except for the per-ISA runs that tests/CMakeLists.txt
// registers (NIBBLE_TEST_ISA_RUN set, NIBBLE_ISA naming a level): those first check that this CPU
// can run the requested level below its best one, and otherwise skip (exit 77, ctest's
// SKIP_RETURN_CODE) saying why, so that every machine runs each path it has exactly once.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/cpu/common/cpu_features.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  namespace cpu = nibble::cpu;
  if (std::getenv("NIBBLE_TEST_ISA_RUN") != nullptr) {
    const char* name = std::getenv("NIBBLE_ISA");
    const auto isa = cpu::parse_isa(name ? name : "?");
    if (!isa) {
      std::fprintf(stderr, "per-ISA run: NIBBLE_ISA=%s is not one of scalar, avx2, avx512, avx512bf16, amx\n", name ? name : "(unset)");
      return 1;
    }
    const cpu::Isa best = cpu::detected_isa();
    if (*isa > best) {
      std::printf("skipped: NIBBLE_ISA=%s needs %s kernels; this CPU's best is %s\n", name,
                  std::string(cpu::to_string(*isa)).c_str(), std::string(cpu::to_string(best)).c_str());
      return 77;
    }
    if (*isa == best) {
      std::printf("skipped: %s is this CPU's best level, which the uncapped run of these tests covers\n",
                  std::string(cpu::to_string(best)).c_str());
      return 77;
    }
    std::printf("kernels capped at %s (this CPU's best: %s)\n", std::string(cpu::to_string(*isa)).c_str(),
                std::string(cpu::to_string(best)).c_str());
  }
  return RUN_ALL_TESTS();
}
