// The nibble command: every subcommand registered by the cmd_*.cpp files (cli/app.h), with no
// injected faults.
#include "cli/app.h"
#include "common/wait_policy.h"

int main(int argc, char** argv) {
  nibble::apply_default_wait_policy(argv);  // may start the program again (common/wait_policy.h)
  return nibble::cli::run_cli(argc, argv, {});
}
