// Writes fuzz_gguf_expert_map's seed corpus: small valid GGUFs built with
// ggml's gguf writer (gguf_seed.hpp). Usage: moe_residency_fuzz_gguf_seeds OUT_DIR
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include "gguf_seed.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  try {
    const std::filesystem::path dir = std::filesystem::path(argv[1]) / "fuzz_gguf_expert_map";
    std::filesystem::create_directories(dir);
    for (int v = 0; v < 2; ++v) {
      const auto bytes = moe_residency_fuzz::small_expert_gguf(v);
      const std::string name = (dir / ("seed-" + std::to_string(v) + ".gguf")).string();
      std::FILE* f = std::fopen(name.c_str(), "wb");
      if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
        std::fprintf(stderr, "cannot write %s\n", name.c_str());
        return 1;
      }
      std::fclose(f);
      std::printf("%s %zu bytes\n", name.c_str(), bytes.size());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
