// Fuzz target: the trace parser and replay (tools/replay). Any input must end in exit status 0,
// 1 or 2 with no crash, leak or undefined behaviour.

#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "replay/trace_replay.hpp"

namespace {
// Inputs whose config asks for a huge cache test the machine's memory, not the parser: skip
// any number of more than 7 digits (the library allocates what it is told to).
bool asks_for_too_much(const std::string& s) {
  int digits = 0;
  for (const char c : s) {
    digits = (c >= '0' && c <= '9') ? digits + 1 : 0;
    if (digits > 7) return true;
  }
  return false;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (asks_for_too_much(text)) return 0;
  std::istringstream in(text);
  std::ostringstream out, err;
  const int status = kvoffload::replay::run(in, out, err, true);
  if (status < 0 || status > 2) std::abort();
  return 0;
}
