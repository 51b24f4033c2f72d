// Helpers for reading tokenizer.json components. Private to src/model.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace duet {

// A token id as tokenizer.json writes it: a non-negative integer below 2^30 (a float, even an
// integral one, is refused: converting one beyond int64's range was undefined, found by
// fuzz_tokenizer_json). Throws duet::Error naming `what` otherwise.
inline int32_t token_id_of(const nlohmann::json& v, const std::string& what) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0) ||
      v.get<uint64_t>() >= (uint64_t{1} << 30)) {
    DUET_ERROR(what << ": token id " << v.dump() << " is not an integer in [0, 2^30)");
  }
  return static_cast<int32_t>(v.get<uint64_t>());
}

// The "type" of a tokenizer.json component (normalizer, pre_tokenizer, decoder, ...) for
// dispatch and error messages: "null" for null, the JSON text when there is no type.
inline std::string component_type(const nlohmann::json& j) {
  if (j.is_null()) return "null";
  if (!j.is_object() || !j.contains("type") || !j.at("type").is_string()) return j.dump();
  return j.at("type").get<std::string>();
}

}  // namespace duet
