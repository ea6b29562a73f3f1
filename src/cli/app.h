// The nibble command line as a function, so that the nibble program (main.cpp) and the tests'
// fault-injecting driver (tests/support/nibble_with_faults.cpp) run the same commands.
#pragma once
#include "run/faults.h"

namespace nibble::cli {

// Parses argv and runs the subcommand it names; returns the process exit status (2 for a usage
// error, after printing it). `faults` reaches `nibble train` (run/faults.h): none but in tests.
int run_cli(int argc, char** argv, const train::FaultPlan& faults);

// The faults run_cli was given, for the subcommands that take them.
const train::FaultPlan& injected_faults();

}  // namespace nibble::cli
