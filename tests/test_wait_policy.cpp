// How long nibble's OpenMP threads spin before they sleep (common/wait_policy.h): the nibble command
// starts itself again with GOMP_SPINCOUNT set when the user set neither OMP_WAIT_POLICY nor
// GOMP_SPINCOUNT, keeps the user's setting otherwise, and says which is in force in the run's
// start-up report; PyTorch's benchmark (a child that is not nibble) gets the user's environment.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "common/wait_policy.h"
#include "support/cli.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;

namespace {

using cli_test::contains;
using cli_test::Result;

fs::path work_dir() { return nibble_test::process_dir("test_wait_policy"); }

// The environment of a user who set none of the three variables, then `extra`.
const std::string kClean = "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u NIBBLE_GOMP_SPINCOUNT_SET";

// One step of a tiny run started with `env`: its console output (the start-up report included).
Result one_step(const std::string& env, const std::string& name) {
  const fs::path work = work_dir() / name, data = work / "data", config = work / "run.yaml";
  cli_test::set_up_tiny_run(work, data, config, 2, 1);
  return cli_test::run("train " + config.string() + " run.dir=" + (work / "run").string(), env);
}

TEST(WaitPolicy, TheCommandSetsABoundedSpinWhenTheUserSetNone) {
  const Result r = one_step(kClean, "default");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, std::string("OpenMP waits: GOMP_SPINCOUNT=") + nibble::kDefaultSpinCount +
                                     " (nibble's default"))
      << r.output;
}

TEST(WaitPolicy, TheUsersSettingIsKept) {
  Result r = one_step(kClean + " OMP_WAIT_POLICY=passive", "passive");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "OpenMP waits: OMP_WAIT_POLICY=passive (from the environment)")) << r.output;
  r = one_step(kClean + " GOMP_SPINCOUNT=2000", "spincount");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "OpenMP waits: GOMP_SPINCOUNT=2000 (from the environment)")) << r.output;
}

// In this test process: what describe_wait_policy() reads, and what a child that is not nibble
// is left with.
class WaitPolicyEnvironment : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT", nibble::kSpinCountSetByNibble}) ::unsetenv(name);
  }
  void TearDown() override { SetUp(); }
};

TEST_F(WaitPolicyEnvironment, DescribesLibgompsDefaultWhenNothingIsSet) {
  EXPECT_TRUE(nibble::describe_wait_policy().starts_with("libgomp's default")) << nibble::describe_wait_policy();
}

TEST_F(WaitPolicyEnvironment, AChildForgetsOnlyWhatNibbleSet) {
  ::setenv("GOMP_SPINCOUNT", nibble::kDefaultSpinCount, 1);
  ::setenv(nibble::kSpinCountSetByNibble, nibble::kDefaultSpinCount, 1);
  EXPECT_TRUE(contains(nibble::describe_wait_policy(), "nibble's default")) << nibble::describe_wait_policy();
  nibble::forget_default_wait_policy();
  EXPECT_EQ(::getenv("GOMP_SPINCOUNT"), nullptr);
  EXPECT_EQ(::getenv(nibble::kSpinCountSetByNibble), nullptr);

  // A user's own GOMP_SPINCOUNT (the marker then never set: nibble did not start itself again) stays.
  ::setenv("GOMP_SPINCOUNT", "123", 1);
  nibble::forget_default_wait_policy();
  ASSERT_NE(::getenv("GOMP_SPINCOUNT"), nullptr);
  EXPECT_STREQ(::getenv("GOMP_SPINCOUNT"), "123");
  EXPECT_EQ(nibble::describe_wait_policy(), "GOMP_SPINCOUNT=123 (from the environment)");
}

}  // namespace
