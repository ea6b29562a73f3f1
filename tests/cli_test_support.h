// What the tests that run the nibble command share (test_train_cli, test_export): running it with
// its output captured, and the tiny corpus their fixtures train on.
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

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

}  // namespace cli_test
