// Where quantize, dequantize and compare write (io/write_rules.h, docs/run-directory.md "What nibble
// writes"): a device node or FIFO given as -o is written in place and stays what it was, a symlink
// is followed to its file and stays a symlink, and an output inside a run or data directory or
// among the inputs is refused (exit 2) with every byte of the run as it was. Through the command.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/npy.h"
#include "run/checkpoint.h"
#include "support/cli.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using cli_test::contains;
using cli_test::file_bytes;
using cli_test::Result;
using cli_test::run;

namespace {

fs::path work_dir() { return nibble_test::process_dir("test_output_safety"); }

class OutputSafety : public ::testing::Test {
 protected:
  // One tiny trained run and its data directory, shared by the suite's tests.
  static void SetUpTestSuite() {
    cli_test::set_up_tiny_run(work_dir(), data(), work_dir() / "tiny.yaml", /*steps=*/4, /*layers=*/1);
    const Result r = run("train " + (work_dir() / "tiny.yaml").string() + " run.dir=" + run_dir().string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<float> values(256, 0.5f);
    const int64_t shape[2] = {4, 64};
    nibble::io::write_npy(npy(), values, shape);
    ASSERT_EQ(run("quantize " + npy().string() + " -o " + quantized().string() + " --format nvfp4").exit_code, 0);
  }
  static void TearDownTestSuite() {
    if (!::testing::Test::HasFailure()) fs::remove_all(work_dir());
  }
  static fs::path data() { return work_dir() / "data"; }
  static fs::path run_dir() { return work_dir() / "run"; }
  static fs::path npy() { return work_dir() / "x.npy"; }
  static fs::path quantized() { return work_dir() / "x.safetensors"; }

  // The three commands that write one file, each with `out` as -o.
  static std::vector<std::string> writing_to(const fs::path& out) {
    return {"quantize " + npy().string() + " --format nvfp4 -o " + out.string(),
            "dequantize " + quantized().string() + " -o " + out.string(),
            "compare " + run_dir().string() + " -o " + out.string()};
  }
};

// Not as root: a regression would then rename a file over the machine's /dev/null (the test below
// checks the same on a node of its own); as a user, such a regression fails on /dev's permissions.
TEST_F(OutputSafety, DevNullStaysACharacterDevice) {
  if (::geteuid() == 0) GTEST_SKIP() << "as root, DeviceNodeIsWrittenInPlace checks this on a node of its own";
  for (const std::string& command : writing_to("/dev/null")) {
    const Result r = run(command);
    EXPECT_EQ(r.exit_code, 0) << command << ": " << r.output;
    EXPECT_TRUE(fs::is_character_file("/dev/null")) << command;
  }
}

// As root a device node made for the test: the write reaches the device, the node stays.
TEST_F(OutputSafety, DeviceNodeIsWrittenInPlace) {
  if (::geteuid() != 0) GTEST_SKIP() << "making a device node needs root";
  const fs::path node = work_dir() / "null-node";
  fs::remove(node);
  ASSERT_EQ(::mknod(node.c_str(), S_IFCHR | 0666, ::makedev(1, 3)), 0);
  for (const std::string& command : writing_to(node)) {
    const Result r = run(command);
    EXPECT_EQ(r.exit_code, 0) << command << ": " << r.output;
    EXPECT_TRUE(fs::is_character_file(node)) << command;
  }
}

// A FIFO receives exactly the bytes a regular file would and is still a FIFO afterwards. The reader
// is `timeout 60 cat`, so a regression that renamed over the FIFO fails instead of hanging.
TEST_F(OutputSafety, FifoReceivesTheBytesInPlace) {
  const fs::path fifo = work_dir() / "pipe", received = work_dir() / "received", regular = work_dir() / "regular";
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const Result r = cli_test::run_program("(timeout 60 cat " + fifo.string() + " > " + received.string() + " &) ; " +
                                         std::string(NIBBLE_BINARY_DIR) + "/nibble quantize " + npy().string() +
                                         " --format nvfp4 -o " + fifo.string() + "; status=$?; wait; exit $status");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(run("quantize " + npy().string() + " --format nvfp4 -o " + regular.string()).exit_code, 0);
  for (int i = 0; i < 600 && file_bytes(received) != file_bytes(regular); ++i) ::usleep(100000);  // cat's last write
  EXPECT_EQ(file_bytes(received), file_bytes(regular));
  EXPECT_TRUE(fs::is_fifo(fifo));
}

// A symlink output is followed: its target gets the file, the link stays a link.
TEST_F(OutputSafety, SymlinkIsFollowedNotReplaced) {
  const fs::path link = work_dir() / "link.npy", target = work_dir() / "target.npy";
  fs::remove(link);
  fs::remove(target);
  fs::create_symlink("target.npy", link);
  const Result r = run("dequantize " + quantized().string() + " -o " + link.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_TRUE(fs::is_regular_file(target));
  const Result again = run("dequantize " + quantized().string() + " -o " + link.string());
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(fs::is_symlink(link));
}

// No output inside a run (compare -o RUN/checkpoints/step_N/model.safetensors wrote a PNG over the
// weights) or a data directory, whatever the command.
TEST_F(OutputSafety, OutputsInsideARunOrDataDirectoryAreRefused) {
  const auto checkpoints = nibble::train::list_checkpoints(run_dir());
  ASSERT_FALSE(checkpoints.empty());
  const fs::path weights = checkpoints.back() / "model.safetensors";
  const auto weights_before = file_bytes(weights), config_before = file_bytes(run_dir() / "config.yaml");
  for (const fs::path& out : {weights, run_dir() / "config.yaml", run_dir() / "loss.png", data() / "train-00000.bin",
                              data() / "new.npy"}) {
    for (const std::string& command : writing_to(out)) {
      const Result r = run(command);
      EXPECT_EQ(r.exit_code, 2) << command << ": " << r.output;
      EXPECT_TRUE(contains(r.output, "lies inside the run directory") ||
                  contains(r.output, "lies inside the data directory"))
          << command << ": " << r.output;
    }
  }
  EXPECT_EQ(file_bytes(weights), weights_before);
  EXPECT_EQ(file_bytes(run_dir() / "config.yaml"), config_before);
  EXPECT_FALSE(fs::exists(run_dir() / "loss.png"));
  EXPECT_FALSE(fs::exists(data() / "new.npy"));
}

// compare's plot never replaces a run it reads, nor a directory: refused, not renamed over.
TEST_F(OutputSafety, CompareOutputThatIsARunOrADirectoryIsRefused) {
  const Result self = run("compare " + run_dir().string() + " -o " + run_dir().string());
  EXPECT_EQ(self.exit_code, 2) << self.output;
  const Result dir = run("compare " + run_dir().string() + " -o " + work_dir().string());
  EXPECT_EQ(dir.exit_code, 2) << dir.output;
  EXPECT_TRUE(fs::is_directory(run_dir() / "checkpoints"));
  const Result fine = run("compare " + run_dir().string() + " -o " + (work_dir() / "loss.png").string());
  EXPECT_EQ(fine.exit_code, 0) << fine.output;
}

}  // namespace

namespace {

// Inputs that never end: a device as the config file, or as a run's metrics.jsonl behind a symlink,
// is refused at once (both were read until memory ran out). A FIFO stays a stream that is read.
TEST_F(OutputSafety, DevicesAsInputsAreRefusedNotReadForever) {
  // `timeout 60`: a regression reading the device fails the test instead of hanging it.
  const std::string nibble = "timeout 60 " + std::string(NIBBLE_BINARY_DIR) + "/nibble ";
  const Result config = cli_test::run_program(nibble + "train /dev/zero");
  EXPECT_EQ(config.exit_code, 2) << config.output;
  EXPECT_TRUE(contains(config.output, "is a device")) << config.output;
  const fs::path copy = work_dir() / "metrics-is-a-device";
  fs::remove_all(copy);
  fs::create_directories(copy / "checkpoints");
  fs::copy_file(run_dir() / "config.yaml", copy / "config.yaml");
  fs::create_symlink("/dev/zero", copy / "metrics.jsonl");
  const Result compare = cli_test::run_program(nibble + "compare " + copy.string() + " -o " + (work_dir() / "device.png").string());
  EXPECT_EQ(compare.exit_code, 2) << compare.output;
  EXPECT_TRUE(contains(compare.output, "is not a regular file")) << compare.output;
  const Result streamed = cli_test::run_program("bash -c '" + std::string(NIBBLE_BINARY_DIR) +
                                                "/nibble train <(printf \"steps: 3\\n\")'");
  EXPECT_EQ(streamed.exit_code, 2) << streamed.output;  // read, then refused for what it lacks
  EXPECT_TRUE(contains(streamed.output, "data.dir is not set")) << streamed.output;
}

}  // namespace
