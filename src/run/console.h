// What the run driver prints: rank 0 alone prints (the other ranks only compute), and on a terminal
// the progress of each step is one line rewritten in place, which every other message first clears.
#pragma once
#include <cstdio>
#include <string>

namespace nibble::train {

class Console {
 public:
  // `live`: `out` is a terminal of a single-process run (under mpirun a rank's stdout may be a pty
  // that mpirun forwards line by line: no in-place progress there).
  Console(std::FILE* out, bool root, bool live) : out_(out), root_(root), live_(live) {}

  void print(const std::string& text) const {
    if (!root_) return;
    std::fputs(text.c_str(), out_);
    std::fflush(out_);
  }
  // The escape that clears the in-place line before a message (nothing when not live).
  const char* clear_line() const { return live_ ? "\r\033[K" : ""; }
  // Ends the in-place line before an error message, so that the error starts on a line of its own.
  void end_live_line() const {
    if (live_) print("\n");
  }
  // The in-place progress line between logged steps.
  void live_status(const std::string& text) const {
    if (live_) print(clear_line() + text);
  }

 private:
  std::FILE* out_;
  bool root_;
  bool live_;
};

}  // namespace nibble::train
