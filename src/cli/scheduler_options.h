// The engine's scheduler options, shared by the commands that run the serving engine (serve,
// generate): SGLang's --disable-overlap-schedule and vLLM's --num-scheduler-steps.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine/llm_engine.h"

namespace duet {

// Registers --disable-overlap-schedule and --num-scheduler-steps on `cmd`, into `c`.
inline void add_scheduler_options(CLI::App* cmd, EngineConfig& c) {
  cmd->add_flag(
      "--disable-overlap-schedule", [&c](int64_t) { c.overlap_schedule = false; },
      "Run each step after the previous one's outputs are processed (default: the next step "
      "computes while the engine thread processes outputs and schedules)");
  cmd->add_option("--num-scheduler-steps", c.num_scheduler_steps,
                  "Decode steps a decode-only batch runs per scheduler call (multi-step; "
                  "default 1)")
      ->check(CLI::Range(1, 64));
}

// "overlapped scheduler" or "plain scheduler", with ", N steps per decode batch" for multi-step.
inline std::string describe_scheduler(const EngineConfig& c) {
  std::string s = c.overlap_schedule ? "overlapped scheduler" : "plain scheduler";
  if (c.num_scheduler_steps > 1)
    s += ", " + std::to_string(c.num_scheduler_steps) + " steps per decode batch";
  return s;
}

}  // namespace duet
