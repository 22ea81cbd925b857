// kvoffload-replay TRACE: feeds a recorded engine/scheduler conversation to the library and
// prints its answers (shared trace-format v1).

#include <fstream>
#include <iostream>
#include <string_view>

#include "replay/trace_replay.hpp"

int main(int argc, char** argv) {
  if (argc != 2 || std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h") {
    std::cerr << "usage: kvoffload-replay TRACE.jsonl   (\"-\" reads standard input)\n";
    return 2;
  }
  const std::string_view path = argv[1];
  if (path == "-") return kvoffload::replay::run(std::cin, std::cout, std::cerr);
  std::ifstream in{std::string(path)};
  if (!in) {
    std::cerr << "kvoffload-replay: cannot open " << path << "\n";
    return 2;
  }
  return kvoffload::replay::run(in, std::cout, std::cerr);
}
