// Helpers for reading tokenizer.json components. Private to src/model.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace duet {

// The "type" of a tokenizer.json component (normalizer, pre_tokenizer, decoder, ...) for
// dispatch and error messages: "null" for null, the JSON text when there is no type.
inline std::string component_type(const nlohmann::json& j) {
  if (j.is_null()) return "null";
  if (!j.is_object() || !j.contains("type") || !j.at("type").is_string()) return j.dump();
  return j.at("type").get<std::string>();
}

}  // namespace duet
