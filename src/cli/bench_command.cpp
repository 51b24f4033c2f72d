#include "cli/commands.h"

namespace duet {

// `duet bench <what>`: benchmarks that print ratios taken side by side in one run.
void add_bench_command(CLI::App& app) {
  CLI::App* bench =
      app.add_subcommand("bench", "Benchmarks (latency, accuracy, tokenizer, serve, ...)");
  bench->require_subcommand(1);
  // Each benchmark registers itself here.
  add_bench_latency(*bench);
  add_bench_serve(*bench);
  add_bench_tokenizer(*bench);
  add_bench_all2all(*bench);
  add_bench_overlap(*bench);
  add_bench_soak(*bench);
  add_bench_accuracy(*bench);
}

}  // namespace duet
