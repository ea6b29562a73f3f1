#include "common/wait_policy.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace nibble {

namespace {

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value && *value ? value : nullptr;
}

}  // namespace

void apply_default_wait_policy(char** argv) {
  if (env(kSpinCountSetByNibble) || env("OMP_WAIT_POLICY") || env("GOMP_SPINCOUNT")) return;
  // Marked before the exec, so that a program that comes back here (an exec that did not replace
  // the image cannot, but a wrapper that drops GOMP_SPINCOUNT could) never loops.
  if (::setenv(kSpinCountSetByNibble, kDefaultSpinCount, 1) != 0 || ::setenv("GOMP_SPINCOUNT", kDefaultSpinCount, 1) != 0)
    return;
  ::execv("/proc/self/exe", argv);
  // No /proc (a bare chroot): this process keeps libgomp's default, and says so in reports.
  ::unsetenv("GOMP_SPINCOUNT");
}

std::string describe_wait_policy() {
  const char* set_by_nibble = env(kSpinCountSetByNibble);
  const char* spin = env("GOMP_SPINCOUNT");
  const char* policy = env("OMP_WAIT_POLICY");
  if (set_by_nibble && spin && std::strcmp(set_by_nibble, spin) == 0 && !policy)
    return std::string("GOMP_SPINCOUNT=") + spin + " (nibble's default: spin briefly, then sleep)";
  std::string s;
  if (policy) s += std::string("OMP_WAIT_POLICY=") + policy;
  if (spin) s += (s.empty() ? "" : ", ") + std::string("GOMP_SPINCOUNT=") + spin;
  if (!s.empty()) return s + " (from the environment)";
  return "libgomp's default (300000 spins before a thread sleeps: slow on shared cores)";
}

void forget_default_wait_policy() {
  const char* set_by_nibble = env(kSpinCountSetByNibble);
  const char* spin = env("GOMP_SPINCOUNT");
  if (set_by_nibble && spin && std::strcmp(set_by_nibble, spin) == 0) ::unsetenv("GOMP_SPINCOUNT");
  ::unsetenv(kSpinCountSetByNibble);
}

}  // namespace nibble
