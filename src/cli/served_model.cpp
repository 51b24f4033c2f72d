#include "cli/served_model.h"

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace duet {

std::string first_served_model(const std::string& base_url, const std::string& api_key) {
  httplib::Client cli(base_url);
  httplib::Headers headers;
  if (!api_key.empty()) headers.emplace("Authorization", "Bearer " + api_key);
  auto res = cli.Get("/v1/models", headers);
  if (!res || res->status != 200) DUET_ERROR("GET " << base_url << "/v1/models failed");
  const nlohmann::json j = nlohmann::json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || j["data"].empty())
    DUET_ERROR(base_url << "/v1/models lists no model");
  return j["data"][0].value("id", "");
}

}  // namespace duet
