// config.json: any JSON object is either a configuration duet runs or refused by name.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j =
      nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  try {
    const duet::ModelConfig c = duet::parse_config(j, "fuzz/config.json");
    for (int64_t il = 0; il < c.n_layer && il < 1024; ++il) (void)c.is_moe_layer(il);
    (void)c.qk_head_dim();
  } catch (const duet::Error&) {
  }
  return 0;
}
