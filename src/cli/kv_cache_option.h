// --kv-cache-dtype, shared by every command that makes a KV cache (serve, generate, bench
// latency).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace duet {

// Registers --kv-cache-dtype on `cmd`, read into `name`; the command's callback parses it with
// parse_kv_cache_dtype (engine/kv_dtype.h), which refuses other values as a duet::Error.
inline void add_kv_cache_dtype_option(CLI::App* cmd, std::string& name) {
  cmd->add_option("--kv-cache-dtype", name,
                  "KV cache element type: auto (default; bf16 for bf16 weights, else f32) | "
                  "bf16 | f32");
}

}  // namespace duet
