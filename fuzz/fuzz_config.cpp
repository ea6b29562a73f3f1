// libFuzzer target for the run-config reader: any YAML text must either configure a run that
// validates, or raise UsageError (anything else - a crash, a sanitizer report, another exception
// such as one escaping from yaml-cpp - is a finding).
#include <cstdint>
#include <string_view>

#include "common/error.h"
#include "run/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nibble::train::RunConfig config;
  try {
    nibble::train::apply_config_yaml(config, std::string_view(reinterpret_cast<const char*>(data), size), "<fuzz>");
    config.validate();
    // What was accepted must print and read back to the same values.
    nibble::train::RunConfig again;
    nibble::train::apply_config_yaml(again, nibble::train::config_to_yaml(config), "<fuzz round trip>");
    if (nibble::train::config_values(again) != nibble::train::config_values(config)) __builtin_trap();
  } catch (const nibble::UsageError&) {
  }
  return 0;
}
