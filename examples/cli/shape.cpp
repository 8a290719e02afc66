// `moe-residency shape`: the model shape and token cycle of a built-in preset.

#include <cstdio>
#include <string>

#include "checked_options.hpp"
#include "command.hpp"
#include "moe_residency/core.hpp"

namespace {

moe_residency::model_shape preset_by_name(const std::string& name, std::size_t k) {
  using namespace moe_residency;
  if (name == "qwen3-30b") return k ? presets::qwen3_30b_a3b(k) : presets::qwen3_30b_a3b();
  if (name == "gpt-oss-120b") return k ? presets::gpt_oss_120b(k) : presets::gpt_oss_120b();
  return k ? presets::qwen3_6_35b_a3b(k) : presets::qwen3_6_35b_a3b();  // --preset's validator took only these
}

void print_shape(const moe_residency::model_shape& s) {
  using namespace moe_residency;
  std::printf("%s: %zu layers (%zu MoE), %zu experts per layer, top-%zu\n", s.name().c_str(), s.n_layers(),
              s.n_moe_layers(), s.n_experts(), s.top_k());
  std::uint64_t lo = UINT64_MAX, hi = 0, all = 0;
  for (std::size_t l = 0; l < s.n_layers(); ++l) {
    const auto b = s.expert_bytes(layer_id(static_cast<std::uint16_t>(l)));
    if (!b) continue;
    lo = std::min(lo, b);
    hi = std::max(hi, b);
    all += b * s.n_experts();
  }
  std::printf("expert bytes: %.2f to %.2f MiB per expert; all experts %.1f MiB\n", to_mib(lo), to_mib(hi), to_mib(all));
  std::printf("token cycle: %.1f MiB (a recency-evicted cache below this hits 0%%)\n", to_mib(token_cycle_bytes(s)));
}

const moe_residency_cli::command_registrar reg{
    "shape", "Print the model shape and token cycle of a built-in preset", [](CLI::App& sub) {
      auto preset = std::make_shared<std::string>("qwen3-30b");
      auto k = std::make_shared<std::size_t>(0);
      moe_residency_cli::add_preset_option(sub, *preset, {"qwen3-30b", "gpt-oss-120b", "qwen3.6-35b"});
      sub.add_option("--k", *k, "top-k (default: the model's own)")->check(moe_residency_cli::whole(1, 32));
      sub.callback([preset, k] { print_shape(preset_by_name(*preset, *k)); });
    }};

}  // namespace
