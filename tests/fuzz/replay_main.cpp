// A main() for the fuzz targets in builds without libFuzzer (gcc, CI's Debug build): runs each
// file given, or each file in each directory given, through LLVMFuzzerTestOneInput once. So
// the committed corpora and every crash reproducer (tests/fuzz/regressions) are regression
// tests of the ordinary suite.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  int files = 0;
  for (int i = 1; i < argc; ++i) {
    std::vector<fs::path> paths;
    if (fs::is_directory(argv[i])) {
      for (const auto& e : fs::directory_iterator(argv[i])) {
        if (e.is_regular_file()) paths.push_back(e.path());
      }
    } else if (fs::exists(argv[i])) {
      paths.emplace_back(argv[i]);
    }
    for (const fs::path& p : paths) {
      std::ifstream f(p, std::ios::binary);
      const std::vector<char> bytes((std::istreambuf_iterator<char>(f)), {});
      LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
      ++files;
    }
  }
  std::printf("ran %d input(s)\n", files);
  return files > 0 ? 0 : 1;
}
