#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "model/make_model.h"

namespace duet {

void add_make_model_command(CLI::App& app) {
  auto opt = std::make_shared<MakeModelOptions>();
  auto dtype = std::make_shared<std::string>("bf16");
  auto shard_mb = std::make_shared<uint64_t>(512);
  CLI::App* cmd = app.add_subcommand(
      "make-model", "Write a Hugging Face-style model directory with seeded random weights");
  cmd->add_option("dir", opt->dir, "Output directory")->required();
  cmd->add_option("--arch", opt->arch, "qwen3_moe | deepseek_v2 | deepseek_v3 | kimi_k2 | mixtral")
      ->check(CLI::IsMember({"qwen3_moe", "deepseek_v2", "deepseek_v3", "kimi_k2", "mixtral"}));
  cmd->add_option("--preset", opt->preset, "tiny (tests) | small (benchmarks)")
      ->check(CLI::IsMember({"tiny", "small"}));
  cmd->add_option("--seed", opt->seed, "Random seed");
  cmd->add_option("--dtype", *dtype,
                  "bf16 | f32 | fp8 (E4M3 projections with 128 x 128 block scales, as DeepSeek-V3) | "
                  "int4 (routed experts in compressed-tensors' packed int4, as Kimi K2 Thinking)")
      ->check(CLI::IsMember({"bf16", "f32", "fp8", "int4"}));
  cmd->add_option("--hf-overrides", opt->hf_overrides,
                  "JSON object merged into config.json, e.g. '{\"q_lora_rank\": 24}'");
  cmd->add_option("--max-shard-size", *shard_mb,
                  "Largest safetensors shard in MiB; bigger models get an index file");
  cmd->callback([opt, dtype, shard_mb] {
    opt->dtype = *dtype == "f32"    ? DType::kF32
                 : *dtype == "fp8"  ? DType::kF8E4M3
                 : *dtype == "int4" ? DType::kQ4
                                    : DType::kBF16;
    opt->max_shard_bytes = *shard_mb << 20;
    make_model(*opt);
    std::printf("wrote %s (%s, preset %s, %s)\n", opt->dir.c_str(), opt->arch.c_str(),
                opt->preset.c_str(), dtype->c_str());
  });
}

}  // namespace duet
