// The nibble command: every subcommand registered by the cmd_*.cpp files (cli/app.h), with no
// injected faults.
#include "cli/app.h"

int main(int argc, char** argv) { return nibble::cli::run_cli(argc, argv, {}); }
