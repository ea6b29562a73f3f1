// What the tests that run the nibble command share (test_train_cli, test_export, test_distributed):
// running it with its output captured, the tiny corpus their fixtures train on, and reading a run
// directory back.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/data.h"

namespace cli_test {

struct Result {
  int exit_code = -1;  // -signal when killed
  std::string output;
};

// A shell command line with stdout and stderr together; `env` is prefixed to it (e.g.
// "ulimit -v 3000000;" or "NIBBLE_ISA=scalar").
inline Result run_program(const std::string& command_line, const std::string& env = "") {
  const std::string cmd = env + " " + command_line + " 2>&1";
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, p)) > 0;) r.output.append(buffer, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? -WTERMSIG(status) : -1000;
  return r;
}

// `nibble ARGS`.
inline Result run(const std::string& args, const std::string& env = "") {
  return run_program(std::string(NIBBLE_BINARY_DIR) + "/nibble " + args, env);
}

// The same through the tests' driver program (support/nibble_with_faults.cpp), which injects the
// faults `faults` names (--fault NAME=VALUE words) into `nibble train`.
inline Result run_with_faults(const std::string& faults, const std::string& args, const std::string& env = "") {
  return run_program(std::string(NIBBLE_BINARY_DIR) + "/nibble_with_faults " + faults + " " + args, env);
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The first 60,000 characters of the shipped tinyshakespeare.txt as WORK/corpus.txt, prepared into
// `data_dir` by `nibble prepare` (character tokenizer): the fixtures' training data.
inline Result prepare_tiny_corpus(const std::filesystem::path& work, const std::filesystem::path& data_dir) {
  const std::string text = nibble::train::read_text_file(std::string(NIBBLE_SOURCE_DIR) + "/data/tinyshakespeare.txt");
  std::ofstream(work / "corpus.txt") << text.substr(0, 60000);
  return run("prepare " + (work / "corpus.txt").string() + " -o " + data_dir.string());
}

// The CLI fixtures' setup: WORK emptied, the tiny corpus prepared into DATA, and CONFIG a tiny NVFP4
// run of `steps` steps on a model of `layers` blocks (2 heads, width 32, context 32), evaluating
// and checkpointing every 4 steps (keeping 5), logging every step, on 2 threads.
inline void set_up_tiny_run(const std::filesystem::path& work, const std::filesystem::path& data,
                            const std::filesystem::path& config, int steps, int layers) {
  std::filesystem::remove_all(work);
  std::filesystem::create_directories(work);
  const Result p = prepare_tiny_corpus(work, data);
  ASSERT_EQ(p.exit_code, 0) << p.output;
  std::ofstream(config) << "data:\n  dir: " << data.string() << "\n"
                        << "steps: " << steps << "\nbatch: 2\nquantization: nvfp4\n"
                        << "model:\n  layers: " << layers << "\n  heads: 2\n  width: 32\n  context: 32\n"
                        << "schedule:\n  lr: 0.003\n  warmup_steps: 2\n"
                           "eval:\n  interval: 4\n  batches: 2\n"
                           "checkpoint:\n  interval: 4\n  keep: 5\n"
                           "log:\n  interval: 1\nthreads: 2\n";
}

// Every train record's (step, loss) and eval record's (step, val_loss) of RUN/metrics.jsonl, exact.
inline std::vector<std::string> loss_curve(const std::filesystem::path& run_dir) {
  std::ifstream in(run_dir / "metrics.jsonl");
  std::vector<std::string> curve;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    const bool train = j["kind"] == "train";
    curve.push_back(std::string(train ? "train " : "eval ") + std::to_string(j["step"].get<int64_t>()) + " " +
                    j[train ? "loss" : "val_loss"].dump());
  }
  return curve;
}

inline std::vector<uint8_t> file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

}  // namespace cli_test
