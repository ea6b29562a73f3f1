// Directories the tests write in, under the build tree: BUILD/SUITE_tmp/PID. One per process:
// ctest runs each test of a binary as its own process, in parallel, and the isa_* runs start some
// of the same tests again beside the plain run.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace nibble_test {

// BUILD/SUITE_tmp/PID (not created).
inline std::filesystem::path process_dir(const std::string& suite) {
  return std::filesystem::path(NIBBLE_BINARY_DIR) / (suite + "_tmp") / std::to_string(::getpid());
}

namespace detail {
// Removes the process's directory at exit when every test passed (kept for inspection otherwise).
struct RemoveWhenPassed {
  std::filesystem::path dir;
  ~RemoveWhenPassed() {
    if (!::testing::UnitTest::GetInstance()->Passed()) return;
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
};
}  // namespace detail

// process_dir(suite) / name, empty. The process directory goes at exit if every test passed. One
// suite name per test binary.
inline std::filesystem::path fresh_dir(const std::string& suite, const std::string& name) {
  static const detail::RemoveWhenPassed cleanup{process_dir(suite)};
  const std::filesystem::path d = cleanup.dir / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace nibble_test
