// kvoffload-replay [--stats] TRACE: feeds a recorded engine/scheduler conversation to the
// library and prints its answers (shared trace-format v1).

#include <fstream>
#include <iostream>
#include <string_view>

#include "replay/trace_replay.hpp"

int main(int argc, char** argv) {
  bool stats = false;
  std::string_view path;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--stats") {
      stats = true;
    } else if (arg == "--help" || arg == "-h" || !path.empty()) {
      path = {};
      break;
    } else {
      path = arg;
    }
  }
  if (path.empty()) {
    std::cerr << "usage: kvoffload-replay [--stats] TRACE.jsonl   (\"-\" reads standard input)\n"
                 "  Replays a scheduler trace and prints one JSON line per answering op.\n"
                 "  Exit status: 0 done, 1 the library rejected an op, 2 a malformed trace.\n";
    return 2;
  }
  if (path == "-") return kvoffload::replay::run(std::cin, std::cout, std::cerr, stats);
  std::ifstream in{std::string(path)};
  if (!in) {
    std::cerr << "kvoffload-replay: cannot open " << path << "\n";
    return 2;
  }
  return kvoffload::replay::run(in, std::cout, std::cerr, stats);
}
