// The `duet` subcommands. Each registers its options on the app and runs when selected; errors
// surface as duet::Error and are printed by main.
#pragma once

#include <CLI/CLI.hpp>

namespace duet {

void add_make_model_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_bench_latency(CLI::App& bench);  // adds "bench" and its benchmarks (bench_command.cpp)

}  // namespace duet
